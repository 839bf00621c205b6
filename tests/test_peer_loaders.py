"""The synthetic files read the way the field's own loaders read the real ones.

Each test reimplements, in a few lines, what one loader does with the files (cited at the test),
and checks what that loader relies on; none of the loaders' code is copied here.
"""

import json
import pickle
from collections import Counter

import pytest
from PIL import Image
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO

from vlbert.data.synthetic.refcoco import TEST_KINDS
from vlbert.data.vcr import read_metadata, read_object_names, read_vcr

# ---- COCO instances: pycocotools ---------------------------------------------------------------

INSTANCES = [
    "refcoco+/instances.json",
    "vqa/annotations/instances_train2014.json",
    "vqa/annotations/instances_val2014.json",
    "detector/annotations/instances_train2017.json",
]


@pytest.mark.parametrize("relative", INSTANCES)
def test_instances_load_with_pycocotools_and_areas_are_mask_areas(smoke_world, relative):
    coco = COCO(str(smoke_world / relative))
    assert coco.anns and coco.cats
    for ann in coco.anns.values():
        image = coco.imgs[ann["image_id"]]
        x, y, w, h = ann["bbox"]
        assert x >= 0 and y >= 0 and x + w <= image["width"] and y + h <= image["height"]
        assert ann["category_id"] in coco.cats and ann["iscrowd"] == 0
        # COCO's area is its segmentation's, the pixels of the mask pycocotools rasterises.
        assert ann["area"] == mask_utils.area(coco.annToRLE(ann)) > 0, ann


def test_circles_area_is_not_their_box(smoke_world):
    coco = COCO(str(smoke_world / "refcoco+/instances.json"))
    circle = next(c for c, cat in coco.cats.items() if cat["name"] == "circle")
    ratios = [a["area"] / (a["bbox"][2] * a["bbox"][3]) for a in coco.anns.values() if a["category_id"] == circle]
    assert ratios and all(0.6 < q < 0.95 for q in ratios)  # pi / 4 of the box, give or take pixels


# ---- VQA: VL-BERT (jackroos/VL-BERT, vqa/data/datasets/vqa.py, VQA.__init__ and load_annotations) --

# VL-BERT's image set -> (COCO image folder, COCO file), its `coco_dataset` table; its test set
# (cfgs/vqa) is test2015, read in test mode: questions only.
VLBERT_COCO = {
    "train2014": ("train2014", "annotations/instances_train2014.json"),
    "val2014": ("val2014", "annotations/instances_val2014.json"),
    "test-dev2015": ("test2015", "annotations/image_info_test2015.json"),
    "test2015": ("test2015", "annotations/image_info_test2015.json"),
}


def test_vqa_layout_reads_as_vlbert_reads_it(smoke_world):
    # VL-BERT's data path is the COCO root; it opens the question files one level down, in vqa/,
    # where the synthetic folder has them beside the images (docs/synthetic_world.md says how to point it here).
    root = smoke_world / "vqa"
    vocabulary = [w.lower().strip() for w in (root / "answers_vqa.txt").read_text().splitlines()]
    vocabulary = [w for w in vocabulary if w != ""]
    unknown = vocabulary.index("<unk>")  # get_soft_target looks it up for every question
    for image_set, (folder, info_file) in VLBERT_COCO.items():
        questions = json.loads((root / f"v2_OpenEnded_mscoco_{image_set}_questions.json").read_text())["questions"]
        coco = COCO(str(root / info_file))
        for q in questions:
            image_fn = root / folder / f"COCO_{folder}_{q['image_id']:012d}.jpg"
            with Image.open(image_fn) as image:
                assert image.size == (coco.imgs[q["image_id"]]["width"], coco.imgs[q["image_id"]]["height"])
        if folder == "test2015":  # COCO's test image list has no annotations
            assert "annotations" not in coco.dataset and set(coco.imgs) == {q["image_id"] for q in questions}
            continue
        annotations = json.loads((root / f"v2_mscoco_{image_set}_annotations.json").read_text())["annotations"]
        for ann, q in zip(annotations, questions, strict=True):  # VL-BERT pairs them by position
            assert ann["question_id"] == q["question_id"]
            if image_set == "train2014":  # a training answer has a class of its own
                assert vocabulary.index(ann["multiple_choice_answer"]) != unknown


