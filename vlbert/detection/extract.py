"""RoI extraction of a data set split into a sharded feature store, by chunks, resumably.

A split's images are cut into shards of a fixed number of images (shard s is always
items[s*S:(s+1)*S]); the shards are dealt out in contiguous runs to N chunks, one job each (the
workflow's scatter), and a last step writes the store's index over all of them (the gather).
Each shard file is written atomically and records what it was made from (the images, their
boxes, the detector and the store format): a killed chunk, run again, keeps the shards it finished
and ends with the same files as an uninterrupted run. Image decoding of the next batch overlaps
the forward pass of the current one.
"""

from __future__ import annotations

import hashlib
import json
import re
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
from tqdm import tqdm

from .. import io
from ..data.feature_store import FEATURE_DTYPES, compact, shard_summary, shards_folder, write_index, write_shard
from ..data.images import load_image
from .sources import ImageItem

ON_BAD_IMAGE = ("error", "skip")
SHARD_FINGERPRINT = "shard_fingerprint"
# Bumped when what a shard holds changes for the same inputs: older shards are then made again.
SHARD_FORMAT_VERSION = 1


@dataclass(frozen=True)
class StoreFormat:
    """How a store is laid out (the preset's `features` section)."""

    dtype: str = "float16"  # of the region features
    class_topk: int | None = None  # classes kept of each region's distribution; None: all
    images_per_shard: int = 1000

    def __post_init__(self):
        if self.dtype not in FEATURE_DTYPES:
            raise ValueError(f"features.dtype must be one of {FEATURE_DTYPES}, got {self.dtype!r}")
        if self.images_per_shard < 1 or (self.class_topk is not None and self.class_topk < 1):
            raise ValueError(f"images_per_shard and class_topk must be positive: {self}")

    @classmethod
    def from_config(cls, config: dict) -> StoreFormat:
        features = config.get("features", {})
        return cls(
            dtype=features.get("dtype", cls.dtype),
            class_topk=features.get("class_topk"),
            images_per_shard=features.get("images_per_shard", cls.images_per_shard),
        )


@dataclass(frozen=True)
class Chunk:
    """Chunk `number` (1-based) of `count`: the workflow's scatter item `<number>-of-<count>`."""

    number: int = 1
    count: int = 1

    def __post_init__(self):
        if not 1 <= self.number <= self.count:
            raise ValueError(f"need 1 <= chunk <= chunks, got {self.number} of {self.count}")

    @classmethod
    def parse(cls, text: str) -> Chunk:
        match = re.fullmatch(r"(\d+)-of-(\d+)", text)
        if not match:
            raise ValueError(f"a chunk is written <number>-of-<count> (e.g. 3-of-8), got {text!r}")
        return cls(int(match[1]), int(match[2]))

    @property
    def name(self) -> str:
        return f"{self.number}-of-{self.count}"

    def shards(self, num_shards: int) -> range:
        """This chunk's contiguous run of shard numbers (chunks differ in size by at most one)."""
        per, extra = divmod(num_shards, self.count)
        start = (self.number - 1) * per + min(self.number - 1, extra)
        return range(start, start + per + (self.number <= extra))


def chunk_manifest(out, chunk: Chunk) -> Path:
    """What a chunk job writes last, listing its shards: the workflow's output of that job."""
    return shards_folder(out) / f"chunk_{chunk.name}.json"


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


def _fingerprint(items: list[ImageItem], batch_size: int, attrs: dict, fmt: StoreFormat) -> str:
    """What a shard was made from: the store's attributes (the detector's weights among them),
    batch size, format, and each image's key, file (size and time) and given boxes. Any other
    makes it again."""
    digest = hashlib.sha256(json.dumps(attrs, sort_keys=True, default=str).encode())
    digest.update(f"{SHARD_FORMAT_VERSION} {batch_size} {fmt}".encode())
    for item in items:
        try:
            stat = item.path.stat()
            file = f"{stat.st_size} {stat.st_mtime_ns}"
        except OSError:
            file = "unreadable"
        digest.update(f"{item.key}\0{file}\0".encode())
        if item.boxes is not None:
            digest.update(np.ascontiguousarray(item.boxes, dtype=np.float32).tobytes())
    return digest.hexdigest()


