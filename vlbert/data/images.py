"""Image loading, one way for the detector, RoI extraction and the tuned Fast R-CNN."""

from __future__ import annotations

import torch
from PIL import Image
from torchvision.transforms.functional import pil_to_tensor


def load_image(path) -> torch.Tensor:
    """RGB image as float [3, H, W] in [0, 1]; a missing or corrupt file names its path."""
    try:
        with Image.open(path) as image:
            rgb = image if image.mode == "RGB" else image.convert("RGB")  # convert copies even RGB
            return pil_to_tensor(rgb).float().div_(255)
    except (OSError, ValueError) as exc:
        raise OSError(f"cannot read image {path}: {exc}") from None