def test_project_vocabulary_leaves_unk_out(smoke_world):
    from vlbert.data.vqa import read_answer_vocabulary

    lines = (smoke_world / "vqa/answers_vqa.txt").read_text().splitlines()
    assert lines[0] == "<unk>" and read_answer_vocabulary(smoke_world / "vqa/answers_vqa.txt") == lines[1:]


# ---- VCR: r2c (rowanz/r2c, dataloaders/vcr.py) and VL-BERT (vcr/data/datasets/vcr.py) ------------


def coco_2014_names() -> list[str]:
    """COCO 2014's 80 category names, in category-id order, as torchvision ships them."""
    from torchvision.models.detection import FasterRCNN_ResNet50_FPN_Weights

    names = FasterRCNN_ResNet50_FPN_Weights.DEFAULT.meta["categories"]
    return [n for n in names if n not in ("__background__", "N/A")]


@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_vcr_reads_as_r2c_and_vlbert_read_it(smoke_world, split):
    # Both map `objects` through COCO's 80 names spelt without spaces (r2c's cocoontology.json,
    # VL-BERT's `categories`), after '__background__'.
    coco_objects = ["__background__"] + [n.replace(" ", "") for n in coco_2014_names()]
    coco_obj_to_ind = {o: i for i, o in enumerate(coco_objects)}
    root = smoke_world / "vcr"
    for line in (root / f"{split}.jsonl").read_text().splitlines():
        item = json.loads(line)
        obj_labels = [coco_obj_to_ind[o] for o in item["objects"]]  # r2c's and VL-BERT's KeyError
        # Every object is a person, whose mentions both readers read as a neutral name (r2c's
        # GENDER_NEUTRAL_NAMES, by the object's index), as the project's reader does.
        assert set(item["objects"]) == {"person"}
        metadata = json.loads((root / "vcr1images" / item["metadata_fn"]).read_text())
        assert (root / "vcr1images" / item["img_fn"]).is_file()
        assert len(metadata["boxes"]) == len(metadata["segms"]) == len(obj_labels)
        assert metadata["names"] == item["objects"]
        for box, polygons in zip(metadata["boxes"], metadata["segms"]):
            x1, y1, x2, y2, score = box  # r2c chops the score, VL-BERT keeps 5 values
            assert 0 <= x1 < x2 <= metadata["width"] and 0 <= y1 < y2 <= metadata["height"] and 0 < score <= 1
            assert polygons and all(len(p) >= 3 and all(len(point) == 2 for point in p) for p in polygons)


def test_vcr_project_reader_names_a_tag_as_r2c_does(smoke_world):
    from vlbert.data.vcr import GENDER_NEUTRAL_NAMES, tag_name

    root = smoke_world / "vcr"
    assert read_object_names(root) == {}  # the real VCR's layout: no map of names
    for example in read_vcr(root / "train.jsonl"):
        assert read_metadata(example.metadata_path).names == example.objects
        # r2c's _fix_tokenization: GENDER_NEUTRAL_NAMES[index % len] for a person
        assert [tag_name(example.objects, k) for k in range(len(example.objects))] == [
            GENDER_NEUTRAL_NAMES[k % len(GENDER_NEUTRAL_NAMES)] for k in range(len(example.objects))
        ]


# ---- RefCOCO+: REFER (lichengunc/refer, refer.py) ----------------------------------------------


