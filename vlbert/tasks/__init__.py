"""Task adapters: pre-training's (pretraining.py) and one file per fine-tuning task family.

A fine-tuning task is its entry in vlbert/registry.py (stores, splits, head, preset section,
Table 4 column) and its adapter here (base.Task: reading, targets, collation, predictions,
official score); `build` makes the adapter the entry names.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from ..registry import task
from .base import Task


def build(name: str, processor, data_root, features_dir, family: str = "vlbert") -> Task:
    """The adapter of task `name`, as its registry entry names it ("module:Class"), for a model
    of `family` (its head class, and whether its batches carry the images)."""
    module, _, cls = task(name).adapter.partition(":")
    return getattr(importlib.import_module(module), cls)(name, processor, Path(data_root), Path(features_dir), family)
