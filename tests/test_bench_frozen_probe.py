"""bench/frozen_probe.py on the smoke study's results: it runs and prints every figure."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench" / "frozen_probe.py"


def run_bench(smoke_run, *args) -> str:
    results = smoke_run["dir"] / "results" / "smoke"
    command = [sys.executable, str(BENCH), "--results", str(results), "--config", str(REPO / "experiments/smoke.yaml")]
    result = subprocess.run([*command, *args], capture_output=True, text=True, timeout=300, env=smoke_run["env"])
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.slow
def test_frozen_probe_prints_each_settings_vqa_figures(smoke_run):
    out = run_bench(smoke_run, "--task", "vqa", "--settings", "no_pretrain", "full", "--steps", "20")
    figure = r"\d+\.\d \(pairs +\d+\.\d; number \d+\.\d, other \d+\.\d, yes/no \d+\.\d\)"
    assert re.search(rf"^no_pretrain +linear probe +{figure}$", out, re.M), out
    assert re.search(rf"^full +linear probe +{figure}$", out, re.M), out
    assert out.count("images shuffled") == 2
    # Only a pre-trained checkpoint has an MLM head to read zero-shot.
    assert out.count("zero-shot MLM") == 1 and re.search(r"\(\d+ of \d+ answers are words\)", out)


@pytest.mark.slow
def test_frozen_probe_prints_each_settings_vcr_figures(smoke_run):
    out = run_bench(smoke_run, "--task", "vcr_q2a", "--settings", "no_pretrain", "a", "--epochs", "1")
    line = r"head alone, +\d+ epochs: states as they are +\d+\.\d, standardised +\d+\.\d \(images shuffled +\d+\.\d\)"
    for name in ("no_pretrain", "a"):
        # The preset's run epochs and --epochs: two lines a setting (one when they are equal).
        assert 1 <= len(re.findall(rf"^{name} +{line}$", out, re.M)) <= 2, out
    assert len(re.findall(r"tag word reads its object: colour +\d+\.\d, shape +\d+\.\d \(n \d+\)", out)) == 2, out
