"""Benchmark: training throughput of every stage on the mini preset, and time spent waiting for data.

Runs the real pre-training and fine-tuning code (vlbert.engine) for a fixed number of steps and
prints examples per second and the share of step time the loop waited for its next batch
(target: under 10%). Needs the mini study's data, detector, feature stores and BERT init
(`make reproduce`, or the workflow's stages up to bert_init). With several `--finetune-settings`,
each task's fine-tuning cost per example is also printed against the first setting's (a Pixel-BERT
row against VL-BERT's: the systems issue's bar is 2x). `--unfused` steps the optimisers with
torch's per-parameter loop instead of their fused kernels (what the study used before), to print
the difference.

    python bench/train_step.py [--config experiments/mini.yaml] [--steps 20] [--unfused]
    python bench/train_step.py --settings --finetune-settings no_pretrain pixelbert_no_pretrain --threads 1
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from vlbert.config import load_config
from vlbert.engine import optim
from vlbert.engine.context import run_inputs, training_context
from vlbert.engine.finetune import finetune
from vlbert.engine.pretrain import pretrain
from vlbert.registry import SETTINGS, TASKS
from vlbert.tracking import NullTracker


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="experiments/mini.yaml")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--settings", nargs="*", default=["a", "b", "c", "d", "full"], help="pre-training settings")
    parser.add_argument("--finetune-settings", nargs="+", default=["no_pretrain"], help="fine-tuned from their start")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS))
    parser.add_argument("--unfused", action="store_true", help="optimisers without their fused kernels")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    optim.FUSED = not args.unfused
    preset = load_config(args.config)
    context = training_context(preset, run_inputs(preset), NullTracker, progress=False)
    rows, costs = [], {}  # costs: per task, (setting, seconds per example) in --finetune-settings' order
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.settings:
            speed = pretrain(context, SETTINGS[name], Path(scratch) / f"pretrain_{name}", max_steps=args.steps)
            rows.append((f"pretrain {name}", preset["pretrain"]["batch_size"], speed))
        for task in args.tasks:
            batch = preset["finetune"][TASKS[task].options_key]["batch_size"]
            for name in args.finetune_settings:
                out = Path(scratch) / f"finetune_{name}_{task}"
                speed = finetune(context, SETTINGS[name], task, 1e-3, 0, out, max_steps=args.steps)
                rows.append((f"finetune {task} {name}", batch, speed))
                costs.setdefault(task, []).append((name, 1 / speed["examples_per_second"]))
    kernels = "per-parameter loop" if args.unfused else "fused kernels"
    print(f"{preset['name']} preset, {args.steps} steps each, {args.threads} threads, optimisers: {kernels}")
    print(f"{'stage':44} {'batch':>5} {'examples/s':>11} {'data wait':>10}")
    for stage, batch, speed in rows:
        print(f"{stage:44} {batch:5d} {speed['examples_per_second']:11.1f} {100 * speed['data_wait_share']:9.1f}%")
    if len(args.finetune_settings) > 1:
        first = args.finetune_settings[0]
        print(f"fine-tuning seconds per example against {first}'s:")
        for task, (base, *others) in costs.items():
            print(f"  {task:12} " + "  ".join(f"{name} {cost / base[1]:.2f}x" for name, cost in others))
    worst = max(speed["data_wait_share"] for _, _, speed in rows)
    print(f"largest data-wait share (target < 10%): {100 * worst:.1f}%")


if __name__ == "__main__":
    main()
