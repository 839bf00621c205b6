"""Image loading, one way for the detector, RoI extraction and the tuned Fast R-CNN."""

from __future__ import annotations

import threading
from collections import OrderedDict

import torch
from PIL import Image
from torchvision.transforms.functional import pil_to_tensor


def load_image(path) -> torch.Tensor:
    """RGB image as float [3, H, W] in [0, 1]; a missing or corrupt file names its path."""
    return _decode(path).float().div_(255)


def _decode(path) -> torch.Tensor:
    try:
        with Image.open(path) as image:
            rgb = image if image.mode == "RGB" else image.convert("RGB")  # convert copies even RGB
            return pil_to_tensor(rgb)
    except (OSError, ValueError) as exc:
        raise OSError(f"cannot read image {path}: {exc}") from None


class DecodedImages:
    """`load_image` with the decoded pixels (uint8) of the images read last kept in memory, up to
    `max_bytes`: a training run that reads its images every step (a tuned Fast R-CNN, Pixel-BERT's
    CNN) decodes each once, not once an epoch. Every call returns a tensor of its own."""

    def __init__(self, max_bytes: int = 1 << 30):
        self.max_bytes, self.bytes = max_bytes, 0
        self._pixels: OrderedDict = OrderedDict()
        self._lock = threading.Lock()  # batches may be built in a loader thread

    def __call__(self, path) -> torch.Tensor:
        key = str(path)
        with self._lock:
            pixels = self._pixels.get(key)
            if pixels is not None:
                self._pixels.move_to_end(key)
        if pixels is None:
            pixels = _decode(path)
            with self._lock:
                if key not in self._pixels:
                    self._pixels[key] = pixels
                    self.bytes += pixels.numel()
                while self.bytes > self.max_bytes and len(self._pixels) > 1:
                    _, dropped = self._pixels.popitem(last=False)
                    self.bytes -= dropped.numel()
        return pixels.float().div_(255)


# The training batches' images (vlbert.tasks.regions), one cache a process.
decoded_images = DecodedImages()
