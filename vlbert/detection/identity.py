"""Which detector a feature store's regions come from: extraction records the identity of the
weights it ran as the store attribute `detector_weights`; training compares it with the study's
detector, so that the regions of another detector are refused, not read."""

from __future__ import annotations

import json
from pathlib import Path

from ..data.feature_store import DETECTOR_ATTR

__all__ = ["DETECTOR_ATTR", "detector_weights", "study_detector", "weights_identity"]


def detector_weights(config: dict, detector_dir) -> Path:
    """The weights file extraction runs: a given detectron2 model's (as the study's detector folder
    describes it, else as the preset names it), else the trained detector's."""
    if config.get("detector", {}).get("backend") == "detectron2":
        from .model import CONFIG_FILE

        if detector_dir is not None and (Path(detector_dir) / CONFIG_FILE).is_file():
            from .detectron2 import read_description

            return Path(read_description(detector_dir)["weights"])
        return Path(config["detector"]["detectron2"]["weights"])
    from .model import WEIGHTS_FILE

    return Path(detector_dir) / WEIGHTS_FILE


def weights_identity(path) -> str:
    """The attribute's value for a weights file: its SHA-256 (size and time past 64 MiB), as JSON.
    The weights, not the folder: a detector trained again into the same folder is another one."""
    from ..io import file_identity

    return json.dumps(file_identity(path))


def study_detector(config: dict, detector_dir) -> str | None:
    """The identity of the study's detector weights; None where they are not at hand (no detector
    folder given, or no weights in it), and nothing can be compared."""
    if detector_dir is None and config.get("detector", {}).get("backend") != "detectron2":
        return None
    path = detector_weights(config, detector_dir)
    return weights_identity(path) if path.is_file() else None
