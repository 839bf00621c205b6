"""What a training stage runs with, gathered once by the caller (the CLI, a sweep trial, a benchmark):
its inputs (`run_inputs`) and the context around them (`training_context`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..config import pretraining_seed
from ..layout import Layout


@dataclass(frozen=True)
class RunInputs:
    """Where a run reads from. `bert` may be a hub id; `pretrained` is None for a setting without
    pre-training, which starts from `bert` and the detector in `detector_dir`."""

    data_root: Path
    features_dir: Path
    bert: str | Path | None = None
    detector_dir: Path | None = None
    pretrained: Path | None = None


def run_inputs(
    preset: dict,
    setting=None,
    *,
    data_root=None,
    features_dir=None,
    bert=None,
    detector_dir=None,
    pretrained=None,
    seed: int | None = None,
) -> RunInputs:
    """The one place a run's inputs are resolved, for the CLI's runs (study/runs.py, from its
    arguments) and the sweep's trials (study/sweep.py, from the inputs the sweep's CLI run resolved,
    made absolute): each one given, else the preset's (`data.root`, `model.bert`), else where the
    study's layout keeps it; `pretrained`, else the pre-trained checkpoint of a `setting` that
    pre-trains (else None: the run starts from BERT), the one fine-tuning `seed` has of its own
    where the preset gives each seed one (`pretrain.per_seed`).

    A BERT named by a string is a folder when one of that name exists, else a hub id; the layout's
    stays a path even when missing, so that loading it fails as a missing checkpoint (build.py)."""
    layout = Layout(preset["name"])
    bert = bert or preset["model"].get("bert") or layout.bert
    if isinstance(bert, str) and Path(bert).exists():
        bert = Path(bert)
    if not pretrained and setting is not None and setting.pretrains:
        pretrained = layout.pretrained(setting.name, None if seed is None else pretraining_seed(preset, seed))
    return RunInputs(
        data_root=Path(data_root or preset["data"]["root"]),
        features_dir=Path(features_dir or layout.features),
        bert=bert,
        detector_dir=Path(detector_dir or layout.detector),
        pretrained=pretrained,
    )


@dataclass(frozen=True)
class TrainingContext:
    """The preset, the run's inputs, its tokenizer (`processor`), its MLflow tracker, the device,
    whether to show progress bars, and more callbacks for the training loop (a sweep trial's Ray
    reporting; engine/callbacks.py)."""

    preset: dict
    inputs: RunInputs
    processor: object
    tracker: object
    device: str = "cpu"
    progress: bool = True
    callbacks: tuple = ()


def training_context(
    preset: dict,
    inputs: RunInputs,
    make_tracker,
    device: str = "cpu",
    progress: bool = True,
    callbacks: tuple = (),
    bert_tokenizer: bool = True,
) -> TrainingContext:
    """The one place a TrainingContext is made, for the CLI's runs (study/runs.py) and the sweep's
    trials (study/sweep.py): the preset and inputs as given; the tokenizer of the BERT in
    `inputs.bert` (with `bert_tokenizer=False`, BERT's uncased WordPiece alone: bert-init makes
    the BERT), cut at the preset's `model.max_text_length`; and the tracker `make_tracker()`
    gives, called once the tokenizer is loaded (a missing BERT fails before a tracker's run opens)."""
    from .build import load_processor  # modeling and transformers: only once a stage is set up

    processor = load_processor(inputs.bert if bert_tokenizer else None, preset["model"].get("max_text_length", 64))
    return TrainingContext(
        preset, inputs, processor, make_tracker(), device, progress=progress, callbacks=tuple(callbacks)
    )
