"""The feature stores: every image's regions (row 0: the whole image), in shards with an index.

A store is one HDF5 file, `<dataset>.<split>.<det|gt>.h5`, of one of two kinds:

- a *shard*: the images' arrays themselves. Rows of image i are offsets[i]:offsets[i+1]:
      keys [N] str, offsets [N+1] int64, width [N] int32, height [N] int32,
      boxes [T, 4] float32 (x1 y1 x2 y2, pixels), labels [T] int64, scores [T] float32,
      box_ids [T] int64 (ground-truth mode: the VCR object index or RefCOCO+ ann_id of each given
      box; -1 for the whole image and detections),
      features [T, D] float16 (the preset's `features.dtype`),
      class_probs [T, C+1] float16: each region's class distribution (column 0: background); with
      the preset's `features.class_topk` k, only its k most probable classes, class_probs [T, k]
      float16 with their ids class_ids [T, k] int16 (int32 beyond 32,767 classes).
  Stores written before shards existed hold `probs [T, C+1]` float32 instead; they read the same.
- an *index* over the shards in the folder `<dataset>.<split>.<det|gt>.shards/` beside it: the
  shard file names, and for each image its shard and row range (`shard`, `start`, `stop` [N]),
  with `keys` [N] (fixed-length bytes) and `width`, `height` [N]. Extraction writes shards of a
  fixed number of images (`features.images_per_shard`), each by one job of a chunk
  (`features.chunks`), and a cheap last step writes the index: nothing is copied twice.

Attributes (on shards and index alike): dataset, split, mode (detected | gt), feature_dim,
num_classes (C+1, the width of a region's class distribution), class_names, rule, detector,
skipped, tuned_by (stores recomputed by a pre-trained, tuned Fast R-CNN), ...

Each shard also records what extraction wrote, so that an altered or corrupted one is refused
rather than read: a SHA-256 of each dataset and of each attribute (`content_sha256`) and the range
of its features (`feature_range`). A reader that verifies (training's) checks them once per shard.

Reading (`FeatureStore`) gives each image's arrays with the features as float32 and the class
distribution dense, [rows, C+1] float32 (top-k: the kept classes renormalised to sum to one,
the others zero). It opens shards as it needs them (at most `max_open_shards` at once) and reads an
image's rows only, so its memory does not grow with the store; `preload` reads everything once
(small stores, fast random access). DataLoader workers may share a store: each process opens its
own file handles.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections import OrderedDict
from pathlib import Path
from types import SimpleNamespace

import h5py
import numpy as np

from .. import io
from .errors import DataFormatError

# The per-region arrays every shard holds, whatever its class-distribution form.
REGION_ARRAYS = ("boxes", "labels", "scores", "features", "box_ids")
# What a reader gives for an image: those plus the dense class distribution.
ARRAYS = (*REGION_ARRAYS, "probs")
FEATURE_DTYPES = ("float16", "float32")
# The identity of the detector weights a store's regions come from (`vlbert.detection.identity`).
DETECTOR_ATTR = "detector_weights"
# An index's record of what each shard was made from (the store's attributes, the detector's folder
# among them): a check against shards made again, not the store's content.
SHARD_FINGERPRINTS = "shard_fingerprints"
# A shard's proof of its content: {dataset or "attr:<name>": SHA-256}, and its features' [min, max].
CONTENT_CHECKSUM = "content_sha256"
FEATURE_RANGE = "feature_range"
_HASHED_ROWS = 2**16  # rows hashed at a time: a shard is verified without reading it whole at once


class MissingImageError(DataFormatError, KeyError):
    """A store lacks an image its data set has: bad input (the CLI's one line, exit 2), and a
    KeyError to code that looks images up as in a mapping."""

    __str__ = DataFormatError.__str__  # the message as it is, not KeyError's quoted repr


def plain_attr(value):
    """An HDF5 attribute as a plain Python value: h5py gives numpy scalars and bytes back."""
    return value.decode() if isinstance(value, bytes) else value.item() if hasattr(value, "item") else value


def _array_digest(array) -> str:
    """SHA-256 of an array (in memory, or an HDF5 dataset read a block of rows at a time): its
    dtype, shape and bytes; strings (the image keys) by their text."""
    digest = hashlib.sha256(f"{array.dtype.str} {array.shape}".encode())
    if array.dtype.kind == "O" or h5py.check_string_dtype(array.dtype) is not None:
        digest.update("\0".join(k.decode() if isinstance(k, bytes) else str(k) for k in array[()]).encode())
        return digest.hexdigest()
    for start in range(0, max(len(array), 1) if array.ndim else 1, _HASHED_ROWS):
        block = array[start : start + _HASHED_ROWS] if array.ndim else array[()]
        digest.update(np.ascontiguousarray(block).tobytes())
    return digest.hexdigest()


def _attr_digest(value) -> str:
    return hashlib.sha256(json.dumps(plain_attr(value), default=str).encode()).hexdigest()


def content_digests(f: h5py.File, arrays: dict | None = None) -> dict:
    """What `CONTENT_CHECKSUM` records of an open shard: each dataset's digest (from `arrays` where
    they are already in memory) and each attribute's, but its own."""
    arrays = arrays or {}
    digests = {name: _array_digest(arrays.get(name, f[name])) for name in sorted(f.keys())}
    digests.update({f"attr:{k}": _attr_digest(v) for k, v in sorted(f.attrs.items()) if k != CONTENT_CHECKSUM})
    return digests


