"""Benchmark: what common random numbers buy a paired difference, measured on one run of the study.

Seed s of every setting draws the same fine-tuning randomness (data order, head initialisation),
and, with `pretrain.per_seed`, seed s of every pre-trained setting the same pre-training randomness
where their objectives share it (caption order, masked words and RoIs; vlbert/tasks/pretraining.py).
A setting's seed s and another's seed t != s share none of it: pairing them is the study without
common random numbers. For each headline pair (`full` - `no_pretrain`, `c` - `b`) and Table 4 task
this prints, from the runs' per-item scores of the reported split:

- the item level: the variance of one seed pair's difference over the test items, paired by seed
  against across seeds (their ratio: under 1 is item noise the shared draws cancel), and the
  correlation of the two settings' per-item scores within a seed and across seeds (what the shared
  draws make alike). Thousands of items make these precise.
- the seed level: the variance of a per-seed difference paired by seed, Var(a_s - b_s), against
  the unpaired Var(a_s) + Var(b_s). With three seeds each is a two-degree-of-freedom estimate and
  their ratio swings widely with nothing shared: read it over many rows, not one.

Run it on two runs to compare (e.g. before and after a change to what the settings share).

    python bench/common_random_numbers.py STUDY_DIR [--preset mini]

STUDY_DIR is the folder the DAG ran in (it holds results/<preset>/; bench/study_time.py prints it).
"""

from __future__ import annotations

import argparse
import itertools
import os
from pathlib import Path

import numpy as np

PAIRS = [("full", "no_pretrain"), ("c", "b")]


def seed_level(a: np.ndarray, b: np.ndarray) -> dict:
    """a, b: per-seed scores of two settings, aligned by seed. Variance of the paired difference
    against the sum of the two settings' variances (what it would be if the seeds shared nothing)."""
    paired = float(np.var(a - b, ddof=1))
    unpaired = float(np.var(a, ddof=1) + np.var(b, ddof=1))
    return {"paired": paired, "unpaired": unpaired, "ratio": paired / unpaired if unpaired > 0 else float("nan")}


def item_level(a: np.ndarray, b: np.ndarray) -> dict:
    """a, b: [seeds, items] per-item scores, seeds aligned. The SE of one seed pair's difference
    over items (from the pairs' mean variance) and the per-item correlation of the two settings,
    within a seed (s, s) and across seeds (s, t != s)."""
    n = a.shape[1]

    def stats(pairs):  # the pairs' mean variance of the difference's mean over items, mean correlation
        variances, correlations = [], []
        for s, t in pairs:
            variances.append(float(np.var(a[s] - b[t], ddof=1) / n))
            if np.std(a[s]) > 0 and np.std(b[t]) > 0:
                correlations.append(float(np.corrcoef(a[s], b[t])[0, 1]))
        return float(np.mean(variances)), float(np.mean(correlations)) if correlations else float("nan")

    seeds = range(a.shape[0])
    var_paired, rho_paired = stats([(s, s) for s in seeds])
    var_crossed, rho_crossed = stats([(s, t) for s, t in itertools.permutations(seeds, 2)])
    return {
        "se_paired": float(np.sqrt(var_paired)),
        "se_crossed": float(np.sqrt(var_crossed)),
        "variance_ratio": var_paired / var_crossed if var_crossed > 0 else float("nan"),
        "correlation_paired": rho_paired,
        "correlation_crossed": rho_crossed,
    }


def aligned(scores: dict, first: str, second: str, task: str) -> tuple[np.ndarray, np.ndarray] | None:
    """The two settings' [seeds, items] scores (points, Task.item_scores) on the seeds both ran, or None."""
    key_a, key_b = (first, task, 1.0), (second, task, 1.0)
    if key_a not in scores or key_b not in scores:
        return None
    (seeds_a, rows_a), (seeds_b, rows_b) = scores[key_a], scores[key_b]
    common = sorted(set(seeds_a) & set(seeds_b))
    if len(common) < 2:
        return None
    a = np.array([rows_a[seeds_a.index(s)] for s in common], dtype=float)
    b = np.array([rows_b[seeds_b.index(s)] for s in common], dtype=float)
    return a, b


def report(scores: dict, pairs=PAIRS) -> list[str]:
    lines = [
        f"{'pair':<20} {'task':<12} {'delta':>6} {'item SE s,s':>11} {'s,t':>5} {'ratio':>6}"
        f" {'rho s,s':>7} {'s,t':>6} {'Var paired':>10} {'Var unpaired':>12} {'ratio':>6}"
    ]
    for first, second in pairs:
        for task in sorted({key[1] for key in scores}):
            both = aligned(scores, first, second, task)
            if both is None:
                continue
            a, b = both
            seeds, items = seed_level(a.mean(1), b.mean(1)), item_level(a, b)
            lines.append(
                f"{first + ' - ' + second:<20} {task:<12} {a.mean() - b.mean():>+6.1f} {items['se_paired']:>11.2f}"
                f" {items['se_crossed']:>5.2f} {items['variance_ratio']:>6.2f}"
                f" {items['correlation_paired']:>7.2f} {items['correlation_crossed']:>6.2f}"
                f" {seeds['paired']:>10.2f} {seeds['unpaired']:>12.2f} {seeds['ratio']:>6.2f}"
            )
    return lines


def load_preset(name: str) -> dict:
    from vlbert.config import load_config

    return load_config(Path(__file__).resolve().parent.parent / "experiments" / f"{name}.yaml")


def study_scores(study: Path, preset: dict) -> dict:
    """The per-item scores (vlbert.study.report.read.item_scores) of the study run in `study`."""
    from vlbert.layout import Layout
    from vlbert.study.report.read import collect_runs, item_scores, latest_results
    from vlbert.tracking import default_tracking_uri

    os.chdir(study)  # the layout's paths are relative to the folder the DAG ran in
    layout = Layout(preset["name"])
    uri = default_tracking_uri(preset)
    finetunes, _ = latest_results(collect_runs(uri, preset["tracking"]["experiment"]), "finetune")
    return item_scores(uri, finetunes, layout.data, layout.features)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", type=Path, help="the folder the DAG ran in")
    parser.add_argument("--preset", default="mini")
    args = parser.parse_args()
    preset = load_preset(args.preset)
    if not preset.get("pretrain", {}).get("per_seed"):
        print(f"{args.preset}: the seeds of a setting share one pre-training: across seeds, its draws are shared too")
    scores = study_scores(args.study.resolve(), preset)
    print(f"{args.study}: per-seed differences of the reported split, accuracy points")
    print("\n".join(report(scores)))


if __name__ == "__main__":
    main()
