"""bench/vqa_frozen_probe.py on the smoke study's results: it runs and prints every figure."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench" / "vqa_frozen_probe.py"


@pytest.mark.slow
def test_vqa_frozen_probe_prints_each_settings_figures(smoke_run):
    args = ["--results", str(smoke_run["dir"] / "results" / "smoke"), "--config", str(REPO / "experiments/smoke.yaml")]
    args += ["--settings", "no_pretrain", "full", "--steps", "20"]
    result = subprocess.run(
        [sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=300, env=smoke_run["env"]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    figure = r"\d+\.\d \(pairs +\d+\.\d; number \d+\.\d, other \d+\.\d, yes/no \d+\.\d\)"
    assert re.search(rf"^no_pretrain +linear probe +{figure}$", out, re.M), out
    assert re.search(rf"^full +linear probe +{figure}$", out, re.M), out
    assert out.count("images shuffled") == 2
    # Only a pre-trained checkpoint has an MLM head to read zero-shot.
    assert out.count("zero-shot MLM") == 1 and re.search(r"\(\d+ of \d+ answers are words\)", out)
