"""What a training stage runs with, gathered once by the caller (the CLI, a sweep trial, a benchmark)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunInputs:
    """Where a run reads from. `bert` may be a hub id; `pretrained` is None for a setting without
    pre-training, which starts from `bert` and the detector in `detector_dir`."""

    data_root: Path
    features_dir: Path
    bert: str | Path | None = None
    detector_dir: Path | None = None
    pretrained: Path | None = None


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
