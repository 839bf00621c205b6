"""Benchmark: a study's wall time against its budget, and where the time goes, per stage.

Either runs the study (Snakemake, as `make reproduce` does) in a fresh folder and times it, or
reads a finished run. Per stage it prints the jobs, their summed and longest wall seconds (from
the `benchmark:` files every rule writes under results/<preset>/benchmarks/), then the run's
wall time and its ratio to the budget (smoke: 5 minutes, mini: 60 minutes with the three systems, on 2 cores).

    python bench/study_time.py --preset smoke                 # run the smoke study in a temp folder
    python bench/study_time.py --preset mini --workdir .      # a finished run in this checkout
    python bench/study_time.py --preset mini --workdir <run of the Table 4 part> --budget 45

Beside the wall time it prints the jobs' summed seconds over the cores: the least wall time any
order of the same jobs could take (one thread a job, as the default profile runs them), so whether
a budget is missed by the schedule or by the work.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import pandas as pd

from vlbert.layout import Layout

REPO = Path(__file__).resolve().parent.parent
BUDGET_SECONDS = {"smoke": 5 * 60, "mini": 60 * 60}
STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ [\d:]+ \d{4})\]$", re.M)


def run_study(preset: str, workdir: Path, cores: int) -> float:
    started = time.time()
    env_bin = str(Path(sys.executable).parent)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "--snakefile",
            str(REPO / "Snakefile"),
            "--profile",
            str(REPO / "workflow/profiles/default"),
            "--cores",
            str(cores),
            "--configfile",
            str(REPO / "experiments" / f"{preset}.yaml"),
            "--directory",
            str(workdir),
        ],
        check=True,
        env={**os.environ, "PATH": f"{env_bin}:{os.environ['PATH']}"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.time() - started


def logged_wall_seconds(workdir: Path) -> float | None:
    """First to last timestamp of the newest Snakemake log that ran jobs."""
    for log in sorted((workdir / ".snakemake" / "log").glob("*.snakemake.log"), reverse=True):
        stamps = [datetime.strptime(s, "%a %b %d %H:%M:%S %Y") for s in STAMP.findall(log.read_text())]
        if len(stamps) >= 2:
            return (stamps[-1] - stamps[0]).total_seconds()
    return None


def stage_table(benchmarks: Path) -> pd.DataFrame:
    rows = []
    for tsv in sorted(benchmarks.rglob("*.tsv")):
        stage = tsv.parent.name if tsv.parent != benchmarks else tsv.stem
        rows.append({"stage": stage, "job": tsv.stem, "seconds": float(pd.read_csv(tsv, sep="\t")["s"].iloc[-1])})
    if not rows:
        raise SystemExit(f"no benchmark files under {benchmarks}")
    table = pd.DataFrame(rows).groupby("stage", sort=False)["seconds"].agg(jobs="count", summed="sum", longest="max")
    return table.round(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="smoke", choices=sorted(BUDGET_SECONDS))
    parser.add_argument(
        "--workdir", type=Path, help="a finished run's folder (default: run the study in a temp folder)"
    )
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument(
        "--budget", type=float, help="minutes (default: the preset's; the Table 4 part's bar is 45 on the mini preset)"
    )
    args = parser.parse_args()
    if args.workdir:
        workdir, wall = args.workdir, logged_wall_seconds(args.workdir)
    else:
        workdir = Path(tempfile.mkdtemp(prefix=f"study_{args.preset}_"))
        wall = run_study(args.preset, workdir, args.cores)
    table = stage_table(workdir / Layout(args.preset).benchmarks)
    print(table.to_string())
    budget = args.budget * 60 if args.budget else BUDGET_SECONDS[args.preset]
    print("\n" + "\n".join(summary(args.preset, table, wall, args.cores, budget)))


def summary(preset: str, table: pd.DataFrame, wall: float | None, cores: int, budget: float) -> list[str]:
    """The run's wall time against its budget, and the least any order of its jobs could take."""
    summed = float(table["summed"].sum())
    floor = summed / cores
    lines = [
        f"summed job seconds {summed:,.0f}: at least {floor / 60:.1f} min on {cores} cores in any order "
        f"({floor / budget:.2f} of the {budget / 60:.0f}-minute budget)"
    ]
    if wall is not None:
        lines.append(
            f"{preset} study: {wall / 60:.1f} min wall on {cores} cores; "
            f"ratio to its {budget / 60:.0f}-minute budget: {wall / budget:.2f}"
        )
    return lines


if __name__ == "__main__":
    main()
