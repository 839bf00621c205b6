"""The VCR leaderboard's submission CSV from a Q->A and a QA->R fine-tuning run.

The leaderboard's test questions come without their right answer, so it takes the rationale
scores after each of the four answers (r2c's `eval_for_leaderboard.py`; the released code of the
ablation's paper, `vcr/function/test.py`, runs its QA->R model on the four as well). Fine-tuning scores the
rationales after the right answer only; here the QA->R run's best model scores them after every
answer, each input built exactly as in fine-tuning. The answer scores are the Q->A run's
`predictions_<split>.json`.
"""

from __future__ import annotations

import json
from pathlib import Path

from .. import tasks
from ..config import finetune_options
from ..data.errors import DataFormatError, read_text, require_file, require_same_ids
from ..detection.identity import study_detector
from ..evaluation.vcr_eval import (
    CHOICES,
    leaderboard_predictions,
    read_leaderboard_csv,
    vcr_accuracy,
    write_leaderboard_csv,
)
from ..registry import setting as setting_named
from ..tasks.regions import features_path
from .context import TrainingContext
from .finetune import predict
from .tuned_features import check_store_features


def run_metrics(run, task: str) -> dict:
    """A finished fine-tuning run's metrics.json, refused unless it is a run of `task`."""
    path = require_file(Path(run) / "metrics.json", f"metrics of a finished {task} fine-tuning run")
    try:
        metrics = json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise DataFormatError(path, f"invalid JSON: {exc.msg}", exc.lineno) from None
    if not isinstance(metrics, dict) or metrics.get("task") != task:
        found = metrics.get("task") if isinstance(metrics, dict) else None
        raise DataFormatError(path, f"a run of task {found!r}, expected a {task} run", key="task")
    return metrics


def answer_probs_of_run(run, split: str, annot_ids: list[str]) -> dict[str, list[float]]:
    """The Q->A run's answer scores for exactly the split's questions."""
    path = require_file(Path(run) / f"predictions_{split}.json", "Q->A predictions")
    try:
        records = json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise DataFormatError(path, f"invalid JSON: {exc.msg}", exc.lineno) from None
    if not isinstance(records, list):
        raise DataFormatError(path, "predictions are a JSON list of objects")
    probs = {}
    for k, record in enumerate(records):
        if not isinstance(record, dict) or "annot_id" not in record:
            raise DataFormatError(path, "missing key 'annot_id'", key=f"[{k}].annot_id")
        scores = record.get("answer_probs")
        if not (isinstance(scores, list) and len(scores) == CHOICES):
            raise DataFormatError(
                path,
                "expected four answer scores (the leaderboard takes scores, not a choice)",
                key=f"[{k}].answer_probs",
            )
        probs[record["annot_id"]] = scores
    require_same_ids(annot_ids, probs, "annot_id", path)
    return probs


def rationale_probs_after_each_answer(model, task, split: str, batch_size: int) -> dict[str, list[list[float]]]:
    """annot_id -> [the four rationale scores after answer i, for i in 0..3]."""
    after = {}
    for answer in range(CHOICES):
        for p in predict(model, task, task.examples(split, after_answer=answer), batch_size):
            after.setdefault(p["annot_id"], []).append(p["rationale_probs"])
    return after


def write_vcr_submission(context: TrainingContext, q2a_run, qa2r_run, split: str, out) -> dict:
    """Write the leaderboard CSV for `split` to `out`. `context.inputs.features_dir` must hold the
    stores the QA->R run was fine-tuned on (for a setting that tuned Fast R-CNN, those of `vlbert
    tune-features`; `inputs.pretrained`: the checkpoint it started from, that checks them). Returns a
    summary, with the CSV scored as the leaderboard scores it when the split has labels."""
    from ..data.vcr import read_vcr

    inputs = context.inputs
    q2a, qa2r = run_metrics(q2a_run, "vcr_q2a"), run_metrics(qa2r_run, "vcr_qa2r")
    chosen = setting_named(qa2r["setting"])
    task = tasks.build("vcr_qa2r", context.processor, inputs.data_root, inputs.features_dir, chosen.family)
    check_store_features(
        chosen,
        [features_path(inputs.features_dir, task.spec.stores[split])],
        inputs.pretrained,
        study_detector(context.preset, inputs.detector_dir),
    )
    examples = read_vcr(task.jsonl_path(split))
    annot_ids = [e.annot_id for e in examples]
    answer_probs = answer_probs_of_run(q2a_run, split, annot_ids)

    model = task.model_class.from_pretrained(Path(qa2r_run) / "best").to(context.device)
    batch_size = finetune_options(context.preset, task.name)["batch_size"]
    rationale_probs = rationale_probs_after_each_answer(model, task, split, batch_size)
    write_leaderboard_csv(out, annot_ids, answer_probs, rationale_probs)

    summary = {"questions": len(annot_ids), "q2a_setting": q2a["setting"], "qa2r_setting": qa2r["setting"]}
    labels = {e.annot_id: (e.answer_label, e.rationale_label) for e in examples}
    if all(a is not None and r is not None for a, r in labels.values()):
        summary["accuracy"] = vcr_accuracy(labels, leaderboard_predictions(read_leaderboard_csv(out), labels), out)
    return summary