def _value_range(array) -> tuple[float, float, int]:
    """(min, max) of an array's finite values and how many are not finite, a block at a time."""
    low, high, bad = math.inf, -math.inf, 0
    for start in range(0, len(array), _HASHED_ROWS):
        block = np.asarray(array[start : start + _HASHED_ROWS], np.float32)
        finite = np.isfinite(block)
        bad += int(block.size - finite.sum())
        if finite.any():
            low, high = min(low, float(block[finite].min())), max(high, float(block[finite].max()))
    return low, high, bad


def _set_attrs(f: h5py.File, attrs: dict) -> None:
    for key, value in attrs.items():
        f.attrs[key] = value if isinstance(value, (int, float, str)) else json.dumps(value)


def shards_folder(out) -> Path:
    """Where the shards of the store `out` (<name>.h5) live: <name>.shards/ beside it."""
    return Path(out).with_suffix(".shards")


# ---- writing ---------------------------------------------------------------------------------


def top_classes(probs: np.ndarray, k: int | None) -> tuple[np.ndarray | None, np.ndarray]:
    """probs [T, C+1] -> (class ids [T, k], their probabilities [T, k] float16), most probable
    first. k None or >= C+1 keeps every class: (None, probs as float16), no ids needed."""
    width = probs.shape[1] if probs.ndim == 2 else 0
    if k is None or k >= width:
        return None, probs.astype(np.float16)
    ids = np.argpartition(-probs, k - 1, axis=1)[:, :k]
    values = np.take_along_axis(probs, ids, axis=1)
    order = np.argsort(-values, axis=1, kind="stable")
    id_dtype = np.int16 if width <= np.iinfo(np.int16).max else np.int32
    return np.take_along_axis(ids, order, 1).astype(id_dtype), np.take_along_axis(values, order, 1).astype(np.float16)


def compact(result, dtype: str = "float16", class_topk: int | None = None) -> SimpleNamespace:
    """An image's regions (RoIResult-like: boxes, labels, probs, scores, features, box_ids, width,
    height) as a shard stores them: features in `dtype`, the class distribution as top_classes
    gives it. Extraction compacts each image as it comes, so a shard in the making holds what it
    will store, not the detector's float32 distributions."""
    if dtype not in FEATURE_DTYPES:
        raise ValueError(f"feature dtype must be one of {FEATURE_DTYPES}, got {dtype!r}")
    largest = float(np.abs(result.features).max(initial=0.0))
    if dtype == "float16" and not largest <= float(np.finfo(np.float16).max):
        raise ValueError(
            f"a region feature of {largest:g} does not fit float16 (at most 65504): "
            "set features.dtype: float32 in the preset"
        )
    class_ids, class_probs = top_classes(result.probs, class_topk)
    fields = {name: getattr(result, name) for name in (*REGION_ARRAYS, "width", "height")}
    fields["features"] = result.features.astype(dtype, copy=False)
    return SimpleNamespace(**fields, class_ids=class_ids, class_probs=class_probs, num_classes=result.probs.shape[1])


