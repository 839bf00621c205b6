"""Feature stores recomputed by a setting's tuned Fast R-CNN.

A setting that tunes Fast R-CNN in pre-training (`full`) no longer matches the detector's cached
features. Fine-tuning keeps Fast R-CNN frozen, so its features are fixed after pre-training: they
are computed here once per store, for the same regions, and every fine-tuning run of the setting
(sweep trials and seeds alike) reads them, instead of running the backbone in each step of each run.

Shards as in `vlbert.detection.extract`: a killed run resumes, and ends with the same files.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import SimpleNamespace

import torch
from tqdm import tqdm

from ..data.errors import DataFormatError
from ..data.feature_store import (
    CONTENT_CHECKSUM,
    DETECTOR_ATTR,
    FEATURE_RANGE,
    FeatureStore,
    plain_attr,
    shards_folder,
    write_index,
    write_shard,
)
from ..data.images import load_image
from ..detection.extract import SHARD_FINGERPRINT, shard_is_done
from ..io import file_identity

TUNED_BY = "tuned_by"  # store attribute: the pre-trained checkpoint whose Fast R-CNN made the features
# ... and its weights' identity: a checkpoint pre-trained again into the same folder is another one.
TUNED_BY_WEIGHTS = "tuned_by_weights"
DETECTOR_FEATURES = "the detector's Fast R-CNN (not tuned)"


def weights_identity(pretrained) -> str | None:
    return file_identity(Path(pretrained) / "model.safetensors")


def _fingerprint(source: Path, pretrained: Path, batch_size: int, keys: list[str]) -> str:
    parts = [str(source.resolve()), str(batch_size), *keys]
    for path in (source, pretrained / "model.safetensors"):
        stat = path.stat()
        parts += [str(stat.st_size), str(stat.st_mtime_ns)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


@torch.no_grad()
def tune_store(
    fast_rcnn,
    pretrained,
    source,
    image_paths: dict[str, Path],
    out,
    batch_size: int = 32,
    images_per_shard: int = 1000,
    progress: bool = True,
) -> dict:
    """Write the store `out`: the regions of store `source`, their features from `fast_rcnn` (in
    eval mode), in the source's feature dtype and class top-k.

    image_paths maps each image key of the store to its file.
    """
    source, out, pretrained = Path(source), Path(out), Path(pretrained)
    store = FeatureStore(source, verify=True)
    keys = store.keys
    missing = [k for k in keys if k not in image_paths]
    if missing:
        raise FileNotFoundError(f"{source}: no image file known for {len(missing)} images, e.g. {missing[0]!r}")
    attrs = {
        k: plain_attr(v)
        for k, v in store.attrs.items()
        if k not in ("skipped", "num_skipped", "num_images", SHARD_FINGERPRINT, CONTENT_CHECKSUM, FEATURE_RANGE)
    }
    attrs[TUNED_BY], attrs[TUNED_BY_WEIGHTS] = str(pretrained.resolve()), weights_identity(pretrained)
    dtype = str(attrs.get("feature_dtype", "float32"))
    topk = int(attrs.get("class_topk", 0)) or None
    fast_rcnn.eval()
    folder = shards_folder(out)
    shards = [keys[k : k + images_per_shard] for k in range(0, len(keys), images_per_shard)]
    paths = []
    with tqdm(total=len(keys), desc=f"tuned features {out.name}", unit="img", disable=not progress) as bar:
        for number, shard_keys in enumerate(shards):
            path = folder / f"shard_{number:06d}.h5"
            paths.append(path)
            fingerprint = _fingerprint(source, pretrained, batch_size, shard_keys)
            if shard_is_done(path, fingerprint):
                bar.update(len(shard_keys))
                continue
            results = []
            for k in range(0, len(shard_keys), batch_size):
                batch = shard_keys[k : k + batch_size]
                items = [store[key] for key in batch]
                features = fast_rcnn(
                    [load_image(image_paths[key]) for key in batch],
                    [torch.from_numpy(item["boxes"]) for item in items],
                )
                for item, tuned in zip(items, features):
                    results.append(SimpleNamespace(**{**item, "features": tuned.float().numpy()}))
                bar.update(len(batch))
            write_shard(path, shard_keys, results, [], {**attrs, SHARD_FINGERPRINT: fingerprint}, dtype, topk)
    store.close()
    return write_index(out, paths, attrs)


def image_paths_for(config: dict, store_path) -> dict[str, Path]:
    """The image file of every key of an extracted store, from the data set it was extracted from."""
    from ..config import dataset_root
    from ..detection.sources import image_items

    with FeatureStore(store_path) as store:
        attrs = store.attrs
    try:
        dataset, split, mode = (str(attrs[k]) for k in ("dataset", "split", "mode"))
    except KeyError as exc:
        raise ValueError(f"{store_path}: not made by `vlbert extract-rois` (no {exc.args[0]!r} attribute)") from None
    items = image_items(dataset_root(config, dataset), dataset, split, gt_boxes=mode == "gt")
    return {item.key: item.path for item in items}


def check_store_detector(store_paths, detector: str | None) -> None:
    """Every store's regions must come from the study's detector (`detector`: the identity of its
    weights, vlbert.detection.identity; None: not at hand, nothing to compare); a store of another
    detector is refused, naming it. Tuned stores keep the regions, and the attribute, of theirs."""
    if detector is None:
        return
    for path in store_paths:
        with FeatureStore(path, expect={DETECTOR_ATTR: detector}):
            pass


def check_store_features(setting, store_paths, pretrained, detector: str | None = None) -> None:
    """Fine-tuning keeps Fast R-CNN frozen and reads the stores' features as they are, so they must
    be those of the Fast R-CNN the run starts from: the detector's for a setting that never tuned
    it; for one that tuned it in pre-training (`full`), those `vlbert tune-features` made from this
    very checkpoint (the same weights). Any other store would feed the model features it never
    saw, without a word: it is refused, naming both Fast R-CNNs. Every setting's stores must hold
    the regions of the study's `detector` (check_store_detector)."""
    check_store_detector(store_paths, detector)
    wanted = Path(pretrained).resolve() if setting.tune_frcnn else None
    wanted_weights = weights_identity(wanted) if wanted is not None else None  # hashed once, not per store
    for path in store_paths:
        with FeatureStore(path) as store:
            tuned_by, weights = (store.attrs.get(key) for key in (TUNED_BY, TUNED_BY_WEIGHTS))
        if tuned_by is None and wanted is None:
            continue
        same_path = tuned_by is not None and wanted is not None and str(tuned_by) == str(wanted)
        # Stores that record the weights match by them (a copied checkpoint still matches);
        # older ones by the checkpoint's path.
        if (
            wanted is not None
            and tuned_by is not None
            and ((str(weights) == wanted_weights) if weights is not None else same_path)
        ):
            continue
        found = (
            DETECTOR_FEATURES
            if tuned_by is None
            else f"the tuned Fast R-CNN of {tuned_by}"
            + (" before it was pre-trained again" if wanted is not None and same_path else "")
        )
        expected = DETECTOR_FEATURES if wanted is None else f"the tuned Fast R-CNN of {wanted}"
        hint = (
            f"run `vlbert tune-features --pretrained {pretrained} --store <the stores of extract-rois> --out DIR`"
            " and fine-tune with --features DIR"
            if wanted is not None
            else "fine-tune with --features pointing at the stores of `vlbert extract-rois`"
        )
        raise DataFormatError(
            path,
            f"holds the features of {found}, but setting {setting.name!r} fine-tunes on those of {expected}: {hint}",
        )
