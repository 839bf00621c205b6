"""COCO instances reader, through pycocotools, with the checks pycocotools leaves out."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from pycocotools.coco import COCO

from .errors import DataFormatError, load_json, require_keys, require_nonempty, resolve_inside


def read_coco(instances_path, image_root=None) -> COCO:
    """Load a COCO instances file; `coco.image_root` is where its `file_name`s resolve."""
    data = load_json(instances_path, "COCO instances")
    require_keys(data, ["images", "annotations", "categories"], instances_path)
    image_root = Path(image_root) if image_root else Path(instances_path).parent
    image_ids = set()
    for k, image in enumerate(data["images"]):
        require_keys(image, ["id", "file_name", "width", "height"], instances_path, prefix=f"images[{k}].")
        resolve_inside(image_root, image["file_name"], instances_path, key=f"images[{k}].file_name")
        image_ids.add(image["id"])
    for k, ann in enumerate(data["annotations"]):
        require_keys(ann, ["id", "image_id", "category_id", "bbox"], instances_path, prefix=f"annotations[{k}].")
        if len(ann["bbox"]) != 4:
            raise DataFormatError(instances_path, "bbox must be [x, y, width, height]", key=f"annotations[{k}].bbox")
        if ann["image_id"] not in image_ids:
            raise DataFormatError(
                instances_path, f"image_id {ann['image_id']} is not in images", key=f"annotations[{k}].image_id"
            )
    require_nonempty(data["images"], instances_path, "images")
    coco = COCO()
    coco.dataset = data
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress lines
        coco.createIndex()
    coco.image_root = image_root
    return coco
