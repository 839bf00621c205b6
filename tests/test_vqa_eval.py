"""Worked examples of the official VQA accuracy (the current script, GT-Vision-Lab/VQA a013f00)."""

import pytest

from vlbert.data.errors import DataFormatError
from vlbert.evaluation.vqa_eval import normalize_answer, process_punctuation, question_accuracy, vqa_accuracy


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("Two", "2"),  # number words to digits, lower case
        ("the red one", "red 1"),  # articles dropped
        ("an apple", "apple"),
        ("yes!", "yes"),  # glued punctuation becomes a space, then collapses
        ("dont", "don't"),  # contractions restored
        ("isnt it", "isn't it"),
        ("3.5", "3.5"),  # a decimal point stays
        ("end.", "end"),  # a full stop goes
        ("1,000", "1000"),  # a comma between digits goes
        ("  black\tand\nwhite ", "black and white"),
        ("t-shirt", "t shirt"),  # '-' between letters becomes a space
        ("yes , sir", "yes sir"),  # spaced punctuation is removed outright
    ],
)
def test_normalisation(raw, expected):
    assert normalize_answer(raw) == expected


def test_punctuation_rule_depends_on_spacing():
    assert process_punctuation("a/b") == "a b"
    assert process_punctuation("a / b") == "a  b"


def test_leave_one_out_average():
    humans = ["red"] * 7 + ["maroon"] * 2 + ["orange"]
    # Leaving out a red (7 of 10 subsets) leaves 2 maroons: 2/3; a maroon (2): 1/3; the orange: 2/3.
    assert question_accuracy("maroon", humans) == pytest.approx((7 * 2 / 3 + 2 * 1 / 3 + 2 / 3) / 10)
    assert question_accuracy("red", humans) == 1.0  # always >= 3 other reds
    assert question_accuracy("orange", humans) == pytest.approx(9 * (1 / 3) / 10)
    assert question_accuracy("blue", humans) == 0.0


def test_exactly_three_matches_is_not_full_credit():
    humans = ["2"] * 3 + ["3"] * 7
    # Leaving out one of the three "2"s leaves two: 2/3 in 3 subsets; 1 in the other 7.
    assert question_accuracy("2", humans) == pytest.approx((3 * 2 / 3 + 7) / 10)


# Worked cases, each checked against the official script (GT-Vision-Lab/VQA a013f00, run outside
# the repository): (prediction, the ten human answers, official accuracy in percent).
OFFICIAL_CASES = [
    # All ten agree: nothing is normalised, on either side (the 2016 script gave these 100).
    ("LARGE", ["large"] * 10, 0.0),
    ("a purple!", ["purple"] * 10, 0.0),
    ("yes!", ["yes"] * 10, 0.0),
    ("large", ["large"] * 10, 100.0),
    ("t-shirt", ["t-shirt"] * 10, 100.0),  # 2016: the prediction became "t shirt": 0
    # Newlines, tabs and surrounding spaces go always, and before the agreement is counted.
    (" large\n", ["large"] * 10, 100.0),
    ("Large", ["large"] * 9 + [" large "], 0.0),
    # They disagree: the prediction and every human answer are normalised alike.
    ("2", ["two"] * 7 + ["2"] + ["3"] * 2, 100.0),  # 2016: the humans' "two" stayed: 30
    ("yes", ["Yes"] * 8 + ["no"] * 2, 100.0),  # 2016: the humans' "Yes" stayed: 0
    ("don't", ["dont"] * 7 + ["don't"] + ["no"] * 2, 100.0),  # contractions, on the humans' side too
    ("the dog", ["dog"] * 5 + ["a dog"] * 5, 100.0),  # articles
    ("none", ["0"] * 9 + ["1"], 100.0),  # number words
    ("1,000", ["1,000"] * 6 + ["1000"] * 4, 100.0),  # a comma between digits
    ("T-Shirt", ["t-shirt"] * 9 + ["shirt"], 100.0),
    # The punctuation list has neither the apostrophe nor the colon.
    ("its red", ["it's red"] * 5 + ["red"] * 5, 0.0),
    ("10:30", ["10:30"] * 9 + ["1030"], 100.0),
    ("1030", ["10:30"] * 9 + ["1030"], 30.0),
]


@pytest.mark.parametrize("prediction, humans, official", OFFICIAL_CASES)
def test_official_worked_cases(prediction, humans, official):
    records = [{"answer": a, "answer_confidence": "yes", "answer_id": n + 1} for n, a in enumerate(humans)]
    assert round(100 * question_accuracy(prediction, records), 2) == official
    assert round(100 * question_accuracy(prediction, humans), 2) == official  # strings: one person each


def test_equal_answer_records_are_left_out_together():
    # The script leaves out every record equal to the one left out: records without an answer_id
    # that give the same answer are all left out at once (real records differ by answer_id).
    assert question_accuracy("red", [{"answer": "red"}] * 10) == 0.0
    assert question_accuracy("red", [{"answer": "red", "answer_id": n} for n in range(10)]) == 1.0


def _annotation(humans, answer_type, question_type):
    return {
        "answers": [{"answer": a, "answer_id": n + 1} for n, a in enumerate(humans)],
        "answer_type": answer_type,
        "question_type": question_type,
    }


def test_overall_and_per_type():
    annotations = {
        1: _annotation(["red"] * 10, "other", "what color"),
        2: _annotation(["2"] * 10, "number", "how many"),
        3: _annotation(["yes"] * 2 + ["no"] * 8, "yes/no", "is"),
        4: _annotation(["two"] * 9 + ["3"], "number", "how many"),
    }
    result = vqa_accuracy(annotations, {1: "red", 2: "three", 3: "Yes", 4: "2"})
    # q1: 1.0; q2: 0.0; q3: leaving out a yes (2 subsets) -> 1/3, leaving out a no (8) -> 2/3: 0.6; q4: 1.0
    assert result["perAnswerType"] == {"number": 50.0, "other": 100.0, "yes/no": 60.0}
    assert result["perQuestionType"] == {"how many": 50.0, "is": 60.0, "what color": 100.0}
    assert result["overall"] == round(100 * 2.6 / 4, 2) == 65.0
    assert result["n_questions"] == 4


def test_predictions_must_be_for_exactly_the_annotated_questions():
    annotations = {q: _annotation(["x"] * 10, "other", "q") for q in range(1, 10)}
    with pytest.raises(
        ValueError,
        match=r"^no prediction for 7 of the 9 question_ids \(3, 4, 5, 6, 7, \.\.\.\); "
        r"predictions for 2 question_ids that are not annotated \(10, 11\): ",
    ):
        vqa_accuracy(annotations, {1: "x", 2: "x", 10: "x", 11: "x"})
    with pytest.raises(DataFormatError, match=r"^pred\.json: no prediction for 1 of the 9 question_ids \(9\): "):
        vqa_accuracy(annotations, {q: "x" for q in range(1, 9)}, source="pred.json")
