"""The fine-tuning tasks: their examples, input format, head, predictions and official metric.

Each task reads its split with the data set's reader and its regions from the feature store,
turns examples into batches for its head, turns outputs into predictions (VQA's official result
format; the project's JSON for VCR and RefCOCO+: README, "Readers and metrics"), and scores them
with the official metric (vlbert.evaluation), so that `vlbert evaluate` on the written
predictions gives the same figure.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torchvision.ops import box_iou

from ..data.feature_store import FeatureStore
from ..modeling import VLBertForRefCOCO, VLBertForVCR, VLBertForVQA
from ..modeling.processing_vlbert import VLBertProcessor, Word, pad_batch
from ..registry import TASK_STORES, store_name
from .data import Regions, regions_of, visual_batch

SPLITS = ("train", "val", "test")


def features_path(features_dir, dataset: str, split: str, boxes: str) -> Path:
    """The store the workflow's extract_rois rule writes: <dataset>.<split>.<det|gt>.h5."""
    return Path(features_dir) / f"{store_name(dataset, split, boxes)}.h5"


BOX_MODES = {"det": "detected", "gt": "gt"}  # a store's `mode` attribute for each kind of boxes


def open_store(features_dir, dataset: str, split: str, boxes: str) -> FeatureStore:
    """That store, preloaded; one of another data set, split or kind of boxes under its name is
    refused (the image keys of two data sets can match, and the features would be read silently)."""
    return FeatureStore(
        features_path(features_dir, dataset, split, boxes),
        preload=True,
        expect={"dataset": dataset, "split": split, "mode": BOX_MODES[boxes]},
    )


@dataclass
class Task:
    name: str
    processor: VLBertProcessor
    data_root: Path
    features_dir: Path

    model_class = None
    options_key = None  # the preset's finetune section for this task

    def __post_init__(self):
        """Subclasses read what every split shares (answer vocabulary, RefCOCO+ refs) here."""

    def examples(self, split: str) -> list[dict]:
        raise NotImplementedError

    def collate(self, examples: list[dict]) -> dict:
        raise NotImplementedError

    def predictions(self, outputs, examples: list[dict]) -> list[dict]:
        raise NotImplementedError

    def score(self, predictions: list[dict], split: str) -> dict:
        raise NotImplementedError

    def model_overrides(self) -> dict:
        return {}

    def store_paths(self) -> list[Path]:
        return [features_path(self.features_dir, *store) for store in TASK_STORES[self.name]]

    def _visual(self, regions: list[Regions]):
        # Fast R-CNN stays frozen in fine-tuning: the stores hold its features (check_store_features).
        return visual_batch(regions, with_images=False, cached=True)


# ---- VQA -------------------------------------------------------------------------------------

VQA_SUBTYPES = {"train": "train2014", "val": "val2014", "test": "test-dev2015"}


class VQATask(Task):
    model_class = VLBertForVQA
    options_key = "vqa"

    def __post_init__(self):
        from ..data.vqa import read_answer_vocabulary

        self.root = self.data_root / "vqa"
        self.answers = read_answer_vocabulary(self.root / "answers_vqa.txt")
        self.answer_index = {a: k for k, a in enumerate(self.answers)}
        self._annotations = {}

    def model_overrides(self):
        return {"num_answers": len(self.answers)}

    def annotations(self, split: str) -> dict:
        from ..data.vqa import read_annotations

        if split not in self._annotations:
            self._annotations[split] = read_annotations(
                self.root / f"v2_mscoco_{VQA_SUBTYPES[split]}_annotations.json"
            )
        return self._annotations[split]

    def examples(self, split):
        from ..data.vqa import read_vqa
        from ..evaluation.vqa_eval import question_accuracy

        subtype = VQA_SUBTYPES[split]
        store = open_store(self.features_dir, "vqa", subtype, "det")
        out = []
        for e in read_vqa(
            self.root / f"v2_OpenEnded_mscoco_{subtype}_questions.json",
            self.root / f"v2_mscoco_{subtype}_annotations.json",
        ):
            # Soft targets: each candidate answer's official score against the 10 human answers.
            scores = {a: question_accuracy(a, list(e.answers)) for a in set(e.answers) if a in self.answer_index}
            out.append(
                {
                    "id": e.question_id,
                    "question": e.question,
                    "scores": scores,
                    "regions": regions_of(store, str(e.image_id), e.image_path),
                }
            )
        return out

    def collate(self, examples):
        regions = [e["regions"] for e in examples]
        batch = pad_batch(
            [self.processor.encode(e["question"], "[MASK]", num_rois=r.num_rois) for e, r in zip(examples, regions)],
            self.processor.pad_id,
        )
        batch["answer_positions"] = (batch["input_ids"] == self.processor.mask_id).int().argmax(1)
        scores = torch.zeros(len(examples), len(self.answers))
        for k, e in enumerate(examples):
            for answer, score in e["scores"].items():
                scores[k, self.answer_index[answer]] = score
        batch["answer_scores"] = scores
        batch["visual"] = self._visual(regions)
        return batch

    def predictions(self, outputs, examples):
        best = outputs.logits.argmax(-1).tolist()
        return [{"question_id": e["id"], "answer": self.answers[b]} for e, b in zip(examples, best)]

    def score(self, predictions, split):
        from ..evaluation.vqa_eval import vqa_accuracy

        result = vqa_accuracy(self.annotations(split), {p["question_id"]: p["answer"] for p in predictions})
        return {"accuracy": result["overall"], **{f"accuracy_{k}": v for k, v in result["perAnswerType"].items()}}


