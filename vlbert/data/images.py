"""Image loading, one way for the detector, RoI extraction and the tuned Fast R-CNN."""

from __future__ import annotations

import os
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
    `max_bytes` (0, the default: nothing kept). A run whose images fit (the synthetic world's: a
    tuned Fast R-CNN or Pixel-BERT's CNN reading them every step) decodes each once in a process,
    not once an epoch; a forked loader worker fills a cache of its own. Every call returns a tensor
    of its own."""

    def __init__(self, max_bytes: int = 0):
        self.max_bytes, self.bytes = max_bytes, 0
        self._pixels: OrderedDict = OrderedDict()
        self._lock = threading.Lock()  # batches may be built in a loader thread
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # a lock held by another thread at the fork stays held in the child

    def resize(self, max_bytes: int) -> None:
        """Keep up to `max_bytes` from now on (0: keep nothing, drop what is kept)."""
        with self._lock:
            self.max_bytes = max_bytes
            self._evict()

    def _evict(self) -> None:
        while self._pixels and (self.bytes > self.max_bytes or self.max_bytes == 0):
            _, dropped = self._pixels.popitem(last=False)
            self.bytes -= dropped.numel()

    def __call__(self, path) -> torch.Tensor:
        if self.max_bytes == 0:
            return load_image(path)
        key = os.fspath(path)  # a run names an image one way; data files do not change during it
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
                    self._evict()
        return pixels.float().div_(255)


# The training batches' images (vlbert.tasks.regions), one cache a process; its size is the
# preset's `loading.decoded_images_mb`, set when a stage runs (vlbert.engine.stage).
decoded_images = DecodedImages()
