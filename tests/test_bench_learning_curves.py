"""bench/learning_curves.py on a made-up results folder: each run's take-off epoch against its task's
blind floor, and the share of a setting's seed spread the take-off explains."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "learning_curves.py"

FLOORS = {
    "vcr_q2a": {"val": {"n": 400, "option_only": 23.0, "text_only": 25.0}},
    "vcr_qa2r": {"val": {"n": 400, "option_only": 28.0, "text_only": 25.0}},
    "vqa": {"val": {"n": 500, "n_pairs": 250, "question_only": 36.0, "question_only_pairs": 0.0}},
    "refcoco_det": {"val": {"n": 528, "n_rare": 142, "no_colour_rule": 34.0, "no_colour_rule_rare": 31.0}},
}


def write_run(results: Path, setting: str, seed: int, curve: list[float], test: float) -> None:
    folder = results / "finetune" / setting / "vcr_q2a" / f"seed{seed}"
    folder.mkdir(parents=True)
    best = max(range(len(curve)), key=curve.__getitem__) + 1
    metrics = {"val_history": [{"accuracy": v} for v in curve], "best_epoch": best, "test": {"accuracy": test}}
    (folder / "metrics.json").write_text(json.dumps(metrics))


@pytest.fixture
def results(tmp_path):
    (tmp_path / "floors.json").write_text(json.dumps(FLOORS))
    # Within each setting the later a run takes off (clears 25 + 10 on val), the lower its test score.
    write_run(tmp_path, "full", 0, [40, 60, 70, 80], 80.0)
    write_run(tmp_path, "full", 1, [25, 30, 50, 60], 60.0)
    write_run(tmp_path, "full", 2, [26, 36, 55, 70], 70.0)
    write_run(tmp_path, "no_pretrain", 0, [30, 66, 60, 65], 65.0)  # best at epoch 2 of 4
    write_run(tmp_path, "no_pretrain", 1, [25, 26, 27, 28], 27.0)  # never takes off: epochs + 1
    write_run(tmp_path, "no_pretrain", 2, [36, 50, 60, 66], 66.0)
    write_run(tmp_path, "a", 0, [50, 60, 70, 80], 80.0)  # a setting left out by --settings
    return tmp_path


def test_take_off_epochs_and_the_share_of_the_spread_they_explain(results):
    sys.path.insert(0, str(BENCH.parent))
    try:
        import learning_curves
    finally:
        sys.path.pop(0)
    assert learning_curves.val_floor(FLOORS, "vqa") == 36.0  # not the pairs' floor, not a count
    assert learning_curves.val_floor(FLOORS, "refcoco_det") == 34.0
    table = learning_curves.runs(results, margin=10.0, settings=["full", "no_pretrain"])
    assert dict(zip(zip(table["setting"], table["seed"]), table["takes_off"])) == {
        ("full", 0): 1,
        ("full", 1): 3,
        ("full", 2): 2,
        ("no_pretrain", 0): 2,
        ("no_pretrain", 1): 5,
        ("no_pretrain", 2): 1,
    }
    share = learning_curves.explained(table)
    assert 0.8 < share <= 1.0
    out = subprocess.run(
        [sys.executable, str(BENCH), str(results), "--settings", "full", "no_pretrain"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert f"the take-off epoch explains {share:.0%}" in out
    assert "5 of 6 runs' best epoch among their last two" in out
    assert not re.search(r"^\s+a\s+seed", out, re.M)  # left out by --settings
