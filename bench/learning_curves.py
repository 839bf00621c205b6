"""Benchmark: where a cell's seed spread comes from, read from its fine-tuning runs' curves.

For every Table 4 task and every setting that fine-tuned it on the whole training set, each seed's
run: the epoch at which its validation accuracy first clears the task's blind floor (the higher of
the floors `vlbert floors` computes on val) by `--margin` points, its best epoch against its
last, and its test score. Per task it prints how much of the test scores' spread within a setting
that epoch explains (the squared correlation of the two, each centred on its setting's mean) and
how many runs had their best epoch among the last two: a run that leaves the floor late and whose
schedule ends while it still rises scores what its start cost it, so the seeds' spread then
measures when runs take off more than what they learn.

    python bench/learning_curves.py results/mini
    python bench/learning_curves.py /path/to/study/results/mini --settings no_pretrain a b c d full
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

TABLE4_TASKS = ("vcr_q2a", "vcr_qa2r", "vqa", "refcoco_det")
SEED_FOLDER = re.compile(r"^seed(\d+)$")


def val_floor(floors: dict, task: str) -> float:
    """The higher of the task's blind floors on val (what a model that does not look scores)."""
    val = floors[task]["val"]
    # counts (n, n_rare), pair accuracy and the rare/seen parts are not a floor of the whole split
    parts = ("n", "_pairs", "_rare", "_seen")
    return max(v for k, v in val.items() if k != "n" and not k.startswith("n_") and not k.endswith(parts[1:]))


def runs(results: Path, margin: float, settings: list[str] | None = None) -> pd.DataFrame:
    floors = json.loads((results / "floors.json").read_text())
    rows = []
    for task in TABLE4_TASKS:
        floor = val_floor(floors, task)
        for metrics_path in sorted(results.glob(f"finetune/*/{task}/seed*/metrics.json")):
            seed = SEED_FOLDER.match(metrics_path.parent.name)
            if seed is None:
                continue
            if settings and metrics_path.parents[2].name not in settings:
                continue
            metrics = json.loads(metrics_path.read_text())
            curve = [epoch["accuracy"] for epoch in metrics["val_history"]]
            took_off = next((i + 1 for i, v in enumerate(curve) if v >= floor + margin), None)
            rows.append(
                {
                    "task": task,
                    "setting": metrics_path.parents[2].name,
                    "seed": int(seed.group(1)),
                    "takes_off": took_off if took_off is not None else len(curve) + 1,
                    "best_epoch": metrics["best_epoch"],
                    "epochs": len(curve),
                    "test": metrics["test"]["accuracy"],
                    "floor": floor,
                }
            )
    if not rows:
        raise SystemExit(f"{results}: no fine-tuning run's metrics.json under finetune/<setting>/<task>/seed<N>/")
    return pd.DataFrame(rows)


def explained(task_runs: pd.DataFrame) -> float:
    """The share of the test scores' within-setting variance that the take-off epoch explains."""
    centred = task_runs.groupby("setting")[["takes_off", "test"]].transform(lambda x: x - x.mean())
    if centred["takes_off"].std() == 0 or centred["test"].std() == 0:
        return float("nan")
    return float(np.corrcoef(centred["takes_off"], centred["test"])[0, 1] ** 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="a study's results folder (results/<preset>)")
    parser.add_argument("--margin", type=float, default=10.0, help="points over the blind floor (default 10)")
    parser.add_argument("--settings", nargs="+", help="only these settings (default: every one that ran)")
    args = parser.parse_args()
    table = runs(args.results, args.margin, args.settings)
    for task, task_runs in table.groupby("task", sort=False):
        floor = task_runs["floor"].iloc[0]
        print(f"\n{task}: epoch each run's val first clears {floor:.1f} + {args.margin:g} (best epoch / epochs), test")
        for setting, part in task_runs.groupby("setting", sort=False):
            cells = "  ".join(
                f"seed {r.seed}: {r.takes_off} ({r.best_epoch}/{r.epochs}) {r.test:5.1f}" for r in part.itertuples()
            )
            print(f"  {setting:>22}  {cells}  std {part['test'].std(ddof=1):4.1f}")
        late = int((task_runs["best_epoch"] >= task_runs["epochs"] - 1).sum())
        print(
            f"  the take-off epoch explains {explained(task_runs):.0%} of the test scores' spread within a setting;"
            f" {late} of {len(task_runs)} runs' best epoch among their last two"
        )


if __name__ == "__main__":
    main()
