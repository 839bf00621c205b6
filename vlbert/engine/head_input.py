"""The statistics a task head standardises its input with (`standardise_head_input`): the mean and
standard deviation per feature of what the head receives on the fine-tuning set, taken once, in
eval mode, before the first step."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ..modeling.heads import HeadInputStandardiser
from .device import move_to

# Features whose spread is below this are centred, not blown up.
MIN_STD = 1e-5


@torch.no_grad()
def fit_head_standardisers(model: torch.nn.Module, batches: Iterable[dict]) -> int:
    """Set every HeadInputStandardiser of `model` from its inputs over `batches`; the rows seen
    (0: the model has none, and nothing runs). Rows of zeros are padding (a RefCOCO+ item's missing
    regions, `region_states`) and are left out."""
    standardisers = [module for module in model.modules() if isinstance(module, HeadInputStandardiser)]
    if not standardisers:
        return 0
    sums: dict[int, tuple] = {}  # per standardiser: rows, their sum, their sum of squares

    def observe(module, args):
        rows = args[0].detach().reshape(-1, args[0].shape[-1]).double()
        rows = rows[rows.ne(0).any(-1)]
        count, total, squares = sums.get(id(module), (0, 0.0, 0.0))
        sums[id(module)] = (count + len(rows), total + rows.sum(0), squares + rows.square().sum(0))

    hooks = [module.register_forward_pre_hook(observe) for module in standardisers]
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    try:
        for batch in batches:
            model(**move_to(batch, device))
    finally:
        for hook in hooks:
            hook.remove()
        model.train(was_training)
    rows = 0
    for module in standardisers:
        count, total, squares = sums.get(id(module), (0, 0.0, 0.0))
        if count < 2:
            raise ValueError("the head's input statistics need at least two rows of the training set")
        mean = total / count
        variance = (squares - count * mean.square()) / (count - 1)
        module.mean.copy_(mean.to(module.mean.dtype))
        module.std.copy_(variance.clamp(min=0).sqrt().clamp(min=MIN_STD).to(module.std.dtype))
        rows = max(rows, count)
    return rows
