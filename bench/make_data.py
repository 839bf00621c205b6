"""Benchmark: time `make-data` for the smoke and mini presets against their budgets.

Budgets (issue: foundation): smoke data in at most 30 s, mini in at most 3 min, on this 2-core
machine. Prints seconds, files, megabytes and the time / budget ratio (<= 1.00 meets it).

    python bench/make_data.py [--presets smoke mini]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from vlbert.config import load_config, synthetic_spec
from vlbert.data.synthetic import make_world

BUDGET_S = {"smoke": 30.0, "mini": 180.0}
REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=list(BUDGET_S))
    args = parser.parse_args()
    print(f"{'preset':8} {'seconds':>8} {'budget':>7} {'ratio':>6} {'files':>7} {'MB':>7}")
    for preset in args.presets:
        spec = synthetic_spec(load_config(REPO / "experiments" / f"{preset}.yaml"))
        with tempfile.TemporaryDirectory() as out:
            start = time.perf_counter()
            make_world(spec, out, progress=False)
            seconds = time.perf_counter() - start
            files = [p for p in Path(out).rglob("*") if p.is_file()]
            megabytes = sum(p.stat().st_size for p in files) / 1e6
        budget = BUDGET_S.get(preset, float("nan"))
        print(f"{preset:8} {seconds:8.1f} {budget:7.0f} {seconds / budget:6.2f} {len(files):7d} {megabytes:7.1f}")


if __name__ == "__main__":
    main()
