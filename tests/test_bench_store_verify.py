"""bench/store_verify.py at a toy size: it runs and prints every figure."""

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "store_verify.py"


def test_store_verify_bench_prints_its_figures(tmp_path):
    args = ["--images", "40", "--images-per-shard", "20", "--repeats", "1", "--quiet", "--workdir", str(tmp_path)]
    result = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "40 images in 2 shards of 20" in out
    assert "not verified:" in out and "verified:" in out and out.count("images/s") == 2
    assert "ms per image" in out and "s per GB" in out and "checksums of one shard at writing" in out
    assert list(tmp_path.iterdir()) == []  # the store is removed without --keep
