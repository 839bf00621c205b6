"""VCR accuracy: Q->A, QA->R, and Q->AR (a question counts only when both are right), and the
leaderboard's submission CSV.

The project's prediction files are JSON lists, one object per question: {"annot_id", "answer" or
"answer_probs"} from a Q->A run, {"annot_id", "rationale" or "rationale_probs"} from a QA->R run
(its rationale scores follow the right answer). The VCR leaderboard takes a CSV instead, in the
format of r2c's `models/README.md` and `eval_for_leaderboard.py` (rowanz/r2c, commit 77813d9):
`annot_id`, the four answer scores `answer_0..3`, and for each answer i the four rationale scores
after that answer, `rationale_conditioned_on_a{i}_{j}`. The leaderboard takes the argmax of the
answer scores for Q->A, the argmax of the rationale scores after the right answer for QA->R, and
counts a question for Q->AR when both are right.
"""

from __future__ import annotations

import csv
import json
import math
from io import StringIO
from pathlib import Path

from ..data.errors import DataFormatError, read_text, require_file, require_same_ids

CHOICES = 4
LEADERBOARD_COLUMNS = (
    ["annot_id"]
    + [f"answer_{j}" for j in range(CHOICES)]
    + [f"rationale_conditioned_on_a{i}_{j}" for i in range(CHOICES) for j in range(CHOICES)]
)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _choice(prediction: dict, key: str, source=None):
    """A prediction gives a choice index (`answer`) or four scores (`answer_probs`); anything else
    (a null, a string, three scores) is refused naming the question."""
    where = f"annot_id {prediction.get('annot_id')!r}"
    if key in prediction:
        value = prediction[key]
        if not (_number(value) and value == int(value) and 0 <= value < CHOICES):
            _refuse(f"{where}: {key} is {json.dumps(value)}, not a choice 0..{CHOICES - 1}", source)
        return int(value)
    scores = prediction.get(f"{key}_probs")
    if scores is None:
        return None
    if not (isinstance(scores, list) and len(scores) == CHOICES and all(map(_number, scores))):
        _refuse(f"{where}: {key}_probs is {json.dumps(scores)}, not {CHOICES} numbers", source)
    return max(range(len(scores)), key=lambda i: scores[i])


def _refuse(problem: str, source) -> None:
    raise DataFormatError(source, problem) if source is not None else ValueError(problem)


def vcr_choices(labels: dict, predictions: dict[str, dict], source=None) -> dict[str, dict[str, int]]:
    """The chosen answer and/or rationale per question: {"answer": {annot_id: index}, ...}.

    Refused unless the predictions are for exactly the labelled questions, each key (`answer`,
    `rationale`) given for every question or for none: a part scored as the whole misleads.
    source: the predictions file, named in the refusal.
    """
    require_same_ids(labels, predictions, "annot_id", source)
    chosen = {}
    for key in ("answer", "rationale"):
        choices = {a: _choice(predictions[a], key, source) for a in labels}
        without = [a for a, c in choices.items() if c is None]
        if len(without) == len(labels):
            continue
        if without:
            _refuse(
                f"{key}: given for {len(labels) - len(without)} of the {len(labels)} questions, not for annot_id "
                f"{without[0]!r} and {len(without) - 1} more: give `{key}` or `{key}_probs` for every question",
                source,
            )
        chosen[key] = choices
    if not chosen:
        _refuse("no predictions: give `answer` and/or `rationale` (or their `_probs`) per annot_id", source)
    return chosen


def vcr_accuracy(labels: dict[str, tuple[int, int]], predictions: dict[str, dict], source=None) -> dict:
    """labels: annot_id -> (answer_label, rationale_label); predictions: annot_id -> {answer, rationale}
    for exactly the labelled questions (see vcr_choices). Q->AR needs both."""
    chosen = vcr_choices(labels, predictions, source)
    right = {
        key: {a: choice == labels[a][index] for a, choice in chosen[key].items()}
        for index, key in enumerate(("answer", "rationale"))
        if key in chosen
    }
    pct = lambda hits: round(100 * sum(hits) / len(labels), 2)
    result = {
        name: pct(right[key].values()) for name, key in (("q2a", "answer"), ("qa2r", "rationale")) if key in right
    }
    if len(right) == 2:
        result["q2ar"] = pct(right["answer"][a] and right["rationale"][a] for a in labels)
    result["n_questions"] = len(labels)
    return result


# ---- the leaderboard's CSV -------------------------------------------------------------------


def write_leaderboard_csv(
    path, annot_ids: list[str], answer_probs: dict[str, list[float]], rationale_probs: dict[str, list[list[float]]]
) -> Path:
    """One row per annot_id, in the given order: its four answer scores, then its rationale scores
    after each answer i (rationale_probs[annot_id][i][j])."""
    from .. import io

    rows = []
    for annot_id in annot_ids:
        answers, rationales = answer_probs[annot_id], rationale_probs[annot_id]
        if len(answers) != CHOICES or len(rationales) != CHOICES or any(len(r) != CHOICES for r in rationales):
            raise ValueError(f"annot_id {annot_id!r}: expected 4 answer scores and 4 x 4 rationale scores")
        rows.append([annot_id, *map(float, answers), *(float(p) for row in rationales for p in row)])
    text = StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(LEADERBOARD_COLUMNS)
    writer.writerows(rows)
    io.write_text(path, text.getvalue())
    return Path(path)


def read_leaderboard_csv(path) -> dict[str, dict]:
    """A leaderboard CSV as annot_id -> {"answer_probs": [4], "rationale_probs_after": [[4] x 4]}."""
    lines = read_text(require_file(path, "VCR leaderboard CSV")).splitlines()
    reader = csv.reader(lines)
    header = next(reader, None)
    if header is None or set(header) != set(LEADERBOARD_COLUMNS) or len(header) != len(LEADERBOARD_COLUMNS):
        missing = sorted(set(LEADERBOARD_COLUMNS) - set(header or []))
        raise DataFormatError(
            path,
            "not a VCR leaderboard CSV: the header must be annot_id, answer_0..3 and "
            "rationale_conditioned_on_a{i}_{j}" + (f" (missing {', '.join(missing[:3])})" if missing else ""),
            1,
        )
    column = {name: k for k, name in enumerate(header)}
    out = {}
    for line, row in enumerate(reader, 2):
        if len(row) != len(header):
            raise DataFormatError(path, f"{len(row)} fields, the header has {len(header)}", line)
        try:
            value = lambda name: float(row[column[name]])
            out[row[column["annot_id"]]] = {
                "answer_probs": [value(f"answer_{j}") for j in range(CHOICES)],
                "rationale_probs_after": [
                    [value(f"rationale_conditioned_on_a{i}_{j}") for j in range(CHOICES)] for i in range(CHOICES)
                ],
            }
        except ValueError as exc:
            raise DataFormatError(path, f"not a number: {exc}", line) from None
    return out


def leaderboard_predictions(rows: dict[str, dict], labels: dict[str, tuple[int, int]]) -> dict[str, dict]:
    """What the leaderboard scores in a CSV: the answer scores, and the rationale scores after the
    right answer. Questions the labels do not have are kept as they are (refused when scored)."""
    return {
        annot_id: {
            "answer_probs": row["answer_probs"],
            **({"rationale_probs": row["rationale_probs_after"][labels[annot_id][0]]} if annot_id in labels else {}),
        }
        for annot_id, row in rows.items()
    }
