"""What each `vlbert` verb does, given its parsed arguments: one function per verb (cli.py only
parses). Each returns the process's exit status; heavy imports wait until a verb runs."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from ..engine.context import TrainingContext
from ..layout import Layout
from ..tracking import LR_TAG, SEED_TAG, SETTING_TAG, STAGE_TAG, TASK_TAG, TRAIN_FRACTION_TAG


def make_data(args) -> int:
    """Write the embedded default's data sets (deterministic from the preset's seed)."""
    from ..config import check_output, load_config, synthetic_spec
    from ..data.synthetic import make_world
    from ..registry import DATASETS

    config = load_config(args.config)
    if args.out:
        check_output(args.out, "--out")
    out = Path(args.out or config["data"]["root"])
    written = make_world(
        synthetic_spec(config), out, datasets=args.only or DATASETS, force=args.force, progress=not args.quiet
    )
    print(f"{out}: wrote {', '.join(written) if written else 'nothing (all data sets up to date)'}")
    return 0


def floors(args) -> int:
    """What a model that does not look at the image scores on each task (vlbert.evaluation.floors)."""
    from ..config import dataset_root, load_config
    from ..evaluation.floors import blind_floors
    from ..io import write_json

    config = load_config(args.config, check_paths_exist=True)
    out = Path(args.out or Layout(config["name"]).floors)
    result = blind_floors({name: dataset_root(config, name) for name in ("vqa", "vcr", "refcoco+")})
    write_json(out, result, indent=2)
    for task, roles in result.items():
        reported = roles.get("reported", {})
        print(f"{task}: " + ", ".join(f"{k} {v}" for k, v in reported.items()))
    print(f"floors: {out}")
    return 0


def train_detector(args) -> int:
    """Train the C4/C5 Faster R-CNN on <data>/annotations/instances_train2017.json, report COCO mAP on
    val, save safetensors + config JSON."""
    import torch

    from ..config import load_config
    from ..detection.train import train_detector
    from ..io import write_json
    from ..tracking import make_tracker

    config = load_config(args.config, check_paths_exist=True)
    options = config.get("detector", {})
    if options.get("backend", "torchvision") != "torchvision":
        raise ValueError(
            f"{args.config}: detector.backend is {options['backend']!r}: its weights are "
            "given (detector.detectron2), there is nothing to train"
        )
    torch.set_num_threads(args.threads)
    tracker = make_tracker(config, "detector", {STAGE_TAG: "detector"}, enabled=not args.no_tracking)
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


def describe_detector(args) -> int:
    """For `detector.backend: detectron2`: the study's detector folder as a description of the given
    model (its merged config, the weights' path and identity, its sizes), read downstream as a
    trained detector's folder is."""
    from ..config import load_config
    from ..detection.detectron2 import BACKEND, describe
    from ..detection.model import CONFIG_FILE
    from ..io import write_json

    config = load_config(args.config, check_paths_exist=True)
    options = config.get("detector", {})
    if options.get("backend", "torchvision") != BACKEND:
        raise ValueError(
            f"{args.config}: detector.backend is {options.get('backend', 'torchvision')!r}: the study "
            "trains its detector (`vlbert train-detector`), there is no given model to describe"
        )
    description = describe(options[BACKEND]["config"], options[BACKEND]["weights"])
    out = Path(args.out) / CONFIG_FILE
    write_json(out, description, indent=2)
    print(
        f"detector: detectron2 model {description['config_file']}, {description['feature_dim']}-d regions, "
        f"{len(description['class_names'])} classes -> {out}"
    )
    return 0


def extract_rois(args) -> int:
    """For every image of a data set split: detections by the paper's rule (score > threshold, at
    least min_boxes, at most max_boxes) plus the whole image, or features of given boxes
    (--gt-boxes). Resumable."""
    import torch

    from ..config import dataset_root, load_config
    from ..detection.backends import build_backend
    from ..detection.extract import Chunk, StoreFormat, chunk_manifest, extract_chunk, extract_to_store
    from ..detection.identity import DETECTOR_ATTR, detector_weights, weights_identity
    from ..detection.sources import image_items

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
        DETECTOR_ATTR: weights_identity(detector_weights(config, args.detector)),
    }
    options = dict(
        batch_size=args.batch_size,
        on_bad_image=args.on_bad_image,
        attrs=attrs,
        fmt=StoreFormat.from_config(config),
        progress=not args.quiet,
    )
    if args.chunk:
        chunk = Chunk.parse(args.chunk)
        shards = extract_chunk(backend, items, args.out, chunk, **options)
        print(f"{chunk_manifest(args.out, chunk)}: chunk {chunk.name}, {len(shards)} shards")
        return 0
    summary = extract_to_store(backend, items, args.out, **options)
    print(
        f"{args.out}: {summary['images']} images, {summary['regions']} regions in {summary['shards']} shards"
        + (
            f", {summary['skipped']} unreadable images skipped (listed in the file's attributes)"
            if summary["skipped"]
            else ""
        )
    )
    return 0


