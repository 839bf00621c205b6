"""VCR: Q->A and QA->R as four-way multiple choice over the candidates, the official accuracy."""

from __future__ import annotations

from pathlib import Path

import torch

from ..data.vcr import tag_name
from ..modeling.processing_study import Word, pad_batch
from .base import Task
from .regions import open_store, regions_of


def vcr_words(tokens: list, objects: list[str]) -> list[Word]:
    """VCR tokens to words (vcr_text's, in order): an object reference [i, j] becomes 'name_i and
    name_j' (tag_name), each word taking its object's visual feature (RoI row i + 1; row 0 is the
    whole image)."""
    words = []
    for token in tokens:
        if isinstance(token, str):
            words.append(Word(token))
            continue
        for n, index in enumerate(token):
            if n:
                words.append(Word("and"))
            words.append(Word(tag_name(objects, index), roi=index + 1))
    return words


class VCRTask(Task):
    """vcr_q2a: [CLS] question [SEP] answer [SEP]; vcr_qa2r: [CLS] question answer [SEP] rationale [SEP]."""

    def examples(self, split, after_answer: int | None = None):
        """vcr_qa2r: the rationales follow the right answer, or answer `after_answer` (0..3) of
        every question (the leaderboard takes the rationale scores after each answer)."""
        from ..data.vcr import read_vcr

        root = self.data_root / "vcr"
        store = open_store(self.features_dir, self.spec.stores[split])
        out = []
        for e in read_vcr(self.jsonl_path(split)):
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

    def jsonl_path(self, split: str) -> Path:
        """The annotations of `split` (train, val, test)."""
        (name,) = self.spec.splits[split]
        return self.data_root / "vcr" / f"{name}.jsonl"

    def _labels(self, split: str) -> dict:
        """annot_id -> (answer, rationale) labels, read once per split (val is scored every epoch)."""
        from ..data.vcr import read_vcr

        cache = self.__dict__.setdefault("_label_cache", {})
        if split not in cache:
            cache[split] = {e.annot_id: (e.answer_label, e.rationale_label) for e in read_vcr(self.jsonl_path(split))}
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

    def item_scores(self, predictions, split):
        from ..evaluation.vcr_eval import vcr_choices

        labels = self._labels(split)
        key, index = ("answer", 0) if self.name == "vcr_q2a" else ("rationale", 1)
        chosen = vcr_choices(labels, {p["annot_id"]: p for p in predictions})[key]
        return {a: 100.0 * (chosen[a] == labels[a][index]) for a in labels}
