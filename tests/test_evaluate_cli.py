"""`vlbert evaluate` on the hand-written fixtures gives the official figures."""

import json
import subprocess
import sys

import pytest
from conftest import FIXTURES

from vlbert.cli import main


def test_evaluate_vqa(tmp_path, capsys):
    root = FIXTURES / "vqa"
    out = tmp_path / "vqa.json"
    assert (
        main(
            [
                "evaluate",
                "vqa",
                "--questions",
                str(root / "v2_OpenEnded_mscoco_val2014_questions.json"),
                "--annotations",
                str(root / "v2_mscoco_val2014_annotations.json"),
                "--predictions",
                str(root / "predictions.json"),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    # The current official script gives the same (run outside the repository): "Maroon" against
    # red x7, maroon x2, orange -> 0.6; "two" against disagreeing humans (2 and 3 and 1) -> "2" -> 1.0;
    # "yes!" against ten "yes" -> not normalised -> 0 (the 2016 logic made it 1.0, and 86.67 overall).
    assert "VQA accuracy: 53.33" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["perAnswerType"] == {"number": 100.0, "other": 60.0, "yes/no": 0.0}
    assert result["perQuestionType"] == {"how many": 100.0, "is the man": 0.0, "what color is the": 60.0}


def _vqa_arguments(predictions):
    root = FIXTURES / "vqa"
    return [
        "evaluate",
        "vqa",
        "--questions",
        str(root / "v2_OpenEnded_mscoco_val2014_questions.json"),
        "--annotations",
        str(root / "v2_mscoco_val2014_annotations.json"),
        "--predictions",
        str(predictions),
    ]


@pytest.mark.parametrize(
    "question_ids, error",
    [
        ([420, 421], "pred.json: no prediction for 1 of the 3 question_ids (730): predictions must cover exactly"),
        ([420, 421, 730, 999, 1000], "pred.json: predictions for 2 question_ids that are not annotated (999, 1000): "),
        (
            [420, 5, 6, 7, 8, 9, 10],
            "pred.json: no prediction for 2 of the 3 question_ids (421, 730); "
            "predictions for 6 question_ids that are not annotated (5, 6, 7, 8, 9, ...): "
            "predictions must cover exactly the annotated question_ids",
        ),
    ],
)
def test_vqa_predictions_for_other_questions_are_refused(tmp_path, capsys, question_ids, error):
    """As the official loadRes: results must answer exactly the annotated questions."""
    path = tmp_path / "pred.json"
    path.write_text(json.dumps([{"question_id": q, "answer": "red"} for q in question_ids]))
    assert main(_vqa_arguments(path)) == 2
    err = capsys.readouterr().err
    assert error in err and len(err.strip().splitlines()) == 1


def test_evaluate_vcr(capsys):
    assert (
        main(
            [
                "evaluate",
                "vcr",
                "--annotations",
                str(FIXTURES / "vcr/val.jsonl"),
                "--predictions",
                str(FIXTURES / "vcr/predictions.json"),
            ]
        )
        == 0
    )
    # val-0: answer right, rationale wrong; val-1 (scores): both right.
    assert "q2a: 100.00  qa2r: 50.00  q2ar: 50.00" in capsys.readouterr().out


def test_evaluate_vcr_q2ar_from_a_pair_of_runs(tmp_path, capsys):
    both = json.loads((FIXTURES / "vcr/predictions.json").read_text())
    q2a = [{"annot_id": p["annot_id"], **{k: v for k, v in p.items() if k.startswith("answer")}} for p in both]
    qa2r = [{"annot_id": p["annot_id"], **{k: v for k, v in p.items() if k.startswith("rationale")}} for p in both]
    (tmp_path / "q2a.json").write_text(json.dumps(q2a))
    (tmp_path / "qa2r.json").write_text(json.dumps(qa2r))
    assert (
        main(
            [
                "evaluate",
                "vcr",
                "--annotations",
                str(FIXTURES / "vcr/val.jsonl"),
                "--predictions",
                str(tmp_path / "q2a.json"),
                str(tmp_path / "qa2r.json"),
            ]
        )
        == 0
    )
    assert "q2a: 100.00  qa2r: 50.00  q2ar: 50.00" in capsys.readouterr().out


@pytest.mark.parametrize(
    "records, error",
    [
        # 50 of 200 used to be scored as if they were all, n_questions 200.
        (
            [{"annot_id": "val-0", "answer": 0, "rationale": 1}],
            "q2a.json: no prediction for 1 of the 2 annot_ids ('val-1'): predictions must cover exactly",
        ),
        (
            [{"annot_id": a, "answer": 0} for a in ("val-0", "val-1", "val-7")],
            "q2a.json: predictions for 1 annot_ids that are not annotated ('val-7')",
        ),
        (
            [{"annot_id": "val-0", "answer": 0, "rationale": 1}, {"annot_id": "val-1", "answer": 2}],
            "q2a.json: rationale: given for 1 of the 2 questions, not for annot_id 'val-1' and 0 more",
        ),
        # A null or a string choice used to be a TypeError (or ValueError) from int().
        (
            [{"annot_id": "val-0", "answer": None}, {"annot_id": "val-1", "answer": 2}],
            "q2a.json: annot_id 'val-0': answer is null, not a choice 0..3",
        ),
        (
            [{"annot_id": "val-0", "answer": 0}, {"annot_id": "val-1", "answer": "two"}],
            "q2a.json: annot_id 'val-1': answer is \"two\", not a choice 0..3",
        ),
        (
            [{"annot_id": "val-0", "answer_probs": [0.5, 0.5]}, {"annot_id": "val-1", "answer": 2}],
            "q2a.json: annot_id 'val-0': answer_probs is [0.5, 0.5], not 4 numbers",
        ),
    ],
)
def test_vcr_predictions_for_other_questions_are_refused(tmp_path, capsys, records, error):
    path = tmp_path / "q2a.json"
    path.write_text(json.dumps(records))
    assert main(["evaluate", "vcr", "--annotations", str(FIXTURES / "vcr/val.jsonl"), "--predictions", str(path)]) == 2
    err = capsys.readouterr().err
    assert error in err and len(err.strip().splitlines()) == 1


def test_each_file_of_a_pair_must_cover_the_split(tmp_path, capsys):
    # Together they would cover both questions; each file alone does not.
    (tmp_path / "q2a.json").write_text(
        json.dumps([{"annot_id": "val-0", "answer": 0}, {"annot_id": "val-1", "answer": 2}])
    )
    (tmp_path / "qa2r.json").write_text(json.dumps([{"annot_id": "val-1", "rationale": 0}]))
    assert (
        main(
            [
                "evaluate",
                "vcr",
                "--annotations",
                str(FIXTURES / "vcr/val.jsonl"),
                "--predictions",
                str(tmp_path / "q2a.json"),
                str(tmp_path / "qa2r.json"),
            ]
        )
        == 2
    )
    assert "qa2r.json: no prediction for 1 of the 2 annot_ids ('val-0')" in capsys.readouterr().err


def test_a_leaderboard_csv_is_scored_as_the_leaderboard_scores_it(tmp_path, capsys):
    """Q->A: the argmax of the answer scores; QA->R: the argmax of the rationale scores after the
    right answer (val-0's is answer 0, val-1's answer 2: see the fixture's labels)."""
    from vlbert.evaluation.vcr_eval import LEADERBOARD_COLUMNS, write_leaderboard_csv

    after_wrong = [0.0, 0.0, 0.0, 1.0]  # a rationale no label picks, after every wrong answer
    answers = {"val-0": [0.7, 0.1, 0.1, 0.1], "val-1": [0.1, 0.6, 0.2, 0.1]}  # val-1's answer is wrong
    rationales = {
        "val-0": [[0.1, 0.1, 0.8, 0.0]] + [after_wrong] * 3,  # after the right answer: 2
        "val-1": [after_wrong] * 2 + [[0.9, 0.1, 0.0, 0.0]] + [after_wrong],
    }
    path = write_leaderboard_csv(tmp_path / "submission.csv", ["val-0", "val-1"], answers, rationales)
    lines = path.read_text().splitlines()
    assert lines[0].split(",") == LEADERBOARD_COLUMNS
    assert lines[0].startswith("annot_id,answer_0,answer_1,answer_2,answer_3,rationale_conditioned_on_a0_0,")
    assert lines[0].endswith(",rationale_conditioned_on_a3_2,rationale_conditioned_on_a3_3")
    assert lines[1] == "val-0,0.7,0.1,0.1,0.1,0.1,0.1,0.8,0.0" + ",0.0,0.0,0.0,1.0" * 3
    # val-0: answer 0 right, the rationale after it (2) wrong; val-1: answer 1 wrong, the rationale
    # after its right answer 2 (0) right. Q->AR: neither.
    labels = [json.loads(line) for line in (FIXTURES / "vcr/val.jsonl").read_text().splitlines() if line]
    assert [(r["answer_label"], r["rationale_label"]) for r in labels] == [(0, 0), (2, 0)]
    assert main(["evaluate", "vcr", "--annotations", str(FIXTURES / "vcr/val.jsonl"), "--predictions", str(path)]) == 0
    assert "q2a: 50.00  qa2r: 50.00  q2ar: 0.00" in capsys.readouterr().out


def test_evaluate_refcoco(refcoco_fixture, tmp_path, capsys):
    predictions = [
        {"sent_id": 0, "bbox": [103.93, 299.99, 134.22, 128.0]},  # exact: IoU 1
        {"sent_id": 1, "bbox": [103.93, 299.99, 134.22, 64.0]},  # half the box: IoU 0.5, counts
        {"sent_id": 2, "bbox": [300.0, 100.0, 100.0, 90.0]},  # IoU 0.45: wrong
        {"sent_id": 3, "bbox": [25.0, 0.0, 50.0, 50.0]},  # IoU 1/3: wrong
    ]
    path = tmp_path / "pred.json"
    path.write_text(json.dumps(predictions))
    assert main(["evaluate", "refcoco", "--root", str(refcoco_fixture), "--predictions", str(path)]) == 0
    assert "testA: 66.67  testB: 0.00" in capsys.readouterr().out


@pytest.mark.parametrize(
    "convention, printed",
    [
        (None, "RefCOCO+ accuracy (IoU >= 0.5, continuous): testA: 33.33"),
        ("continuous", "RefCOCO+ accuracy (IoU >= 0.5, continuous): testA: 33.33"),
        ("plus-one", "RefCOCO+ accuracy (IoU >= 0.5, plus-one): testA: 66.67"),
    ],
)
def test_refcoco_iou_convention(refcoco_fixture, tmp_path, capsys, convention, printed):
    # Sent 0's box (h 128) shifted down by 42.8: continuous IoU (128 - 42.8) / (128 + 42.8) = 0.4988,
    # a miss; counting one pixel more a side (VL-BERT's code), (129 - 42.8) / (129 + 42.8) = 0.5017, a hit.
    path = tmp_path / "pred.json"
    path.write_text(
        json.dumps(
            [
                {"sent_id": 0, "bbox": [103.93, 299.99 + 42.8, 134.22, 128.0]},
                {"sent_id": 1, "bbox": [103.93, 299.99, 134.22, 64.0]},  # 0.5 and 0.504: hits
                {"sent_id": 2, "bbox": [300.0, 100.0, 100.0, 90.0]},
            ]
        )
    )  # 0.45 and 0.453: misses
    assert (
        main(
            [
                "evaluate",
                "refcoco",
                "--root",
                str(refcoco_fixture),
                "--predictions",
                str(path),
                *(["--iou-convention", convention] if convention else []),
            ]
        )
        == 0
    )
    assert printed in capsys.readouterr().out


def test_refcoco_predictions_for_part_of_a_split_are_refused(refcoco_fixture, tmp_path, capsys):
    path = tmp_path / "pred.json"
    path.write_text(json.dumps([{"sent_id": s, "bbox": [0, 0, 1, 1]} for s in (0, 2, 3, 17)]))
    assert main(["evaluate", "refcoco", "--root", str(refcoco_fixture), "--predictions", str(path)]) == 2
    assert (
        "pred.json: no prediction for 1 of the 4 sent_ids (1); predictions for 1 sent_ids that are not annotated "
        "(17): predictions must cover exactly the annotated sent_ids"
    ) in capsys.readouterr().err


def test_box_iou_conventions():
    from vlbert.evaluation.refcoco_eval import box_iou

    for convention in ("continuous", "plus-one"):
        assert box_iou([5, 5, 10, 20], [5, 5, 10, 20], convention) == pytest.approx(1.0)
    # Boxes that touch: no overlap, or a one-pixel-wide column of 11 pixels out of 2 x 121 - 11.
    assert box_iou([0, 0, 10, 10], [10, 0, 10, 10]) == 0.0
    assert box_iou([0, 0, 10, 10], [10, 0, 10, 10], "plus-one") == pytest.approx(11 / 231)
    assert box_iou([0, 0, 10, 10], [30, 30, 5, 5], "plus-one") == 0.0
    assert box_iou([0, 0, 10, 10], [5, 0, 10, 10]) == pytest.approx(50 / 150)
    assert box_iou([0, 0, 10, 10], [5, 0, 10, 10], "plus-one") == pytest.approx(66 / 176)
    with pytest.raises(ValueError, match="unknown IoU convention 'vlbert'"):
        box_iou([0, 0, 1, 1], [0, 0, 1, 1], "vlbert")


def test_bad_predictions_name_the_key(tmp_path, capsys):
    path = tmp_path / "pred.json"
    path.write_text(json.dumps([{"question_id": 420, "answer": "red"}, {"question_id": 421}]))
    root = FIXTURES / "vqa"
    assert (
        main(
            [
                "evaluate",
                "vqa",
                "--questions",
                str(root / "v2_OpenEnded_mscoco_val2014_questions.json"),
                "--annotations",
                str(root / "v2_mscoco_val2014_annotations.json"),
                "--predictions",
                str(path),
            ]
        )
        == 2
    )
    assert "pred.json [[1].answer]: missing key 'answer'" in capsys.readouterr().err


@pytest.mark.parametrize("answer, shown", [(None, "null"), (3, "3"), (["red"], '["red"]')])
def test_a_vqa_answer_that_is_not_a_string_is_one_line(answer, shown, tmp_path, capsys):
    # Seen: an AttributeError in `_strip`, exit 1, for a null or a number.
    path = tmp_path / "pred.json"
    records = [{"question_id": 420, "answer": "red"}, {"question_id": 421, "answer": answer}]
    path.write_text(json.dumps(records + [{"question_id": 730, "answer": "yes"}]))
    root = FIXTURES / "vqa"
    args = ["--questions", str(root / "v2_OpenEnded_mscoco_val2014_questions.json")]
    args += ["--annotations", str(root / "v2_mscoco_val2014_annotations.json"), "--predictions", str(path)]
    assert main(["evaluate", "vqa", *args]) == 2
    err = capsys.readouterr().err
    assert err == f"vlbert evaluate: error: {path} [[1].answer]: the answer is {shown}, not a string\n"


@pytest.mark.parametrize("box, shown", [(None, "null"), ([0, 0, 1], "[0, 0, 1]"), ("0 0 1 1", '"0 0 1 1"')])
def test_a_refcoco_box_that_is_not_four_numbers_is_one_line(box, shown, refcoco_fixture, tmp_path, capsys):
    path = tmp_path / "pred.json"
    path.write_text(json.dumps([{"sent_id": s, "bbox": [0, 0, 1, 1] if s else box} for s in range(4)]))
    assert main(["evaluate", "refcoco", "--root", str(refcoco_fixture), "--predictions", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"vlbert evaluate: error: {path} [[0].bbox]: the bbox is {shown}, not [x, y, w, h] numbers\n"


def test_make_data_cli_on_a_bad_preset(tmp_path, capsys):
    preset = tmp_path / "p.yaml"
    preset.write_text("name: x\nseed: 0\ndata: {source: synthetic, synthetik: {}}\n")
    assert main(["make-data", "--config", str(preset)]) == 2
    assert "p.yaml: data.synthetik: unknown key" in capsys.readouterr().err


@pytest.mark.parametrize(
    "verb",
    [
        [],
        ["make-data"],
        ["evaluate"],
        ["evaluate", "vqa"],
        ["evaluate", "vcr"],
        ["evaluate", "refcoco"],
        ["vcr-leaderboard"],
    ],
)
def test_every_verb_has_help(verb):
    result = subprocess.run([sys.executable, "-m", "vlbert.cli", *verb, "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "usage: vlbert" in result.stdout


def _nine_answers(tmp_path):
    data = json.loads((FIXTURES / "vqa/v2_mscoco_val2014_annotations.json").read_text())
    data["annotations"][2]["answers"].pop()
    (tmp_path / "ann.json").write_text(json.dumps(data))
    root = FIXTURES / "vqa"
    return [
        "vqa",
        "--questions",
        str(root / "v2_OpenEnded_mscoco_val2014_questions.json"),
        "--annotations",
        str(tmp_path / "ann.json"),
        "--predictions",
        str(root / "predictions.json"),
    ]


def _latin1_vcr(tmp_path):
    lines = (FIXTURES / "vcr/val.jsonl").read_bytes().split(b"\n")
    (tmp_path / "val.jsonl").write_bytes(lines[0] + b"\n" + lines[1].replace(b"smiling", b"sm\xefling") + b"\n")
    return [
        "vcr",
        "--annotations",
        str(tmp_path / "val.jsonl"),
        "--predictions",
        str(FIXTURES / "vcr/predictions.json"),
    ]


def _empty_refs(tmp_path):
    (tmp_path / "instances.json").write_text((FIXTURES / "refcoco/instances.json").read_text())
    (tmp_path / "refs(unc).p").write_bytes(b"")
    return ["refcoco", "--root", str(tmp_path), "--predictions", str(FIXTURES / "vqa/predictions.json")]


@pytest.mark.parametrize(
    "arguments, error",
    [
        (_nine_answers, "ann.json [annotations[2].answers]: question_id 730 has 9 answers"),
        (_latin1_vcr, "val.jsonl:2: not UTF-8 text"),
        (_empty_refs, "refs(unc).p: not a readable pickle"),
    ],
)
def test_bad_input_is_one_line_naming_the_file(tmp_path, capsys, arguments, error):
    assert main(["evaluate", *arguments(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert error in err and len(err.strip().splitlines()) == 1


def test_a_predictions_file_that_answers_an_item_twice_is_refused_naming_it(refcoco_fixture, tmp_path, capsys):
    # Seen: a second VQA answer for one question_id (another answer) scored 97.22 and exited 0; a
    # duplicated VCR annot_id alike.
    vqa = tmp_path / "vqa.json"
    vqa.write_text(
        json.dumps(
            [{"question_id": q, "answer": "red"} for q in (420, 421, 730)] + [{"question_id": 421, "answer": "two"}]
        )
    )
    vcr = json.loads((FIXTURES / "vcr/predictions.json").read_text())
    (tmp_path / "vcr.json").write_text(json.dumps([*vcr, vcr[0]]))
    refcoco = tmp_path / "refcoco.json"
    refcoco.write_text(json.dumps([{"sent_id": s, "bbox": [0, 0, 1, 1]} for s in (0, 1, 2, 3, 3, 2)]))
    cases = [
        (_vqa_arguments(vqa), "vqa.json: 1 question_ids predicted more than once: 421 (records 1 and more)"),
        (
            [
                "evaluate",
                "vcr",
                "--annotations",
                str(FIXTURES / "vcr/val.jsonl"),
                "--predictions",
                str(tmp_path / "vcr.json"),
            ],
            f"vcr.json: 1 annot_ids predicted more than once: {vcr[0]['annot_id']!r}",
        ),
        (
            ["evaluate", "refcoco", "--root", str(refcoco_fixture), "--predictions", str(refcoco)],
            "refcoco.json: 2 sent_ids predicted more than once: 3 (records 3 and more), 2 (records 2 and more)",
        ),
    ]
    for arguments, error in cases:
        assert main(arguments) == 2
        err = capsys.readouterr().err
        assert error in err and len(err.strip().splitlines()) == 1
