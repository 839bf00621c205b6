"""Feature stores recomputed by a setting's tuned Fast R-CNN.

A setting that tunes Fast R-CNN in pre-training (`full`) no longer matches the detector's cached
features. Fine-tuning keeps Fast R-CNN frozen, so its features are fixed after pre-training: they
are computed here once per store, for the same regions, and every fine-tuning run of the setting
(sweep trials and seeds alike) reads them, instead of running the backbone in each step of each run.

Shards as in `vlbert.detection.extract`: a killed run resumes, and ends with the same file.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import SimpleNamespace

import torch
from tqdm import tqdm

from ..data.feature_store import ARRAYS, FeatureStore, finish_shards, shard_paths, write_shard
from ..detection.train import load_image

TUNED_BY = "tuned_by"   # store attribute: the pre-trained checkpoint whose Fast R-CNN made the features


def _fingerprint(source: Path, pretrained: Path, batch_size: int) -> str:
    parts = [str(source.resolve()), str(batch_size)]
    for path in (source, pretrained / "model.safetensors"):
        stat = path.stat()
        parts += [str(stat.st_size), str(stat.st_mtime_ns)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


@torch.no_grad()
def tune_store(fast_rcnn, pretrained, source, image_paths: dict[str, Path], out, batch_size: int = 32,
               progress: bool = True) -> dict:
    """Write `out`: the regions of store `source`, their features from `fast_rcnn` (in eval mode).

    image_paths maps each image key of the store to its file.
    """
    source, out, pretrained = Path(source), Path(out), Path(pretrained)
    store = FeatureStore(source, preload=True)
    missing = [k for k in store.keys if k not in image_paths]
    if missing:
        raise FileNotFoundError(f"{source}: no image file known for {len(missing)} images, e.g. {missing[0]!r}")
    fast_rcnn.eval()
    batches = [store.keys[k:k + batch_size] for k in range(0, len(store.keys), batch_size)]
    shards = shard_paths(out, _fingerprint(source, pretrained, batch_size), len(batches))
    for keys, shard in tqdm(list(zip(batches, shards)), desc=f"tuned features {out.name}", unit="batch",
                            disable=not progress):
        if shard.exists():
            continue
        items = [store[key] for key in keys]
        features = fast_rcnn([load_image(image_paths[key]) for key in keys],
                             [torch.from_numpy(item["boxes"]) for item in items])
        results = [SimpleNamespace(**{name: item[name] for name in ARRAYS}, width=item["width"], height=item["height"])
                   for item in items]
        for result, tuned in zip(results, features):
            result.features = tuned.float().numpy()
        write_shard(shard, keys, results, [])
    # h5py gives numpy scalars and bytes back; the merge writes plain values (or JSON).
    attrs = {k: v.decode() if isinstance(v, bytes) else v.item() if hasattr(v, "item") else v
             for k, v in store.attrs.items() if k not in ("skipped", "num_skipped", "num_images")}
    attrs[TUNED_BY] = str(pretrained.resolve())
    return finish_shards(shards, out, attrs)


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


def recomputes_features(setting, store_paths, pretrained) -> bool:
    """Whether fine-tuning this setting must run its Fast R-CNN on the images in every step: it
    tuned the module in pre-training, and the stores it reads are not that module's features."""
    return setting.tune_frcnn and not all(is_tuned_by(path, pretrained) for path in store_paths)


def is_tuned_by(store_path, pretrained) -> bool:
    """Whether a store holds the features of this pre-trained checkpoint's Fast R-CNN."""
    with FeatureStore(store_path) as store:
        tuned_by = store.attrs.get(TUNED_BY)
    return tuned_by is not None and str(tuned_by) == str(Path(pretrained).resolve())
