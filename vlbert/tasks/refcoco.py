"""RefCOCO+: a score per region for the expression, the referent the best one; official accuracy."""

from __future__ import annotations

import numpy as np
import torch
from torchvision.ops import box_iou

from ..modeling.processing_study import pad_batch
from .base import Task
from .regions import open_store, regions_of


class RefCOCOTask(Task):
    """refcoco_det: detected regions, a region is right when its IoU with the referent >= 0.5;
    refcoco_gt: the image's annotated boxes, the referent's own box is the right one."""

    def __post_init__(self):
        from ..data.refcoco import RefCOCO

        self.dataset = RefCOCO(self.data_root / "refcoco+")
        (store,) = set(self.spec.stores.values())  # its splits share one image set
        self.boxes = store.boxes
        self.store = open_store(self.features_dir, store)

    def examples(self, split):
        out = []
        for name in self.spec.splits[split]:
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
        from ..evaluation.floors import word_subsets
        from ..evaluation.refcoco_eval import refcoco_accuracy, refcoco_hits

        expressions = [e for name in self.spec.splits[split] for e in self.dataset.expressions(name)]
        boxes = {p["sent_id"]: p["bbox"] for p in predictions}
        result = refcoco_accuracy(expressions, boxes)
        result.pop("n_expressions")
        hits = refcoco_hits(expressions, boxes)
        scores = {
            "accuracy": _pooled(hits.values()),
            **({f"accuracy_{s}": v for s, v in result.items()} if len(result) > 1 else {}),
        }
        # Expressions with a word rare in fine-tuning (and the others), as nocaps scores novel objects.
        for subset, ids in word_subsets(expressions, self._train_expressions()).items():
            if ids:
                scores[f"accuracy_{subset}"] = _pooled(hits[i] for i in ids)
        return scores

    def item_scores(self, predictions, split):
        from ..evaluation.refcoco_eval import refcoco_hits

        expressions = [e for name in self.spec.splits[split] for e in self.dataset.expressions(name)]
        return {
            i: 100.0 * hit
            for i, hit in refcoco_hits(expressions, {p["sent_id"]: p["bbox"] for p in predictions}).items()
        }

    def _train_expressions(self):
        return [e for name in self.spec.splits["train"] for e in self.dataset.expressions(name)]


def _pooled(hits) -> float:
    """The accuracy (percent) over several splits' expressions, from each expression's hit: pooled
    before rounding (pooling the splits' rounded figures moved it by up to 0.01)."""
    hits = list(hits)
    return round(100 * sum(hits) / len(hits), 2)
