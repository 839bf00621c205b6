import json
import pickle

import pytest

from conftest import FIXTURES
from vlbert.data.coco import read_coco
from vlbert.data.conceptual_captions import read_captions
from vlbert.data.errors import DataFormatError
from vlbert.data.refcoco import SPLITS, RefCOCO
from vlbert.data.safe_pickle import UnsafePickleError, load_plain_pickle
from vlbert.data.text_corpus import read_corpus
from vlbert.data.vcr import read_metadata, read_vcr
from vlbert.data.vqa import read_answer_vocabulary, read_vqa

VQA_SPLITS = {"train": "train2014", "val": "val2014", "test-dev": "test-dev2015"}


# ---- every reader reads the generated smoke world -------------------------------------------

def test_generated_captions_read_back(smoke_world):
    for split in ("train", "val"):
        records = read_captions(smoke_world / "conceptual_captions" / f"{split}.tsv", check_images=True)
        assert len(records) == {"train": 120, "val": 20}[split]


def test_generated_corpus_reads_back(smoke_world):
    assert len(read_corpus(smoke_world / "text_corpus/corpus.txt")) == 120


def test_generated_vqa_reads_back(smoke_world):
    root = smoke_world / "vqa"
    vocabulary = read_answer_vocabulary(root / "answers_vqa.txt")
    for split, subtype in VQA_SPLITS.items():
        examples = read_vqa(root / f"v2_OpenEnded_mscoco_{subtype}_questions.json",
                            root / f"v2_mscoco_{subtype}_annotations.json")
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
        coco = read_coco(smoke_world / f"detector/annotations/instances_{split}2017.json",
                         smoke_world / f"detector/{split}2017")
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
    examples = read_vqa(root / "v2_OpenEnded_mscoco_val2014_questions.json", root / "v2_mscoco_val2014_annotations.json",
                        image_root="/coco")
    assert [e.question_id for e in examples] == [420, 421, 730]
    assert str(examples[0].image_path) == "/coco/val2014/COCO_val2014_000000000042.jpg"
    assert examples[0].answers.count("red") == 7 and examples[1].answer_type == "number"
    unlabelled = read_vqa(root / "v2_OpenEnded_mscoco_val2014_questions.json")
    assert unlabelled[0].answers == () and unlabelled[0].multiple_choice_answer is None


def test_vcr_fixture_with_object_index_lists():
    examples = read_vcr(FIXTURES / "vcr/val.jsonl")
    first = examples[0]
    assert first.question == ["What", "is", [0], "doing", "?"]
    assert first.answer_choices[1][0] == [0, 1]          # a reference to two objects at once
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
    assert records[0].caption == "a man riding a horse on a beach" and str(records[1].image_path) == "/cc/frames/0002.jpg"
    assert read_corpus(FIXTURES / "corpus.txt") == [
        "the quick brown fox jumps over the lazy dog , and then it sleeps .", "another passage from another document ."]


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


def test_refcoco_ref_to_unknown_annotation(refcoco_fixture):
    from refcoco.refs import REFS
    refs = [dict(r) for r in REFS]
    refs[2]["ann_id"] = 99
    (refcoco_fixture / "refs(unc).p").write_bytes(pickle.dumps(refs, protocol=2))
    with pytest.raises(DataFormatError, match=r"refs\(unc\)\.p \[\[2\]\.ann_id\]: ann_id 99 is not in instances\.json"):
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
