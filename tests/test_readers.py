import json
import pickle
import re
import shutil

import pytest
from conftest import FIXTURES

from vlbert.data.coco import read_coco
from vlbert.data.conceptual_captions import WORD_KINDS_FILE, read_captions, read_word_kinds
from vlbert.data.errors import DataFormatError
from vlbert.data.refcoco import SPLITS, RefCOCO
from vlbert.data.safe_pickle import UnsafePickleError, load_plain_pickle
from vlbert.data.text_corpus import read_corpus
from vlbert.data.vcr import read_metadata, read_object_names, read_vcr
from vlbert.data.vqa import read_answer_vocabulary, read_vqa

VQA_SPLITS = {"train": "train2014", "val": "val2014", "test-dev": "test-dev2015"}


# ---- every reader reads the generated smoke world -------------------------------------------


def test_generated_captions_read_back(smoke_world):
    for split in ("train", "val"):
        records = read_captions(smoke_world / "conceptual_captions" / f"{split}.tsv", check_images=True)
        assert len(records) == {"train": 120, "val": 20}[split]


def test_generated_word_kinds_are_the_world_s_words(smoke_world):
    """What pre-training's grounding probe masks comes from the captions' folder: the colours, shapes
    (and their plurals) and sizes the world draws its captions from."""
    from vlbert.data.synthetic.world import COLOURS, SHAPES, SIZES

    kinds = read_word_kinds(smoke_world / "conceptual_captions")
    assert kinds == {
        "colour": tuple(COLOURS),
        "shape": (*SHAPES, *(s + ("es" if s.endswith(("s", "x")) else "s") for s in SHAPES)),
        "size": SIZES,
    }
    captions = " ".join(c.caption for c in read_captions(smoke_world / "conceptual_captions" / "val.tsv")).split()
    assert all(any(word in captions for word in words) for words in kinds.values())


def test_a_captions_folder_without_word_kinds_has_none_and_a_bad_file_names_its_key(tmp_path):
    assert read_word_kinds(tmp_path) is None  # real Conceptual Captions: no grounding probe
    (tmp_path / WORD_KINDS_FILE).write_text(json.dumps({"colour": ["red", "blue"], "shape": []}))
    with pytest.raises(DataFormatError, match=r"word_kinds\.json \[shape\]: expected a non-empty list of words"):
        read_word_kinds(tmp_path)
    (tmp_path / WORD_KINDS_FILE).write_text('{"colour": ["red",')
    with pytest.raises(DataFormatError, match=r"word_kinds\.json:1: invalid JSON"):
        read_word_kinds(tmp_path)


def test_generated_corpus_reads_back(smoke_world):
    assert len(read_corpus(smoke_world / "text_corpus/corpus.txt")) == 120


def test_generated_vqa_reads_back(smoke_world):
    root = smoke_world / "vqa"
    vocabulary = read_answer_vocabulary(root / "answers_vqa.txt")
    for split, subtype in VQA_SPLITS.items():
        examples = read_vqa(
            root / f"v2_OpenEnded_mscoco_{subtype}_questions.json", root / f"v2_mscoco_{subtype}_annotations.json"
        )
        assert examples and all(len(e.answers) == 10 and e.image_path.is_file() for e in examples)
        assert {e.answer_type for e in examples} <= {"yes/no", "number", "other"}
        if split == "train":
            assert {e.multiple_choice_answer for e in examples} == set(vocabulary)


def test_generated_vcr_reads_back(smoke_world):
    for split, n in (("train", 40), ("val", 16), ("test", 16)):
        examples = read_vcr(smoke_world / "vcr" / f"{split}.jsonl")
        assert len(examples) == n
        for e in examples:
            assert e.image_path.is_file()
            meta = read_metadata(e.metadata_path)
            assert len(meta.boxes) == len(e.objects) and meta.width == 96


def test_generated_refcoco_reads_back(smoke_world):
    data = RefCOCO(smoke_world / "refcoco+")
    for split in SPLITS:
        expressions = data.expressions(split)
        assert all(e.image_path.is_file() and len(e.bbox) == 4 for e in expressions)


