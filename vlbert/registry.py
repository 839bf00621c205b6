"""One canonical name per model family, setting and task, and every fact about them.

These strings are the Snakemake wildcards, the CLI choices, the MLflow tags and the report's
rows and columns; nothing else defines them. A task's entry also says which feature stores and
data set splits it reads, its head, its preset section and its Table 4 column, so a new task is
one entry here and its adapter in vlbert/tasks/. A model family's entry names its classes (which
`family_class` looks up and `vlbert.modeling.register_family` puts on transformers' Auto classes), its cost to the
workflow's scheduler and its rows in the systems table, so a new family is one entry here, its rows
in SETTINGS, and its files: in vlbert/modeling/, or any module its entry's `module` names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


@dataclass(frozen=True)
class ModelFamily:
    """A system of the seed papers: its classes (`family_class`) and what its inputs need."""

    name: str
    title: str  # the report's name for it
    pretraining_class: str
    head_classes: dict[str, str]  # per task head (TaskSpec.head): its class
    config_class: str  # in configuration_<name>.py; its model_type is the family's name
    model_class: str  # the encoder, AutoModel's class for the family
    # The workflow's scheduling weights (workflow/rules/common.smk): a fine-tuning job and a
    # pre-training run's base, in VL-BERT fine-tuning jobs. Rough ratios of the reference mini run
    # (docs/history.md, "How long the study takes"); they need only be roughly right.
    finetune_cost: float
    pretrain_cost: float
    system_rows: tuple[str, ...]  # its settings in the systems table, in the table's order
    # Masked regions: their pixels zeroed and features recomputed by the Fast R-CNN module
    # (VL-BERT), or their cached features zeroed (ViLBERT).
    masks_region_pixels: bool = True
    reads_pixels: bool = False  # its visual input is the image itself (Pixel-BERT), not regions
    # It fine-tunes Table 4's tasks alone, the systems table's columns: RefCOCO+'s ground-truth
    # track is VL-BERT's (the paper's main results), and the study reads it for no other system.
    table4_tasks_only: bool = False
    # The module whose attributes are its classes (config, encoder, pre-training model, heads), for
    # a family whose files live outside vlbert/modeling/. None: vlbert.modeling's lazy names, from
    # its configuration_<name>.py and modeling_<name>.py.
    module: str | None = None

    @property
    def class_names(self) -> tuple[str, ...]:
        """Its config, encoder, pre-training model and heads: every class `family_class` gives."""
        return (self.config_class, self.model_class, self.pretraining_class, *self.head_classes.values())

    @property
    def configuration_module(self) -> str:
        """The vlbert.modeling module of its config class."""
        return f"configuration_{self.name}"

    @property
    def modeling_module(self) -> str:
        """The vlbert.modeling module of its encoder, pre-training model and heads."""
        return f"modeling_{self.name}"


def _family(name: str, title: str, prefix: str, **facts) -> ModelFamily:
    heads = {head: f"{prefix}For{suffix}" for head, suffix in (("vqa", "VQA"), ("vcr", "VCR"), ("refcoco", "RefCOCO"))}
    classes = {"config_class": f"{prefix}Config", "model_class": f"{prefix}Model"}
    return ModelFamily(name, title, f"{prefix}ForPreTraining", heads, **classes, **facts)


# Costs: Pixel-BERT runs a CNN on every image of every step, ViLBERT's second stream adds a visual
# transformer and co-attention. Systems rows: without pre-training, (ablations,) pre-trained;
# VL-BERT's `c` has ViLBERT's objectives (masked words, masked regions, sentence-image relation;
# frozen detector, no corpus).
FAMILIES = {
    f.name: f
    for f in (
        _family(
            "vlbert",
            "VL-BERT",
            "VLBert",
            finetune_cost=1.0,
            pretrain_cost=0.5,
            system_rows=("no_pretrain", "c", "full"),
        ),
        _family(
            "vilbert",
            "ViLBERT",
            "ViLBert",
            finetune_cost=1.6,
            pretrain_cost=0.8,
            system_rows=("vilbert_no_pretrain", "vilbert"),
            masks_region_pixels=False,
            table4_tasks_only=True,
        ),
        _family(
            "pixelbert",
            "Pixel-BERT",
            "PixelBert",
            finetune_cost=3.3,
            pretrain_cost=2.75,
            system_rows=("pixelbert_no_pretrain", "pixelbert_no_sampling", "pixelbert"),
            masks_region_pixels=False,
            reads_pixels=True,
            table4_tasks_only=True,
        ),
    )
}


@dataclass(frozen=True)
class Setting:
    name: str
    mlm_visual: bool  # masked language modelling with visual clues
    masked_roi: bool  # masked RoI classification with linguistic clues (ViLBERT: masked regions, KL)
    sentence_image: bool  # sentence-image relationship prediction (ViLBERT: alignment; Pixel-BERT: matching)
    text_corpus: bool  # text-only corpus mixed in 1:1 per batch
    tune_frcnn: bool  # the Fast R-CNN receives gradients
    family: str = "vlbert"
    pixel_sampling: bool = False  # Pixel-BERT's random pixel sampling in pre-training

    @property
    def pretrains(self) -> bool:
        return self.mlm_visual

    @property
    def model_family(self) -> ModelFamily:
        return FAMILIES[self.family]

    @property
    def pretraining_overrides(self) -> dict:
        """What its pre-training model's config takes over the preset's model section: a family
        that reads pixels keeps every pixel token where the setting does not sample them (the
        preset's `pixel_samples` are the sampling setting's)."""
        return {"pixel_samples": 0} if self.model_family.reads_pixels and not self.pixel_sampling else {}


SETTINGS = {
    s.name: s
    for s in (
        # VL-BERT's Table 4 rows.
        Setting("no_pretrain", False, False, False, False, False),
        Setting("a", True, False, False, False, False),
        Setting("b", True, True, False, False, False),
        Setting("c", True, True, True, False, False),
        Setting("d", True, True, False, True, False),
        Setting("full", True, True, False, True, True),
        # The other systems of the seed papers, each with its own pre-training objectives.
        Setting("vilbert_no_pretrain", False, False, False, False, False, family="vilbert"),
        Setting("vilbert", True, True, True, False, False, family="vilbert"),
        Setting("pixelbert_no_pretrain", False, False, False, False, False, family="pixelbert"),
        Setting("pixelbert_no_sampling", True, False, True, False, False, family="pixelbert"),
        Setting("pixelbert", True, False, True, False, False, family="pixelbert", pixel_sampling=True),
    )
}
TABLE4_SETTINGS = tuple(name for name, s in SETTINGS.items() if s.family == "vlbert")


def family_settings(families) -> tuple[str, ...]:
    """The settings of these model families, in SETTINGS' order."""
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        raise ValueError(f"unknown model families {', '.join(unknown)}; expected some of {', '.join(FAMILIES)}")
    return tuple(name for name, s in SETTINGS.items() if s.family in families)


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
    head: str  # its head in every model family (ModelFamily.head_classes)
    options_key: str  # the preset's finetune.<key> section: optimiser, epochs, batch size; sweep.lrs' key
    stores: dict[str, Store]  # per split (train, val, test): the store its regions come from
    splits: dict[str, tuple[str, ...]]  # per split: the data set's own splits it reads
    title: str  # the report's name for it
    # The split its Table 4 column reports, scored once with the chosen rate and epoch; val (the
    # selection split) chooses them and is never reported. None: not a column.
    table4_split: str | None = None
    table4_title: str | None = None  # that column's header


