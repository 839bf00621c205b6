"""bench/store_scale.py at a toy size: it runs, checks its own store and prints every figure."""

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "store_scale.py"


def test_store_scale_bench_prints_its_figures(tmp_path):
    args = ["--images", "60", "--images-per-shard", "25", "--no-drop-caches", "--quiet", "--workdir", str(tmp_path)]
    result = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "60 images in 3 shards of 25" in out
    assert "write:" in out and out.count("images/s") >= 3  # write, sequential and random reads
    assert "bytes per image on disk" in out and "class top-k" in out
    assert "sequential (store order)" in out and "random (seed 0)" in out
    assert "peak RSS" in out and "page cache not dropped" in out
    assert "read back equal what was written" in out
    assert "3,300,000 images" in out and "disk (TB)" in out and "one epoch, random read (h)" in out
    assert "64 GPUs" in out and "ASSUMED" in out
    assert list(tmp_path.iterdir()) == []  # the store is removed without --keep
