"""One canonical name per setting and task, and every fact about them.

These strings are the Snakemake wildcards, the CLI choices, the MLflow tags and the report's
rows and columns; nothing else defines them. A task's entry also says which feature stores and
data set splits it reads, its head, its preset section and its Table 4 column, so a new task is
one entry here and its adapter in vlbert/tasks/.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


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


class Store(NamedTuple):
    """A feature store: the regions of one split of a data set, detected (det) or given (gt)."""

    dataset: str
    split: str  # the data set's own split name
    boxes: str  # det | gt

    @property
    def name(self) -> str:
        """The file stem, as the workflow's extract_rois rule writes it."""
        return f"{self.dataset}.{self.split}.{self.boxes}"


@dataclass(frozen=True)
class TaskSpec:
    """What the study knows of a fine-tuning task; its adapter (vlbert/tasks/) does the reading."""

    name: str
    adapter: str  # "module:Class" of its task adapter, imported when the task is built
    model_class: str  # the vlbert.modeling class of its head
    options_key: str  # the preset's finetune.<key> section: optimiser, epochs, batch size; sweep.lrs' key
    stores: dict[str, Store]  # per split (train, val, test): the store its regions come from
    splits: dict[str, tuple[str, ...]]  # per split: the data set's own splits it reads
    title: str  # the report's name for it
    table4_split: str | None = None  # the split its Table 4 column reports; None: not a column
    table4_title: str | None = None  # that column's header


@dataclass(frozen=True)
class DerivedTask:
    """A figure combined from trained tasks' predictions, never trained itself."""

    name: str
    parts: tuple[str, ...]  # the tasks whose predictions it combines
    title: str


def _vcr(name: str, title: str) -> TaskSpec:
    # VCR reads its given boxes, as VL-BERT does.
    return TaskSpec(
        name,
        adapter="vlbert.tasks.vcr:VCRTask",
        model_class="VLBertForVCR",
        options_key="vcr",
        stores={s: Store("vcr", s, "gt") for s in ("train", "val", "test")},
        splits={s: (s,) for s in ("train", "val", "test")},
        title=title,
        table4_split="val",
        table4_title=f"{title} (val)",
    )


def _refcoco(name: str, boxes: str, title: str, table4: bool) -> TaskSpec:
    # RefCOCO+'s splits share one image set, so one store; its test split is testA and testB.
    return TaskSpec(
        name,
        adapter="vlbert.tasks.refcoco:RefCOCOTask",
        model_class="VLBertForRefCOCO",
        options_key="refcoco",
        stores={s: Store("refcoco+", "all", boxes) for s in ("train", "val", "test")},
        splits={"train": ("train",), "val": ("val",), "test": ("testA", "testB")},
        title=title,
        table4_split="val" if table4 else None,
        table4_title=f"{title} (val)" if table4 else None,
    )


# VQA v2's question sets: Table 4 reports test-dev.
_VQA_SPLITS = {"train": "train2014", "val": "val2014", "test": "test-dev2015"}

# The fine-tuning tasks, Table 4's columns in its order; refcoco_gt is the ground-truth-box track.
TASKS = {
    t.name: t
    for t in (
        _vcr("vcr_q2a", "VCR Q->A"),
        _vcr("vcr_qa2r", "VCR QA->R"),
        TaskSpec(
            "vqa",
            adapter="vlbert.tasks.vqa:VQATask",
            model_class="VLBertForVQA",
            options_key="vqa",
            stores={s: Store("vqa", name, "det") for s, name in _VQA_SPLITS.items()},
            splits={s: (name,) for s, name in _VQA_SPLITS.items()},
            title="VQA",
            table4_split="test",
            table4_title="VQA (test-dev)",
        ),
        _refcoco("refcoco_det", "det", "RefCOCO+ det", table4=True),
        _refcoco("refcoco_gt", "gt", "RefCOCO+ gt", table4=False),
    )
}
TABLE4_TASKS = tuple(name for name, spec in TASKS.items() if spec.table4_split)
DERIVED_TASKS = {"vcr_q2ar": DerivedTask("vcr_q2ar", parts=("vcr_q2a", "vcr_qa2r"), title="VCR Q->AR")}

# The data sets: the detector's (COCO's layout, standing in for Visual Genome), pre-training's
# captions and text corpus, and the tasks'.
DATASETS = ("detector", "conceptual_captions", "text_corpus", "vqa", "vcr", "refcoco+")
DETECTOR_SPLITS = ("train2017", "val2017")
PRETRAINING_STORES = {s: Store("conceptual_captions", s, "det") for s in ("train", "val")}
# Every store the study extracts: pre-training's, then each task's.
FEATURE_STORES = tuple(PRETRAINING_STORES.values()) + tuple(
    sorted({store for spec in TASKS.values() for store in spec.stores.values()})
)


def _image_splits() -> dict[str, tuple[str, ...]]:
    """The splits of each data set whose images are extracted: pre-training's, the tasks' in their
    order, the detector's."""
    splits = {}
    for store in (*PRETRAINING_STORES.values(), *(s for spec in TASKS.values() for s in spec.stores.values())):
        if store.split not in splits.setdefault(store.dataset, ()):
            splits[store.dataset] += (store.split,)
    return {**splits, "detector": DETECTOR_SPLITS}


IMAGE_SPLITS = _image_splits()


def task(name: str) -> TaskSpec:
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; expected one of {', '.join(TASKS)}") from None


def setting(name: str) -> Setting:
    try:
        return SETTINGS[name]
    except KeyError:
        raise ValueError(f"unknown setting {name!r}; expected one of {', '.join(SETTINGS)}") from None