def write_shard(
    path,
    keys: list[str],
    results,
    skipped: list[tuple[str, str]] = (),
    attrs: dict | None = None,
    dtype: str = "float16",
    class_topk: int | None = None,
) -> dict:
    """Write one shard atomically: `results` (RoIResult-like, or already `compact`ed), one per
    key, and the images skipped as unreadable. Returns {images, regions, skipped}."""
    try:
        stored = [r if hasattr(r, "class_probs") else compact(r, dtype, class_topk) for r in results]
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    counts = np.array([len(r.boxes) for r in stored], dtype=np.int64)
    num_classes = stored[0].num_classes if stored else int((attrs or {}).get("num_classes", 0))

    def joined(name):
        return np.concatenate([getattr(r, name) for r in stored]) if stored else np.zeros(0)

    with io.atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
        f.create_dataset("keys", data=np.array(keys, dtype=object), dtype=h5py.string_dtype())
        f.create_dataset("offsets", data=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))
        f.create_dataset("width", data=np.array([r.width for r in stored], dtype=np.int32))
        f.create_dataset("height", data=np.array([r.height for r in stored], dtype=np.int32))
        for name in REGION_ARRAYS:
            f.create_dataset(name, data=joined(name))
        if stored and stored[0].class_ids is not None:
            f.create_dataset("class_ids", data=joined("class_ids"))
        f.create_dataset(
            "class_probs", data=joined("class_probs") if stored else np.zeros((0, num_classes), np.float16)
        )
        _set_attrs(f, {**(attrs or {}), "num_classes": int(num_classes)})
        f.attrs["skipped"] = json.dumps([list(s) for s in skipped])
        f.attrs["num_skipped"] = len(skipped)
        f.attrs["num_images"] = len(keys)
        low, high, _ = _value_range(f["features"])
        f.attrs[FEATURE_RANGE] = json.dumps([low, high] if high >= low else [])
        f.attrs[CONTENT_CHECKSUM] = json.dumps(content_digests(f))
    return {"images": len(keys), "regions": int(counts.sum()), "skipped": len(skipped)}


def shard_summary(path) -> dict:
    """{images, regions, skipped} of a written shard, from its small arrays only."""
    with h5py.File(path, "r") as f:
        return {
            "images": int(f.attrs["num_images"]),
            "regions": int(f["offsets"][-1]),
            "skipped": int(f.attrs["num_skipped"]),
        }


# Attributes a shard has of its own, not the store's.
_SHARD_ONLY = ("skipped", "num_skipped", "num_images", "shard_fingerprint", CONTENT_CHECKSUM, FEATURE_RANGE)


