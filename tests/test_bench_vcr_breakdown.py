"""bench/vcr_breakdown.py on a hand-made results folder: each group's accuracy is its own questions'."""

import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench" / "vcr_breakdown.py"


def _question(annot_id: str, objects: int, kind: str) -> dict:
    return {"annot_id": annot_id, "objects": ["person"] * objects, "question_type": kind, "answer_label": 0}


def test_a_setting_right_on_one_object_images_only_scores_100_there_and_0_elsewhere(tmp_path):
    questions = [
        _question("a", 1, "feel"),
        _question("b", 1, "corners"),
        _question("c", 2, "feel"),
        _question("d", 4, "feel"),
    ]
    (tmp_path / "data" / "vcr").mkdir(parents=True)
    (tmp_path / "data" / "vcr" / "test.jsonl").write_text("".join(json.dumps(q) + "\n" for q in questions))
    right, wrong = [0.7, 0.1, 0.1, 0.1], [0.1, 0.7, 0.1, 0.1]
    for seed in (0, 1):
        run = tmp_path / "finetune" / "vilbert" / "vcr_q2a" / f"seed{seed}"
        run.mkdir(parents=True)
        predictions = [
            {"annot_id": q["annot_id"], "answer_probs": right if len(q["objects"]) == 1 else wrong} for q in questions
        ]
        (run / "predictions_test.json").write_text(json.dumps(predictions))
    result = subprocess.run(
        [sys.executable, str(BENCH), "--results", str(tmp_path), "--settings", "vilbert"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()

    def score(group: str) -> str:
        return lines[next(i for i, line in enumerate(lines) if line.startswith(group)) + 1].split()[1]

    assert score("all (4 questions, 100%)") == "50.0"
    assert score("1 object (2 questions, 50%)") == "100.0"
    assert score("2 objects (1 questions, 25%)") == "0.0"
    assert score("3+ objects (1 questions, 25%)") == "0.0"
    assert score("kind feel (3 questions, 75%)") == "33.3"


def test_on_the_synthetic_world_each_group_has_its_no_link_ceiling(smoke_world, tmp_path):
    # Drawn again from the data's spec: one-object images leave no doubt (100), and a setting
    # that is always right scores 100 beside a ceiling under it where several objects are in view.
    questions = [json.loads(line) for line in (smoke_world / "vcr" / "test.jsonl").read_text().splitlines()]
    run = tmp_path / "finetune" / "full" / "vcr_q2a" / "seed0"
    run.mkdir(parents=True)
    predictions = [
        {"annot_id": q["annot_id"], "answer_probs": [float(k == q["answer_label"]) for k in range(4)]}
        for q in questions
    ]
    (run / "predictions_test.json").write_text(json.dumps(predictions))
    result = subprocess.run(
        [sys.executable, str(BENCH), "--results", str(tmp_path), "--data", str(smoke_world), "--settings", "full"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()

    def scores(group: str) -> dict[str, float]:
        at = next(i for i, line in enumerate(lines) if line.startswith(group))
        rows = [re.match(r"^\s+(.+?)\s+(\d+\.\d)", line) for line in lines[at + 1 : at + 3]]
        return {row[1]: float(row[2]) for row in rows}

    everything = scores("all")
    assert everything["full"] == 100.0 and 25.0 < everything["no-link ceiling"] < 100.0
    assert scores("1 object")["no-link ceiling"] == 100.0
