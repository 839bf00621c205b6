"""The embedded default's data: a synthetic world written in the real data sets' formats.

`make_world(spec, out)` writes, under `out`, one folder per data set, each laid out and named as
the real one is, so that the real readers (vlbert.data) read it. Deterministic from the seed:
the same spec gives byte-identical files. Each data set folder is built under a `.partial` name
and renamed when complete, so an interrupted run is simply run again. A folder is replaced only
when it holds nothing but what make-data wrote there (ownership.py).
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ... import io
from ...registry import DATASETS, TASKS, WRITER_VERSIONS
from ..conceptual_captions import WORD_KINDS_FILE
from ..vqa import UNKNOWN_ANSWER, complementary_pairs_name
from . import captions, corpus, refcoco, vcr, vqa
from .language import plural, tokenize
from .ownership import check_replaceable, write_manifest
from .world import (
    COLOURS,
    SHAPES,
    SIZES,
    Scene,
    coco_area,
    coco_bbox,
    coco_polygon,
    render,
    sample_scene,
    save_image,
    scene_size,
    stable_seed,
)

SPEC_STAMP = ".spec.json"  # the spec a folder was made from; a different spec remakes it
CATEGORIES = [{"id": k + 1, "name": s, "supercategory": "shape"} for k, s in enumerate(SHAPES)]
_CATEGORY_ID = {s: k + 1 for k, s in enumerate(SHAPES)}
# The detector's set stands in for Visual Genome, whose classes name what things look like: its
# categories are coloured shapes ("red circle"), so the detector's region features carry colour
# as Visual Genome-trained features do; trained on the six shapes alone, they carried almost none.
DETECTOR_CATEGORIES = [
    {"id": k + 1, "name": f"{c} {s}", "supercategory": s}
    for k, (c, s) in enumerate((c, s) for s in SHAPES for c in COLOURS)
]
_DETECTOR_CATEGORY_ID = {tuple(c["name"].split()): c["id"] for c in DETECTOR_CATEGORIES}
# The spec's VQA splits: the question set the vqa task reads, and the COCO image folder it names.
VQA_SPLITS = {
    "train": (TASKS["vqa"].splits["train"][0], "train2014"),
    "val": (TASKS["vqa"].splits["val"][0], "val2014"),
    "test-dev": (TASKS["vqa"].splits["test"][0], "test2015"),
}
# COCO's files for those image folders, as readers of the VQA layout (VL-BERT's) open them: the
# instances of train and val, the image list alone for test (COCO releases no test annotations).
COCO_IMAGE_INFO = {
    "train2014": "instances_train2014.json",
    "val2014": "instances_val2014.json",
    "test2015": "image_info_test2015.json",
}


def _scenes(spec: dict, name: str, split: str, count: int, objects, desc: str, forced=None):
    """Yield (index, scene, image) for one split, each split from its own random stream.
    `objects`: (fewest, most) shapes a scene, uniformly, or a function of the generator;
    `forced(rng, n, index)`: attributes to fix of the first objects (sample_scene)."""
    rng = np.random.default_rng(stable_seed(spec["seed"], name, split))
    for index in tqdm(
        range(count), desc=f"{desc} {split}", unit="img", leave=False, disable=not spec.get("progress", True)
    ):
        n = objects(rng) if callable(objects) else int(rng.integers(objects[0], objects[1] + 1))
        scene = sample_scene(rng, spec["image_size"], n, forced=forced(rng, n, index) if forced else None)
        yield index, scene, render(scene, rng), rng


def _coco_annotations(scene: Scene, image_id: int, first_ann_id: int, coloured: bool = False) -> list[dict]:
    # The detector's set also keeps each object's size, an extra field as Visual Genome's attributes
    # (pycocotools ignores it), so the detector's quality can be reported per size.
    return [
        {
            "id": first_ann_id + k,
            "image_id": image_id,
            "category_id": _DETECTOR_CATEGORY_ID[o.colour, o.shape] if coloured else _CATEGORY_ID[o.shape],
            "bbox": coco_bbox(o),
            "area": coco_area(coco_polygon(o), scene.width, scene.height),
            "iscrowd": 0,
            "segmentation": coco_polygon(o),
            **({"size": o.size} if coloured else {}),
        }
        for k, o in enumerate(scene.objects)
    ]


def _coco_image(image_id: int, file_name: str, scene: Scene) -> dict:
    return {"id": image_id, "file_name": file_name, "width": scene.width, "height": scene.height}


def write_detector(spec: dict, root: Path) -> None:
    """COCO instances (train2017/val2017 layout); categories are the coloured shapes."""
    for split, count in spec["detector"].items():
        folder = f"{split}2017"
        (root / folder).mkdir()
        images, annotations = [], []
        for index, scene, image, _ in _scenes(spec, "detector", split, count, (1, 6), "detector"):
            image_id = index + 1
            file_name = f"{image_id:012d}.jpg"
            save_image(image, root / folder / file_name)
            images.append(_coco_image(image_id, file_name, scene))
            annotations += _coco_annotations(scene, image_id, len(annotations) + 1, coloured=True)
        io.write_json(
            root / "annotations" / f"instances_{folder}.json",
            {"images": images, "annotations": annotations, "categories": DETECTOR_CATEGORIES},
        )


def write_conceptual_captions(spec: dict, root: Path) -> None:
    for split, count in spec["conceptual_captions"].items():
        (root / "images" / split).mkdir(parents=True)
        lines = []
        for index, scene, image, rng in _scenes(spec, "conceptual_captions", split, count, scene_size, "captions"):
            relative = f"images/{split}/{index:08d}.jpg"
            save_image(image, root / relative)
            lines.append(f"{captions.make_caption(scene, rng)}\t{relative}\n")
        io.write_text(root / f"{split}.tsv", "".join(lines))
    # The words only the image can tell, by kind: what pre-training's grounding probe masks (its
    # kinds in name order: write_json sorts the keys).
    kinds = {"colour": list(COLOURS), "shape": [*SHAPES, *(plural(s) for s in SHAPES)], "size": list(SIZES)}
    io.write_json(root / WORD_KINDS_FILE, kinds, indent=1)


def write_text_corpus(spec: dict, root: Path) -> None:
    rng = np.random.default_rng(stable_seed(spec["seed"], "text_corpus"))
    passages = [corpus.make_passage(rng) for _ in range(spec["text_corpus"]["passages"])]
    io.write_text(root / "corpus.txt", "\n".join(passages) + "\n")


def _vqa_pairs(spec: dict, split: str, count: int):
    """Yield (pair index, question fields, [(scene, answer, image, rng)] x 2) for one split: the
    kinds in equal shares, in a shuffled order."""
    rng = np.random.default_rng(stable_seed(spec["seed"], "vqa", split))
    kinds = [vqa.KINDS[k % len(vqa.KINDS)] for k in range(count)]
    kinds = [kinds[k] for k in rng.permutation(count)]
    for index in tqdm(
        range(count), desc=f"vqa {split}", unit="pair", leave=False, disable=not spec.get("progress", True)
    ):
        n = scene_size(rng)
        fields, scene_a, a, scene_b, b = vqa.complementary_pair(rng, spec["image_size"], kinds[index], n)
        yield index, fields, [(scene_a, a, render(scene_a, rng), rng), (scene_b, b, render(scene_b, rng), rng)]


def write_vqa(spec: dict, root: Path) -> None:
    """Complementary pairs (synthetic/vqa.py): `count` pairs a split, one question an image."""
    answer_counts: dict[str, int] = {}
    for split, count in spec["vqa"].items():
        subtype, image_folder = VQA_SPLITS[split]
        (root / image_folder).mkdir(exist_ok=True)
        questions, annotations, images, instances, pairs = [], [], [], [], []
        for index, fields, members in _vqa_pairs(spec, split, count):
            pair = []
            for member, (scene, answer, image, rng) in enumerate(members):
                image_id = 2 * index + member + 1 + 1_000_000 * list(VQA_SPLITS).index(split)
                file_name = f"COCO_{image_folder}_{image_id:012d}.jpg"
                save_image(image, root / image_folder / file_name)
                images.append(_coco_image(image_id, file_name, scene))
                instances += _coco_annotations(scene, image_id, len(instances) + 1)
                question_id = image_id * 10
                answers = vqa.annotate(answer, fields["answer_type"], rng)
                questions.append({"image_id": image_id, "question": fields["question"], "question_id": question_id})
                annotations.append(
                    {
                        "question_id": question_id,
                        "image_id": image_id,
                        "question_type": fields["question_type"],
                        "answer_type": fields["answer_type"],
                        "multiple_choice_answer": answer,
                        "answers": [
                            {"answer": a, "answer_confidence": "yes", "answer_id": n + 1}
                            for n, a in enumerate(answers)
                        ],
                    }
                )
                pair.append(question_id)
                if split == "train":
                    answer_counts[answer] = answer_counts.get(answer, 0) + 1
            pairs.append(pair)
        header = {"info": {"description": "vlbert-ablation synthetic world"}, "license": {}, "data_subtype": subtype}
        io.write_json(
            root / f"v2_OpenEnded_mscoco_{subtype}_questions.json",
            {**header, "task_type": "Open-Ended", "data_type": "mscoco", "questions": questions},
        )
        if split == "test-dev":
            # The real test2015 questions hold test-dev's among others; here test-dev is all of test,
            # and VL-BERT's test set is test2015.
            io.write_json(
                root / "v2_OpenEnded_mscoco_test2015_questions.json",
                {
                    **header,
                    "data_subtype": "test2015",
                    "task_type": "Open-Ended",
                    "data_type": "mscoco",
                    "questions": questions,
                },
            )
        io.write_json(
            root / f"v2_mscoco_{subtype}_annotations.json",
            {**header, "data_type": "mscoco", "annotations": annotations},
        )
        io.write_json(root / complementary_pairs_name(subtype), pairs)
        coco = {"info": header["info"], "licenses": [], "images": images, "categories": CATEGORIES}
        if image_folder != "test2015":
            coco["annotations"] = instances
        io.write_json(root / "annotations" / COCO_IMAGE_INFO[image_folder], coco)
    # The answer vocabulary: training answers, most frequent first (ties alphabetical), after the
    # `<unk>` placeholder that VL-BERT's reader needs, first as in its (Pythia's) file.
    vocabulary = sorted(answer_counts, key=lambda a: (-answer_counts[a], a))
    io.write_text(root / "answers_vqa.txt", "\n".join([UNKNOWN_ANSWER] + vocabulary) + "\n")


def vcr_split(spec: dict, split: str, count: int, on_image=None):
    """One VCR split as `write_vcr` draws it: its items (synthetic/vcr.py), scenes, tags and matched
    choices. `on_image(index, scene, image, confidences)` receives each rendered image and its
    boxes' detection scores; the images are drawn either way, so that the choices, matched after
    them from the same generator, are the files'."""
    rng = np.random.default_rng(stable_seed(spec["seed"], "vcr", split))
    items = vcr.draw_items(rng, count)
    scenes, tags = [], []
    for index, item in enumerate(
        tqdm(items, desc=f"vcr {split}", unit="img", leave=False, disable=not spec.get("progress", True))
    ):
        scene, item_tags = vcr.scene_for(item, rng, spec["image_size"], scene_size(rng))
        image = render(scene, rng)
        confidences = [round(float(rng.uniform(0.9, 1.0)), 4) for _ in scene.objects]
        if on_image is not None:
            on_image(index, scene, image, confidences)
        scenes.append(scene)
        tags.append(item_tags)
    return items, scenes, tags, vcr.adversarial_choices(items, tags, rng)


