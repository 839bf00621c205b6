"""Worked examples of the official VQA accuracy."""

import pytest

from vlbert.evaluation.vqa_eval import normalize_answer, process_punctuation, question_accuracy, vqa_accuracy


@pytest.mark.parametrize("raw, expected", [
    ("Two", "2"),                      # number words to digits, lower case
    ("the red one", "red 1"),          # articles dropped
    ("an apple", "apple"),
    ("yes!", "yes"),                   # glued punctuation becomes a space, then collapses
    ("dont", "don't"),                 # contractions restored
    ("isnt it", "isn't it"),
    ("3.5", "3.5"),                    # a decimal point stays
    ("end.", "end"),                   # a full stop goes
    ("1,000", "1000"),                 # a comma between digits goes
    ("  black\tand\nwhite ", "black and white"),
    ("t-shirt", "t shirt"),            # '-' between letters becomes a space
    ("yes , sir", "yes sir"),          # spaced punctuation is removed outright
])
def test_normalisation(raw, expected):
    assert normalize_answer(raw) == expected


def test_punctuation_rule_depends_on_spacing():
    assert process_punctuation("a/b") == "a b"
    assert process_punctuation("a / b") == "a  b"


def test_leave_one_out_average():
    humans = ["red"] * 7 + ["maroon"] * 2 + ["orange"]
    # Leaving out a red (7 of 10 subsets) leaves 2 maroons: 2/3; a maroon (2): 1/3; the orange: 2/3.
    assert question_accuracy("maroon", humans) == pytest.approx((7 * 2 / 3 + 2 * 1 / 3 + 2 / 3) / 10)
    assert question_accuracy("red", humans) == 1.0          # always >= 3 other reds
    assert question_accuracy("orange", humans) == pytest.approx(9 * (1 / 3) / 10)
    assert question_accuracy("blue", humans) == 0.0


def test_exactly_three_matches_is_not_full_credit():
    humans = ["2"] * 3 + ["3"] * 7
    # Leaving out one of the three "2"s leaves two: 2/3 in 3 subsets; 1 in the other 7.
    assert question_accuracy("2", humans) == pytest.approx((3 * 2 / 3 + 7) / 10)


def test_human_answers_are_normalised_only_when_they_disagree():
    # The prediction "t-shirt" normalises to "t shirt". All humans agree on "t-shirt": they are not
    # normalised, so it never matches (the official script's quirk).
    assert question_accuracy("t-shirt", ["t-shirt"] * 10) == 0.0
    # When humans disagree, their punctuation is normalised too, and it matches.
    assert question_accuracy("t-shirt", ["t-shirt"] * 9 + ["shirt"]) == 1.0


def test_overall_and_per_type():
    annotations = {
        1: {"answers": [{"answer": "red"}] * 10, "answer_type": "other", "question_type": "what color"},
        2: {"answers": [{"answer": "2"}] * 10, "answer_type": "number", "question_type": "how many"},
        3: {"answers": [{"answer": "yes"}] * 2 + [{"answer": "no"}] * 8, "answer_type": "yes/no", "question_type": "is"},
    }
    result = vqa_accuracy(annotations, {1: "Red", 2: "three", 3: "yes"})
    # q1: 1.0; q2: 0.0; q3: leaving out a yes (2 subsets) -> 1/3, leaving out a no (8) -> 2/3: 0.6
    assert result["perAnswerType"] == {"number": 0.0, "other": 100.0, "yes/no": 60.0}
    assert result["overall"] == round(100 * 1.6 / 3, 2) == 53.33


def test_missing_prediction_is_an_error():
    with pytest.raises(ValueError, match="question_id 7"):
        vqa_accuracy({7: {"answers": [{"answer": "x"}], "answer_type": "other", "question_type": "q"}}, {})