# ---- VCR -------------------------------------------------------------------------------------


def vcr_words(tokens: list, objects: list[str]) -> list[Word]:
    """VCR tokens to words: an object reference [i, j] becomes 'name_i and name_j', each word
    taking its object's visual feature (RoI row i + 1; row 0 is the whole image)."""
    words = []
    for token in tokens:
        if isinstance(token, str):
            words.append(Word(token))
            continue
        for n, index in enumerate(token):
            if n:
                words.append(Word("and"))
            words.append(Word(objects[index], roi=index + 1))
    return words


class VCRTask(Task):
    """vcr_q2a: [CLS] question [SEP] answer [SEP]; vcr_qa2r: [CLS] question answer [SEP] rationale [SEP]."""

    model_class = VLBertForVCR
    options_key = "vcr"

    def examples(self, split, after_answer: int | None = None):
        """vcr_qa2r: the rationales follow the right answer, or answer `after_answer` (0..3) of
        every question (the leaderboard takes the rationale scores after each answer)."""
        from ..data.vcr import read_vcr

        root = self.data_root / "vcr"
        store = open_store(self.features_dir, "vcr", split, "gt")
        out = []
        for e in read_vcr(root / f"{split}.jsonl"):
            question = vcr_words(e.question, e.objects)
            if self.name == "vcr_q2a":
                first, choices, label = question, e.answer_choices, e.answer_label
            else:
                answer = e.answer_label if after_answer is None else after_answer
                first = question + vcr_words(e.answer_choices[answer], e.objects)
                # The rationale label holds after the right answer only.
                choices, label = e.rationale_choices, e.rationale_label if answer == e.answer_label else None
            out.append(
                {
                    "id": e.annot_id,
                    "first": first,
                    "label": label,
                    "choices": [vcr_words(c, e.objects) for c in choices],
                    "regions": regions_of(store, str(e.image_path.relative_to(root / "vcr1images")), e.image_path),
                }
            )
        return out

    def _labels(self, split: str) -> dict:
        """annot_id -> (answer, rationale) labels, read once per split (val is scored every epoch)."""
        from ..data.vcr import read_vcr

        cache = self.__dict__.setdefault("_label_cache", {})
        if split not in cache:
            cache[split] = {
                e.annot_id: (e.answer_label, e.rationale_label)
                for e in read_vcr(self.data_root / "vcr" / f"{split}.jsonl")
            }
        return cache[split]

    def collate(self, examples):
        encodings, regions = [], []
        for e in examples:
            for choice in e["choices"]:
                encodings.append(self.processor.encode(e["first"], choice, num_rois=e["regions"].num_rois))
                regions.append(e["regions"])
        batch = pad_batch(encodings, self.processor.pad_id)
        batch.pop("roi_positions")  # no masked RoI classification in fine-tuning batches without masks
        if all(e["label"] is not None for e in examples):  # unlabelled ones are scored, never trained on
            batch["labels"] = torch.tensor([e["label"] for e in examples])
        batch["visual"] = self._visual(regions)
        return batch

    def predictions(self, outputs, examples):
        key = "answer_probs" if self.name == "vcr_q2a" else "rationale_probs"
        probs = outputs.logits.softmax(-1).tolist()
        return [{"annot_id": e["id"], key: p} for e, p in zip(examples, probs)]

    def score(self, predictions, split):
        from ..evaluation.vcr_eval import vcr_accuracy

        result = vcr_accuracy(self._labels(split), {p["annot_id"]: p for p in predictions})
        return {"accuracy": result["q2a" if self.name == "vcr_q2a" else "qa2r"]}


