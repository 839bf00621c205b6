"""RefCOCO+ accuracy: a predicted box is correct when its IoU with the referred object's box is >= 0.5."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
from pycocotools import mask as mask_utils

IOU_THRESHOLD = 0.5


def box_iou(predicted: list[float], truth: list[float]) -> float:
    """IoU of two COCO [x, y, w, h] boxes (pycocotools' implementation)."""
    iou = mask_utils.iou(np.array([predicted], dtype=np.float64), np.array([truth], dtype=np.float64), [0])
    return float(iou[0, 0])


def refcoco_accuracy(expressions, predictions: dict[int, list[float]], digits: int = 2) -> dict:
    """expressions: RefExpression records (any splits); predictions: sent_id -> predicted [x, y, w, h].

    Returns accuracy in percent per split, for the splits that have predictions.
    """
    by_sent = {e.sent_id: e for e in expressions}
    unknown = [s for s in predictions if s not in by_sent]
    if unknown:
        raise ValueError(f"prediction for unknown sent_id {unknown[0]}")
    hits = defaultdict(list)
    for sent_id, box in predictions.items():
        expression = by_sent[sent_id]
        hits[expression.split].append(box_iou(box, expression.bbox) >= IOU_THRESHOLD)
    if not hits:
        raise ValueError("no predictions")
    return {split: round(100 * sum(h) / len(h), digits) for split, h in sorted(hits.items())} | \
        {"n_expressions": {split: len(h) for split, h in sorted(hits.items())}}
