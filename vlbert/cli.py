"""`vlbert <verb> ...`: argument parsing only; what each verb does is vlbert/study/runs.py's."""

from __future__ import annotations

import argparse
import os
import sys

from . import __version__
from .layout import Layout

# The defaults the help texts name: where vlbert/layout.py keeps them for any preset.
STUDY = Layout("<preset>")
PRETRAINED_HELP = f"pre-trained checkpoint (default: {STUDY.pretrained('<setting>')})"


def _add_device_arguments(p) -> None:
    p.add_argument("--device", default="auto", help="auto (a GPU where there is one, else the CPU), cpu or cuda[:N]")
    p.add_argument("--threads", type=int, default=2, help="CPU threads for torch")


def _add_data_argument(p) -> None:
    p.add_argument("--data", help="data root (default: the preset's data.root)")


def _add_quiet_argument(p) -> None:
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _add_runtime_arguments(p) -> None:
    _add_device_arguments(p)
    p.add_argument("--no-tracking", action="store_true", help="do not log to MLflow")


def _add_training_arguments(p, per_seed: bool = False) -> None:
    """`per_seed`: --features may name one folder for each of the run's --seed (in their order)."""
    _add_data_argument(p)
    if per_seed:
        p.add_argument(
            "--features",
            nargs="+",
            help=f"feature stores folder, or one for each seed (default: {STUDY.features})",
        )
    else:
        p.add_argument("--features", help=f"feature stores folder (default: {STUDY.features})")
    p.add_argument("--detector", help=f"detector folder (default: {STUDY.detector})")
    p.add_argument("--bert", help=f"BERT checkpoint (default: the preset's model.bert, else {STUDY.bert})")
    p.add_argument("--run-name", help="MLflow run name")
    _add_quiet_argument(p)
    _add_runtime_arguments(p)


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:  # NaN fails too
        raise argparse.ArgumentTypeError(f"a fraction in (0, 1], got {text}")
    return value


def _add_verb(verbs, name: str, run, help: str, preset: bool = True) -> argparse.ArgumentParser:
    """A verb that `run` (vlbert/study/runs.py) does; its docstring is the verb's description."""
    p = verbs.add_parser(name, help=help, description=run.__doc__)
    if preset:
        p.add_argument("--config", required=True, help="preset YAML (experiments/*.yaml)")
    p.set_defaults(func=run)
    return p


def _add_evaluate_verb(verbs) -> None:
    from .evaluation.refcoco_eval import IOU_CONVENTIONS
    from .study import runs

    p = verbs.add_parser(
        "evaluate",
        help="score predictions with the official metrics",
        description="Score prediction files with the official metrics (docs/evaluation.md: which official "
        "version each follows). Predictions must cover exactly the annotated questions.",
    )
    tasks = p.add_subparsers(dest="task", required=True, metavar="<task>")
    q = _add_verb(tasks, "vqa", runs.evaluate_vqa, "VQA accuracy (the current official script's)", preset=False)
    q.add_argument("--questions", required=True, help="v2_OpenEnded_mscoco_<split>_questions.json")
    q.add_argument("--annotations", required=True, help="v2_mscoco_<split>_annotations.json")
    q.add_argument("--predictions", required=True, help="predictions JSON")
    q = _add_verb(tasks, "vcr", runs.evaluate_vcr, "VCR Q->A, QA->R and Q->AR accuracy", preset=False)
    q.add_argument("--annotations", required=True, help="VCR <split>.jsonl with labels")
    q.add_argument(
        "--predictions",
        required=True,
        nargs="+",
        help="predictions JSON (a Q->A and a QA->R file together give Q->AR) or a leaderboard CSV",
    )
    q = _add_verb(tasks, "refcoco", runs.evaluate_refcoco, "RefCOCO+ accuracy at IoU >= 0.5, per split", preset=False)
    q.add_argument("--root", required=True, help="folder with refs(unc).p and instances.json")
    q.add_argument(
        "--iou-convention",
        choices=IOU_CONVENTIONS,
        default="continuous",
        help="continuous: a box's area is w * h (COCO, pycocotools); plus-one: each side counts one pixel "
        "more, width x2 - x1 + 1 (the released VL-BERT code's evaluation)",
    )
    q.add_argument("--predictions", required=True, help="predictions JSON")
    for q in tasks.choices.values():
        q.add_argument("--out", help="also write the figures as JSON here")


