"""RefCOCO+ accuracy: a predicted box is right when its IoU with the referred object's box is >= 0.5.

Boxes are COCO [x, y, w, h]. Their IoU follows one of two conventions:

- "continuous" (the default): a box covers [x, x + w] x [y, y + h], its area is w * h. This is
  COCO's convention and pycocotools' `mask.iou`, which computes it.
- "plus-one": the released VL-BERT code's (jackroos/VL-BERT, commit 4373674,
  `refcoco/function/test.py`, `cacluate_iou`): corners x1 = x, x2 = x + w, and each side counts
  one pixel more, width x2 - x1 + 1 and intersection width min(x2) - max(x1) + 1 (at least 0).
  The difference is a pixel's worth on each side: it matters for small boxes, and for boxes
  whose IoU is near the 0.5 threshold.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
from pycocotools import mask as mask_utils

from ..data.errors import require_same_ids

IOU_THRESHOLD = 0.5
IOU_CONVENTIONS = ("continuous", "plus-one")


def box_iou(predicted: list[float], truth: list[float], convention: str = "continuous") -> float:
    """IoU of two COCO [x, y, w, h] boxes under `convention` (see the module's docstring)."""
    if convention == "continuous":
        iou = mask_utils.iou(np.array([predicted], dtype=np.float64), np.array([truth], dtype=np.float64), [0])
        return float(iou[0, 0])
    if convention == "plus-one":
        (px, py, pw, ph), (tx, ty, tw, th) = predicted, truth
        width = max(0.0, min(px + pw, tx + tw) - max(px, tx) + 1)
        height = max(0.0, min(py + ph, ty + th) - max(py, ty) + 1)
        inter = width * height
        return inter / ((pw + 1) * (ph + 1) + (tw + 1) * (th + 1) - inter)
    raise ValueError(f"unknown IoU convention {convention!r}; expected one of {', '.join(IOU_CONVENTIONS)}")


def refcoco_hits(
    expressions, predictions: dict[int, list[float]], iou_convention: str = "continuous", source=None
) -> dict[int, bool]:
    """sent_id -> whether its predicted [x, y, w, h] overlaps the referent's box at IoU >= 0.5, for
    every expression of the splits that have predictions (refused unless each has one)."""
    if iou_convention not in IOU_CONVENTIONS:
        raise ValueError(f"unknown IoU convention {iou_convention!r}; expected one of {', '.join(IOU_CONVENTIONS)}")
    by_sent = {e.sent_id: e for e in expressions}
    predicted_splits = {by_sent[s].split for s in predictions if s in by_sent}
    require_same_ids([e.sent_id for e in expressions if e.split in predicted_splits], predictions, "sent_id", source)
    return {
        sent_id: box_iou(box, by_sent[sent_id].bbox, iou_convention) >= IOU_THRESHOLD
        for sent_id, box in predictions.items()
    }


def refcoco_accuracy(
    expressions, predictions: dict[int, list[float]], digits: int = 2, iou_convention: str = "continuous", source=None
) -> dict:
    """expressions: RefExpression records (any splits); predictions: sent_id -> predicted [x, y, w, h].

    Returns accuracy in percent per split, for the splits that have predictions; each of those
    must have a prediction for every expression (a part of a split is not scored as the whole).
    source: the predictions file, named when they are refused.
    """
    by_sent = {e.sent_id: e for e in expressions}
    hits = defaultdict(list)
    for sent_id, hit in refcoco_hits(expressions, predictions, iou_convention, source).items():
        hits[by_sent[sent_id].split].append(hit)
    if not hits:
        raise ValueError("no predictions")
    return {split: round(100 * sum(h) / len(h), digits) for split, h in sorted(hits.items())} | {
        "n_expressions": {split: len(h) for split, h in sorted(hits.items())}
    }