@dataclass(frozen=True)
class DerivedTask:
    """A figure combined from trained tasks' predictions, never trained itself."""

    name: str
    parts: tuple[str, ...]  # the tasks whose predictions it combines
    title: str


def _vcr(name: str, title: str) -> TaskSpec:
    # VCR reads its given boxes, as VL-BERT does. Table 4 reports a held-out labelled split (the
    # synthetic world's test; the real test's labels are the leaderboard's, `vlbert vcr-leaderboard`),
    # so that the rate is never chosen on the reported split.
    return TaskSpec(
        name,
        adapter="vlbert.tasks.vcr:VCRTask",
        head="vcr",
        options_key="vcr",
        stores={s: Store("vcr", s, "gt") for s in ("train", "val", "test")},
        splits={s: (s,) for s in ("train", "val", "test")},
        title=title,
        table4_split="test",
        table4_title=f"{title} (test)",
    )


def _refcoco(name: str, boxes: str, title: str, table4: bool) -> TaskSpec:
    # RefCOCO+'s splits share one image set, so one store; its test split is testA and testB.
    return TaskSpec(
        name,
        adapter="vlbert.tasks.refcoco:RefCOCOTask",
        head="refcoco",
        options_key="refcoco",
        stores={s: Store("refcoco+", "all", boxes) for s in ("train", "val", "test")},
        splits={"train": ("train",), "val": ("val",), "test": ("testA", "testB")},
        title=title,
        table4_split="test" if table4 else None,
        table4_title=f"{title} (testA+B)" if table4 else None,
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
            head="vqa",
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
# A data set whose synthetic writer (vlbert.data.synthetic) writes more than it did when earlier
# folders were made: its version, in the folder's stamp and in the DAG's make_data job, so that
# both make the folder again. Conceptual Captions 2: the grounding probe's word kinds.
WRITER_VERSIONS = {"conceptual_captions": 2}
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


def finetune_tasks(setting_name: str) -> tuple[str, ...]:
    """The tasks a setting fine-tunes, in TASKS' order: every one, or Table 4's where its family
    says so (ModelFamily.table4_tasks_only)."""
    return TABLE4_TASKS if setting(setting_name).model_family.table4_tasks_only else tuple(TASKS)


def task(name: str) -> TaskSpec:
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; expected one of {', '.join(TASKS)}") from None


def family_class(family: ModelFamily | str, name: str):
    """One of a family's classes (ModelFamily.class_names) by name, imported from its module:
    every lookup of a family's classes goes through here."""
    import importlib

    family = FAMILIES[family] if isinstance(family, str) else family
    if name not in family.class_names:
        raise ValueError(f"{name!r} is not a class of model family {family.name!r}: {', '.join(family.class_names)}")
    return getattr(importlib.import_module(family.module or "vlbert.modeling"), name)


def model_class_name(setting_name: str, task_name: str | None = None) -> str:
    """The class a setting trains: its family's pre-training model, or its head for a task."""
    family = setting(setting_name).model_family
    return family.pretraining_class if task_name is None else family.head_classes[task(task_name).head]


def setting(name: str) -> Setting:
    try:
        return SETTINGS[name]
    except KeyError:
        raise ValueError(f"unknown setting {name!r}; expected one of {', '.join(SETTINGS)}") from None