def write_index(out, shards: list[Path], attrs: dict | None = None) -> dict:
    """Write the index `out` over `shards` (in order; all in shards_folder(out)), atomically, and
    delete the folder's other shard files (left by an earlier layout). Returns a summary."""
    out, folder = Path(out), shards_folder(out)
    keys, shard_of, starts, stops, widths, heights, skipped = [], [], [], [], [], [], []
    fingerprints, rows = [], []
    store_attrs = empty_attrs = None
    for number, path in enumerate(shards):
        if Path(path).parent.resolve() != folder.resolve():
            raise ValueError(f"{out}: shard {path} is not in its shards folder {folder}")
        try:
            with h5py.File(path, "r") as f:
                offsets = f["offsets"][()]
                names = [k.decode() if isinstance(k, bytes) else k for k in f["keys"][()]]
                keys += names
                shard_of.append(np.full(len(names), number, np.int32))
                starts.append(offsets[:-1])
                stops.append(offsets[1:])
                widths.append(f["width"][()])
                heights.append(f["height"][()])
                skipped += json.loads(f.attrs.get("skipped", "[]"))
                fingerprints.append(str(plain_attr(f.attrs.get("shard_fingerprint", ""))))
                rows.append(int(offsets[-1]))
                mine = {k: plain_attr(v) for k, v in f.attrs.items() if k not in _SHARD_ONLY}
        except (OSError, KeyError) as exc:
            raise DataFormatError(
                path, f"not a readable shard ({exc}); delete it and extract its chunk again"
            ) from None
        if not len(names):  # every image of it unreadable: nothing of the detector's in it to compare
            empty_attrs = mine
            continue
        if store_attrs is not None and mine != store_attrs:
            differ = sorted(k for k in mine.keys() | store_attrs.keys() if mine.get(k) != store_attrs.get(k))
            raise DataFormatError(
                path, f"its attributes {differ} differ from {shards[0]}'s: shards of two extractions"
            )
        store_attrs = mine
    if len(set(keys)) != len(keys):
        raise ValueError(f"{out}: duplicate image keys across shards")
    store_attrs = store_attrs if store_attrs is not None else empty_attrs
    encoded = np.array([k.encode() for k in keys], dtype=bytes) if keys else np.zeros(0, "S1")

    def joined(parts, dtype):
        return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)

    with io.atomic_path(out) as tmp, h5py.File(tmp, "w") as f:
        f.create_dataset(
            "shards", data=np.array([Path(p).name for p in shards], dtype=object), dtype=h5py.string_dtype()
        )
        # What each shard was when indexed: a shard made again since is refused, not misread.
        f.create_dataset(SHARD_FINGERPRINTS, data=np.array(fingerprints, dtype=object), dtype=h5py.string_dtype())
        f.create_dataset("shard_rows", data=np.array(rows, dtype=np.int64))
        f.create_dataset("keys", data=encoded)
        f.create_dataset("shard", data=joined(shard_of, np.int32))
        f.create_dataset("start", data=joined(starts, np.int64))
        f.create_dataset("stop", data=joined(stops, np.int64))
        f.create_dataset("width", data=joined(widths, np.int32))
        f.create_dataset("height", data=joined(heights, np.int32))
        _set_attrs(f, {**(store_attrs or {}), **(attrs or {})})
        f.attrs["skipped"] = json.dumps(skipped)
        f.attrs["num_skipped"] = len(skipped)
        f.attrs["num_images"] = len(keys)
    listed = {Path(p).name for p in shards}
    for stale in folder.glob("shard_*.h5"):
        if stale.name not in listed:
            stale.unlink()
    regions = int(sum((b - a).sum() for a, b in zip(starts, stops)))
    return {"images": len(keys), "regions": regions, "skipped": len(skipped), "shards": len(shards)}


# ---- reading ---------------------------------------------------------------------------------


def store_bytes(path) -> int:
    """A store's size on disk: its file and, for an index, the shards folder beside it."""
    path, folder = Path(path), shards_folder(path)
    shards = sum(p.stat().st_size for p in folder.glob("shard_*.h5")) if folder.is_dir() else 0
    return (path.stat().st_size if path.is_file() else 0) + shards


