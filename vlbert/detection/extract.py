"""RoI extraction for a whole data set split into the HDF5 feature store, resumably.

Images go in fixed batches (batch k is always items[k*B:(k+1)*B]), each batch's results land in
its own shard file, and a re-run skips the shards already written: killed halfway and run again,
the final file equals an uninterrupted run's. Image decoding of the next batch overlaps the
forward pass of the current one.
"""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..data.feature_store import finish_shards, shard_paths, write_shard
from ..data.images import load_image
from .sources import ImageItem

ON_BAD_IMAGE = ("error", "skip")


def _load_batch(items: list[ImageItem], on_bad_image: str):
    images, kept, skipped = [], [], []
    for item in items:
        try:
            images.append(load_image(item.path))
            kept.append(item)
        except OSError as exc:
            if on_bad_image == "error":
                raise OSError(f"{exc} (use --on-bad-image skip to skip and record such images)") from None
            skipped.append((item.key, str(exc)))
    return images, kept, skipped


def _fingerprint(items: list[ImageItem], batch_size: int, attrs: dict) -> str:
    """What the shards were made from: a different list, batch size or detector starts afresh."""
    digest = hashlib.sha256(json.dumps(attrs, sort_keys=True, default=str).encode())
    digest.update(str(batch_size).encode())
    for item in items:
        digest.update(item.key.encode())
        if item.boxes is not None:
            digest.update(np.ascontiguousarray(item.boxes, dtype=np.float32).tobytes())
    return digest.hexdigest()


def extract_to_store(
    backend,
    items: list[ImageItem],
    out,
    batch_size: int = 16,
    on_bad_image: str = "error",
    attrs: dict | None = None,
    progress: bool = True,
) -> dict:
    """Extract every item into the HDF5 file `out`; returns {images, regions, skipped}."""
    if on_bad_image not in ON_BAD_IMAGE:
        raise ValueError(f"on_bad_image must be one of {ON_BAD_IMAGE}, got {on_bad_image!r}")
    if not items:
        raise ValueError(f"{out}: no images to extract")
    out = Path(out)
    attrs = {
        "mode": "gt" if items[0].boxes is not None else "detected",
        "whole_image_row": 0,
        "feature_dim": backend.feature_dim,
        "class_names": backend.class_names,
        **(attrs or {}),
    }
    batches = [items[k : k + batch_size] for k in range(0, len(items), batch_size)]
    shards = shard_paths(out, _fingerprint(items, batch_size, attrs), len(batches))
    todo = [k for k, shard in enumerate(shards) if not shard.exists()]
    with (
        ThreadPoolExecutor(max_workers=1) as loader,
        tqdm(
            total=len(items),
            initial=len(items) - sum(len(batches[k]) for k in todo),
            desc=f"extract {out.name}",
            unit="img",
            disable=not progress,
        ) as bar,
    ):
        pending = loader.submit(_load_batch, batches[todo[0]], on_bad_image) if todo else None
        for position, k in enumerate(todo):
            images, kept, skipped = pending.result()
            if position + 1 < len(todo):
                pending = loader.submit(_load_batch, batches[todo[position + 1]], on_bad_image)
            results = backend.extract(images, [item.boxes for item in kept]) if kept else []
            for item, result in zip(kept, results):
                ids = [-1] + list(item.box_ids) if item.box_ids else [-1] * len(result.boxes)
                result.box_ids = np.array(ids, dtype=np.int64)
            write_shard(shards[k], [item.key for item in kept], results, skipped)
            bar.update(len(batches[k]))
    return finish_shards(shards, out, attrs)
