"""`vlbert <verb> ...`: thin argument parsing; each verb calls into the package."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import __version__


def _make_data(args) -> int:
    from .config import load_config, synthetic_spec
    from .data.synthetic import DATASETS, make_world

    config = load_config(args.config)
    out = Path(args.out or config["data"]["root"])
    written = make_world(synthetic_spec(config), out, datasets=args.only or DATASETS,
                         force=args.force, progress=not args.quiet)
    print(f"{out}: wrote {', '.join(written) if written else 'nothing (all data sets up to date)'}")
    return 0


def _write_result(result: dict, out) -> None:
    if out:
        from .io import write_json
        write_json(out, result, indent=2)


def _evaluate_vqa(args) -> int:
    from .data.vqa import load_json, read_annotations
    from .evaluation.vqa_eval import vqa_accuracy

    annotations = read_annotations(args.annotations)
    questions = load_json(args.questions, "VQA questions")["questions"]
    asked = {q["question_id"] for q in questions}
    annotations = {q: a for q, a in annotations.items() if q in asked}
    predictions = _predictions(args.predictions, "question_id", "answer")
    result = vqa_accuracy(annotations, predictions)
    print(f"VQA accuracy: {result['overall']:.2f}  "
          + "  ".join(f"{k}: {v:.2f}" for k, v in result["perAnswerType"].items()))
    _write_result(result, args.out)
    return 0


def _evaluate_vcr(args) -> int:
    from .data.vcr import read_vcr
    from .evaluation.vcr_eval import vcr_accuracy

    examples = read_vcr(args.annotations, image_root=Path(args.annotations).parent)
    labels = {e.annot_id: (e.answer_label, e.rationale_label) for e in examples}
    if any(a is None or r is None for a, r in labels.values()):
        raise SystemExit(f"{args.annotations}: has no labels (the real VCR test split is scored by the leaderboard)")
    predictions = {p["annot_id"]: p for p in _records(args.predictions, "annot_id")}
    result = vcr_accuracy(labels, predictions)
    print("VCR accuracy: " + "  ".join(f"{k}: {result[k]:.2f}" for k in ("q2a", "qa2r", "q2ar") if k in result))
    _write_result(result, args.out)
    return 0


def _evaluate_refcoco(args) -> int:
    from .data.refcoco import SPLITS, RefCOCO
    from .evaluation.refcoco_eval import refcoco_accuracy

    dataset = RefCOCO(args.root)
    expressions = [e for split in SPLITS if any(r["split"] == split for r in dataset.refs)
                   for e in dataset.expressions(split)]
    predictions = _predictions(args.predictions, "sent_id", "bbox")
    result = refcoco_accuracy(expressions, predictions)
    print("RefCOCO+ accuracy (IoU >= 0.5): " + "  ".join(
        f"{k}: {v:.2f}" for k, v in result.items() if k != "n_expressions"))
    _write_result(result, args.out)
    return 0


def _records(path, key: str) -> list[dict]:
    from .data.errors import DataFormatError
    from .data.vqa import load_json

    records = load_json(path, "predictions")
    if not isinstance(records, list):
        raise DataFormatError(path, "predictions are a JSON list of objects")
    for k, record in enumerate(records):
        if not isinstance(record, dict) or key not in record:
            raise DataFormatError(path, f"missing key {key!r}", key=f"[{k}].{key}")
    return records


def _predictions(path, key: str, value: str) -> dict:
    from .data.errors import DataFormatError

    out = {}
    for k, record in enumerate(_records(path, key)):
        if value not in record:
            raise DataFormatError(path, f"missing key {value!r}", key=f"[{k}].{value}")
        out[record[key]] = record[value]
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vlbert", description="VL-BERT pre-training ablation study (ICLR 2020, Table 4).")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="<verb>")

    p = verbs.add_parser("make-data", help="write the synthetic world in the real data sets' formats",
                         description="Write the embedded default's data sets (deterministic from the preset's seed).")
    p.add_argument("--config", required=True, help="preset YAML (experiments/*.yaml)")
    p.add_argument("--out", help="output folder (default: the preset's data.root)")
    p.add_argument("--only", nargs="+", metavar="DATASET", help="write only these data sets")
    p.add_argument("--force", action="store_true", help="rewrite data sets that are up to date")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_make_data)

    p = verbs.add_parser("evaluate", help="score predictions with the official metrics",
                         description="Score predictions in the official result formats.")
    tasks = p.add_subparsers(dest="task", required=True, metavar="<task>")
    q = tasks.add_parser("vqa", help="VQA accuracy (official soft accuracy)",
                         description='Predictions: [{"question_id": ..., "answer": ...}].')
    q.add_argument("--questions", required=True, help="v2_OpenEnded_mscoco_<split>_questions.json")
    q.add_argument("--annotations", required=True, help="v2_mscoco_<split>_annotations.json")
    q.set_defaults(func=_evaluate_vqa)
    q = tasks.add_parser("vcr", help="VCR Q->A, QA->R and Q->AR accuracy",
                         description='Predictions: [{"annot_id": ..., "answer": i, "rationale": j}] '
                                     '(or answer_probs / rationale_probs, four scores each).')
    q.add_argument("--annotations", required=True, help="VCR <split>.jsonl with labels")
    q.set_defaults(func=_evaluate_vcr)
    q = tasks.add_parser("refcoco", help="RefCOCO+ accuracy at IoU >= 0.5, per split",
                         description='Predictions: [{"sent_id": ..., "bbox": [x, y, w, h]}].')
    q.add_argument("--root", required=True, help="folder with refs(unc).p and instances.json")
    q.set_defaults(func=_evaluate_refcoco)
    for q in tasks.choices.values():
        q.add_argument("--predictions", required=True, help="predictions JSON in the official results format")
        q.add_argument("--out", help="also write the figures as JSON here")
    return parser


def main(argv=None) -> int:
    from .config import ConfigError
    from .data.errors import DataFormatError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, DataFormatError, FileNotFoundError, ValueError) as exc:
        print(f"vlbert {args.verb}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
