"""VCR reader: `{split}.jsonl` annotations and the per-image metadata JSON under vcr1images/.

VCR names its objects by COCO category (`person`, `dog`). A data set whose objects are not COCO's
(the synthetic world's shapes) writes COCO stand-ins in the files, so that the readers built for
VCR take them, and puts `object_names.json` beside the jsonl files: {its own name: the COCO name
written}. The reader gives back its own names, which are the words the text is about.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .errors import (
    DataFormatError,
    load_json,
    require_file,
    require_keys,
    require_nonempty,
    resolve_inside,
    text_lines,
)

Tokens = list  # a VCR token list: words (str) and object references (lists of object indices)
OBJECT_NAMES = "object_names.json"

_REQUIRED = ["annot_id", "objects", "question", "answer_choices", "rationale_choices", "img_fn", "metadata_fn"]


@dataclass(frozen=True)
class VCRExample:
    annot_id: str
    objects: list[str]
    question: Tokens
    answer_choices: list[Tokens]
    rationale_choices: list[Tokens]
    image_path: Path
    metadata_path: Path
    answer_label: int | None  # None on the real test split, which ships without labels
    rationale_label: int | None


@dataclass(frozen=True)
class VCRMetadata:
    boxes: list[list[float]]  # x1, y1, x2, y2, score
    names: list[str]
    width: int
    height: int


def _check_tokens(tokens, n_objects: int, path, line: int, key: str) -> None:
    if not isinstance(tokens, list) or not tokens:
        raise DataFormatError(path, "expected a non-empty token list", line, key)
    for t, token in enumerate(tokens):
        if isinstance(token, str):
            continue
        if not (isinstance(token, list) and token and all(isinstance(i, int) for i in token)):
            raise DataFormatError(
                path, f"token {t} is neither a word nor a list of object indices: {token!r}", line, key
            )
        bad = [i for i in token if not 0 <= i < n_objects]
        if bad:
            raise DataFormatError(
                path, f"token {t} refers to object {bad[0]}, but there are {n_objects} objects", line, key
            )


def read_object_names(folder) -> dict[str, str]:
    """{COCO name written in the files: the data set's own name}, from `object_names.json` in
    `folder`; empty when there is none (the real VCR, whose names are its own)."""
    path = Path(folder) / OBJECT_NAMES
    if not path.is_file():
        return {}
    names = load_json(path, "VCR object names")
    if not isinstance(names, dict) or not all(isinstance(v, str) for v in names.values()):
        raise DataFormatError(path, "expected an object {own name: COCO name written in the files}")
    coco_to_own = {coco: own for own, coco in names.items()}
    if len(coco_to_own) != len(names):
        shared = next(c for c in coco_to_own if list(names.values()).count(c) > 1)
        raise DataFormatError(
            path, f"two names are written as {shared!r}: the reader could not tell them apart", key=shared
        )
    return coco_to_own


def _own_names(written: list, names: dict[str, str], path, line: int | None, key: str) -> list:
    if not names:
        return written
    unknown = [n for n in written if n not in names]
    if unknown:
        raise DataFormatError(path, f"object name {unknown[0]!r} is not in {OBJECT_NAMES}", line, key)
    return [names[n] for n in written]


def read_vcr(jsonl_path, image_root=None) -> list[VCRExample]:
    """Read one split. Images and metadata resolve against `image_root` (default: vcr1images/ beside it).
    Objects carry the data set's own names (see the module's docstring)."""
    jsonl_path = require_file(jsonl_path, "VCR annotations")
    root = Path(image_root) if image_root else jsonl_path.parent / "vcr1images"
    names = read_object_names(jsonl_path.parent)
    examples = []
    for line_no, line in text_lines(jsonl_path):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataFormatError(jsonl_path, f"invalid JSON: {exc.msg}", line_no) from None
        require_keys(record, _REQUIRED, jsonl_path, line_no)
        n = len(record["objects"])
        _check_tokens(record["question"], n, jsonl_path, line_no, "question")
        for field in ("answer_choices", "rationale_choices"):
            choices = record[field]
            if not isinstance(choices, list) or len(choices) != 4:
                raise DataFormatError(jsonl_path, "expected 4 choices", line_no, field)
            for c, choice in enumerate(choices):
                _check_tokens(choice, n, jsonl_path, line_no, f"{field}[{c}]")
        labels = []
        for field in ("answer_label", "rationale_label"):
            label = record.get(field)
            if label is not None and label not in (0, 1, 2, 3):
                raise DataFormatError(jsonl_path, f"label must be 0..3, got {label!r}", line_no, field)
            labels.append(label)
        image, metadata = (
            resolve_inside(root, record[field], jsonl_path, line_no, field) for field in ("img_fn", "metadata_fn")
        )
        examples.append(
            VCRExample(
                record["annot_id"],
                _own_names(record["objects"], names, jsonl_path, line_no, "objects"),
                record["question"],
                record["answer_choices"],
                record["rationale_choices"],
                image,
                metadata,
                *labels,
            )
        )
    return require_nonempty(examples, jsonl_path, "VCR questions")


def read_metadata(path, object_names: dict[str, str] | None = None) -> VCRMetadata:
    """One image's metadata; `object_names` (read_object_names) gives `names` back as the data set's own."""
    path = require_file(path, "VCR image metadata")
    data = load_json(path, "VCR image metadata")
    require_keys(data, ["boxes", "names", "width", "height"], path)
    if len(data["boxes"]) != len(data["names"]):
        raise DataFormatError(path, f"{len(data['boxes'])} boxes but {len(data['names'])} names", key="boxes")
    for b, box in enumerate(data["boxes"]):
        if len(box) != 5:
            raise DataFormatError(path, "a box is x1, y1, x2, y2, score", key=f"boxes[{b}]")
    names = _own_names(data["names"], object_names or {}, path, None, "names")
    return VCRMetadata(data["boxes"], names, int(data["width"]), int(data["height"]))


# Copied from r2c's dataloaders/vcr.py (VL-BERT's VCR reader keeps the same list): a person's tag
# is read as one of these names, by its object's index, so that a tag says nothing of its object.
GENDER_NEUTRAL_NAMES = [
    "Casey", "Riley", "Jessie", "Jackie", "Avery", "Jaime", "Peyton", "Kerry",
    "Jody", "Kendall", "Peyton", "Skyler", "Frankie", "Pat", "Quinn",
]  # fmt: skip


def tag_name(objects: list[str], index: int) -> str:
    """The word a tag of object `index` is read as: its category, or a neutral name for a person."""
    name = objects[index]
    return GENDER_NEUTRAL_NAMES[index % len(GENDER_NEUTRAL_NAMES)] if name == "person" else name


def vcr_text(tokens: list, objects: list[str]) -> str:
    """VCR tokens as the text a model reads: an object reference [i, j] becomes 'name_i and
    name_j' (tag_name)."""
    words = []
    for token in tokens:
        if isinstance(token, str):
            words.append(token)
        else:
            words.append(" and ".join(tag_name(objects, index) for index in token))
    return " ".join(words)
