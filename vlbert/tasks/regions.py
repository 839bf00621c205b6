"""What every task reads: an image's regions from the feature stores, and as model inputs.

An example is a plain dict: text (a string or a list of `Word`s with object references), the
image's regions (row 0: the whole image) and the targets; each task's collator turns a list of
them into model inputs.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..data.feature_store import FeatureStore, store_bytes
from ..data.images import decoded_images
from ..modeling.inputs import VisualInputs
from ..registry import Store

BOX_MODES = {"det": "detected", "gt": "gt"}  # a store's `mode` attribute for each kind of boxes


def features_path(features_dir, store: Store) -> Path:
    """The store the workflow's extract_rois rule writes: <dataset>.<split>.<det|gt>.h5."""
    return Path(features_dir) / f"{store.name}.h5"


# Stores up to this size are read into memory once (the mini world's are a few MB); larger ones
# (the paper's: up to 1.4 TB) are read an image at a time, with bounded memory.
PRELOAD_MAX_BYTES = 2 * 2**30


def open_store(features_dir, store: Store) -> FeatureStore:
    """That store (preloaded if small); one of another data set, split or kind of boxes under its
    name is refused (the image keys of two data sets can match, and the features would be read
    silently), and so is a shard that is not what extraction wrote (checked once per shard)."""
    path = features_path(features_dir, store)
    return FeatureStore(
        path,
        preload=store_bytes(path) <= PRELOAD_MAX_BYTES,
        expect={"dataset": store.dataset, "split": store.split, "mode": BOX_MODES[store.boxes]},
        verify=True,
    )


@dataclass
class Regions:
    boxes: np.ndarray  # [R+1, 4]
    labels: np.ndarray  # [R+1] detector class ids
    features: np.ndarray  # [R+1, D]
    box_ids: np.ndarray  # [R+1]
    width: int
    height: int
    image_path: Path | None = None
    probs: np.ndarray | None = None  # [R+1, C+1] the detector's class distribution (column 0: background)

    @property
    def num_rois(self) -> int:
        return len(self.boxes) - 1


def regions_of(store: FeatureStore, key: str, image_path: Path | None = None, max_rois: int | None = None) -> Regions:
    item = store[key]
    rows = slice(None) if max_rois is None else slice(0, max_rois + 1)
    return Regions(
        item["boxes"][rows],
        item["labels"][rows],
        item["features"][rows],
        item["box_ids"][rows],
        item["width"],
        item["height"],
        image_path,
        item["probs"][rows],
    )


def feature_mean(regions: Iterable[Regions], limit: int = 20_000) -> torch.Tensor:
    """The mean appearance feature over every row (the whole image and its RoIs) of the first
    `limit` examples' regions, each counted as often as training sees it: what the visual
    embeddings centre the features on."""
    rows = [r.features for r in itertools.islice(regions, limit)]
    if not rows:
        raise ValueError("no images to take the appearance features' mean from")
    return torch.from_numpy(np.concatenate(rows).astype(np.float64).mean(0)).float()


def visual_batch(
    regions: list[Regions], with_images: bool = False, masked: torch.Tensor | None = None, cached: bool = True
) -> VisualInputs:
    """The regions as model inputs. `with_images`: the images too, for the Fast R-CNN module;
    `cached`: the stores' features hold for this model (not for a Fast R-CNN tuned since), so that
    only the images with a masked RoI need the module."""
    rois = max(len(r.boxes) for r in regions)
    n = len(regions)
    boxes = torch.zeros(n, rois, 4)
    features = torch.zeros(n, rois, regions[0].features.shape[1])
    valid = torch.zeros(n, rois, dtype=torch.bool)
    for k, r in enumerate(regions):
        boxes[k, : len(r.boxes)] = torch.from_numpy(r.boxes)
        features[k, : len(r.boxes)] = torch.from_numpy(r.features)
        valid[k, : len(r.boxes)] = True
    sizes = torch.tensor([[r.width, r.height] for r in regions])
    # With cached features the Fast R-CNN sees only the images that have a masked RoI: load just those.
    needed = masked.any(1).tolist() if cached and masked is not None else [True] * n
    images = keys = None
    if with_images:
        # An image in the batch several times (VCR's candidates, RefCOCO+'s expressions) is loaded
        # once: the same tensor, which a model can compute once (Pixel-BERT's CNN does).
        loaded, images = {}, []
        for r, need in zip(regions, needed):
            if need and r.image_path not in loaded:
                loaded[r.image_path] = decoded_images(r.image_path)
            images.append(loaded[r.image_path] if need else None)
        keys = [str(r.image_path) if need and r.image_path is not None else None for r, need in zip(regions, needed)]
    return VisualInputs(boxes, sizes, valid, features if cached else None, images, masked, keys)


def with_other_images(examples: list[dict], seed: int = 0) -> list[dict]:
    """The examples with their images shuffled among them: each reads another image's appearance
    (its region features, detector classes and pixels) over its own boxes, so that a candidate
    box (RefCOCO+) or a tag's region (VCR) stays where the example's text points. No example
    keeps its own image (a derangement of the distinct images). What a checkpoint scores on these
    is its score without the image's content: the image's share of a cell is the difference."""
    key = lambda e: e["regions"].image_path or id(e["regions"])
    images = list(dict.fromkeys(key(e) for e in examples))
    if len(images) < 2:
        raise ValueError("shuffling images among the examples needs at least two images")
    first = {}
    for e in examples:
        first.setdefault(key(e), e["regions"])
    order = [images[int(k)] for k in np.random.default_rng([seed, len(images)]).permutation(len(images))]
    other = {image: first[order[(k + 1) % len(order)]] for k, image in enumerate(order)}
    return [{**e, "regions": _appearance_of(e["regions"], other[key(e)])} for e in examples]


def _appearance_of(own: Regions, other: Regions) -> Regions:
    """`own`'s boxes with `other`'s appearance: row 0 (the whole image) from other's row 0, each
    region from other's regions in turn (cycled where other has fewer)."""
    rows = np.array([0] + [1 + k % other.num_rois if other.num_rois else 0 for k in range(own.num_rois)])
    return Regions(
        own.boxes,
        other.labels[rows],
        other.features[rows],
        own.box_ids,
        own.width,
        own.height,
        other.image_path,
        None if other.probs is None else other.probs[rows],
    )
