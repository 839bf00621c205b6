"""The paper's box-selection rule (bottom-up-attention's `generate_tsv.py`).

A proposal's confidence is its highest class probability among the classes for which it survives
per-class NMS; proposals above the threshold (0.2 there: `conf_thresh`) are kept, topped up to
`min_boxes` and capped at `max_boxes` by confidence.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torchvision.ops import box_iou, nms


@dataclass(frozen=True)
class BoxRule:
    score_threshold: float = 0.2
    min_boxes: int = 10
    max_boxes: int = 100
    nms_iou: float = 0.3

    def __post_init__(self):
        if not 1 <= self.min_boxes <= self.max_boxes:
            raise ValueError(f"need 1 <= min_boxes <= max_boxes, got {self.min_boxes}, {self.max_boxes}")


# Up to this many (box, class) pairs, per-class NMS runs on their IoU matrix at once (a few tensor
# ops and a loop over the kept pairs); beyond it, one NMS call a class. Both keep the same pairs.
MATRIX_NMS_MAX_PAIRS = 512


def _per_class_nms(boxes: torch.Tensor, scores: torch.Tensor, classes: torch.Tensor, iou: float) -> torch.Tensor:
    """NMS within each class (the rule's definition; batched_nms's coordinate offsets would round
    boxes far from the origin differently): indices kept, in no particular order. A class with
    one box keeps it."""
    if len(scores) <= MATRIX_NMS_MAX_PAIRS:
        return _per_class_nms_matrix(boxes, scores, classes, iou)
    return _per_class_nms_by_class(boxes, scores, classes, iou)


def _per_class_nms_by_class(boxes: torch.Tensor, scores: torch.Tensor, classes: torch.Tensor, iou: float):
    """`_per_class_nms` as one torchvision NMS call a class."""
    order = torch.argsort(classes, stable=True)
    counts = torch.unique_consecutive(classes[order], return_counts=True)[1].tolist()
    kept, start = [], 0
    for count in counts:
        members = order[start : start + count]
        kept.append(members if count == 1 else members[nms(boxes[members], scores[members], iou)])
        start += count
    return torch.cat(kept) if kept else torch.zeros(0, dtype=torch.long)


def _per_class_nms_matrix(boxes: torch.Tensor, scores: torch.Tensor, classes: torch.Tensor, iou: float):
    """`_per_class_nms` over all pairs at once, as torchvision's CPU kernel computes it: greedy in
    stable descending score order, the overlap in float32 with the same operations, compared with
    the threshold in float64. Across classes nothing is suppressed, so one pass over every class
    in score order keeps what one pass a class keeps."""
    order = torch.argsort(scores, descending=True, stable=True)
    ordered, same_class = boxes[order], classes[order]
    overlap = box_iou(ordered, ordered)  # the kernel's float32 operations, in its order
    suppresses = ((overlap.double() > iou) & (same_class[:, None] == same_class)).numpy()
    suppressed = np.zeros(len(order), dtype=bool)
    kept = []
    for position in range(len(order)):
        if not suppressed[position]:
            kept.append(position)
            suppressed |= suppresses[position]
    return order[kept]


def _confidence(boxes: torch.Tensor, foreground: torch.Tensor, rule: BoxRule, floor: float) -> torch.Tensor:
    """Each proposal's confidence, exact wherever it is above `floor` (0 elsewhere).

    Per-class NMS keeps a box unless a kept box of higher score overlaps it, so the boxes of a
    class scored above `floor` are kept or not whatever happens below it: NMS over the (box,
    class) pairs above the floor gives the exact confidence of every box whose confidence is
    above it, at a fraction of the cost of NMS over all P x C pairs.
    """
    n, classes = foreground.shape
    pairs = (foreground > floor).nonzero() if floor > 0 else None
    if pairs is None:
        box_of, class_of = torch.arange(n).repeat_interleave(classes), torch.arange(classes).repeat(n)
    else:
        box_of, class_of = pairs[:, 0], pairs[:, 1]
    scores = foreground[box_of, class_of]
    keep = _per_class_nms(boxes[box_of], scores, class_of, rule.nms_iou)
    return torch.zeros(n).scatter_reduce(0, box_of[keep], scores[keep], reduce="amax")


def select_boxes(boxes: torch.Tensor, probs: torch.Tensor, rule: BoxRule) -> tuple[torch.Tensor, torch.Tensor]:
    """boxes [P, 4], probs [P, C+1] (column 0: background) -> (kept indices, their confidences).

    Kept indices are ordered by decreasing confidence.
    """
    n = probs.shape[0]
    if n == 0:
        return torch.zeros(0, dtype=torch.long), torch.zeros(0)
    foreground = probs[:, 1:]
    confidence = _confidence(boxes, foreground, rule, rule.score_threshold)
    above = int((confidence > rule.score_threshold).sum())
    count = min(max(above, rule.min_boxes), rule.max_boxes, n)
    # Topped up from below the threshold: lower the floor until it leaves `count` boxes above it
    # (all of them exact), down to none (every pair: boxes suppressed in every class score 0).
    floor = rule.score_threshold
    while floor > 0 and count > int((confidence > floor).sum()):
        floor = floor / 8 if floor > 1e-4 else 0.0
        confidence = _confidence(boxes, foreground, rule, floor)
    order = torch.argsort(confidence, descending=True, stable=True)
    kept = order[:count]
    return kept, confidence[kept]
