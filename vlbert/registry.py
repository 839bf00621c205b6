"""One canonical name per setting and task.

These strings are the Snakemake wildcards, the CLI choices, the MLflow tags and the report's
rows and columns; nothing else defines them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    name: str
    mlm_visual: bool  # masked language modelling with visual clues
    masked_roi: bool  # masked RoI classification with linguistic clues
    sentence_image: bool  # sentence-image relationship prediction
    text_corpus: bool  # text-only corpus mixed in 1:1 per batch
    tune_frcnn: bool  # the Fast R-CNN receives gradients

    @property
    def pretrains(self) -> bool:
        return self.mlm_visual


SETTINGS = {
    s.name: s
    for s in (
        Setting("no_pretrain", False, False, False, False, False),
        Setting("a", True, False, False, False, False),
        Setting("b", True, True, False, False, False),
        Setting("c", True, True, True, False, False),
        Setting("d", True, True, False, True, False),
        Setting("full", True, True, False, True, True),
    )
}

# Fine-tuning tasks. The first four are Table 4's columns; refcoco_gt is the ground-truth-box
# track. vcr_q2ar is derived from a (vcr_q2a, vcr_qa2r) pair, never trained.
TABLE4_TASKS = ("vcr_q2a", "vcr_qa2r", "vqa", "refcoco_det")
TASKS = TABLE4_TASKS + ("refcoco_gt",)
DERIVED_TASKS = ("vcr_q2ar",)
# The feature stores (data set, split, boxes) each task reads: VCR its given boxes, as VL-BERT does.
TASK_STORES = {
    "vcr_q2a": [("vcr", "train", "gt"), ("vcr", "val", "gt"), ("vcr", "test", "gt")],
    "vcr_qa2r": [("vcr", "train", "gt"), ("vcr", "val", "gt"), ("vcr", "test", "gt")],
    "vqa": [("vqa", "train2014", "det"), ("vqa", "val2014", "det"), ("vqa", "test-dev2015", "det")],
    "refcoco_det": [("refcoco+", "all", "det")],
    "refcoco_gt": [("refcoco+", "all", "gt")],
}


def store_name(dataset: str, split: str, boxes: str) -> str:
    """A feature store's file stem, as the workflow's extract_rois rule writes it."""
    return f"{dataset}.{split}.{boxes}"


def setting(name: str) -> Setting:
    try:
        return SETTINGS[name]
    except KeyError:
        raise ValueError(f"unknown setting {name!r}; expected one of {', '.join(SETTINGS)}") from None
