"""Optimisers and learning-rate schedules from a preset's section (the paper's, by default).

Pre-training, VQA and RefCOCO+: AdamW, linear warm-up then linear decay. VCR: SGD with momentum,
linear warm-up, then the rate divided by 10 at each of `step_epochs`.
"""

from __future__ import annotations

import torch
from torch import nn

NO_DECAY = ("bias", "LayerNorm.weight", "norm.weight", "mask_embedding", "text_only_embedding", "text_scale")
# Every family's task model names its new answer / score head `classifier`: `head_lr_factor` x the rate.
TASK_HEAD = "classifier."
# Devices whose optimisers step every parameter in one fused kernel; elsewhere the step is a loop
# of small ops per parameter, which a small model pays on every step (bench/train_step.py --unfused).
FUSED_DEVICES = {"cpu", "cuda"}
FUSED = True  # bench/train_step.py --unfused sets it off, to measure the difference


def build_optimizer(model: nn.Module, options: dict, lr: float | None = None) -> torch.optim.Optimizer:
    lr = lr if lr is not None else options["lr"]
    # A head that starts from random weights, at a pre-trained body's rate, learns the answer
    # prior and stays there, though the body's features already hold the answer.
    head_factor = float(options.get("head_lr_factor", 1.0))
    module_factors = _module_factors(model, options)
    groups = {}
    for name, param in model.named_parameters():
        if param.requires_grad:
            decays = not (name.endswith(NO_DECAY) or param.ndim == 1)
            factor = module_factors.get(id(param), head_factor if name.startswith(TASK_HEAD) else 1.0)
            groups.setdefault((decays, factor), []).append(param)
    groups = [
        {"params": params, "weight_decay": options.get("weight_decay", 1e-4) if decays else 0.0, "lr": lr * factor}
        for (decays, factor), params in groups.items()
    ]
    kind = options.get("optimizer", "adamw")
    fused = _fusable(model)
    if kind == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-6, fused=fused)
    if kind == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=options.get("momentum", 0.9), fused=fused)
    raise ValueError(f"unknown optimizer {kind!r}")


def _module_factors(model: nn.Module, options: dict) -> dict[int, float]:
    """The rate factor of each parameter (by id) of a module that names the section's option scaling
    its rate (`lr_factor_option`: a pre-trained detector's or CNN's, usually below 1)."""
    factors = {}
    for module in model.modules():
        option = getattr(module, "lr_factor_option", None)
        if option is not None:
            factors.update({id(p): float(options.get(option, 1.0)) for p in module.parameters()})
    return factors


def _fusable(model: nn.Module) -> bool | None:
    """True where every trained parameter is a floating-point tensor on a device with fused
    optimiser kernels; None (torch's own choice) otherwise."""
    params = [p for p in model.parameters() if p.requires_grad]
    if FUSED and params and all(p.is_floating_point() and p.device.type in FUSED_DEVICES for p in params):
        return True
    return None


def build_scheduler(optimizer, options: dict, total_steps: int, steps_per_epoch: int):
    warmup = min(int(options.get("warmup_steps", 0)), max(0, total_steps - 1))
    schedule = options.get("schedule", "linear_decay")
    step_epochs = [int(e) for e in options.get("step_epochs", [])]

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if schedule == "linear_decay":
            return max(0.0, (total_steps - step) / max(1, total_steps - warmup))
        epoch = step // max(1, steps_per_epoch)
        return 0.1 ** sum(epoch >= e for e in step_epochs)

    if schedule not in ("linear_decay", "step"):
        raise ValueError(f"unknown schedule {schedule!r}")
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