def build_parser() -> argparse.ArgumentParser:
    from .registry import IMAGE_SPLITS, SETTINGS, TASKS
    from .study import runs

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

    p = _add_verb(verbs, "make-data", runs.make_data, "write the synthetic world in the real data sets' formats")
    p.add_argument("--out", help="output folder (default: the preset's data.root)")
    p.add_argument("--only", nargs="+", metavar="DATASET", help="write only these data sets")
    p.add_argument("--force", action="store_true", help="rewrite data sets that are up to date")
    _add_quiet_argument(p)

    p = _add_verb(
        verbs,
        "floors",
        runs.floors,
        "the tasks' blind floors (question-only, text-only, no-colour rule) from the files",
    )
    p.add_argument("--out", help="output JSON (default: the preset's results/<name>/floors.json)")

    p = _add_verb(verbs, "train-detector", runs.train_detector, "train the Faster R-CNN on the detector split")
    p.add_argument("--data", required=True, help="detector data folder (COCO layout)")
    p.add_argument("--out", required=True, help="output folder for the weights, config and metrics")
    _add_runtime_arguments(p)

    p = _add_verb(
        verbs,
        "describe-detector",
        runs.describe_detector,
        "the study's detector folder for a given detectron2 model (detector.backend: detectron2)",
    )
    p.add_argument("--out", required=True, help="the detector folder (its detector_config.json)")

    p = _add_verb(verbs, "extract-rois", runs.extract_rois, "detect regions and store their features (HDF5)")
    p.add_argument("--dataset", required=True, choices=list(IMAGE_SPLITS))
    p.add_argument("--split", required=True, help="; ".join(f"{d}: {', '.join(s)}" for d, s in IMAGE_SPLITS.items()))
    p.add_argument("--out", required=True, help="the store's HDF5 index to write (its shards go to <name>.shards/)")
    p.add_argument(
        "--detector",
        help="the study's detector folder (`vlbert train-detector`'s, or `vlbert describe-detector`'s "
        "for detectron2; default for detectron2: the preset's model)",
    )
    p.add_argument(
        "--chunk",
        help="only chunk N-of-M of the split's shards, and its manifest (the workflow's scatter); "
        "`vlbert index-store` then writes the index",
    )
    _add_data_argument(p)
    p.add_argument("--gt-boxes", action="store_true", help="features of the data set's own boxes (VCR, RefCOCO+)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument(
        "--on-bad-image",
        choices=["error", "skip"],
        default="error",
        help="a corrupt or missing image: stop with its path, or skip it and record it",
    )
    p.add_argument("--limit", type=int, help="only the first N images (quick looks)")
    _add_quiet_argument(p)
    _add_runtime_arguments(p)

    p = _add_verb(
        verbs, "index-store", runs.index_store, "write a store's index over its chunks' shards (gather)", preset=False
    )
    p.add_argument("--out", required=True, help="the store's HDF5 index, as given to extract-rois --out")
    p.add_argument("manifests", nargs="+", help="every chunk's manifest, <name>.shards/chunk_N-of-M.json")

    p = _add_verb(verbs, "bert-init", runs.bert_init, "pre-train the small BERT on the text corpus (embedded default)")
    p.add_argument("--out", required=True, help="output folder; the checkpoint lands in OUT/bert")
    _add_training_arguments(p)

    p = _add_verb(verbs, "pretrain", runs.pretrain, "pre-train one setting of the ablation")
    p.add_argument("--setting", required=True, choices=[s for s, spec in SETTINGS.items() if spec.pretrains])
    p.add_argument("--out", required=True, help="output folder (checkpoint/, best/, metrics.json)")
    p.add_argument(
        "--seed",
        type=int,
        help="seed (default: the preset's); another seed makes a fine-tuning seed's own pre-training "
        f"(pretrain.per_seed: {STUDY.pretrain('<setting>', '<seed>')})",
    )
    _add_training_arguments(p)

    p = _add_verb(verbs, "finetune", runs.finetune, "fine-tune one setting on one or more tasks")
    p.add_argument("--setting", required=True, choices=list(SETTINGS))
    p.add_argument(
        "--task",
        required=True,
        nargs="+",
        choices=list(TASKS),
        help="one or more tasks; several tasks or seeds: each run in OUT/<task>/seed<N>/",
    )
    p.add_argument(
        "--lr", type=float, help="learning rate (default: the preset's finetune.<task>.lr, or the family's own there)"
    )
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
    p.add_argument(
        "--train-fraction",
        type=_fraction,
        default=1.0,
        help="train on this share of each training set (the same examples for every setting and seed) "
        "for as many steps as the whole set gets (default 1)",
    )
    p.add_argument("--out", required=True)
    p.add_argument(
        "--pretrained",
        nargs="+",
        help=f"pre-trained checkpoint, or one for each seed (default: {STUDY.pretrained('<setting>')}; "
        f"with pretrain.per_seed, a seed but the first starts from {STUDY.pretrained('<setting>', '<seed>')})",
    )
    _add_training_arguments(p, per_seed=True)

    p = _add_verb(
        verbs, "tune-features", runs.tune_features, "recompute feature stores with a pre-trained, tuned Fast R-CNN"
    )
    p.add_argument("--pretrained", required=True, help="pre-trained checkpoint folder (pretrain/<setting>/best)")
    p.add_argument("--store", required=True, nargs="+", help="feature stores written by extract-rois")
    p.add_argument("--out", required=True, help="output folder")
    _add_data_argument(p)
    p.add_argument("--batch-size", type=int, default=32)
    _add_quiet_argument(p)
    _add_device_arguments(p)

    p = _add_verb(verbs, "sweep", runs.sweep, "Ray Tune learning-rate sweeps for one setting")
    p.add_argument("--setting", required=True, choices=list(SETTINGS))
    p.add_argument("--task", required=True, nargs="+", choices=list(TASKS))
    p.add_argument("--out", required=True)
    p.add_argument("--pretrained", help=PRETRAINED_HELP)
    p.add_argument("--cores", type=int, help="CPU cores the sweep may use (default: all)")
    _add_training_arguments(p)

    p = _add_verb(
        verbs,
        "vcr-leaderboard",
        runs.vcr_leaderboard,
        "the VCR leaderboard's submission CSV from a Q->A and a QA->R run",
    )
    p.add_argument("--q2a", required=True, help="a finished vcr_q2a fine-tuning run (its folder)")
    p.add_argument("--qa2r", required=True, help="a finished vcr_qa2r fine-tuning run (its folder)")
    p.add_argument("--split", default="test", choices=["val", "test"])
    p.add_argument("--out", required=True, help="the CSV to write")
    p.add_argument(
        "--pretrained",
        help="the checkpoint the QA->R run started from, for setting full: checks that --features are its "
        f"tuned features (default: {STUDY.pretrained('<setting>')})",
    )
    _add_data_argument(p)
    p.add_argument(
        "--features", help=f"the feature stores the QA->R run was fine-tuned on (default: {STUDY.features})"
    )
    p.add_argument("--bert", help="BERT checkpoint whose tokenizer the runs used (default: as fine-tuning's)")
    _add_device_arguments(p)

    p = _add_verb(verbs, "report", runs.report, "Table 4, the paper's findings and figures, read back from MLflow")
    p.add_argument("--out", required=True, help=f"the report folder ({STUDY.reports}/)")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: the preset's)")
    p.add_argument("--sweeps", help=f"folder of <setting>/<task>/best.json (default: {STUDY.sweeps})")

    p = _add_verb(verbs, "ui", runs.ui, "MLflow's UI over the preset's runs, opened on the study's runs table")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    p.add_argument("--port", type=int, default=5000)
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: the preset's)")

    p = _add_verb(verbs, "fingerprint", runs.fingerprint, "where two runs of a study part", preset=False)
    p.add_argument("results", help=f"a results folder ({STUDY.results}) or a saved fingerprint JSON")
    p.add_argument("--against", help="another run's results folder or fingerprint JSON to compare with")
    p.add_argument("--out", help="write the fingerprint JSON here (default: print it)")

    _add_evaluate_verb(verbs)
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
    if getattr(args, "device", None) == "auto":
        from .engine.device import resolve_device

        args.device = resolve_device(args.device)
    # Our own bars say what is going on. transformers takes its default from huggingface_hub's
    # variable when it is imported: set so, commands that never load it do not pay its import.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
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
        if "torch.distributed" in sys.modules:  # leave a torchrun process group, if this process joined one
            from .engine.distributed import shutdown

            shutdown()


if __name__ == "__main__":
    sys.exit(main())
