"""Which images to extract for a data set and split, read with the data set's own reader.

An item has a key (how the fine-tuning code finds it in the feature store), the image path and,
in ground-truth-box mode, the boxes to describe (VCR metadata boxes; RefCOCO+ annotation boxes).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..registry import IMAGE_SPLITS

GT_BOX_DATASETS = ("vcr", "refcoco+")


@dataclass(frozen=True)
class ImageItem:
    key: str
    path: Path
    boxes: np.ndarray | None = None  # [n, 4] x1 y1 x2 y2, ground-truth mode only
    box_ids: tuple = ()  # what each given box is (VCR object index, RefCOCO+ ann_id)


def _unique(items: list[ImageItem]) -> list[ImageItem]:
    seen, out = set(), []
    for item in items:
        if item.key not in seen:
            seen.add(item.key)
            out.append(item)
    return out


def image_items(root, dataset: str, split: str, gt_boxes: bool = False) -> list[ImageItem]:
    root = Path(root)
    if split not in IMAGE_SPLITS.get(dataset, ()):
        raise ValueError(f"unknown split {split!r} of {dataset!r}; expected one of {IMAGE_SPLITS.get(dataset, ())}")
    if gt_boxes and dataset not in GT_BOX_DATASETS:
        raise ValueError(f"ground-truth boxes exist only for {GT_BOX_DATASETS}, not {dataset!r}")
    if dataset == "conceptual_captions":
        from ..data.conceptual_captions import read_captions

        return _unique(
            [
                ImageItem(str(c.image_path.relative_to(root)), c.image_path)
                for c in read_captions(root / f"{split}.tsv")
            ]
        )
    if dataset == "vqa":
        from ..data.vqa import read_vqa

        return _unique(
            [
                ImageItem(str(e.image_id), e.image_path)
                for e in read_vqa(root / f"v2_OpenEnded_mscoco_{split}_questions.json")
            ]
        )
    if dataset == "vcr":
        from ..data.vcr import read_metadata, read_vcr

        items = []
        for e in read_vcr(root / f"{split}.jsonl"):
            boxes = None
            if gt_boxes:
                meta = read_metadata(e.metadata_path)
                boxes = np.array([b[:4] for b in meta.boxes], dtype=np.float32).reshape(-1, 4)
            key = str(e.image_path.relative_to(root / "vcr1images"))
            items.append(ImageItem(key, e.image_path, boxes, tuple(range(len(e.objects))) if gt_boxes else ()))
        return _unique(items)
    if dataset == "refcoco+":
        from ..data.refcoco import RefCOCO

        coco = RefCOCO(root).coco
        items = []
        for image_id in sorted(coco.imgs):
            boxes, ids = None, ()
            if gt_boxes:
                anns = sorted(coco.imgToAnns[image_id], key=lambda a: a["id"])
                boxes = np.array(
                    [
                        [a["bbox"][0], a["bbox"][1], a["bbox"][0] + a["bbox"][2], a["bbox"][1] + a["bbox"][3]]
                        for a in anns
                    ],
                    dtype=np.float32,
                ).reshape(-1, 4)
                ids = tuple(a["id"] for a in anns)
            items.append(ImageItem(str(image_id), coco.image_root / coco.imgs[image_id]["file_name"], boxes, ids))
        return items
    if dataset == "detector":
        from ..data.coco import read_coco

        coco = read_coco(root / "annotations" / f"instances_{split}.json", root / split)
        return [ImageItem(str(i), coco.image_root / coco.imgs[i]["file_name"]) for i in sorted(coco.imgs)]
    raise ValueError(f"unknown data set {dataset!r}; expected one of {tuple(IMAGE_SPLITS)}")
