"""`vlbert <verb> ...`: thin argument parsing; each verb calls into the package."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import __version__


def _make_data(args) -> int:
    from .config import load_config, synthetic_spec
    from .data.synthetic import make_world
    from .registry import DATASETS

    config = load_config(args.config)
    out = Path(args.out or config["data"]["root"])
    written = make_world(
        synthetic_spec(config), out, datasets=args.only or DATASETS, force=args.force, progress=not args.quiet
    )
    print(f"{out}: wrote {', '.join(written) if written else 'nothing (all data sets up to date)'}")
    return 0


def _train_detector(args) -> int:
    import torch

    from .config import load_config
    from .detection.train import train_detector
    from .io import write_json
    from .tracking import make_tracker

    config = load_config(args.config, check_paths_exist=True)
    options = config.get("detector", {})
    if options.get("backend", "torchvision") != "torchvision":
        raise ValueError(
            f"{args.config}: detector.backend is {options['backend']!r}: its weights are "
            "given (detector.detectron2), there is nothing to train"
        )
    torch.set_num_threads(args.threads)
    tracker = make_tracker(config, "detector", {"stage": "detector"}, enabled=not args.no_tracking)
    try:
        metrics = train_detector(args.data, args.out, options, tracker, seed=config["seed"], device=args.device)
        write_json(Path(args.out) / "metrics.json", metrics, indent=2)
        tracker.log_artifact(Path(args.out))
    except BaseException:
        tracker.close("FAILED")
        raise
    tracker.close()
    print(f"detector: val mAP@0.5 {metrics['val_mAP50']:.3f}, mAP {metrics['val_mAP']:.3f} -> {args.out}")
    return 0


def _extract_rois(args) -> int:
    import torch

    from .config import dataset_root, load_config
    from .detection.backends import build_backend
    from .detection.extract import extract_to_store
    from .detection.sources import image_items

    config = load_config(args.config, check_paths_exist=True)
    if args.data:
        config["data"]["root"] = args.data
    torch.set_num_threads(args.threads)
    items = image_items(dataset_root(config, args.dataset), args.dataset, args.split, gt_boxes=args.gt_boxes)
    if args.limit:
        items = items[: args.limit]
    backend = build_backend(config, args.detector, args.device)
    attrs = {
        "dataset": args.dataset,
        "split": args.split,
        "preset": config["name"],
        "rule": json.dumps(backend.rule.__dict__),
        "detector": str(Path(args.detector).resolve()) if args.detector else config["detector"]["backend"],
    }
    summary = extract_to_store(
        backend,
        items,
        args.out,
        batch_size=args.batch_size,
        on_bad_image=args.on_bad_image,
        attrs=attrs,
        progress=not args.quiet,
    )
    print(
        f"{args.out}: {summary['images']} images, {summary['regions']} regions"
        + (
            f", {summary['skipped']} unreadable images skipped (listed in the file's attributes)"
            if summary["skipped"]
            else ""
        )
    )
    return 0


def _tune_features(args) -> int:
    import torch

    from .config import load_config
    from .engine.tuned_features import image_paths_for, tune_store
    from .modeling.modeling_vlbert import VLBertForPreTraining

    config = load_config(args.config, check_paths_exist=True)
    if args.data:
        config["data"]["root"] = args.data
    torch.set_num_threads(args.threads)
    model = VLBertForPreTraining.from_pretrained(args.pretrained)
    if model.vlbert.fast_rcnn is None:
        raise ValueError(f"{args.pretrained}: this checkpoint has no Fast R-CNN module (its setting does not tune it)")
    fast_rcnn = model.vlbert.fast_rcnn.to(args.device)
    for store in args.store:
        out = Path(args.out) / Path(store).name
        summary = tune_store(
            fast_rcnn,
            args.pretrained,
            store,
            image_paths_for(config, store),
            out,
            batch_size=args.batch_size,
            progress=not args.quiet,
        )
        print(f"{out}: {summary['images']} images, {summary['regions']} regions")
    return 0


def _training_context(args, stage: str, tags: dict, tracked: bool = True):
    """Shared by the training verbs: preset, threads, device, processor, MLflow tracker."""
    import torch

    from .config import load_config
    from .engine.build import load_processor
    from .engine.distributed import init_from_environment, is_main_process
    from .tracking import NullTracker, make_tracker

    config = load_config(args.config, check_paths_exist=True)
    if getattr(args, "data", None):
        config["data"]["root"] = args.data
    torch.set_num_threads(args.threads)
    device = init_from_environment(args.device)
    results = Path("results") / config["name"]
    bert = getattr(args, "bert", None) or config["model"].get("bert") or results / "bert_init" / "bert"
    if isinstance(bert, str) and Path(bert).exists():
        bert = Path(bert)
    # bert-init makes the BERT: it starts from BERT's uncased WordPiece vocabulary alone.
    processor = load_processor(None if stage == "bert_init" else bert, config["model"].get("max_text_length", 64))
    tracker = (
        make_tracker(
            config,
            args.run_name or f"{stage}-{'-'.join(str(v) for v in tags.values())}",
            {"stage": stage, **tags},
            enabled=not args.no_tracking,
        )
        if is_main_process() and tracked
        else NullTracker()
    )
    tracker.log_params({"preset": config})
    return config, device, results, bert, processor, tracker


def _run_tracked(tracker, out: Path, work):
    """Run `work`, holding its output folder; log the folder's metrics.json and best checkpoint;
    close the run."""
    from contextlib import nullcontext

    from .engine.distributed import is_main_process
    from .io import FolderInUseError, exclusive_folder

    try:
        # Under torchrun the processes of one run share the folder: the first one holds it.
        with exclusive_folder(out) if is_main_process() else nullcontext():
            result = work()
    except FolderInUseError:
        tracker.close("KILLED")
        raise
    except BaseException:
        tracker.close("FAILED")
        raise
    for name in ("metrics.json", "predictions_val.json", "predictions_test.json", "best"):
        if (out / name).exists():
            tracker.log_artifact(out / name, "checkpoint" if name == "best" else None)
    tracker.close()
    return result


def _bert_init(args) -> int:
    from .engine.bert_init import bert_init
    from .io import write_json

    config, _, _, _, processor, tracker = _training_context(args, "bert_init", {})
    if "bert_init" not in config:
        raise ValueError(
            f"{args.config}: bert_init: missing required key (the paper preset names a BERT "
            "checkpoint in model.bert instead)"
        )
    out = Path(args.out)

    def work():
        summary = bert_init(config, config["data"]["root"], out, tracker, processor, progress=not args.quiet)
        write_json(out / "metrics.json", summary, indent=2)
        return summary

    _run_tracked(tracker, out, work)
    print(f"bert-init: {out / 'bert'}")
    return 0


def _pretrain(args) -> int:
    from .engine.pretrain import pretrain
    from .io import write_json
    from .registry import setting

    chosen = setting(args.setting)
    config, device, results, bert, processor, tracker = _training_context(args, "pretrain", {"setting": chosen.name})
    out = Path(args.out)

    def work():
        summary = pretrain(
            config,
            chosen,
            bert,
            args.detector or results / "detector",
            config["data"]["root"],
            args.features or results / "features",
            out,
            tracker,
            processor,
            device,
            not args.quiet,
        )
        write_json(out / "metrics.json", summary, indent=2)
        return summary

    summary = _run_tracked(tracker, out, work)
    print(f"pretrain {chosen.name}: {summary.get('val', {})} -> {out / 'best'}")
    return 0


def _finetune(args) -> int:
    from .engine.finetune import finetune
    from .registry import setting
    from .study.sweep import continue_trial

    chosen = setting(args.setting)
    if (args.lr is None) == (args.lr_from is None):
        raise ValueError("give exactly one of --lr and --lr-from")
    if args.continue_trial and not (args.lr_from and Path(args.lr_from).is_dir()):
        raise ValueError("--continue-trial needs --lr-from with a sweep folder (its <task>/trials/ hold the runs)")
    lrs = {
        task: args.lr if args.lr is not None else _swept_lr(args.lr_from, task, len(args.task)) for task in args.task
    }
    # Every (task, seed) runs one after the other in this process (the imports paid once), each
    # its own MLflow run: in OUT itself for a single one, else in OUT/<task>/seed<N>/.
    runs = [(task, seed) for task in args.task for seed in args.seed]
    for task, seed in runs:
        out = Path(args.out) / task / f"seed{seed}" if len(runs) > 1 else Path(args.out)
        config, device, results, bert, processor, tracker = _training_context(
            args, "finetune", {"setting": chosen.name, "task": task, "seed": seed, "lr": lrs[task]}
        )
        pretrained = args.pretrained or (results / "pretrain" / chosen.name / "best" if chosen.pretrains else None)
        if args.continue_trial:
            trial = continue_trial(Path(args.lr_from) / task, seed, out)
            if trial is not None:
                tracker.log_params({"continued_from_trial": str(trial)})
                print(f"finetune {chosen.name}/{task} seed {seed}: continuing the sweep's trial {trial}")
        metrics = _run_tracked(
            tracker,
            out,
            lambda: finetune(
                config,
                chosen,
                task,
                lrs[task],
                seed,
                out,
                config["data"]["root"],
                args.features or results / "features",
                tracker,
                processor,
                pretrained=pretrained,
                bert=bert,
                detector_dir=args.detector or results / "detector",
                device=device,
                progress=not args.quiet,
            ),
        )
        if metrics:
            print(
                f"finetune {chosen.name}/{task} seed {seed}: val {metrics['val']['accuracy']:.2f} "
                f"(epoch {metrics['best_epoch']}), test {metrics['test']['accuracy']:.2f}"
            )
    return 0


def _swept_lr(lr_from: str, task: str, tasks: int) -> float:
    """The learning rate a sweep chose: from its best.json, or from SWEEP_DIR/<task>/best.json."""
    from .study.sweep import read_best_lr

    path = Path(lr_from)
    if path.is_dir():
        return read_best_lr(path / task / "best.json")
    if tasks > 1:
        raise ValueError(f"--lr-from {lr_from}: several tasks need a sweep folder holding <task>/best.json")
    return read_best_lr(path)


def _sweep(args) -> int:
    import os

    from .registry import setting
    from .study.sweep import run_sweeps
    from .tracking import make_tracker

    chosen = setting(args.setting)
    config, device, results, bert, _, _ = _training_context(args, "sweep", {"setting": chosen.name}, tracked=False)
    pretrained = args.pretrained or (results / "pretrain" / chosen.name / "best" if chosen.pretrains else None)

    def parent(task):
        return make_tracker(
            config,
            f"sweep-{chosen.name}-{task}",
            {"stage": "sweep", "setting": chosen.name, "task": task},
            enabled=not args.no_tracking,
        )

    summaries = run_sweeps(
        config,
        chosen.name,
        args.task,
        args.out,
        data_root=config["data"]["root"],
        features_dir=args.features or results / "features",
        bert=bert,
        detector=args.detector or results / "detector",
        pretrained=pretrained,
        device=device,
        cores=args.cores or os.cpu_count(),
        make_parent=parent,
    )
    for task, summary in summaries.items():
        print(f"sweep {chosen.name}/{task}: best lr {summary['lr']:g} (val {summary['val_accuracy']:.2f})")
    return 0


def _ui(args) -> int:
    from .config import load_config
    from .study.ui import serve

    return serve(load_config(args.config), args.host, args.port, args.tracking_uri)


def _report(args) -> int:
    from .config import dataset_root, load_config
    from .study.report import write_report
    from .tracking import default_tracking_uri, experiment_name

    config = load_config(args.config)
    uri = args.tracking_uri or default_tracking_uri(config)
    experiment = experiment_name(config)
    sweeps = sorted(Path(args.sweeps or Path("results") / config["name"] / "sweep").glob("*/*/best.json"))
    vcr_val = dataset_root(config, "vcr") / "val.jsonl"
    summary = write_report(
        uri,
        experiment,
        args.out,
        sweeps,
        vcr_val if vcr_val.is_file() else None,
        detector_metrics=Path("results") / config["name"] / "detector" / "metrics.json",
    )
    for warning in summary["warnings"]:
        print(f"vlbert report: warning: {warning}", file=sys.stderr)
    no_data = f", {summary['findings_no_data']} without data" if summary["findings_no_data"] else ""
    print(
        f"report: {args.out} ({summary['finetune_runs']} fine-tuning runs; "
        f"{summary['findings_agreeing']} of 6 findings agree with the paper{no_data})"
    )
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
    result = vqa_accuracy(annotations, predictions, source=args.predictions)
    print(
        f"VQA accuracy: {result['overall']:.2f}  "
        + "  ".join(f"{k}: {v:.2f}" for k, v in result["perAnswerType"].items())
    )
    _write_result(result, args.out)
    return 0


def _evaluate_vcr(args) -> int:
    from .data.vcr import read_vcr
    from .evaluation.vcr_eval import leaderboard_predictions, read_leaderboard_csv, vcr_accuracy, vcr_choices

    examples = read_vcr(args.annotations, image_root=Path(args.annotations).parent)
    labels = {e.annot_id: (e.answer_label, e.rationale_label) for e in examples}
    if any(a is None or r is None for a, r in labels.values()):
        raise SystemExit(f"{args.annotations}: has no labels (the real VCR test split is scored by the leaderboard)")
    # Q->AR comes from a pair of runs: a Q->A and a QA->R predictions file, merged per annot_id,
    # each for exactly the split's questions; or from one leaderboard CSV, which holds both.
    predictions = {}
    for path in args.predictions:
        if Path(path).suffix.lower() == ".csv":
            records = leaderboard_predictions(read_leaderboard_csv(path), labels)
        else:
            records = {p["annot_id"]: p for p in _records(path, "annot_id")}
        vcr_choices(labels, records, source=path)
        for annot_id, p in records.items():
            predictions.setdefault(annot_id, {}).update(p)
    result = vcr_accuracy(labels, predictions)
    print("VCR accuracy: " + "  ".join(f"{k}: {result[k]:.2f}" for k in ("q2a", "qa2r", "q2ar") if k in result))
    _write_result(result, args.out)
    return 0


def _evaluate_refcoco(args) -> int:
    from .data.refcoco import SPLITS, RefCOCO
    from .evaluation.refcoco_eval import refcoco_accuracy

    dataset = RefCOCO(args.root)
    expressions = [
        e for split in SPLITS if any(r["split"] == split for r in dataset.refs) for e in dataset.expressions(split)
    ]
    predictions = _predictions(args.predictions, "sent_id", "bbox")
    result = refcoco_accuracy(expressions, predictions, iou_convention=args.iou_convention, source=args.predictions)
    print(
        f"RefCOCO+ accuracy (IoU >= 0.5, {args.iou_convention}): "
        + "  ".join(f"{k}: {v:.2f}" for k, v in result.items() if k != "n_expressions")
    )
    _write_result(result, args.out)
    return 0


def _vcr_leaderboard(args) -> int:
    from .engine.vcr_leaderboard import run_metrics, write_vcr_submission
    from .registry import setting

    config, device, results, _, processor, _ = _training_context(args, "vcr_leaderboard", {}, tracked=False)
    chosen = setting(run_metrics(args.qa2r, "vcr_qa2r")["setting"])
    pretrained = args.pretrained or (results / "pretrain" / chosen.name / "best" if chosen.pretrains else None)
    summary = write_vcr_submission(
        args.q2a,
        args.qa2r,
        args.split,
        args.out,
        config,
        config["data"]["root"],
        args.features or results / "features",
        processor,
        pretrained=pretrained,
        device=device,
    )
    print(
        f"{args.out}: the leaderboard's CSV for {summary['questions']} {args.split} questions "
        f"(Q->A: {summary['q2a_setting']}, QA->R: {summary['qa2r_setting']})"
    )
    if "accuracy" in summary:
        accuracy = summary["accuracy"]
        print(
            "scored as the leaderboard scores it: "
            + "  ".join(f"{k}: {accuracy[k]:.2f}" for k in ("q2a", "qa2r", "q2ar"))
        )
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


def _add_runtime_arguments(p) -> None:
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--threads", type=int, default=2, help="CPU threads for torch")
    p.add_argument("--no-tracking", action="store_true", help="do not log to MLflow")


def _add_training_arguments(p) -> None:
    p.add_argument("--data", help="data root (default: the preset's data.root)")
    p.add_argument("--features", help="feature stores folder (default: results/<preset>/features)")
    p.add_argument("--detector", help="detector folder (default: results/<preset>/detector)")
    p.add_argument(
        "--bert", help="BERT checkpoint (default: the preset's model.bert, else results/<preset>/bert_init/bert)"
    )
    p.add_argument("--run-name", help="MLflow run name")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    _add_runtime_arguments(p)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vlbert", description="VL-BERT pre-training ablation study (ICLR 2020, Table 4)."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--debug",
        action="store_true",
        help="on an error, show its traceback instead of one line (before the verb: vlbert --debug ...)",
    )
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="<verb>")

    p = verbs.add_parser(
        "make-data",
        help="write the synthetic world in the real data sets' formats",
        description="Write the embedded default's data sets (deterministic from the preset's seed).",
    )
    p.add_argument("--config", required=True, help="preset YAML (experiments/*.yaml)")
    p.add_argument("--out", help="output folder (default: the preset's data.root)")
    p.add_argument("--only", nargs="+", metavar="DATASET", help="write only these data sets")
    p.add_argument("--force", action="store_true", help="rewrite data sets that are up to date")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_make_data)

    p = verbs.add_parser(
        "train-detector",
        help="train the Faster R-CNN on the detector split",
        description="Train the C4/C5 Faster R-CNN on <data>/annotations/instances_train2017.json, "
        "report COCO mAP on val, save safetensors + config JSON.",
    )
    p.add_argument("--config", required=True, help="preset YAML")
    p.add_argument("--data", required=True, help="detector data folder (COCO layout)")
    p.add_argument("--out", required=True, help="output folder for the weights, config and metrics")
    _add_runtime_arguments(p)
    p.set_defaults(func=_train_detector)

    from .registry import IMAGE_SPLITS

    p = verbs.add_parser(
        "extract-rois",
        help="detect regions and store their features (HDF5)",
        description="For every image of a data set split: detections by the paper's rule "
        "(score > threshold, at least min_boxes, at most max_boxes) plus the "
        "whole image, or features of given boxes (--gt-boxes). Resumable.",
    )
    p.add_argument("--config", required=True, help="preset YAML")
    p.add_argument("--dataset", required=True, choices=list(IMAGE_SPLITS))
    p.add_argument("--split", required=True, help="; ".join(f"{d}: {', '.join(s)}" for d, s in IMAGE_SPLITS.items()))
    p.add_argument("--out", required=True, help="HDF5 file to write")
    p.add_argument("--detector", help="folder written by `vlbert train-detector` (torchvision backend)")
    p.add_argument("--data", help="data root (default: the preset's data.root)")
    p.add_argument("--gt-boxes", action="store_true", help="features of the data set's own boxes (VCR, RefCOCO+)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument(
        "--on-bad-image",
        choices=["error", "skip"],
        default="error",
        help="a corrupt or missing image: stop with its path, or skip it and record it",
    )
    p.add_argument("--limit", type=int, help="only the first N images (quick looks)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_runtime_arguments(p)
    p.set_defaults(func=_extract_rois)

    from .registry import SETTINGS, TASKS

    p = verbs.add_parser(
        "bert-init",
        help="pre-train the small BERT on the text corpus (embedded default)",
        description="Text-only masked language modelling of a small BERT on the synthetic text "
        "corpus: the embedded default's stand-in for BERT's own pre-training.",
    )
    p.add_argument("--config", required=True)
    p.add_argument("--out", required=True, help="output folder; the checkpoint lands in OUT/bert")
    _add_training_arguments(p)
    p.set_defaults(func=_bert_init)

    p = verbs.add_parser(
        "pretrain",
        help="pre-train one setting of the ablation",
        description="Pre-train VL-BERT with one setting's tasks (the settings: vlbert/registry.py). "
        "Re-running the same command resumes from the last checkpoint.",
    )
    p.add_argument("--config", required=True)
    p.add_argument("--setting", required=True, choices=[s for s in SETTINGS if s != "no_pretrain"])
    p.add_argument("--out", required=True, help="output folder (checkpoint/, best/, metrics.json)")
    _add_training_arguments(p)
    p.set_defaults(func=_pretrain)

    p = verbs.add_parser(
        "finetune",
        help="fine-tune one setting on one or more tasks",
        description="Fine-tune on each task with its learning rate and each seed: per-epoch "
        "validation, best epoch kept, test scored once; predictions written as "
        "`vlbert evaluate` reads them.",
    )
    p.add_argument("--config", required=True)
    p.add_argument("--setting", required=True, choices=list(SETTINGS))
    p.add_argument(
        "--task",
        required=True,
        nargs="+",
        choices=list(TASKS),
        help="one or more tasks; several tasks or seeds: each run in OUT/<task>/seed<N>/",
    )
    p.add_argument("--lr", type=float, help="learning rate")
    p.add_argument(
        "--lr-from",
        help="take the learning rate from a sweep: its best.json, or its folder (<task>/best.json for each task)",
    )
    p.add_argument("--seed", required=True, type=int, nargs="+", help="one or more seeds")
    p.add_argument(
        "--continue-trial",
        action="store_true",
        help="with --lr-from SWEEP_DIR: the sweep's seed continues the sweep's own trial of the chosen "
        "rate from its last checkpoint, not from scratch (same metrics, fewer steps); the sweep "
        "must have run with this preset, setting and pre-trained checkpoint",
    )
    p.add_argument("--out", required=True)
    p.add_argument("--pretrained", help="pre-trained checkpoint (default: results/<preset>/pretrain/<setting>/best)")
    _add_training_arguments(p)
    p.set_defaults(func=_finetune)

    p = verbs.add_parser(
        "tune-features",
        help="recompute feature stores with a pre-trained, tuned Fast R-CNN",
        description="For a setting that tunes Fast R-CNN in pre-training: the same regions as "
        "each store, their features from the checkpoint's (now frozen) Fast R-CNN, "
        "written to OUT/<store name>. Fine-tuning that setting reads them.",
    )
    p.add_argument("--config", required=True)
    p.add_argument("--pretrained", required=True, help="pre-trained checkpoint folder (pretrain/<setting>/best)")
    p.add_argument("--store", required=True, nargs="+", help="feature stores written by extract-rois")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--data", help="data root (default: the preset's data.root)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--threads", type=int, default=2, help="CPU threads for torch")
    p.set_defaults(func=_tune_features)

    p = verbs.add_parser(
        "sweep",
        help="Ray Tune learning-rate sweeps for one setting",
        description="A grid over the tasks and the preset's sweep.lrs in one Ray Tune run, ASHA on "
        "each task's validation accuracy, the choice written to OUT/<task>/best.json. "
        "MLflow: a parent run per task with a child run per trial.",
    )
    p.add_argument("--config", required=True)
    p.add_argument("--setting", required=True, choices=list(SETTINGS))
    p.add_argument("--task", required=True, nargs="+", choices=list(TASKS))
    p.add_argument("--out", required=True)
    p.add_argument("--pretrained", help="pre-trained checkpoint (default: results/<preset>/pretrain/<setting>/best)")
    p.add_argument("--cores", type=int, help="CPU cores the sweep may use (default: all)")
    _add_training_arguments(p)
    p.set_defaults(func=_sweep)

    p = verbs.add_parser(
        "vcr-leaderboard",
        help="the VCR leaderboard's submission CSV from a Q->A and a QA->R run",
        description="The leaderboard's CSV (annot_id, answer_0..3, "
        "rationale_conditioned_on_a{i}_{j}): the answer scores from the Q->A run's predictions_<split>.json, "
        "the rationale scores after each of the four answers from the QA->R run's best model. A "
        "labelled split's CSV is also scored as the leaderboard scores it.",
    )
    p.add_argument("--config", required=True, help="preset YAML")
    p.add_argument("--q2a", required=True, help="a finished vcr_q2a fine-tuning run (its folder)")
    p.add_argument("--qa2r", required=True, help="a finished vcr_qa2r fine-tuning run (its folder)")
    p.add_argument("--split", default="test", choices=["val", "test"])
    p.add_argument("--out", required=True, help="the CSV to write")
    p.add_argument(
        "--pretrained",
        help="the checkpoint the QA->R run started from, for setting full: checks that "
        "--features are its tuned features "
        "(default: results/<preset>/pretrain/<setting>/best)",
    )
    p.add_argument("--data", help="data root (default: the preset's data.root)")
    p.add_argument(
        "--features", help="the feature stores the QA->R run was fine-tuned on (default: results/<preset>/features)"
    )
    p.add_argument("--bert", help="BERT checkpoint whose tokenizer the runs used (default: as fine-tuning's)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--threads", type=int, default=2, help="CPU threads for torch")
    p.set_defaults(func=_vcr_leaderboard)

    p = verbs.add_parser(
        "report",
        help="Table 4, the paper's findings and figures, read back from MLflow",
        description="Read the study's runs from MLflow and write table4.{md,csv,tex}, "
        "findings.md, figures/*.png and runs.csv.",
    )
    p.add_argument("--config", required=True)
    p.add_argument("--out", required=True, help="reports/<preset>/")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: the preset's)")
    p.add_argument("--sweeps", help="folder of <setting>/<task>/best.json (default: results/<preset>/sweep)")
    p.set_defaults(func=_report)

    p = verbs.add_parser(
        "ui",
        help="MLflow's UI over the preset's runs, opened on the study's runs table",
        description="Print the address of the study's runs table, then serve MLflow's UI over the "
        "preset's tracking store (a tracking server: only print the address).",
    )
    p.add_argument("--config", required=True)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    p.add_argument("--port", type=int, default=5000)
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: the preset's)")
    p.set_defaults(func=_ui)

    from .evaluation.refcoco_eval import IOU_CONVENTIONS

    p = verbs.add_parser(
        "evaluate",
        help="score predictions with the official metrics",
        description="Score prediction files with the official metrics (README: which official "
        "version each follows). Predictions must cover exactly the annotated questions.",
    )
    tasks = p.add_subparsers(dest="task", required=True, metavar="<task>")
    q = tasks.add_parser(
        "vqa",
        help="VQA accuracy (the current official script's)",
        description="Predictions in the official results format, "
        '[{"question_id": ..., "answer": ...}], one per annotated question.',
    )
    q.add_argument("--questions", required=True, help="v2_OpenEnded_mscoco_<split>_questions.json")
    q.add_argument("--annotations", required=True, help="v2_mscoco_<split>_annotations.json")
    q.set_defaults(func=_evaluate_vqa)
    q = tasks.add_parser(
        "vcr",
        help="VCR Q->A, QA->R and Q->AR accuracy",
        description="Predictions: the project's JSON, "
        '[{"annot_id": ..., "answer": i, "rationale": j}] (or answer_probs / '
        "rationale_probs, four scores each), one per question; or the leaderboard's "
        "CSV (`vlbert vcr-leaderboard`), scored as the leaderboard does.",
    )
    q.add_argument("--annotations", required=True, help="VCR <split>.jsonl with labels")
    q.set_defaults(func=_evaluate_vcr)
    q = tasks.add_parser(
        "refcoco",
        help="RefCOCO+ accuracy at IoU >= 0.5, per split",
        description='Predictions: the project\'s JSON, [{"sent_id": ..., "bbox": [x, y, w, h]}].',
    )
    q.add_argument("--root", required=True, help="folder with refs(unc).p and instances.json")
    q.add_argument(
        "--iou-convention",
        choices=IOU_CONVENTIONS,
        default="continuous",
        help="continuous: a box's area is w * h (COCO, pycocotools); plus-one: each side counts one pixel "
        "more, width x2 - x1 + 1 (the released VL-BERT code's evaluation)",
    )
    q.set_defaults(func=_evaluate_refcoco)
    for name, q in tasks.choices.items():
        if name == "vcr":
            q.add_argument(
                "--predictions",
                required=True,
                nargs="+",
                help="predictions JSON (a Q->A and a QA->R file together give Q->AR) or a leaderboard CSV",
            )
        else:
            q.add_argument("--predictions", required=True, help="predictions JSON")
        q.add_argument("--out", help="also write the figures as JSON here")
    return parser


def _error_line(exc: BaseException) -> str:
    """The one line an expected failure prints: its message, flattened, with what kind of failure
    it is where the message alone would not say (a library's bare "Ran out of input")."""
    import pickle

    from .data.safe_pickle import UnsafePickleError

    message = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, EOFError):
        return f"a file ends too early (truncated or empty?): {message}"
    if isinstance(exc, pickle.UnpicklingError) and not isinstance(exc, UnsafePickleError):
        return f"a pickle cannot be read (corrupt?): {message}"
    if isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError):
        if exc.filename and str(exc.filename) not in message:
            message += f": {exc.filename}"
        return message if exc.errno else f"{type(exc).__name__}: {message}"
    return message


def main(argv=None) -> int:
    import pickle

    from .config import ConfigError
    from .data.errors import DataFormatError
    from .io import FolderInUseError
    from .tracking import TrackingStoreError

    args = build_parser().parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own bars say what is going on
    from .engine.distributed import shutdown

    try:
        return args.func(args)
    except (
        ConfigError,
        DataFormatError,
        FolderInUseError,
        ValueError,
        TrackingStoreError,
        ImportError,
        OSError,
        pickle.UnpicklingError,
        EOFError,
        FloatingPointError,
    ) as exc:
        # Bad input, a broken file, a diverged run: the user's to fix, so one line, not a traceback.
        if args.debug:
            raise
        print(f"vlbert {args.verb}: error: {_error_line(exc)}", file=sys.stderr)
        return 2
    finally:
        shutdown()  # leave a torchrun process group, if this process joined one


if __name__ == "__main__":
    sys.exit(main())