def test_generated_detector_split_reads_back(smoke_world):
    import numpy as np
    from PIL import Image

    from vlbert.data.synthetic.world import COLOURS, SHAPES

    for split, n in (("train", 60), ("val", 20)):
        coco = read_coco(
            smoke_world / f"detector/annotations/instances_{split}2017.json", smoke_world / f"detector/{split}2017"
        )
        assert len(coco.imgs) == n
        assert all((coco.image_root / img["file_name"]).is_file() for img in coco.imgs.values())
        # Visual Genome-like classes: coloured shapes, so detector features must carry colour.
        assert sorted(c["name"] for c in coco.cats.values()) == sorted(f"{c} {s}" for c in COLOURS for s in SHAPES)
        for ann in list(coco.anns.values())[:20]:
            x, y, w, h = ann["bbox"]
            image = np.asarray(Image.open(coco.image_root / coco.imgs[ann["image_id"]]["file_name"]).convert("RGB"))
            centre = image[int(y + h / 2), int(x + w / 2)].astype(float)
            nearest = min(COLOURS, key=lambda c: ((np.array(COLOURS[c]) - centre) ** 2).sum())
            assert coco.cats[ann["category_id"]]["name"].split()[0] == nearest


# ---- the hand-written fixtures in the official formats --------------------------------------


def test_vqa_fixture():
    root = FIXTURES / "vqa"
    examples = read_vqa(
        root / "v2_OpenEnded_mscoco_val2014_questions.json",
        root / "v2_mscoco_val2014_annotations.json",
        image_root="/coco",
    )
    assert [e.question_id for e in examples] == [420, 421, 730]
    assert str(examples[0].image_path) == "/coco/val2014/COCO_val2014_000000000042.jpg"
    assert examples[0].answers.count("red") == 7 and examples[1].answer_type == "number"
    unlabelled = read_vqa(root / "v2_OpenEnded_mscoco_val2014_questions.json")
    assert unlabelled[0].answers == () and unlabelled[0].multiple_choice_answer is None


def test_vcr_fixture_with_object_index_lists():
    examples = read_vcr(FIXTURES / "vcr/val.jsonl")
    first = examples[0]
    assert first.question == ["What", "is", [0], "doing", "?"]
    assert first.answer_choices[1][0] == [0, 1]  # a reference to two objects at once
    assert first.answer_label == 0 and examples[1].answer_label == 2
    meta = read_metadata(first.metadata_path)
    assert meta.names == ["person", "person", "dog"] and meta.boxes[0][4] == 0.99


def test_vcr_test_split_without_labels(tmp_path):
    record = json.loads((FIXTURES / "vcr/val.jsonl").read_text().splitlines()[0])
    del record["answer_label"], record["rationale_label"]
    (tmp_path / "test.jsonl").write_text(json.dumps(record) + "\n")
    [example] = read_vcr(tmp_path / "test.jsonl")
    assert example.answer_label is None and example.rationale_label is None


def test_captions_and_corpus_fixtures():
    records = read_captions(FIXTURES / "cc/train.tsv", image_root="/cc")
    assert (
        records[0].caption == "a man riding a horse on a beach" and str(records[1].image_path) == "/cc/frames/0002.jpg"
    )
    assert read_corpus(FIXTURES / "corpus.txt") == [
        "the quick brown fox jumps over the lazy dog , and then it sleeps .",
        "another passage from another document .",
    ]


def test_refcoco_fixture(refcoco_fixture):
    data = RefCOCO(refcoco_fixture)
    testA = data.expressions("testA")
    assert [e.sent_id for e in testA] == [0, 1, 2]
    assert testA[0].bbox == [103.93, 299.99, 134.22, 128.0] and testA[0].tokens == ["woman", "in", "red", "coat"]
    assert data.expressions("testB")[0].sentence == "white bowl"


# ---- bad input: an error that names the file and the line or key ----------------------------