def index_store(args) -> int:
    """The gather step of a chunked extraction: the store's index over every chunk's shards."""
    from ..detection.extract import index_store

    summary = index_store(args.out, [Path(m) for m in args.manifests])
    print(f"{args.out}: {summary['images']} images, {summary['regions']} regions in {summary['shards']} shards")
    return 0


def tune_features(args) -> int:
    """For a setting that tunes Fast R-CNN in pre-training: the same regions as each store, their
    features from the checkpoint's (now frozen) Fast R-CNN, written to OUT/<store name>.
    Fine-tuning that setting reads them."""
    import torch

    from ..config import load_config
    from ..detection.extract import StoreFormat
    from ..engine.tuned_features import image_paths_for, tune_store
    from ..modeling.modeling_vlbert import VLBertForPreTraining

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
            images_per_shard=StoreFormat.from_config(config).images_per_shard,
            progress=not args.quiet,
        )
        print(f"{out}: {summary['images']} images, {summary['regions']} regions")
    return 0


def _training_context(
    args, stage: str, tags: dict, tracked: bool = True, setting=None, seed: int | None = None
) -> TrainingContext:
    """Shared by the training verbs: the preset, threads, device, processor, MLflow tracker, and the
    run's inputs (the arguments', else the preset's or the study layout's: `run_inputs`, for a
    fine-tuning `seed`)."""
    import torch

    from ..config import load_config
    from ..engine.context import run_inputs, training_context
    from ..engine.distributed import init_from_environment, is_main_process
    from ..tracking import NullTracker, make_tracker

    config = load_config(args.config, check_paths_exist=True)
    if getattr(args, "data", None):
        config["data"]["root"] = args.data
    torch.set_num_threads(args.threads)
    device = init_from_environment(args.device)
    inputs = run_inputs(
        config,
        setting,
        features_dir=getattr(args, "features", None),
        bert=getattr(args, "bert", None),
        detector_dir=getattr(args, "detector", None),
        pretrained=getattr(args, "pretrained", None),
        seed=seed,
    )

    def tracker():
        made = (
            make_tracker(
                config,
                args.run_name or f"{stage}-{'-'.join(str(v) for v in tags.values())}",
                {STAGE_TAG: stage, **tags},
                enabled=not args.no_tracking,
            )
            if is_main_process() and tracked
            else NullTracker()
        )
        made.log_params({"preset": config})
        return made

    # bert-init makes the BERT: it starts from BERT's uncased WordPiece vocabulary alone.
    return training_context(
        config,
        inputs,
        tracker,
        device,
        progress=not getattr(args, "quiet", False),
        bert_tokenizer=stage != "bert_init",
    )


def _holding(out: Path):
    """Hold a training run's output folder from its first step, before any set-up (the preset,
    the tokenizer, the MLflow run, the model): a second run into the folder stops at once instead
    of after minutes of set-up on a loaded machine. Under torchrun the processes of one run share
    the folder: rank 0 holds it (torchrun's RANK, known before the process group is joined)."""
    import os
    from contextlib import nullcontext

    from ..io import exclusive_folder

    return exclusive_folder(out) if int(os.environ.get("RANK", "0")) == 0 else nullcontext()


