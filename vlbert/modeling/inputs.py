"""The regions of a batch, as every model family's encoder takes them (VL-BERT's RoIs, ViLBERT's
visual stream, Pixel-BERT's images) and the task adapters build them (`vlbert.tasks.regions`).

Its own module, not VL-BERT's: no family imports another family's modeling module.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class VisualInputs:
    """The regions of a batch. Row 0 of every image is the whole image.

    boxes: [B, R, 4] x1 y1 x2 y2 in image pixels; image_sizes: [B, 2] width, height;
    roi_mask: [B, R] bool, real rows (the rest is padding);
    features: [B, R, D] cached appearance features, or None to compute them from `images`;
    images: list of B float RGB [3, H, W] tensors in [0, 1] (needed when features is None; with
        features, None stands for an image without a masked RoI, which is never read);
    masked: [B, R] bool, RoIs masked for masked RoI classification (pixels zeroed, mask embedding);
    image_keys: with `images`, what identifies each image across batches (its path; None where the
        image is None): a model with a frozen visual module computes what it reads of an image once.
    """

    boxes: torch.Tensor
    image_sizes: torch.Tensor
    roi_mask: torch.Tensor
    features: torch.Tensor | None = None
    images: list[torch.Tensor] | None = None
    masked: torch.Tensor | None = None
    image_keys: list[str | None] | None = None
