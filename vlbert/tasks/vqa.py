"""VQA v2: a question, soft targets over the answer vocabulary, the official accuracy."""

from __future__ import annotations

import torch

from ..modeling.processing_study import pad_batch
from .base import Task
from .regions import open_store, regions_of


class VQATask(Task):
    def __post_init__(self):
        from ..data.vqa import read_answer_vocabulary

        self.root = self.data_root / "vqa"
        self.answers = read_answer_vocabulary(self.root / "answers_vqa.txt")
        self.answer_index = {a: k for k, a in enumerate(self.answers)}
        self._annotations = {}

    def model_overrides(self):
        return {"num_answers": len(self.answers)}

    def _subtype(self, split: str) -> str:
        """VQA v2's name of the split's question set (train2014, val2014, test-dev2015)."""
        (subtype,) = self.spec.splits[split]
        return subtype

    def annotations(self, split: str) -> dict:
        from ..data.vqa import read_annotations

        if split not in self._annotations:
            self._annotations[split] = read_annotations(
                self.root / f"v2_mscoco_{self._subtype(split)}_annotations.json"
            )
        return self._annotations[split]

    def examples(self, split):
        from ..data.vqa import read_vqa
        from ..evaluation.vqa_eval import question_accuracy

        subtype = self._subtype(split)
        store = open_store(self.features_dir, self.spec.stores[split])
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

    def item_scores(self, predictions, split):
        from ..data.errors import require_same_ids
        from ..evaluation.vqa_eval import question_accuracy

        annotations, answers = self.annotations(split), {p["question_id"]: p["answer"] for p in predictions}
        require_same_ids(annotations, answers, "question_id")
        return {q: 100 * question_accuracy(answers[q], a["answers"]) for q, a in annotations.items()}

    def pairs(self, split: str) -> list[tuple[int, int]] | None:
        """The split's complementary pairs, when its folder has VQA v2's file of them."""
        from ..data.vqa import complementary_pairs_name, read_complementary_pairs

        path = self.root / complementary_pairs_name(self._subtype(split))
        return read_complementary_pairs(path) if path.is_file() else None

    def score(self, predictions, split):
        from ..evaluation.vqa_eval import pair_accuracy, vqa_accuracy

        answers = {p["question_id"]: p["answer"] for p in predictions}
        result = vqa_accuracy(self.annotations(split), answers)
        scores = {"accuracy": result["overall"], **{f"accuracy_{k}": v for k, v in result["perAnswerType"].items()}}
        pairs = self.pairs(split)
        if pairs:
            scores["pair_accuracy"] = pair_accuracy(self.annotations(split), answers, pairs)
        return scores