def _run_tracked(tracker, out: Path, work):
    """Run `work` (its caller holds `out`: `_holding`); log the folder's metrics.json and best
    checkpoint; close the run."""
    try:
        result = work()
    except BaseException:
        tracker.close("FAILED")
        raise
    for name in ("metrics.json", "predictions_val.json", "predictions_test.json", "best"):
        if (out / name).exists():
            tracker.log_artifact(out / name, "checkpoint" if name == "best" else None)
    tracker.close()
    return result


def bert_init(args) -> int:
    """Text-only masked language modelling of a small BERT on the synthetic text corpus: the
    embedded default's stand-in for BERT's own pre-training."""
    from ..engine.bert_init import bert_init as pretrain_bert
    from ..io import write_json

    out = Path(args.out)
    with _holding(out):
        context = _training_context(args, "bert_init", {})
        config = context.preset
        if "bert_init" not in config:
            context.tracker.close("FAILED")
            raise ValueError(
                f"{args.config}: bert_init: missing required key (the paper preset names a BERT "
                "checkpoint in model.bert instead)"
            )

        def work():
            summary = pretrain_bert(
                config, config["data"]["root"], out, context.tracker, context.processor, progress=context.progress
            )
            write_json(out / "metrics.json", summary, indent=2)
            return summary

        _run_tracked(context.tracker, out, work)
    print(f"bert-init: {out / 'bert'}")
    return 0


def pretrain(args) -> int:
    """Pre-train VL-BERT with one setting's tasks (the settings: vlbert/registry.py). Re-running the
    same command resumes from the last checkpoint."""
    from ..engine.pretrain import pretrain as pretrain_setting
    from ..io import write_json
    from ..registry import setting

    chosen = setting(args.setting)
    out = Path(args.out)
    with _holding(out):
        # A fine-tuning seed's own pre-training is tagged with its seed; the setting's has none.
        tags = {SETTING_TAG: chosen.name} | ({} if args.seed is None else {SEED_TAG: args.seed})
        context = _training_context(args, "pretrain", tags)

        def work():
            summary = pretrain_setting(context, chosen, out, seed=args.seed)
            write_json(out / "metrics.json", summary, indent=2)
            return summary

        summary = _run_tracked(context.tracker, out, work)
    print(f"pretrain {chosen.name}: {summary.get('val', {})} -> {out / 'best'}")
    return 0


def finetune(args) -> int:
    """Fine-tune on each task with its learning rate and each seed: per-epoch validation, best epoch
    kept, test scored once; predictions written as `vlbert evaluate` reads them."""
    from ..config import load_config
    from ..engine.callbacks import TRACKING_FILE
    from ..engine.finetune import finetune as finetune_setting
    from ..registry import setting
    from .sweep import continue_trial

    chosen = setting(args.setting)
    if args.lr is not None and args.lr_from is not None:
        raise ValueError("give at most one of --lr and --lr-from")
    if args.continue_trial and args.train_fraction < 1:
        raise ValueError("--continue-trial continues a sweep's trial, which trained on the whole training set")
    if args.continue_trial and not (args.lr_from and Path(args.lr_from).is_dir()):
        raise ValueError("--continue-trial needs --lr-from with a sweep folder (its <task>/trials/ hold the runs)")
    preset = None if args.lr is not None or args.lr_from is not None else load_config(args.config)
    lrs = {task: _chosen_lr(args, task, preset, chosen.family) for task in args.task}
    per_seed = {name: _per_seed(getattr(args, name), args.seed, f"--{name}") for name in ("pretrained", "features")}
    # Every (task, seed) runs one after the other in this process (the imports paid once), each
    # its own MLflow run: in OUT itself for a single one, else in OUT/<task>/seed<N>/.
    runs = [(task, seed) for task in args.task for seed in args.seed]
    for task, seed in runs:
        out = Path(args.out) / task / f"seed{seed}" if len(runs) > 1 else Path(args.out)
        tags = {SETTING_TAG: chosen.name, TASK_TAG: task, SEED_TAG: seed, LR_TAG: lrs[task]}
        if args.train_fraction < 1:
            tags[TRAIN_FRACTION_TAG] = args.train_fraction
        seed_args = argparse.Namespace(**{**vars(args), **{name: given[seed] for name, given in per_seed.items()}})
        with _holding(out):
            context = _training_context(seed_args, "finetune", tags, setting=chosen, seed=seed)

            def work(context=context, task=task, seed=seed, out=out):
                if args.continue_trial:
                    trial = continue_trial(Path(args.lr_from) / task, seed, out)
                    if trial is not None:
                        context.tracker.log_params({"continued_from_trial": str(trial)})
                        recorded = trial / TRACKING_FILE  # the trial's MLflow run: its curves come along
                        if recorded.is_file():
                            context.tracker.inherit_history(json.loads(recorded.read_text())["run_id"])
                        print(f"finetune {chosen.name}/{task} seed {seed}: continuing the sweep's trial {trial}")
                return finetune_setting(
                    context, chosen, task, lrs[task], seed, out, train_fraction=args.train_fraction
                )

            metrics = _run_tracked(context.tracker, out, work)
        if metrics:
            print(
                f"finetune {chosen.name}/{task} seed {seed}: val {metrics['val']['accuracy']:.2f} "
                f"(epoch {metrics['best_epoch']}), test {metrics['test']['accuracy']:.2f}"
            )
    return 0