# ---- RefCOCO+ --------------------------------------------------------------------------------

REFCOCO_SPLITS = {"train": ("train",), "val": ("val",), "test": ("testA", "testB")}


class RefCOCOTask(Task):
    """refcoco_det: detected regions, a region is right when its IoU with the referent >= 0.5;
    refcoco_gt: the image's annotated boxes, the referent's own box is the right one."""

    model_class = VLBertForRefCOCO
    options_key = "refcoco"

    def __post_init__(self):
        from ..data.refcoco import RefCOCO

        self.dataset = RefCOCO(self.data_root / "refcoco+")
        self.boxes = "det" if self.name == "refcoco_det" else "gt"
        self.store = open_store(self.features_dir, "refcoco+", "all", self.boxes)

    def examples(self, split):
        out = []
        for name in REFCOCO_SPLITS[split]:
            for e in self.dataset.expressions(name):
                regions = regions_of(self.store, str(e.image_id), e.image_path)
                x, y, w, h = e.bbox
                if self.boxes == "det":
                    iou = box_iou(torch.tensor([[x, y, x + w, y + h]]), torch.from_numpy(regions.boxes))[0]
                    targets = (iou >= 0.5).long()
                else:
                    targets = torch.from_numpy((regions.box_ids == e.ann_id).astype(np.int64))
                targets[0] = -1  # the whole image is not a candidate
                out.append(
                    {"id": e.sent_id, "text": e.sentence, "targets": targets, "regions": regions, "split": name}
                )
        return out

    def collate(self, examples):
        regions = [e["regions"] for e in examples]
        batch = pad_batch(
            [self.processor.encode(e["text"], num_rois=r.num_rois) for e, r in zip(examples, regions)],
            self.processor.pad_id,
        )
        targets = torch.full(batch["roi_positions"].shape, -1)
        for k, e in enumerate(examples):
            targets[k, : len(e["targets"])] = e["targets"]
        batch["roi_targets"] = targets
        batch["visual"] = self._visual(regions)
        return batch

    def predictions(self, outputs, examples):
        # Row 0 (the whole image) is scored but is never a candidate: pick among the regions.
        best = (outputs.logits[:, 1:].argmax(-1) + 1).tolist()
        out = []
        for e, row in zip(examples, best):
            x1, y1, x2, y2 = (float(v) for v in e["regions"].boxes[row])
            out.append({"sent_id": e["id"], "bbox": [x1, y1, x2 - x1, y2 - y1]})
        return out

    def score(self, predictions, split):
        from ..evaluation.refcoco_eval import refcoco_accuracy

        expressions = [e for name in REFCOCO_SPLITS[split] for e in self.dataset.expressions(name)]
        result = refcoco_accuracy(expressions, {p["sent_id"]: p["bbox"] for p in predictions})
        counts = result.pop("n_expressions")
        total = sum(counts.values())
        return {
            "accuracy": round(sum(result[s] * counts[s] for s in counts) / total, 2),
            **({f"accuracy_{s}": v for s, v in result.items()} if len(result) > 1 else {}),
        }


TASK_CLASSES = {
    "vqa": VQATask,
    "vcr_q2a": VCRTask,
    "vcr_qa2r": VCRTask,
    "refcoco_det": RefCOCOTask,
    "refcoco_gt": RefCOCOTask,
}


def build_task(name: str, processor, data_root, features_dir) -> Task:
    try:
        cls = TASK_CLASSES[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; expected one of {', '.join(TASK_CLASSES)}") from None
    return cls(name, processor, Path(data_root), Path(features_dir))
