"""The HDF5 feature store: one file per data set and split, every image's regions in flat arrays.

Layout (rows of image i are offsets[i]:offsets[i+1]; row 0 of each image is the whole image):
    keys [N] str, offsets [N+1] int64, width [N] int32, height [N] int32,
    boxes [T, 4] float32 (x1 y1 x2 y2, pixels), labels [T] int64, probs [T, C+1] float32,
    scores [T] float32, features [T, D] float32, box_ids [T] int64 (ground-truth mode: the VCR
    object index or RefCOCO+ ann_id of each given box; -1 for the whole image and detections)
Attributes: dataset, split, mode (detected | gt), feature_dim, class_names, rule, detector, skipped,
tuned_by (stores recomputed by a pre-trained, tuned Fast R-CNN), ...

Writing goes through shards (one .npz per batch, each written atomically) that are merged into the
HDF5 file at the end, itself written under a temporary name and renamed: a killed extraction
resumes from its shards and ends with the same file as an uninterrupted one.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np

from .. import io
from .errors import DataFormatError

ARRAYS = ("boxes", "labels", "probs", "scores", "features", "box_ids")


def write_shard(path, keys: list[str], results, skipped: list[tuple[str, str]]) -> None:
    """One batch: its images' results (RoIResult-like) and the images skipped as unreadable."""
    arrays = {name: np.concatenate([getattr(r, name) for r in results]) if results else np.zeros(0) for name in ARRAYS}
    with io.atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez(
            f,
            keys=np.array(keys, dtype=str),
            counts=np.array([len(r.boxes) for r in results], dtype=np.int64),
            width=np.array([r.width for r in results], dtype=np.int32),
            height=np.array([r.height for r in results], dtype=np.int32),
            skipped=np.array(["\t".join(s) for s in skipped], dtype=str),
            **arrays,
        )


def _parts_folder(out) -> Path:
    return Path(out).with_name(Path(out).name + ".parts")


def shard_paths(out, fingerprint: str, count: int) -> list[Path]:
    """The shard files of a resumable write of `out`, in its `.parts` folder. Shards already there
    are kept only when they were made from the same inputs (same `fingerprint`)."""
    parts = _parts_folder(out)
    manifest = parts / "fingerprint"
    if parts.exists() and (not manifest.exists() or manifest.read_text() != fingerprint):
        shutil.rmtree(parts)
    parts.mkdir(parents=True, exist_ok=True)
    manifest.write_text(fingerprint)
    return [parts / f"shard_{k:06d}.npz" for k in range(count)]


def finish_shards(shards: list[Path], out, attrs: dict) -> dict:
    """Merge the shards into `out` (atomically), then drop their `.parts` folder."""
    summary = merge_shards(shards, out, attrs)
    shutil.rmtree(_parts_folder(out), ignore_errors=True)
    return summary


def merge_shards(shards: list[Path], out, attrs: dict) -> dict:
    """Concatenate shards (in order) into the HDF5 file `out`, atomically. Returns a summary."""
    parts = [np.load(s, allow_pickle=False) for s in shards]
    loaded = [p for p in parts if len(p["keys"])]
    keys = [k for p in loaded for k in p["keys"].tolist()]
    if len(set(keys)) != len(keys):
        raise ValueError(f"{out}: duplicate image keys across shards")
    counts = np.concatenate([p["counts"] for p in loaded]) if loaded else np.zeros(0, np.int64)
    skipped = [s.split("\t", 1) for p in parts for s in p["skipped"].tolist()]
    with io.atomic_path(out) as tmp, h5py.File(tmp, "w") as f:
        f.create_dataset("keys", data=np.array(keys, dtype=object), dtype=h5py.string_dtype())
        f.create_dataset("offsets", data=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))
        for name in ("width", "height"):
            f.create_dataset(name, data=np.concatenate([p[name] for p in loaded]) if loaded else np.zeros(0, np.int32))
        for name in ARRAYS:
            if loaded:
                f.create_dataset(name, data=np.concatenate([p[name] for p in loaded]))
        for key, value in attrs.items():
            f.attrs[key] = value if isinstance(value, (int, float, str)) else json.dumps(value)
        f.attrs["skipped"] = json.dumps(skipped)
        f.attrs["num_skipped"] = len(skipped)
        f.attrs["num_images"] = len(keys)
    return {"images": len(keys), "regions": int(counts.sum()), "skipped": len(skipped)}