def _per_seed(given: list[str] | None, seeds: list[int], option: str) -> dict[int, str | None]:
    """An option given once for every seed, or once for each (in --seed's order): seed -> value."""
    if not given:
        return dict.fromkeys(seeds)
    if len(given) == 1:
        return dict.fromkeys(seeds, given[0])
    if len(given) != len(seeds):
        raise ValueError(
            f"{option}: give one for every seed or one for each of the {len(seeds)} seeds, not {len(given)}"
        )
    return dict(zip(seeds, given))


def _chosen_lr(args, task: str, preset: dict | None, family: str) -> float:
    """--lr, else the rate a sweep chose (--lr-from), else the preset's `finetune.<task>.lr` (the
    family's own where its `families` entry gives one)."""
    from ..config import finetune_options
    from ..registry import task as task_spec

    if args.lr is not None:
        return args.lr
    if args.lr_from is not None:
        return _swept_lr(args.lr_from, task, len(args.task))
    options = finetune_options(preset, task, family)
    if "lr" not in options:
        key = f"finetune.{task_spec(task).options_key}.lr"
        raise ValueError(f"{args.config}: {key} is not set; give --lr or --lr-from for {task}")
    return float(options["lr"])


def _swept_lr(lr_from: str, task: str, tasks: int) -> float:
    """The learning rate a sweep chose: from its best.json, or from SWEEP_DIR/<task>/best.json."""
    from .sweep import read_best_lr

    path = Path(lr_from)
    if path.is_dir():
        return read_best_lr(path / task / "best.json")
    if tasks > 1:
        raise ValueError(f"--lr-from {lr_from}: several tasks need a sweep folder holding <task>/best.json")
    return read_best_lr(path)


def sweep(args) -> int:
    """A grid over the tasks and the preset's sweep.lrs in one Ray Tune run, ASHA's rungs on each
    task's validation accuracy (a trial stopped only beyond the val split's noise), the choice
    (the preset's rate unless another beats it beyond that noise) written to OUT/<task>/best.json.
    MLflow: a parent run per task with a child run per trial."""
    from ..registry import setting

    chosen = setting(args.setting)
    with _holding(Path(args.out)):  # a second sweep into the folder stops at once
        return _sweep(args, chosen)


def _sweep(args, chosen) -> int:
    import os

    from ..tracking import make_tracker
    from .sweep import run_sweeps

    context = _training_context(args, "sweep", {SETTING_TAG: chosen.name}, tracked=False, setting=chosen)

    def parent(task):
        return make_tracker(
            context.preset,
            f"sweep-{chosen.name}-{task}",
            {STAGE_TAG: "sweep", SETTING_TAG: chosen.name, TASK_TAG: task},
            enabled=not args.no_tracking,
        )

    summaries = run_sweeps(
        context.preset,
        chosen.name,
        args.task,
        args.out,
        context.inputs,
        device=context.device,
        cores=args.cores or os.cpu_count(),
        make_parent=parent,
    )
    for task, summary in summaries.items():
        print(f"sweep {chosen.name}/{task}: best lr {summary['lr']:g} (val {summary['val_accuracy']:.2f})")
    return 0