def refer_index(root):
    """REFER.__init__ and createIndex: refs(unc).p and instances.json, indexed as REFER indexes them."""
    with open(root / "refs(unc).p", "rb") as f:
        refs = pickle.load(f)
    instances = json.loads((root / "instances.json").read_text())
    Anns = {ann["id"]: ann for ann in instances["annotations"]}
    Imgs = {img["id"]: img for img in instances["images"]}
    Cats = {cat["id"]: cat["name"] for cat in instances["categories"]}
    imgToAnns, imgToRefs, catToRefs, Refs, refToAnn, sentToRef = {}, {}, {}, {}, {}, {}
    for ann in instances["annotations"]:
        imgToAnns.setdefault(ann["image_id"], []).append(ann)
    for ref in refs:
        Refs[ref["ref_id"]] = ref
        imgToRefs.setdefault(ref["image_id"], []).append(ref)
        catToRefs.setdefault(ref["category_id"], []).append(ref)
        refToAnn[ref["ref_id"]] = Anns[ref["ann_id"]]  # REFER's KeyError on a missing ann
        for sent in ref["sentences"]:
            sentToRef[sent["sent_id"]] = ref
    return dict(
        refs=refs,
        Refs=Refs,
        Anns=Anns,
        Imgs=Imgs,
        Cats=Cats,
        imgToAnns=imgToAnns,
        imgToRefs=imgToRefs,
        catToRefs=catToRefs,
        refToAnn=refToAnn,
        sentToRef=sentToRef,
    )


def test_refcoco_loads_as_refer_reads_it(smoke_world):
    r = refer_index(smoke_world / "refcoco+")
    assert len(r["Refs"]) == len(r["refs"])  # ref ids unique
    assert len(r["sentToRef"]) == sum(len(ref["sentences"]) for ref in r["refs"])  # sent ids unique
    for ref in r["refs"]:
        ann = r["refToAnn"][ref["ref_id"]]
        assert ann["category_id"] in r["Cats"] and ref["category_id"] == ann["category_id"]
        assert ref["image_id"] == ann["image_id"] and ref["image_id"] in r["Imgs"]
        assert ref["sent_ids"] == [s["sent_id"] for s in ref["sentences"]]
        assert all(s["tokens"] == s["sent"].split() for s in ref["sentences"])
    assert {ref["split"] for ref in r["refs"]} == {"train", "val", "testA", "testB"}
    # REFER's getRefIds(split="testA") keeps the refs whose split contains "A": only testA's.
    assert [ref for ref in r["refs"] if "A" in ref["split"]] == [ref for ref in r["refs"] if ref["split"] == "testA"]
    # Splits divide images, as the UNC splits do.
    splits_of_image = {image: {ref["split"] for ref in refs} for image, refs in r["imgToRefs"].items()}
    assert all(len(splits) == 1 for splits in splits_of_image.values())


def test_refcoco_refers_to_objects_that_share_their_category(smoke_world):
    """RefCOCO+ was collected on objects with another of their category in the image; testA refers
    to one kind of category (RefCOCO+'s people), testB to the other."""
    r = refer_index(smoke_world / "refcoco+")
    for ref in r["refs"]:
        categories = Counter(ann["category_id"] for ann in r["imgToAnns"][ref["image_id"]])
        assert categories[ref["category_id"]] >= 2, ref
        if ref["split"] in TEST_KINDS:
            assert r["Cats"][ref["category_id"]] in TEST_KINDS[ref["split"]], ref
    kinds = {
        split: {r["Cats"][ref["category_id"]] for ref in r["refs"] if ref["split"] == split} for split in TEST_KINDS
    }
    assert kinds["testA"] and kinds["testB"] and not kinds["testA"] & kinds["testB"]


def test_refcoco_split_sizes_are_the_configured_shares(smoke_world):
    r = refer_index(smoke_world / "refcoco+")
    images = Counter(refs[0]["split"] for refs in r["imgToRefs"].values())
    # 60 images, 30% held out: 6 val, 6 testA, 6 testB, 42 train; fewer when an image's objects of
    # one shape are twins (same colour and size), which no expression tells apart: more often in
    # train, whose twins wear one of the five common colours only (about one image in five).
    configured = {"train": 42, "val": 6, "testA": 6, "testB": 6}
    assert all(configured[split] - 1 <= images[split] <= configured[split] for split in ("val", "testA", "testB"))
    assert 0.7 * configured["train"] <= images["train"] <= configured["train"], images