class _Shard:
    """One shard file's arrays: an open HDF5 file read a row range at a time, or (preload) all
    of it in memory. With `verify` (the attribute values the reader expects), the shard must hold
    what extraction wrote (`check_content`) and those values."""

    def __init__(self, path: Path, preload: bool, verify: dict | None = None):
        self.path = path
        try:
            self._file = h5py.File(path, "r")
        except OSError as exc:
            raise _unreadable(path, exc) from None
        try:
            missing = [name for name in REGION_ARRAYS if name not in self._file]
            if not ("probs" in self._file or "class_probs" in self._file):
                missing.append("class_probs")
            if missing:
                raise DataFormatError(path, f"no {missing[0]!r} dataset: not a shard written by `vlbert extract-rois`")
            probs = [name for name in ("probs", "class_ids", "class_probs") if name in self._file]
            names = [*REGION_ARRAYS, *probs]
            self.data = {name: self._file[name][()] if preload else self._file[name] for name in names}
            self.top_k = "class_ids" in self._file
            if verify is not None:
                check_content(self._file, path, verify, self.data if preload else None)
        except OSError as exc:  # h5py reads lazily: a truncated file can open, then fail here
            self._file.close()
            raise _unreadable(path, exc) from None
        except BaseException:
            self._file.close()
            raise
        self.fingerprint = str(plain_attr(self._file.attrs.get("shard_fingerprint", "")))
        self.num_rows = len(self._file["boxes"])
        if preload:
            self._file.close()
            self._file = None  # a preloaded store pickles (to processes that read it)

    def rows(self, start: int, stop: int, num_classes: int) -> dict:
        try:
            item = {name: self.data[name][start:stop] for name in REGION_ARRAYS}
            if self.top_k:
                item["probs"] = dense_probs(
                    self.data["class_ids"][start:stop], self.data["class_probs"][start:stop], num_classes
                )
            else:  # every class kept: float16 (or float32, stores from before shards)
                item["probs"] = np.asarray(
                    self.data["probs" if "probs" in self.data else "class_probs"][start:stop], np.float32
                )
        except OSError as exc:
            raise _unreadable(self.path, exc) from None
        item["features"] = item["features"].astype(np.float32, copy=False)
        return item

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


# The shards this process has verified, each as `_verification` names it: a job checks a shard
# once, however many readers open it (a task opens its stores for each split it scores).
_VERIFIED: set[tuple] = set()


def _verification(path: Path, expect: dict) -> tuple:
    """A shard file as it is now (written again: another file) and what it was checked against."""
    stat = path.stat()
    return (str(path.resolve()), stat.st_ino, stat.st_size, stat.st_mtime_ns, tuple(sorted(expect.items())))


def check_content(f: h5py.File, path, expect: dict, arrays: dict | None = None) -> None:
    """Refuse a shard that is not what extraction wrote: one without checksums, one whose datasets
    or attributes differ from their checksums (naming them; the features with their range now and
    then), or whose attributes are not the `expect`ed values (another detector's regions)."""
    recorded = f.attrs.get(CONTENT_CHECKSUM)
    if recorded is None:
        raise DataFormatError(
            path, "records no content checksum (written before shards had one): run `vlbert extract-rois` again"
        )
    recorded, found = json.loads(plain_attr(recorded)), content_digests(f, arrays)
    differ = sorted(k for k in recorded.keys() | found.keys() if recorded.get(k) != found.get(k))
    if differ:
        parts = []
        for key in differ:
            if key == "features" and "features" in f:
                low, high, bad = _value_range(f["features"])
                written = json.loads(plain_attr(f.attrs.get(FEATURE_RANGE, "[]")))
                parts.append(
                    f"its features (now in [{low:.4g}, {high:.4g}]"
                    + (f" with {bad} values that are not finite" if bad else "")
                    + (f"; written in [{written[0]:.4g}, {written[1]:.4g}]" if written else "")
                    + ")"
                )
            else:
                parts.append(f"its attribute {key[5:]!r}" if key.startswith("attr:") else f"its {key}")
        raise DataFormatError(
            path,
            f"{', '.join(parts)} differ from what extraction wrote (checksums): the shard was altered or is "
            "corrupt; run `vlbert extract-rois` (or `vlbert tune-features`) again",
        )
    _check_attrs(path, {k: v for k, v in f.attrs.items()}, expect)


def _check_attrs(path, attrs: dict, expect: dict) -> None:
    def describe(values):
        return ", ".join(f"{key} {value!r}" for key, value in values.items())

    for key in expect:
        if key not in attrs:
            raise DataFormatError(
                path,
                f"no {key!r} attribute: not a store written by `vlbert extract-rois`"
                f" (expected a store of {describe(expect)})",
            )
    found = {key: str(plain_attr(attrs[key])) for key in expect}
    wanted = {key: str(value) for key, value in expect.items()}
    if found.get(DETECTOR_ATTR, "") != wanted.get(DETECTOR_ATTR, ""):
        raise DataFormatError(
            path,
            f"its regions come from the detector whose weights are {found[DETECTOR_ATTR]}, but the study's "
            f"detector's are {wanted[DETECTOR_ATTR]}: extract the stores again with it (`vlbert extract-rois`)",
        )
    if found != wanted:
        raise DataFormatError(path, f"a store of {describe(found)}, but {describe(expect)} is expected here")


