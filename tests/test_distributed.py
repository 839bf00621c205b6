"""Data-parallel training on CPU processes and autocast precisions (vlbert/engine/distributed.py,
device.py)."""

import json
import subprocess
import sys

import pytest
import torch
from conftest import finetune_args, study_args
from training_helpers import Tiny

from vlbert.engine.optim import build_optimizer, build_scheduler

# ---- DDP -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_two_processes_on_cpu_stay_in_step(smoke_study, tmp_path):
    """torchrun with 2 CPU processes (gloo): the loop checks every epoch that the ranks hold the
    same weights, and fails if they drift."""
    out = tmp_path / "ddp"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            "29517",
            "-m",
            "vlbert.cli",
            *finetune_args("no_pretrain", "vcr_q2a", "0.02", "0"),
            "--out",
            str(out),
            *study_args(smoke_study),
            "--threads",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["best_epoch"] == 1 and 0 <= metrics["val"]["accuracy"] <= 100
    assert "data-parallel fine-tuning: 2 processes" in result.stdout


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_autocast_precision_trains(tmp_path, precision):
    """bf16 autocast (GPU in real use; CPU here) runs the same loop and still learns."""
    from vlbert.engine.loop import LoopConfig, LoopSteps, TrainingLoop

    torch.manual_seed(0)
    model = Tiny(4)
    x, y = torch.randn(64, 4), torch.randn(64, 1)
    optimizer = build_optimizer(model, {"lr": 0.05, "weight_decay": 0.0})
    scheduler = build_scheduler(optimizer, {}, 40, 20)
    loss_fn = lambda model, batch: (((model.linear(batch["x"]).float() - batch["y"]) ** 2).mean(), {})
    loop = TrainingLoop(
        model,
        optimizer,
        scheduler,
        LoopConfig(2, 20, precision=precision, progress=False),
        tmp_path,
        LoopSteps(lambda e, b: {"x": x, "y": y}, loss_fn),
        [],
    )
    before = loss_fn(model, {"x": x, "y": y})[0].item()
    loop.fit()
    assert loss_fn(model, {"x": x, "y": y})[0].item() < 0.8 * before
    with pytest.raises(ValueError, match="precision"):
        TrainingLoop(
            model,
            optimizer,
            scheduler,
            LoopConfig(1, 1, precision="fp8"),
            tmp_path,
            LoopSteps(None, None),
            [],
        )
