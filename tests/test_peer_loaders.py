"""The synthetic files read the way the field's own loaders read the real ones.

Each test reimplements, in a few lines, what one loader does with the files (cited at the test),
and checks what that loader relies on; none of the loaders' code is copied here.
"""

import pytest
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO


# ---- COCO instances: pycocotools ---------------------------------------------------------------

INSTANCES = ["refcoco+/instances.json", "detector/annotations/instances_train2017.json"]


@pytest.mark.parametrize("relative", INSTANCES)
def test_instances_load_with_pycocotools_and_areas_are_mask_areas(smoke_world, relative):
    coco = COCO(str(smoke_world / relative))
    assert coco.anns and coco.cats
    for ann in coco.anns.values():
        image = coco.imgs[ann["image_id"]]
        x, y, w, h = ann["bbox"]
        assert 0 <= x and 0 <= y and x + w <= image["width"] and y + h <= image["height"]
        assert ann["category_id"] in coco.cats and ann["iscrowd"] == 0
        # COCO's area is its segmentation's, the pixels of the mask pycocotools rasterises.
        assert ann["area"] == mask_utils.area(coco.annToRLE(ann)) > 0, ann


def test_circles_area_is_not_their_box(smoke_world):
    coco = COCO(str(smoke_world / "refcoco+/instances.json"))
    circle = next(c for c, cat in coco.cats.items() if cat["name"] == "circle")
    ratios = [a["area"] / (a["bbox"][2] * a["bbox"][3]) for a in coco.anns.values() if a["category_id"] == circle]
    assert ratios and all(0.6 < q < 0.95 for q in ratios)       # pi / 4 of the box, give or take pixels