def write_vcr(spec: dict, root: Path) -> None:
    """Adversarially matched questions (synthetic/vcr.py); every object written as a person."""
    for split, count in spec["vcr"].items():
        records = []

        def write_image(index: int, scene: Scene, image, confidences: list[float]) -> None:
            movie = f"synthetic_movie_{index // 50:04d}"
            stem = f"{movie}/{split}_{index:06d}"
            (root / "vcr1images" / movie).mkdir(parents=True, exist_ok=True)
            save_image(image, root / "vcr1images" / f"{stem}.jpg")
            boxes = [[round(v, 2) for v in o.box] + [score] for o, score in zip(scene.objects, confidences)]
            names = [vcr.OBJECT_NAME] * len(scene.objects)
            io.write_json(
                root / "vcr1images" / f"{stem}.json",
                {
                    "boxes": boxes,
                    "names": names,
                    "segms": [[[[round(x, 2), round(y, 2)] for x, y in o.polygon()]] for o in scene.objects],
                    "width": scene.width,
                    "height": scene.height,
                },
            )
            records.append(
                {
                    "annot_id": f"{split}-{index}",
                    "movie": movie,
                    "img_id": f"{split}-{index}",
                    "img_fn": f"{stem}.jpg",
                    "metadata_fn": f"{stem}.json",
                    "objects": names,
                    "question_number": 0,
                    "interesting_scores": [],
                }
            )

        items, _, _, choices = vcr_split(spec, split, count, write_image)
        lines = [
            json.dumps({**r, "question_type": item.kind, **c}, sort_keys=True) + "\n"
            for r, item, c in zip(records, items, choices)
        ]
        io.write_text(root / f"{split}.jsonl", "".join(lines))