def shard_is_done(path: Path, fingerprint: str) -> bool:
    if not path.is_file():
        return False
    try:
        with h5py.File(path, "r") as f:
            return f.attrs.get(SHARD_FINGERPRINT) == fingerprint
    except OSError:
        return False


def store_attrs(backend, items: list[ImageItem], attrs: dict | None, fmt: StoreFormat) -> dict:
    return {
        "mode": "gt" if items[0].boxes is not None else "detected",
        "whole_image_row": 0,
        "feature_dim": backend.feature_dim,
        "class_names": backend.class_names,
        "feature_dtype": fmt.dtype,
        "class_topk": fmt.class_topk or 0,
        **(attrs or {}),
    }


def extract_chunk(  # noqa: PLR0913 - the one-call form of extract_to_store, plus its chunk
    backend,
    items: list[ImageItem],
    out,
    chunk: Chunk = Chunk(),
    batch_size: int = 16,
    on_bad_image: str = "error",
    attrs: dict | None = None,
    fmt: StoreFormat = StoreFormat(),
    progress: bool = True,
) -> list[Path]:
    """Extract this chunk's shards of the store `out` (into shards_folder(out)), then write its
    manifest; returns the shard paths. `backend` scores regions (`forward_regions`) and applies
    the box rule (`select`)."""
    if on_bad_image not in ON_BAD_IMAGE:
        raise ValueError(f"on_bad_image must be one of {ON_BAD_IMAGE}, got {on_bad_image!r}")
    if not items:
        raise ValueError(f"{out}: no images to extract")
    out, folder = Path(out), shards_folder(out)
    folder.mkdir(parents=True, exist_ok=True)
    attrs = store_attrs(backend, items, attrs, fmt)
    size = fmt.images_per_shard
    numbers = chunk.shards(-(-len(items) // size))
    shards = {s: items[s * size : (s + 1) * size] for s in numbers}
    paths = {s: folder / f"shard_{s:06d}.h5" for s in numbers}
    fingerprints = {s: _fingerprint(shards[s], batch_size, attrs, fmt) for s in numbers}
    todo = [s for s in numbers if not shard_is_done(paths[s], fingerprints[s])]
    # Every batch of the shards to do, in order: (shard, batch items).
    batches = [(s, shards[s][k : k + batch_size]) for s in todo for k in range(0, len(shards[s]), batch_size)]
    total = sum(len(shards[s]) for s in numbers)
    shard = {"keys": [], "results": [], "skipped": []}
    written = {}  # summaries of the shards written here; those done before are read back below

    def finish(position: int, images, kept: list[ImageItem], bad, regions) -> None:
        """The rule over a batch's regions, then its shard written once the shard is complete."""
        s = batches[position][0]
        for item, result in zip(kept, backend.select(images, [item.boxes for item in kept], regions)):
            ids = [-1] + list(item.box_ids) if item.box_ids else [-1] * len(result.boxes)
            result.box_ids = np.array(ids, dtype=np.int64)
            try:
                stored = compact(result, fmt.dtype, fmt.class_topk)
            except ValueError as exc:
                raise ValueError(f"{paths[s]}: image {item.key}: {exc}") from None
            shard["keys"].append(item.key)
            shard["results"].append(stored)
        shard["skipped"] += bad
        if position + 1 == len(batches) or batches[position + 1][0] != s:  # the shard's last batch
            shard_attrs = {**attrs, SHARD_FINGERPRINT: fingerprints[s]}
            written[s] = write_shard(
                paths[s], shard["keys"], shard["results"], shard["skipped"], shard_attrs, fmt.dtype, fmt.class_topk
            )
            shard.update(keys=[], results=[], skipped=[])

    # Decoding batch k+1 runs in a thread beside the forward pass of batch k (PIL leaves the GIL;
    # on a CPU it fills the single-threaded RoIAlign and NMS). With the detector on a GPU the rule
    # and writes of batch k-1 do too; on a CPU they run in turn, as their torch ops in a thread of
    # their own (an OpenMP team of its own) slowed the forward pass more than they cost.
    on_gpu = str(getattr(backend, "device", "cpu")).startswith("cuda")
    with (
        ThreadPoolExecutor(max_workers=1) as loader,
        ThreadPoolExecutor(max_workers=1) if on_gpu else _InTurn() as finisher,
        tqdm(
            total=total,
            initial=total - sum(len(shards[s]) for s in todo),
            desc=f"extract {out.stem} {chunk.name}",
            unit="img",
            disable=not progress,
        ) as bar,
    ):
        pending = loader.submit(_load_batch, batches[0][1], on_bad_image) if batches else None
        finishing = None
        for position, (_, batch) in enumerate(batches):
            images, kept, bad = pending.result()
            if position + 1 < len(batches):
                pending = loader.submit(_load_batch, batches[position + 1][1], on_bad_image)
            regions = backend.forward_regions(images, [item.boxes for item in kept]) if kept else []
            if finishing is not None:
                finishing.result()  # in order, and one batch's regions held at a time
            finishing = finisher.submit(finish, position, images, kept, bad, regions)
            bar.update(len(batch))
        if finishing is not None:
            finishing.result()
    summaries = [written[s] if s in written else shard_summary(paths[s]) for s in numbers]
    manifest = {
        "chunk": chunk.name,
        "shards": [paths[s].name for s in numbers],
        "images_per_shard": size,
        "num_shards": -(-len(items) // size),
        **{key: sum(summary[key] for summary in summaries) for key in ("images", "regions", "skipped")},
    }
    io.write_json(chunk_manifest(out, chunk), manifest, indent=1)
    return [paths[s] for s in numbers]


def index_store(out, manifests: list[Path]) -> dict:
    """The gather step: the index `out` over the shards the chunks' manifests list, in chunk order.
    The chunks must be all of one extraction: every chunk of one count, one shard size, and
    together the shards 0..S-1."""
    out = Path(out)
    listed, layouts = [], set()
    for manifest in sorted(manifests, key=lambda p: Chunk.parse(Path(p).stem.removeprefix("chunk_")).number):
        try:
            content = json.loads(Path(manifest).read_text())
            listed += content["shards"]
            layouts.add((content["images_per_shard"], content["num_shards"]))
        except (OSError, ValueError, KeyError) as exc:
            raise ValueError(f"{manifest}: not a chunk manifest of `vlbert extract-rois --chunk` ({exc})") from None
    counts = {Chunk.parse(Path(p).stem.removeprefix("chunk_")).count for p in manifests}
    if len(counts) != 1 or len(manifests) != counts.pop():
        raise ValueError(f"{out}: the manifests of every chunk are needed, got {[Path(p).name for p in manifests]}")
    expected = [f"shard_{s:06d}.h5" for s in range(next(iter(layouts))[1])] if len(layouts) == 1 else None
    if listed != expected:
        raise ValueError(
            f"{out}: the chunks' manifests are of different extractions (shard sizes and counts "
            f"{sorted(layouts)}): extract every chunk again"
        )
    return write_index(out, [shards_folder(out) / name for name in listed])


def extract_to_store(
    backend,
    items: list[ImageItem],
    out,
    batch_size: int = 16,
    on_bad_image: str = "error",
    attrs: dict | None = None,
    fmt: StoreFormat = StoreFormat(),
    progress: bool = True,
) -> dict:
    """Extract every item into the store `out` (one chunk, then its index); returns {images,
    regions, skipped, shards}."""
    chunk = Chunk()
    extract_chunk(backend, items, out, chunk, batch_size, on_bad_image, attrs, fmt, progress)
    return index_store(out, [chunk_manifest(out, chunk)])


class _InTurn:
    """An executor that runs each task at once, in the caller's thread."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def submit(self, function, *args) -> Future:
        future = Future()
        try:
            future.set_result(function(*args))
        except BaseException as exc:
            future.set_exception(exc)
        return future