def ui(args) -> int:
    """Print the address of the study's runs table, then serve MLflow's UI over the preset's tracking
    store (a tracking server: only print the address)."""
    from ..config import load_config
    from .ui import serve

    return serve(load_config(args.config), args.host, args.port, args.tracking_uri)


def fingerprint(args) -> int:
    """Digest each stage's outputs of a study's results folder, in the DAG's order; with --against,
    compare two runs (folders or saved fingerprints): the stage where they first part, and by how
    much. Exit status 1 when they part."""
    from . import fingerprint as fp

    results = Path(args.results)
    if args.against is None:
        stages = fp.fingerprint(results)
        if args.out:
            fp.save(stages, args.out)
        else:
            print(json.dumps(stages, indent=1))
        return 0
    against = Path(args.against)
    rows = fp.compare(fp.load(results), fp.load(against))
    print(fp.render(rows, results if results.is_dir() else None, against if against.is_dir() else None))
    return 0 if fp.first_parting(rows) is None else 1


def report(args) -> int:
    """Read the study's runs from MLflow and write table4.{md,csv,tex}, findings.md, figures/*.png and
    runs.csv."""
    from ..config import dataset_root, load_config
    from ..registry import TASKS
    from ..tracking import default_tracking_uri, end_dead_runs, experiment_name
    from .report import write_report

    config = load_config(args.config)
    uri = args.tracking_uri or default_tracking_uri(config)
    experiment = experiment_name(config)
    end_dead_runs(uri, experiment)  # a killed job's run is shown as killed, not as one still going
    layout = Layout(config["name"])
    sweeps = sorted(Path(args.sweeps or layout.sweeps).glob("*/*/best.json"))
    (vcr_split,) = TASKS["vcr_q2a"].splits[TASKS["vcr_q2a"].table4_split]
    vcr_reported = dataset_root(config, "vcr") / f"{vcr_split}.jsonl"
    summary = write_report(
        uri,
        experiment,
        args.out,
        sweeps,
        vcr_reported if vcr_reported.is_file() else None,
        detector_dir=layout.detector,
        floors_path=layout.floors,
        data_root=config["data"].get("root"),
        features_dir=layout.features,
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
        from ..io import write_json

        write_json(out, result, indent=2)


def evaluate_vqa(args) -> int:
    """Predictions in the official results format, [{"question_id": ..., "answer": ...}], one per
    annotated question."""
    from ..data.errors import load_json
    from ..data.vqa import complementary_pairs_name, read_annotations, read_complementary_pairs
    from ..evaluation.vqa_eval import pair_accuracy, vqa_accuracy

    annotations = read_annotations(args.annotations)
    questions = load_json(args.questions, "VQA questions")["questions"]
    asked = {q["question_id"] for q in questions}
    annotations = {q: a for q, a in annotations.items() if q in asked}
    predictions = _predictions(args.predictions, "question_id", "answer", _is_answer, "a string")
    result = vqa_accuracy(annotations, predictions, source=args.predictions)
    # VQA v2's complementary pairs beside the annotations (the synthetic world writes them for
    # every set): both members right, the balanced pairs' measure.
    pairs_file = Path(args.annotations).with_name(
        complementary_pairs_name(Path(args.annotations).name.removeprefix("v2_mscoco_").split("_annotations")[0])
    )
    if pairs_file.is_file():
        result["pair_accuracy"] = pair_accuracy(annotations, predictions, read_complementary_pairs(pairs_file))
    print(
        f"VQA accuracy: {result['overall']:.2f}  "
        + "  ".join(f"{k}: {v:.2f}" for k, v in result["perAnswerType"].items())
        + (f"  pairs: {result['pair_accuracy']:.2f}" if "pair_accuracy" in result else "")
    )
    _write_result(result, args.out)
    return 0


def evaluate_vcr(args) -> int:
    """Predictions: the project's JSON, [{"annot_id": ..., "answer": i, "rationale": j}] (or
    answer_probs / rationale_probs, four scores each), one per question; or the leaderboard's CSV
    (`vlbert vcr-leaderboard`), scored as the leaderboard does."""
    from ..data.vcr import read_vcr
    from ..evaluation.vcr_eval import leaderboard_predictions, read_leaderboard_csv, vcr_accuracy, vcr_choices

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


def evaluate_refcoco(args) -> int:
    """Predictions: the project's JSON, [{"sent_id": ..., "bbox": [x, y, w, h]}]."""
    from ..data.refcoco import SPLITS, RefCOCO
    from ..evaluation.refcoco_eval import refcoco_accuracy

    dataset = RefCOCO(args.root)
    expressions = [
        e for split in SPLITS if any(r["split"] == split for r in dataset.refs) for e in dataset.expressions(split)
    ]
    predictions = _predictions(args.predictions, "sent_id", "bbox", _is_box, "[x, y, w, h] numbers")
    result = refcoco_accuracy(expressions, predictions, iou_convention=args.iou_convention, source=args.predictions)
    print(
        f"RefCOCO+ accuracy (IoU >= 0.5, {args.iou_convention}): "
        + "  ".join(f"{k}: {v:.2f}" for k, v in result.items() if k != "n_expressions")
    )
    _write_result(result, args.out)
    return 0


def vcr_leaderboard(args) -> int:
    """The leaderboard's CSV (annot_id, answer_0..3, rationale_conditioned_on_a{i}_{j}): the answer
    scores from the Q->A run's predictions_<split>.json, the rationale scores after each of the
    four answers from the QA->R run's best model. A labelled split's CSV is also scored as the
    leaderboard scores it."""
    from ..engine.vcr_leaderboard import run_metrics, write_vcr_submission
    from ..registry import setting

    # The QA->R run's setting names the pre-trained checkpoint it started from.
    chosen = setting(run_metrics(args.qa2r, "vcr_qa2r")["setting"])
    context = _training_context(args, "vcr_leaderboard", {}, tracked=False, setting=chosen)
    summary = write_vcr_submission(context, args.q2a, args.qa2r, args.split, args.out)
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
    from ..data.errors import DataFormatError, load_json

    records = load_json(path, "predictions")
    if not isinstance(records, list):
        raise DataFormatError(path, "predictions are a JSON list of objects")
    seen, repeated = {}, []
    for k, record in enumerate(records):
        if not isinstance(record, dict) or key not in record:
            raise DataFormatError(path, f"missing key {key!r}", key=f"[{k}].{key}")
        if record[key] in seen and record[key] not in repeated:
            repeated.append(record[key])
        seen.setdefault(record[key], k)
    if repeated:
        # A second answer for one question would replace the first unseen and move the score.
        shown = ", ".join(f"{i!r} (records {seen[i]} and more)" for i in repeated[:5])
        more = f" and {len(repeated) - 5} more" if len(repeated) > 5 else ""
        raise DataFormatError(path, f"{len(repeated)} {key}s predicted more than once: {shown}{more}")
    return records


def _is_answer(value) -> bool:
    return isinstance(value, str)


def _is_box(value) -> bool:
    number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    return isinstance(value, list) and len(value) == 4 and all(map(number, value))


def _predictions(path, key: str, value: str, valid, expected: str) -> dict:
    """{record[key]: record[value]} of a predictions file, each value checked by `valid` (what it
    should be: `expected`), so that a null or a number is refused naming its record, not met as
    a traceback in the metric's code."""
    from ..data.errors import DataFormatError

    out = {}
    for k, record in enumerate(_records(path, key)):
        if value not in record:
            raise DataFormatError(path, f"missing key {value!r}", key=f"[{k}].{value}")
        if not valid(record[value]):
            raise DataFormatError(
                path, f"the {value} is {json.dumps(record[value])}, not {expected}", key=f"[{k}].{value}"
            )
        out[record[key]] = record[value]
    return out
