"""The synthetic files read the way the field's own loaders read the real ones.

Each test reimplements, in a few lines, what one loader does with the files (cited at the test),
and checks what that loader relies on; none of the loaders' code is copied here.
"""

import json

import pytest
from PIL import Image
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO


# ---- COCO instances: pycocotools ---------------------------------------------------------------

INSTANCES = ["refcoco+/instances.json", "vqa/annotations/instances_train2014.json",
             "vqa/annotations/instances_val2014.json", "detector/annotations/instances_train2017.json"]


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


# ---- VQA: VL-BERT (jackroos/VL-BERT, vqa/data/datasets/vqa.py, VQA.__init__ and load_annotations) --

# VL-BERT's image set -> (COCO image folder, COCO file), its `coco_dataset` table; its test set
# (cfgs/vqa) is test2015, read in test mode: questions only.
VLBERT_COCO = {"train2014": ("train2014", "annotations/instances_train2014.json"),
               "val2014": ("val2014", "annotations/instances_val2014.json"),
               "test-dev2015": ("test2015", "annotations/image_info_test2015.json"),
               "test2015": ("test2015", "annotations/image_info_test2015.json")}


def test_vqa_layout_reads_as_vlbert_reads_it(smoke_world):
    # VL-BERT's data path is the COCO root; it opens the question files one level down, in vqa/,
    # where the synthetic folder has them beside the images (the README says how to point it here).
    root = smoke_world / "vqa"
    vocabulary = [w.lower().strip() for w in (root / "answers_vqa.txt").read_text().splitlines()]
    vocabulary = [w for w in vocabulary if w != ""]
    unknown = vocabulary.index("<unk>")             # get_soft_target looks it up for every question
    for image_set, (folder, info_file) in VLBERT_COCO.items():
        questions = json.loads((root / f"v2_OpenEnded_mscoco_{image_set}_questions.json").read_text())["questions"]
        coco = COCO(str(root / info_file))
        for q in questions:
            image_fn = root / folder / f"COCO_{folder}_{q['image_id']:012d}.jpg"
            with Image.open(image_fn) as image:
                assert image.size == (coco.imgs[q["image_id"]]["width"], coco.imgs[q["image_id"]]["height"])
        if folder == "test2015":                    # COCO's test image list has no annotations
            assert "annotations" not in coco.dataset and set(coco.imgs) == {q["image_id"] for q in questions}
            continue
        annotations = json.loads((root / f"v2_mscoco_{image_set}_annotations.json").read_text())["annotations"]
        for ann, q in zip(annotations, questions, strict=True):  # VL-BERT pairs them by position
            assert ann["question_id"] == q["question_id"]
            if image_set == "train2014":            # a training answer has a class of its own
                assert vocabulary.index(ann["multiple_choice_answer"]) != unknown


def test_project_vocabulary_leaves_unk_out(smoke_world):
    from vlbert.data.vqa import read_answer_vocabulary
    lines = (smoke_world / "vqa/answers_vqa.txt").read_text().splitlines()
    assert lines[0] == "<unk>" and read_answer_vocabulary(smoke_world / "vqa/answers_vqa.txt") == lines[1:]
