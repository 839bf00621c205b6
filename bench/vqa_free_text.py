"""Benchmark: the project's VQA accuracy on free-text predictions, to set beside the official script's.

A model's predictions come from the answer vocabulary and are never normalised differently by the
2016 and the current official logic; free text is where they part. This writes, for a VQA split,
predictions that exercise the normalisation (a human answer, as it is or in upper or title case,
with punctuation, an article, a number word, stray whitespace; the most common training answer of
the question type; a random vocabulary answer), scores them with `vlbert evaluate vqa`'s metric,
and prints the command that scores the same file with the official script, from a copy of
GT-Vision-Lab/VQA made outside this repository (vqa.py and vqaEval.py at commit a013f00; under
Python 3 their print statements need parentheses). The two must agree to the second decimal.

    python bench/vqa_free_text.py --data results/<preset>/data/vqa --out /tmp/free_text.json [--split val2014]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from vlbert.data.errors import load_json
from vlbert.data.vqa import read_annotations, read_answer_vocabulary
from vlbert.evaluation.vqa_eval import NUMBER_WORDS, vqa_accuracy

DIGIT_WORDS = {digit: word for word, digit in NUMBER_WORDS.items() if word != "none"}
VARIANTS = [
    lambda a, rng: a,
    lambda a, rng: a.upper(),
    lambda a, rng: a.title(),
    lambda a, rng: a + "!",
    lambda a, rng: "a " + a,
    lambda a, rng: "The " + a + ".",
    lambda a, rng: DIGIT_WORDS.get(a, a),
    lambda a, rng: " " + a + "\n",
    lambda a, rng: a + " ?",
    lambda a, rng: "(" + a + ")",
]


def free_text_predictions(annotations: dict, train_annotations: dict, vocabulary: list[str], seed: int = 0) -> dict:
    """question_id -> a free-text answer: a variant of a random human answer (most questions), the
    question type's most common training answer, or a random vocabulary answer."""
    by_type = defaultdict(Counter)
    for ann in train_annotations.values():
        by_type[ann["question_type"]][ann["multiple_choice_answer"]] += 1
    rng = np.random.default_rng(seed)
    predictions = {}
    for question_id, ann in annotations.items():
        draw = rng.random()
        if draw < 0.1:
            predictions[question_id] = by_type[ann["question_type"]].most_common(1)[0][0]
        elif draw < 0.2:
            predictions[question_id] = vocabulary[int(rng.integers(len(vocabulary)))]
        else:
            human = ann["answers"][int(rng.integers(len(ann["answers"])))]["answer"]
            predictions[question_id] = VARIANTS[int(rng.integers(len(VARIANTS)))](human, rng)
    return predictions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="a VQA folder written by `vlbert make-data`")
    parser.add_argument("--split", default="val2014", help="val2014 or test-dev2015")
    parser.add_argument("--out", required=True, help="the predictions file to write (official results format)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    data = Path(args.data)
    annotations_path = data / f"v2_mscoco_{args.split}_annotations.json"
    questions_path = data / f"v2_OpenEnded_mscoco_{args.split}_questions.json"
    asked = {q["question_id"] for q in load_json(questions_path, "VQA questions")["questions"]}
    annotations = {q: a for q, a in read_annotations(annotations_path).items() if q in asked}
    predictions = free_text_predictions(
        annotations,
        read_annotations(data / "v2_mscoco_train2014_annotations.json"),
        read_answer_vocabulary(data / "answers_vqa.txt"),
        args.seed,
    )
    Path(args.out).write_text(json.dumps([{"question_id": q, "answer": a} for q, a in predictions.items()]))
    result = vqa_accuracy(annotations, predictions)
    print(
        json.dumps({k: result[k] for k in ("overall", "perAnswerType", "perQuestionType")}, indent=1, sort_keys=True)
    )
    print(
        f"\nofficial: python run_official.py {annotations_path} {questions_path} {args.out}\n"
        "  where run_official.py, beside your copy of vqa.py and vqaEval.py, does:\n"
        "  vqa = VQA(annotations, questions); res = vqa.loadRes(results, questions);\n"
        "  e = VQAEval(vqa, res, n=2); e.evaluate(); print(e.accuracy)"
    )


if __name__ == "__main__":
    main()
