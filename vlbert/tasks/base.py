"""The fine-tuning task adapter: what every task's file (vqa.py, vcr.py, refcoco.py) implements.

A task reads its split with the data set's reader and its regions from the feature stores its
registry entry names, turns examples into batches for its head, turns outputs into predictions
(VQA's official result format; the project's JSON for VCR and RefCOCO+: docs/evaluation.md, "Readers and
metrics"), and scores them with the official metric (vlbert.evaluation), so that `vlbert
evaluate` on the written predictions gives the same figure.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..modeling.processing_study import StudyProcessor
from ..registry import FAMILIES, TaskSpec, family_class, task
from .regions import Regions, features_path, visual_batch


@dataclass
class Task:
    name: str
    processor: StudyProcessor
    data_root: Path
    features_dir: Path
    family: str = "vlbert"  # the model family whose head it feeds (vlbert.registry.FAMILIES)

    def __post_init__(self):
        """Subclasses read what every split shares (answer vocabulary, RefCOCO+ refs) here."""

    @property
    def spec(self) -> TaskSpec:
        return task(self.name)

    @property
    def model_class(self):
        return family_class(self.family, FAMILIES[self.family].head_classes[self.spec.head])

    def examples(self, split: str) -> list[dict]:
        raise NotImplementedError

    def collate(self, examples: list[dict]) -> dict:
        raise NotImplementedError

    def predictions(self, outputs, examples: list[dict]) -> list[dict]:
        raise NotImplementedError

    def score(self, predictions: list[dict], split: str) -> dict:
        raise NotImplementedError

    def item_scores(self, predictions: list[dict], split: str) -> dict:
        """Each item's score (percent) under the official metric, by the item's id: their mean is
        `score`'s accuracy (before its rounding). The report's paired statistics read them."""
        raise NotImplementedError

    def model_overrides(self) -> dict:
        return {}

    def store_paths(self) -> list[Path]:
        stores = dict.fromkeys(self.spec.stores.values())  # RefCOCO+'s splits share one
        return [features_path(self.features_dir, store) for store in stores]

    def _visual(self, regions: list[Regions]):
        # Fast R-CNN stays frozen in fine-tuning: the stores hold its features (check_store_features).
        # A family that reads pixels (Pixel-BERT) gets the images as well.
        return visual_batch(regions, with_images=FAMILIES[self.family].reads_pixels, cached=True)