def dense_probs(class_ids: np.ndarray, class_probs: np.ndarray, num_classes: int) -> np.ndarray:
    """Top-k (ids, probabilities) -> [T, num_classes] float32, each row's kept mass renormalised to
    one (rows with none, e.g. the whole image's when it has no distribution, stay zero)."""
    probs = np.zeros((len(class_ids), num_classes), np.float32)
    if class_ids.size:
        np.put_along_axis(probs, class_ids.astype(np.int64), class_probs.astype(np.float32), axis=1)
        total = probs.sum(1, keepdims=True)
        np.divide(probs, total, out=probs, where=total > 0)
    return probs


def _unreadable(path, exc: OSError) -> DataFormatError:
    return DataFormatError(
        path,
        f"not a readable feature store: empty, truncated or corrupt ({exc}); "
        "delete it and run `vlbert extract-rois` again",
    )


class FeatureStore:
    """Read one feature store (an index over shards, or a single shard): `store[key]` gives that
    image's arrays; `store.keys` lists images.

    Shards are opened as needed, at most `max_open_shards` at once, and only an image's rows
    are read: memory stays bounded whatever the store's size. With `preload`, every shard is read
    into memory once: fast random access for small stores. `expect` names attribute values the
    caller needs (e.g. {"dataset": "refcoco+"}): a store of another data set, split or box mode is
    refused, not read as if it were the right one.
    """

    def __init__(
        self, path, preload: bool = False, expect: dict | None = None, max_open_shards: int = 16, verify: bool = False
    ):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"feature store not found: {self.path} (run `vlbert extract-rois`)")
        self.preload, self.max_open_shards = preload, max(1, max_open_shards)
        self._open: OrderedDict[int, _Shard] = OrderedDict()
        self._pid = os.getpid()
        self._shard_checks = None  # (fingerprint, rows) of each shard when indexed
        self._expect = expect or {}
        self._verify = verify  # each shard checked once in this process (check_content)
        try:
            with h5py.File(self.path, "r") as f:
                self._read_index(f) if "shard" in f else self._read_single(f)
        except OSError as exc:
            raise _unreadable(self.path, exc) from None
        self._check(expect or {})
        self.num_classes = int(plain_attr(self.attrs.get("num_classes", 0)))  # C+1, the distribution's width
        order = np.argsort(self._keys, kind="stable")
        self._sorted_keys, self._order = self._keys[order], order
        if preload:
            for number in range(len(self._shard_paths)):
                self._shard(number)

    def _require(self, f: h5py.File, names) -> None:
        for name in names:
            if name not in f:
                raise DataFormatError(
                    self.path, f"no {name!r} dataset: not a feature store written by `vlbert extract-rois`"
                )

    def _read_single(self, f: h5py.File) -> None:
        self._require(f, ("keys", "offsets", "width", "height"))
        keys = [k.decode() if isinstance(k, bytes) else k for k in f["keys"][()]]
        offsets = f["offsets"][()]
        rows = {name: len(f[name]) for name in (*REGION_ARRAYS, "probs", "class_probs") if name in f}
        if len(offsets) != len(keys) + 1 or any(n != offsets[-1] for n in rows.values()):
            raise DataFormatError(
                self.path,
                f"{len(keys)} images, {len(offsets)} offsets and {rows} rows do not fit together: "
                "the store is corrupt",
            )
        self._keys = np.array([k.encode() for k in keys], dtype=bytes) if keys else np.zeros(0, "S1")
        self._shard_of = np.zeros(len(keys), np.int32)
        self._start, self._stop = offsets[:-1], offsets[1:]
        self._width, self._height = f["width"][()], f["height"][()]
        self._shard_paths = [self.path]
        self.attrs = {k: v for k, v in f.attrs.items()}
        if "probs" in f and "num_classes" not in self.attrs:
            self.attrs["num_classes"] = f["probs"].shape[1] if f["probs"].ndim == 2 else 0

    def _read_index(self, f: h5py.File) -> None:
        self._require(f, ("keys", "shards", "shard", "start", "stop", "width", "height"))
        self._keys = f["keys"][()]
        self._shard_of, self._start, self._stop = f["shard"][()], f["start"][()], f["stop"][()]
        self._width, self._height = f["width"][()], f["height"][()]
        names = [n.decode() if isinstance(n, bytes) else n for n in f["shards"][()]]
        folder = shards_folder(self.path)
        self._shard_paths = [folder / name for name in names]
        if SHARD_FINGERPRINTS in f:
            self._shard_checks = list(zip(f[SHARD_FINGERPRINTS].asstr()[()], f["shard_rows"][()]))
        self.attrs = {k: v for k, v in f.attrs.items()}
        sizes = {len(a) for a in (self._shard_of, self._start, self._stop, self._width, self._height)}
        if sizes != {len(self._keys)} or (len(self._shard_of) and not 0 <= self._shard_of.max() < len(names)):
            raise DataFormatError(
                self.path, "its keys, shard numbers and row ranges do not fit together: the index is corrupt"
            )
        for name in names:
            if Path(name).name != name:  # a shard path must not leave the store's folder
                raise DataFormatError(self.path, f"shard name {name!r} is not a plain file name")

    def _check(self, expect: dict) -> None:
        _check_attrs(self.path, self.attrs, expect)

    def _shard(self, number: int) -> _Shard:
        if os.getpid() != self._pid:  # a forked DataLoader worker: its own handles, not the parent's
            self._open, self._pid = OrderedDict(), os.getpid()
        shard = self._open.get(number)
        if shard is None:
            path = self._shard_paths[number]
            if not path.is_file():
                raise DataFormatError(self.path, f"its shard {path} is missing (run `vlbert extract-rois` again)")
            key = _verification(path, self._expect) if self._verify else None
            verify = key is not None and key not in _VERIFIED
            shard = self._open[number] = _Shard(path, self.preload, self._expect if verify else None)
            if verify:
                _VERIFIED.add(key)
            if self._shard_checks is not None and (shard.fingerprint, shard.num_rows) != tuple(
                self._shard_checks[number]
            ):
                del self._open[number]
                shard.close()
                raise DataFormatError(
                    self.path,
                    f"its shard {path} was written again after the index: run `vlbert index-store` "
                    "(or the workflow) again",
                )
            if not self.preload and len(self._open) > self.max_open_shards:
                self._open.popitem(last=False)[1].close()
        self._open.move_to_end(number)
        return shard

    def _position(self, key: str) -> int:
        encoded = key.encode()
        j = int(np.searchsorted(self._sorted_keys, encoded))
        if j == len(self._sorted_keys) or self._sorted_keys[j] != encoded:
            raise MissingImageError(
                self.path,
                f"no image {key!r}: the store was extracted from other images (run `vlbert extract-rois` again)",
            )
        return int(self._order[j])

    @property
    def keys(self) -> list[str]:
        """Every image key, in store order."""
        return [k.decode() for k in self._keys]

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: str) -> bool:
        try:
            self._position(key)
        except KeyError:
            return False
        return True

    def __getitem__(self, key: str) -> dict:
        i = self._position(key)
        item = self._shard(int(self._shard_of[i])).rows(int(self._start[i]), int(self._stop[i]), self.num_classes)
        item["width"], item["height"] = int(self._width[i]), int(self._height[i])
        return item

    @property
    def skipped(self) -> list[list[str]]:
        return json.loads(self.attrs.get("skipped", "[]"))

    def close(self) -> None:
        if os.getpid() == self._pid:
            for shard in self._open.values():
                if not self.preload:
                    shard.close()
        self._open.clear()

    def __getstate__(self):
        state = dict(self.__dict__)
        if not self.preload:  # file handles do not travel: the other process opens its own
            state["_open"] = OrderedDict()
        return state

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