def _refcoco_splits(spec: dict, count: int, held_out: float) -> list[str]:
    """Each image's split, in exactly the configured shares: `held_out` of the images for val (a
    third) and test, the test images halved between testA and testB as RefCOCO+'s are."""
    n_held = round(count * held_out)
    n_val = round(n_held / 3)
    n_test_a = (n_held - n_val + 1) // 2
    splits = (
        ["val"] * n_val + ["testA"] * n_test_a + ["testB"] * (n_held - n_val - n_test_a) + ["train"] * (count - n_held)
    )
    order = np.random.default_rng(stable_seed(spec["seed"], "refcoco+", "splits")).permutation(count)
    return [splits[k] for k in order]


def _refcoco_forced(splits: list[str], rare_colours=()):
    """Scenes as RefCOCO+'s images: one shape 2-3 times, the category the image's refs are about,
    the other objects distractors of other shapes, one of each, so no other category is referable.
    The shape is of the test split's kind in test images (RefCOCO+'s testA images hold several
    people), of either kind at even odds elsewhere.

    In training images the referable shapes wear no rare colour (distractors may), as nocaps'
    novel objects go unannotated in COCO: were a rare-coloured twin there, only its twins'
    expressions could be kept, and the set would teach "never the orange one"."""

    def forced(rng, n, index):
        kinds = list(refcoco.TEST_KINDS.values())
        kind = refcoco.TEST_KINDS.get(splits[index]) or kinds[int(rng.integers(len(kinds)))]
        shape = kind[int(rng.integers(len(kind)))]
        copies = int(rng.integers(2, min(n, 3) + 1))
        others = [str(s) for s in rng.permutation(SHAPES) if s != shape][: n - copies]
        twin = {"shape": shape}
        if rng.random() < refcoco.TWIN_SAME_SIZE:
            twin["size"] = SIZES[int(rng.integers(len(SIZES)))]
        twins = [twin] * copies
        if splits[index] == "train":
            common = [c for c in COLOURS if c not in rare_colours]
            twins = [{**twin, "colour": common[int(rng.integers(len(common)))]} for _ in range(copies)]
        return twins + [{"shape": s} for s in others]

    return forced


