"""bench/study_time.py on a finished run's folder: stages from the rules' benchmark files, the wall
time from Snakemake's log, and the least wall time any order of the jobs could take."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench" / "study_time.py"
HEADER = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"


def _benchmark(path: Path, seconds: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(HEADER + f"{seconds}\t0:00:00\t1\t1\t1\t1\t0\t0\t90\t{seconds}\n")


def test_a_finished_run_against_its_budget_and_its_floor(tmp_path):
    benchmarks = tmp_path / "results" / "mini" / "benchmarks"
    _benchmark(benchmarks / "train_detector.tsv", 600)
    _benchmark(benchmarks / "sweep" / "a.tsv", 1500)
    _benchmark(benchmarks / "sweep" / "b.tsv", 900)
    log = tmp_path / ".snakemake" / "log" / "2026-01-01T000000.000000.snakemake.log"
    log.parent.mkdir(parents=True)
    log.write_text("[Thu Jan  1 10:00:00 2026]\nrule sweep:\n[Thu Jan  1 10:30:00 2026]\nFinished job 1.\n")
    result = subprocess.run(
        [sys.executable, str(BENCH), "--preset", "mini", "--workdir", str(tmp_path), "--budget", "45"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    sweep = next(line for line in lines if line.startswith("sweep"))
    assert sweep.split()[1:] == ["2", "2400.0", "1500.0"]  # jobs, summed, longest
    # 3,000 job seconds on 2 cores: 25 minutes whatever the order; the log's 30 minutes of wall
    floor = "summed job seconds 3,000: at least 25.0 min on 2 cores in any order (0.56 of the 45-minute budget)"
    assert floor in lines
    assert "mini study: 30.0 min wall on 2 cores; ratio to its 45-minute budget: 0.67" in lines
