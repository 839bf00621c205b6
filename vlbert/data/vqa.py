"""VQA v2 reader: the official question and annotation JSON files, and the answer vocabulary."""

from __future__ import annotations

from dataclasses import dataclass, field
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

ANSWERS_PER_QUESTION = 10  # VQA v2 asked ten people each question; the accuracy is over them

# Image folders of the COCO splits that VQA v2's question files point into.
IMAGE_FOLDER = {"train2014": "train2014", "val2014": "val2014", "test2015": "test2015", "test-dev2015": "test2015"}


@dataclass(frozen=True)
class VQAExample:
    question_id: int
    image_id: int
    question: str
    image_path: Path
    answers: tuple[str, ...] = ()  # the 10 human answers; empty for unlabelled splits
    multiple_choice_answer: str | None = None
    answer_type: str | None = None
    question_type: str | None = None
    extra: dict = field(default_factory=dict, compare=False)


# The placeholder that VL-BERT's vocabulary (Pythia's answers_vqa.txt) puts first, the index its
# reader gives answers outside the vocabulary: no question's answer, so no answer class here.
UNKNOWN_ANSWER = "<unk>"


def read_answer_vocabulary(path) -> list[str]:
    """The answers of `answers_vqa.txt`, one a line, in order, without the `<unk>` placeholder."""
    path = require_file(path, "VQA answer vocabulary")
    answers = [line for _, line in text_lines(path) if line.strip() and line != UNKNOWN_ANSWER]
    if len(set(answers)) != len(answers):
        raise DataFormatError(path, "duplicate answers in the vocabulary")
    return require_nonempty(answers, path, "answers")


def read_annotations(path) -> dict[int, dict]:
    data = load_json(path, "VQA annotations")
    require_keys(data, ["annotations"], path)
    by_question = {}
    for k, ann in enumerate(data["annotations"]):
        prefix = f"annotations[{k}]."
        require_keys(
            ann,
            ["question_id", "image_id", "answers", "answer_type", "question_type", "multiple_choice_answer"],
            path,
            prefix=prefix,
        )
        answers = ann["answers"]
        if not isinstance(answers, list) or len(answers) != ANSWERS_PER_QUESTION:
            count = len(answers) if isinstance(answers, list) else type(answers).__name__
            raise DataFormatError(
                path,
                f"question_id {ann['question_id']} has {count} answers, VQA v2 has "
                f"{ANSWERS_PER_QUESTION} per question",
                key=f"{prefix}answers",
            )
        for n, answer in enumerate(answers):
            require_keys(answer, ["answer"], path, prefix=f"{prefix}answers[{n}].")
        by_question[ann["question_id"]] = ann
    return by_question


def read_vqa(questions_path, annotations_path=None, image_root=None) -> list[VQAExample]:
    """Questions joined with their annotations (when given) and image paths.

    Image paths follow COCO's naming, `<root>/<folder>/COCO_<folder>_<image_id:012d>.jpg`, with
    `image_root` defaulting to the questions file's folder.
    """
    data = load_json(questions_path, "VQA questions")
    require_keys(data, ["questions", "data_subtype"], questions_path)
    subtype = data["data_subtype"]
    folder = IMAGE_FOLDER.get(subtype, subtype)
    root = Path(image_root) if image_root else Path(questions_path).parent
    images = resolve_inside(root, folder, questions_path, key="data_subtype")
    annotations = read_annotations(annotations_path) if annotations_path else {}
    examples = []
    for k, q in enumerate(data["questions"]):
        require_keys(q, ["question_id", "image_id", "question"], questions_path, prefix=f"questions[{k}].")
        if not isinstance(q["image_id"], int) or isinstance(q["image_id"], bool):
            raise DataFormatError(
                questions_path,
                f"expected an integer COCO image id, got {q['image_id']!r}",
                key=f"questions[{k}].image_id",
            )
        image_path = images / f"COCO_{folder}_{q['image_id']:012d}.jpg"
        ann = annotations.get(q["question_id"])
        if annotations_path and ann is None:
            raise DataFormatError(annotations_path, f"no annotation for question_id {q['question_id']}")
        if ann is None:
            examples.append(VQAExample(q["question_id"], q["image_id"], q["question"], image_path))
            continue
        examples.append(
            VQAExample(
                q["question_id"],
                q["image_id"],
                q["question"],
                image_path,
                answers=tuple(a["answer"] for a in ann["answers"]),
                multiple_choice_answer=ann["multiple_choice_answer"],
                answer_type=ann["answer_type"],
                question_type=ann["question_type"],
            )
        )
    return require_nonempty(examples, questions_path, "questions")


def complementary_pairs_name(subtype: str) -> str:
    """VQA v2's file of complementary pairs for a question set: the same question on two images
    with different answers (released for train2014 and val2014; the synthetic world writes one
    for every set)."""
    return f"v2_mscoco_{subtype}_complementary_pairs.json"


def read_complementary_pairs(path) -> list[tuple[int, int]]:
    """[(question_id, question_id)] from a complementary-pairs file (a JSON list of id pairs)."""
    data = load_json(path, "VQA complementary pairs")
    if not isinstance(data, list):
        raise DataFormatError(path, "expected a list of [question_id, question_id] pairs")
    pairs = []
    for k, pair in enumerate(data):
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(q, int) for q in pair)):
            raise DataFormatError(path, f"expected [question_id, question_id], got {pair!r}", key=f"[{k}]")
        pairs.append((pair[0], pair[1]))
    return pairs