def write_refcoco(spec: dict, root: Path) -> None:
    options = spec["refcoco+"]
    (root / "images").mkdir()
    images, annotations, refs = [], [], []
    splits = _refcoco_splits(spec, options["images"], options.get("held_out_fraction", 0.3))
    rare_colours = options.get("rare_colours", refcoco.RARE_COLOURS)
    for index, scene, image, rng in _scenes(
        spec, "refcoco+", "all", options["images"], (3, 6), "refcoco+", forced=_refcoco_forced(splits, rare_colours)
    ):
        image_id = index + 1
        file_name = f"COCO_train2014_{image_id:012d}.jpg"
        save_image(image, root / "images" / file_name)
        images.append(_coco_image(image_id, file_name, scene))
        anns = _coco_annotations(scene, image_id, len(annotations) + 1)
        annotations += anns
        # Refs only for objects another of their category keeps company, as RefCOCO+'s.
        split = splits[index]
        for k in refcoco.referable(scene):
            ann = anns[k]
            texts = refcoco.expressions(scene, k, rng, n=options.get("expressions_per_ref", 2))
            if split == "train":
                texts = [t for t in texts if not refcoco.names_rare_colour(t, rare_colours)]
            if not texts:
                continue
            first_sent_id = sum(len(r["sent_ids"]) for r in refs)
            sentences = [
                {"raw": t, "sent": t, "tokens": tokenize(t), "sent_id": first_sent_id + n} for n, t in enumerate(texts)
            ]
            refs.append(
                {
                    "ref_id": len(refs),
                    "ann_id": ann["id"],
                    "image_id": image_id,
                    "category_id": ann["category_id"],
                    "split": split,
                    "file_name": f"COCO_train2014_{image_id:012d}_{ann['id']}.jpg",
                    "sent_ids": [s["sent_id"] for s in sentences],
                    "sentences": sentences,
                }
            )
    io.write_json(root / "instances.json", {"images": images, "annotations": annotations, "categories": CATEGORIES})
    # Protocol 2 keeps the pickle readable by the Python 2 tools that ship with REFER.
    io.write_bytes(root / "refs(unc).p", pickle.dumps(refs, protocol=2))