def test_malformed_vcr_line_names_file_and_line(tmp_path):
    lines = (FIXTURES / "vcr/val.jsonl").read_text().splitlines()
    bad = json.loads(lines[1])
    del bad["question"]
    path = tmp_path / "val.jsonl"
    path.write_text(lines[0] + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(DataFormatError, match=r"val\.jsonl:2 \[question\]: missing key 'question'"):
        read_vcr(path)
    path.write_text(lines[0] + "\n{not json\n")
    with pytest.raises(DataFormatError, match=r"val\.jsonl:2: invalid JSON"):
        read_vcr(path)


def test_vcr_object_reference_out_of_range(tmp_path):
    record = json.loads((FIXTURES / "vcr/val.jsonl").read_text().splitlines()[0])
    record["answer_choices"][2] = [[7], "is", "asleep", "."]
    (tmp_path / "val.jsonl").write_text(json.dumps(record) + "\n")
    with pytest.raises(DataFormatError, match=r"val\.jsonl:1 \[answer_choices\[2\]\]: token 0 refers to object 7"):
        read_vcr(tmp_path / "val.jsonl")


def test_vcr_object_names_map_coco_names_back(tmp_path):
    # A data set whose objects are not COCO's writes COCO stand-ins and object_names.json beside them.
    shutil.copytree(FIXTURES / "vcr", tmp_path, dirs_exist_ok=True)
    (tmp_path / "object_names.json").write_text(json.dumps({"man": "person", "hound": "dog"}))
    first = read_vcr(tmp_path / "val.jsonl")[0]
    assert first.objects == ["man", "man", "hound"]
    assert read_metadata(first.metadata_path, read_object_names(tmp_path)).names == first.objects
    assert read_metadata(first.metadata_path).names == ["person", "person", "dog"]  # as written


@pytest.mark.parametrize(
    "names, match",
    [
        ({"man": "person"}, r"val\.jsonl:1 \[objects\]: object name 'dog' is not in object_names\.json"),
        ({"man": "person", "hound": "person"}, r"object_names\.json \[person\]: two names are written as 'person'"),
        (["person"], r"object_names\.json: expected an object"),
    ],
)
def test_vcr_object_names_that_do_not_fit_name_the_file(tmp_path, names, match):
    shutil.copytree(FIXTURES / "vcr", tmp_path, dirs_exist_ok=True)
    (tmp_path / "object_names.json").write_text(json.dumps(names))
    with pytest.raises(DataFormatError, match=match):
        read_vcr(tmp_path / "val.jsonl")


def test_answer_vocabulary_leaves_the_unk_placeholder_out(tmp_path):
    # VL-BERT's (Pythia's) answers_vqa.txt starts with <unk>, the slot of answers outside it.
    (tmp_path / "answers_vqa.txt").write_text("<unk>\nyes\nno\n")
    assert read_answer_vocabulary(tmp_path / "answers_vqa.txt") == ["yes", "no"]


def test_malformed_vqa_annotation_names_the_key(tmp_path):
    data = json.loads((FIXTURES / "vqa/v2_mscoco_val2014_annotations.json").read_text())
    del data["annotations"][1]["answers"][3]["answer"]
    (tmp_path / "ann.json").write_text(json.dumps(data))
    with pytest.raises(DataFormatError, match=r"ann\.json \[annotations\[1\]\.answers\[3\]\.answer\]: missing key"):
        read_vqa(FIXTURES / "vqa/v2_OpenEnded_mscoco_val2014_questions.json", tmp_path / "ann.json")


def test_malformed_caption_line_names_the_line(tmp_path):
    (tmp_path / "train.tsv").write_text("a caption\timg.jpg\na caption with no image column\n")
    with pytest.raises(DataFormatError, match=r"train\.tsv:2: expected 2 tab-separated columns"):
        read_captions(tmp_path / "train.tsv")


def test_missing_image_names_its_path(tmp_path):
    (tmp_path / "train.tsv").write_text("a caption\timages/gone.jpg\n")
    with pytest.raises(FileNotFoundError, match=r"train\.tsv:1: image not found: .*images/gone\.jpg"):
        read_captions(tmp_path / "train.tsv", check_images=True)


def test_empty_split_says_so(tmp_path):
    (tmp_path / "val.jsonl").write_text("\n")
    with pytest.raises(DataFormatError, match=r"val\.jsonl: no VCR questions: the split is empty"):
        read_vcr(tmp_path / "val.jsonl")
    (tmp_path / "corpus.txt").write_text("\n\n")
    with pytest.raises(DataFormatError, match="the corpus is empty"):
        read_corpus(tmp_path / "corpus.txt")


def test_refcoco_empty_split_says_so(refcoco_fixture):
    with pytest.raises(DataFormatError, match=r"no expressions in split 'val': the split is empty"):
        RefCOCO(refcoco_fixture).expressions("val")


@pytest.mark.parametrize("index, key, value", [(2, "ann_id", 99), (1, "image_id", 77)])
def test_refcoco_ref_to_unknown_annotation_or_image(refcoco_fixture, index, key, value):
    from refcoco.refs import REFS

    refs = [dict(r) for r in REFS]
    refs[index][key] = value
    (refcoco_fixture / "refs(unc).p").write_bytes(pickle.dumps(refs, protocol=2))
    with pytest.raises(
        DataFormatError, match=rf"refs\(unc\)\.p \[\[{index}\]\.{key}\]: {key} {value} is not in instances\.json"
    ):
        RefCOCO(refcoco_fixture)


def test_missing_file_names_its_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"VCR annotations not found: .*nope\.jsonl"):
        read_vcr(tmp_path / "nope.jsonl")