def plain_attr(value):
    """An HDF5 attribute as a plain Python value: h5py gives numpy scalars and bytes back."""
    return value.decode() if isinstance(value, bytes) else value.item() if hasattr(value, "item") else value


class FeatureStore:
    """Read one feature file: `store[key]` gives that image's arrays; `store.keys` lists images.

    With `preload`, every array is read into memory once and the file closed: fast random
    access for training, and the store can be sent to DataLoader workers. `expect` names attribute
    values the caller needs (e.g. {"dataset": "refcoco+"}): a store of another data set, split or
    box mode is refused, not read as if it were the right one.
    """

    def __init__(self, path, preload: bool = False, expect: dict | None = None):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"feature store not found: {self.path} (run `vlbert extract-rois`)")
        try:
            self._file = h5py.File(self.path, "r")
        except OSError as exc:
            raise self._unreadable(exc) from None
        try:
            self._read(preload)
            self._check(expect or {})
        except BaseException as exc:
            self._file.close()
            if isinstance(exc, OSError):  # h5py reads lazily: a truncated file can open, then fail here
                raise self._unreadable(exc) from None
            raise
        if preload:
            self._file.close()
            self._file = None

    def _unreadable(self, exc: OSError) -> DataFormatError:
        return DataFormatError(
            self.path,
            f"not a readable feature store: empty, truncated or corrupt ({exc}); "
            "delete it and run `vlbert extract-rois` again",
        )

    def _read(self, preload: bool) -> None:
        for name in ("keys", "offsets", "width", "height"):
            if name not in self._file:
                raise DataFormatError(
                    self.path, f"no {name!r} dataset: not a feature store written by `vlbert extract-rois`"
                )
        keys = [k.decode() if isinstance(k, bytes) else k for k in self._file["keys"][()]]
        offsets = self._file["offsets"][()]
        attrs = {k: v for k, v in self._file.attrs.items()}
        rows = {name: len(self._file[name]) for name in ARRAYS if name in self._file}
        if len(offsets) != len(keys) + 1 or any(n != offsets[-1] for n in rows.values()):
            raise DataFormatError(
                self.path,
                f"{len(keys)} images, {len(offsets)} offsets and {rows} rows do not "
                "fit together: the store is corrupt",
            )
        data = {name: self._file[name][()] for name in ("width", "height", *rows)} if preload else self._file
        self.keys, self._offsets, self.attrs, self._data = keys, offsets, attrs, data
        self._index = {k: i for i, k in enumerate(keys)}

    def _check(self, expect: dict) -> None:
        def describe(values):
            return ", ".join(f"{key} {value!r}" for key, value in values.items())

        for key in expect:
            if key not in self.attrs:
                raise DataFormatError(
                    self.path,
                    f"no {key!r} attribute: not a store written by `vlbert extract-rois`"
                    f" (expected a store of {describe(expect)})",
                )
        found = {key: str(plain_attr(self.attrs[key])) for key in expect}
        if found != {key: str(value) for key, value in expect.items()}:
            raise DataFormatError(self.path, f"a store of {describe(found)}, but {describe(expect)} is expected here")

    def __len__(self) -> int:
        return len(self.keys)

    def __contains__(self, key: str) -> bool:
        return key in self._index

    def __getitem__(self, key: str) -> dict:
        try:
            i = self._index[key]
        except KeyError:
            raise KeyError(f"{self.path}: no image {key!r}") from None
        start, end = self._offsets[i], self._offsets[i + 1]
        item = {name: self._data[name][start:end] for name in ARRAYS}
        item["width"], item["height"] = int(self._data["width"][i]), int(self._data["height"][i])
        return item

    @property
    def skipped(self) -> list[list[str]]:
        return json.loads(self.attrs.get("skipped", "[]"))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
