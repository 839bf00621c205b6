"""bench/study_time.py on a finished run's folder: stages from the rules' benchmark files split by
target, each target's wall time from Snakemake's logs, and the least wall time any order of its
jobs could take."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench" / "study_time.py"
HEADER = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"


def _benchmark(path: Path, seconds: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(HEADER + f"{seconds}\t0:00:00\t1\t1\t1\t1\t0\t0\t90\t{seconds}\n")


def _log(folder: Path, name: str, start: str, end: str, settings: list[str]) -> None:
    jobs = "".join(f"rule sweep:\n    wildcards: setting={s}\n" for s in settings)
    (folder / f"{name}.snakemake.log").write_text(f"[{start}]\n{jobs}[{end}]\nFinished job 1.\n")


def test_each_target_against_its_budget_and_its_floor(tmp_path):
    benchmarks = tmp_path / "results" / "mini" / "benchmarks"
    _benchmark(benchmarks / "train_detector.tsv", 600)
    _benchmark(benchmarks / "sweep" / "a.tsv", 1500)
    _benchmark(benchmarks / "sweep" / "no_pretrain.tsv", 900)
    _benchmark(benchmarks / "finetune_fractions" / "full_0.1.tsv", 300)
    # The other systems' jobs: their settings name them, whatever the stage.
    _benchmark(benchmarks / "sweep" / "pixelbert_no_pretrain.tsv", 2000)
    _benchmark(benchmarks / "pretrain" / "vilbert_seed1.tsv", 1000)
    logs = tmp_path / ".snakemake" / "log"
    logs.mkdir(parents=True)
    _log(logs, "2026-01-01T100000", "Thu Jan  1 10:00:00 2026", "Thu Jan  1 10:30:00 2026", ["a", "no_pretrain"])
    _log(logs, "2026-01-01T110000", "Thu Jan  1 11:00:00 2026", "Thu Jan  1 11:20:00 2026", ["vilbert"])
    result = subprocess.run(
        [sys.executable, str(BENCH), "--preset", "mini", "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    sweep = next(line for line in lines if line.split()[:2] == ["reproduce", "sweep"])
    assert sweep.split()[2:] == ["2", "2400.0", "1500.0"]  # jobs, summed, longest
    # 3,300 job seconds on 2 cores: 27.5 minutes whatever the order; the first log's 30 minutes of wall
    floor = (
        "reproduce: summed job seconds 3,300: at least 27.5 min on 2 cores in any order (0.31 of its 90-minute budget)"
    )
    assert floor in lines
    assert "reproduce: 30.0 min wall on 2 cores; ratio to its 90-minute budget: 0.33" in lines
    systems = (
        "reproduce-systems: summed job seconds 3,000: at least 25.0 min on 2 cores in any order "
        "(0.33 of its 75-minute budget)"
    )
    assert systems in lines
    assert "reproduce-systems: 20.0 min wall on 2 cores; ratio to its 75-minute budget: 0.27" in lines
