"""Benchmark: each target's wall time, its job seconds and the floor on the cores, per stage.

The study has two targets (README, "Set-up"): `make reproduce`, the paper's ablation (VL-BERT's
settings: Table 4, its controls, the data fractions, the report), and `make reproduce-systems`,
which adds ViLBERT's and Pixel-BERT's rows on the same upstream. Either runs them (Snakemake, as
`make` does) one after the other in a fresh folder and times each, or reads a finished run's
folder. Per stage it prints the jobs, their summed and longest wall seconds (from the
`benchmark:` files every rule writes under results/<preset>/benchmarks/), split by target: a job
belongs to `reproduce-systems` when it trains or tunes a setting of another family than
VL-BERT's. Then per target its wall time (from Snakemake's logs: the runs that ran its jobs), its
summed job seconds over the cores (the least wall time any order of the same jobs could take, one
thread a job as the default profile runs them, so whether a budget is missed by the schedule or by
the work) and the ratio to its budget (mini: 90 minutes for `reproduce`, 75 more for
`reproduce-systems`, on 2 cores; smoke: 5 and 5).

    python bench/study_time.py --preset smoke                     # run both targets in a temp folder
    python bench/study_time.py --preset mini --target reproduce   # run the ablation alone
    python bench/study_time.py --preset mini --workdir <folder>   # a finished run
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
TARGETS = ("reproduce", "reproduce-systems")
# Minutes on 2 cores: issue bars, not measurements (the README states the measured times).
BUDGET_MINUTES = {
    "smoke": {"reproduce": 5, "reproduce-systems": 5},
    "mini": {"reproduce": 90, "reproduce-systems": 75},
}
STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ [\d:]+ \d{4})\]$", re.M)
WILDCARD_SETTING = re.compile(r"^\s*wildcards:.*\bsetting=([\w]+)", re.M)
# What each target passes to Snakemake beside the profile and the preset (the Makefile's).
TARGET_CONFIG = {"reproduce": ["--config", "systems=[vlbert]"], "reproduce-systems": []}


def systems_settings() -> frozenset[str]:
    """The settings of the model families other than VL-BERT's: the jobs `reproduce-systems` adds."""
    from vlbert.registry import SETTINGS

    return frozenset(name for name, s in SETTINGS.items() if s.family != "vlbert")


def job_target(job: str) -> str:
    """The target a job belongs to, from its benchmark file's stem (`<setting>`, `<setting>_seed1`,
    `<setting>_0.1`, or a data set's name for the upstream's jobs)."""
    head = job.split("_seed")[0]
    named = {head, head.rsplit("_", 1)[0]}
    return "reproduce-systems" if named & systems_settings() else "reproduce"


def run_study(preset: str, workdir: Path, cores: int, target: str) -> float:
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
            *TARGET_CONFIG[target],
        ],
        check=True,
        env={**os.environ, "PATH": f"{env_bin}:{os.environ['PATH']}"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.time() - started


def logged_wall_seconds(workdir: Path) -> dict[str, float]:
    """Per target, the first to last timestamp of each Snakemake log that ran jobs, summed over its
    logs; a log belongs to `reproduce-systems` when it ran a job of another family's setting."""
    walls = {}
    for log in sorted((workdir / ".snakemake" / "log").glob("*.snakemake.log")):
        text = log.read_text()
        stamps = [datetime.strptime(s, "%a %b %d %H:%M:%S %Y") for s in STAMP.findall(text)]
        if len(stamps) < 2:
            continue
        systems = any(job_target(name) != "reproduce" for name in WILDCARD_SETTING.findall(text))
        target = "reproduce-systems" if systems else "reproduce"
        walls[target] = walls.get(target, 0.0) + (stamps[-1] - stamps[0]).total_seconds()
    return walls


def stage_table(benchmarks: Path) -> pd.DataFrame:
    rows = []
    for tsv in sorted(benchmarks.rglob("*.tsv")):
        stage = tsv.parent.name if tsv.parent != benchmarks else tsv.stem
        rows.append(
            {
                "target": job_target(tsv.stem),
                "stage": stage,
                "job": tsv.stem,
                "seconds": float(pd.read_csv(tsv, sep="\t")["s"].iloc[-1]),
            }
        )
    if not rows:
        raise SystemExit(f"no benchmark files under {benchmarks}")
    table = (
        pd.DataFrame(rows)
        .groupby(["target", "stage"], sort=False)["seconds"]
        .agg(jobs="count", summed="sum", longest="max")
    )
    return table.round(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="smoke", choices=sorted(BUDGET_MINUTES))
    parser.add_argument(
        "--workdir", type=Path, help="a finished run's folder (default: run the targets in a temp folder)"
    )
    parser.add_argument(
        "--target", choices=[*TARGETS, "both"], default="both", help="which targets to run (default: both, in order)"
    )
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--budget", type=float, help="minutes, for each target (default: the preset's)")
    args = parser.parse_args()
    targets = TARGETS if args.target == "both" else (args.target,)
    if args.workdir:
        workdir, walls = args.workdir, logged_wall_seconds(args.workdir)
    else:
        workdir = Path(tempfile.mkdtemp(prefix=f"study_{args.preset}_"))
        walls = {target: run_study(args.preset, workdir, args.cores, target) for target in targets}
        print(f"ran in {workdir}")
    table = stage_table(workdir / Layout(args.preset).benchmarks)
    print(table.to_string())
    for target in TARGETS:
        if target not in table.index.get_level_values("target"):
            continue
        budget = (args.budget or BUDGET_MINUTES[args.preset][target]) * 60
        print("\n" + "\n".join(summary(target, table.loc[target], walls.get(target), args.cores, budget)))


def summary(target: str, table: pd.DataFrame, wall: float | None, cores: int, budget: float) -> list[str]:
    """A target's wall time against its budget, and the least any order of its jobs could take."""
    summed = float(table["summed"].sum())
    floor = summed / cores
    lines = [
        f"{target}: summed job seconds {summed:,.0f}: at least {floor / 60:.1f} min on {cores} cores in any order "
        f"({floor / budget:.2f} of its {budget / 60:.0f}-minute budget)"
    ]
    if wall is not None:
        lines.append(
            f"{target}: {wall / 60:.1f} min wall on {cores} cores; ratio to its {budget / 60:.0f}-minute budget: "
            f"{wall / budget:.2f}"
        )
    return lines


if __name__ == "__main__":
    main()