# ---- the restricted unpickler ---------------------------------------------------------------


class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def test_hostile_pickle_is_refused_without_running(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "refs(unc).p"
    path.write_bytes(pickle.dumps([{"ref_id": 0, "payload": _Exploit(marker)}], protocol=2))
    with pytest.raises(UnsafePickleError, match=r"refs\(unc\)\.p: refusing to load (posix|os)\.system"):
        load_plain_pickle(path)
    assert not marker.exists()


def test_plain_pickle_loads_including_python2_strings(tmp_path):
    path = tmp_path / "plain.p"
    data = [{"a": (1, 2.5, None, True), "b": ["x", b"raw"]}]
    path.write_bytes(pickle.dumps(data, protocol=2))
    assert load_plain_pickle(path) == data
    # A Python 2 str (SHORT_BINSTRING opcode) decodes as latin-1 text.
    path.write_bytes(b"\x80\x02]q\x00U\x05caf\xe9!q\x01a.")
    assert load_plain_pickle(path) == ["café!"]


# ---- bad bytes, broken pickles, answer counts, paths outside the data root -------------------


def _latin1_on_line(text: str, line: int, word: str) -> bytes:
    """`text` as UTF-8, except that `word` on line `line` (1-based) is written in latin-1."""
    lines = text.encode().split(b"\n")
    assert word.encode() in lines[line - 1]
    lines[line - 1] = lines[line - 1].replace(word.encode(), word.encode("latin-1"), 1)
    return b"\n".join(lines)


def _vcr_lines():
    return (FIXTURES / "vcr/val.jsonl").read_text().splitlines()


@pytest.mark.parametrize(
    "name, line, write, read",
    [
        (
            "val.jsonl",
            2,
            lambda: _latin1_on_line("\n".join(_vcr_lines()[:2]).replace('"smiling"', '"smïling"'), 2, "ï"),
            read_vcr,
        ),
        ("train.tsv", 2, lambda: b"a caption\timg.jpg\ncaf\xe9 au lait\timg2.jpg\n", read_captions),
        ("corpus.txt", 3, lambda: b"one passage\n\ncaf\xe9 au lait\n", read_corpus),
        ("answers_vqa.txt", 2, lambda: b"yes\ncaf\xe9\n", read_answer_vocabulary),
        (
            "questions.json",
            4,
            lambda: _latin1_on_line(
                (FIXTURES / "vqa/v2_OpenEnded_mscoco_val2014_questions.json").read_text().replace("people", "péople"),
                4,
                "é",
            ),
            read_vqa,
        ),
        (
            "ann.json",
            3,
            lambda: _latin1_on_line(
                (FIXTURES / "vqa/v2_mscoco_val2014_annotations.json").read_text().replace('"red"', '"réd"', 1), 3, "é"
            ),
            lambda p: read_vqa(FIXTURES / "vqa/v2_OpenEnded_mscoco_val2014_questions.json", p),
        ),
        (
            "instances.json",
            1,
            lambda: _latin1_on_line(
                (FIXTURES / "refcoco/instances.json").read_text().replace("COCO_train", "CÖCO_train", 1), 1, "Ö"
            ),
            read_coco,
        ),
    ],
)
def test_bytes_that_are_not_utf8_name_the_file_and_line(tmp_path, name, line, write, read):
    path = tmp_path / name
    path.write_bytes(write())
    with pytest.raises(DataFormatError, match=rf"{name.replace('.', '[.]')}:{line}: not UTF-8 text"):
        read(path)


def test_vcr_metadata_that_is_not_utf8_names_the_file(tmp_path):
    path = tmp_path / "frame.json"
    path.write_bytes(b'{"boxes": [], "names": [],\n "width": 1, "height": 1, "note": "caf\xe9"}')
    with pytest.raises(DataFormatError, match=r"frame\.json:2: not UTF-8 text"):
        read_metadata(path)


@pytest.mark.parametrize("content", [b"", b"\x80\x02]q\x00(}q\x01(X\x06\x00\x00\x00ref_id", b"not a pickle at all"])
def test_empty_truncated_or_corrupt_refs_name_the_file(refcoco_fixture, content):
    (refcoco_fixture / "refs(unc).p").write_bytes(content)
    with pytest.raises(DataFormatError, match=r"refs\(unc\)\.p: not a readable pickle"):
        RefCOCO(refcoco_fixture)


@pytest.mark.parametrize("count", [0, 9, 11])
def test_vqa_annotation_without_ten_answers_names_the_question(tmp_path, count):
    data = json.loads((FIXTURES / "vqa/v2_mscoco_val2014_annotations.json").read_text())
    answers = data["annotations"][1]["answers"]
    data["annotations"][1]["answers"] = (answers * 2)[:count]
    (tmp_path / "ann.json").write_text(json.dumps(data))
    with pytest.raises(
        DataFormatError,
        match=rf"ann\.json \[annotations\[1\]\.answers\]: question_id 421 has "
        rf"{count} answers, VQA v2 has 10",
    ):
        read_vqa(FIXTURES / "vqa/v2_OpenEnded_mscoco_val2014_questions.json", tmp_path / "ann.json")


OUTSIDE = ["../../etc/passwd", "/etc/passwd", "movie_a/../../../etc/passwd"]


@pytest.mark.parametrize("outside", OUTSIDE)
@pytest.mark.parametrize("field", ["img_fn", "metadata_fn"])
def test_vcr_paths_outside_the_image_root_are_refused(tmp_path, field, outside):
    lines = _vcr_lines()
    record = json.loads(lines[1])
    record[field] = outside
    (tmp_path / "val.jsonl").write_text(lines[0] + "\n" + json.dumps(record) + "\n")
    with pytest.raises(
        DataFormatError,
        match=rf"val\.jsonl:2 \[{field}\]: {re.escape(outside)} is outside "
        rf"the data root",
    ):
        read_vcr(tmp_path / "val.jsonl")


@pytest.mark.parametrize("outside", OUTSIDE)
def test_caption_images_outside_the_root_are_refused(tmp_path, outside):
    (tmp_path / "train.tsv").write_text(f"a caption\tframes/1.jpg\nanother caption\t{outside}\n")
    with pytest.raises(DataFormatError, match=rf"train\.tsv:2: {re.escape(outside)} is outside the data root"):
        read_captions(tmp_path / "train.tsv")


@pytest.mark.parametrize("outside", OUTSIDE)
def test_coco_file_names_outside_the_root_are_refused(refcoco_fixture, outside):
    path = refcoco_fixture / "instances.json"
    data = json.loads(path.read_text())
    data["images"][1]["file_name"] = outside
    path.write_text(json.dumps(data))
    with pytest.raises(
        DataFormatError,
        match=rf"instances\.json \[images\[1\]\.file_name\]: {re.escape(outside)} "
        rf"is outside the data root",
    ):
        RefCOCO(refcoco_fixture)


@pytest.mark.parametrize("outside", ["../../etc", "/etc"])
def test_vqa_image_folder_outside_the_root_is_refused(tmp_path, outside):
    data = json.loads((FIXTURES / "vqa/v2_OpenEnded_mscoco_val2014_questions.json").read_text())
    data["data_subtype"] = outside
    (tmp_path / "questions.json").write_text(json.dumps(data))
    with pytest.raises(DataFormatError, match=rf"questions\.json \[data_subtype\]: {re.escape(outside)} is outside"):
        read_vqa(tmp_path / "questions.json")


def test_vqa_image_id_must_be_a_number(tmp_path):
    data = json.loads((FIXTURES / "vqa/v2_OpenEnded_mscoco_val2014_questions.json").read_text())
    data["questions"][2]["image_id"] = "../../etc/passwd"
    (tmp_path / "questions.json").write_text(json.dumps(data))
    with pytest.raises(DataFormatError, match=r"questions\.json \[questions\[2\]\.image_id\]: expected an integer"):
        read_vqa(tmp_path / "questions.json")


def test_paths_inside_the_root_are_kept_as_written(tmp_path):
    from vlbert.data.errors import resolve_inside

    assert resolve_inside(tmp_path, "a/./b/../c.jpg", "f.tsv", 3) == tmp_path / "a/./b/../c.jpg"
    assert resolve_inside(tmp_path, "frames/1.jpg", "f.tsv", 3) == tmp_path / "frames/1.jpg"
