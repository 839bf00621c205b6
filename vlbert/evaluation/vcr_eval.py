"""VCR accuracy: Q->A, QA->R, and Q->AR (a question counts only when both are right)."""

from __future__ import annotations


def _choice(prediction: dict, key: str):
    """A prediction gives a choice index (`answer`) or four scores (`answer_probs`)."""
    if key in prediction:
        return int(prediction[key])
    scores = prediction.get(f"{key}_probs")
    if scores is None:
        return None
    return max(range(len(scores)), key=lambda i: scores[i])


def vcr_accuracy(labels: dict[str, tuple[int, int]], predictions: dict[str, dict]) -> dict:
    """labels: annot_id -> (answer_label, rationale_label); predictions: annot_id -> {answer, rationale}.

    Each of Q->A and QA->R is scored over the questions that have a prediction for it; Q->AR
    needs both for every question.
    """
    unknown = [a for a in predictions if a not in labels]
    if unknown:
        raise ValueError(f"prediction for unknown annot_id {unknown[0]!r}")
    result = {}
    answer_right, rationale_right = {}, {}
    for key, right, index in (("answer", answer_right, 0), ("rationale", rationale_right, 1)):
        for annot_id, label in labels.items():
            choice = _choice(predictions.get(annot_id, {}), key)
            if choice is not None:
                right[annot_id] = choice == label[index]
    if answer_right:
        result["q2a"] = round(100 * sum(answer_right.values()) / len(answer_right), 2)
    if rationale_right:
        result["qa2r"] = round(100 * sum(rationale_right.values()) / len(rationale_right), 2)
    if len(answer_right) == len(rationale_right) == len(labels):
        result["q2ar"] = round(100 * sum(answer_right[a] and rationale_right[a] for a in labels) / len(labels), 2)
    if not result:
        raise ValueError("no predictions: give `answer` and/or `rationale` per annot_id")
    result["n_questions"] = len(labels)
    return result