WRITERS = {
    "detector": write_detector,
    "conceptual_captions": write_conceptual_captions,
    "text_corpus": write_text_corpus,
    "vqa": write_vqa,
    "vcr": write_vcr,
    "refcoco+": write_refcoco,
}


def make_world(
    spec: dict, out: str | Path, datasets=DATASETS, force: bool = False, progress: bool = True
) -> list[str]:
    """Write the data sets under `out`; those complete for this spec are skipped unless `force`.

    `spec` is the preset's `data.synthetic` section plus `seed`. Returns the names written.
    """
    out = Path(out)
    stale = {}
    for name in datasets:
        # What this data set is made from: a change elsewhere in the spec leaves it alone.
        made_from = {k: spec[k] for k in ("seed", "image_size", name)}
        if name in WRITER_VERSIONS:  # a writer's later files: the folders made before are remade
            made_from["writer_version"] = WRITER_VERSIONS[name]
        stamp = json.dumps(made_from, sort_keys=True)
        done = out / name / SPEC_STAMP
        if not (done.exists() and done.read_text() == stamp and not force):
            stale[name] = stamp
    # Every folder that writing removes, checked before anything is written.
    for name in stale:
        for folder in (out / name, io.partial_dir(out / name)):
            check_replaceable(folder, SPEC_STAMP)
    for name, stamp in stale.items():
        with io.atomic_dir(out / name) as partial:
            # The stamp first: a `.partial` folder an interruption leaves is then known as ours.
            (partial / SPEC_STAMP).write_text(stamp)
            WRITERS[name]({**spec, "progress": progress}, partial)
            write_manifest(partial)
            (partial / SPEC_STAMP).touch()  # the workflow's output: newer than what it stands for
    return list(stale)
