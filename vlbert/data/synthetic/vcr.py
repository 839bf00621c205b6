"""VCR stand-in: multiple-choice questions whose answers and rationales need the image and lore.

Objects are referred to as index lists inside token lists (`["how", "does", [0], "feel", "?"]`),
as in the real VCR jsonl. Every question has four answers and four rationales; the right ones
need what only the image shows (the referenced region's colour or size) combined with what only
the text corpus states often (the lore of world.py), in long multi-clause sentences.
"""

from __future__ import annotations

import numpy as np

from .world import COLOURS, CORNERS, SHAPES, TEMPERATURE, TEMPERATURES, WEIGHT, Scene

# The VCR files name objects by COCO category, and r2c's and VL-BERT's readers look each name up in
# COCO's list, so `objects` (and the metadata's `names`) carry these COCO names; object_names.json
# beside the jsonl files holds this map, and the project's reader turns them back into the world's.
# A fixed, arbitrary stand-in per shape: neither `person` (which both readers replace with a
# person's name) nor a word the world's language uses, each one word as VCR spells them.
COCO_NAMES = {
    "circle": "frisbee",
    "square": "book",
    "triangle": "pizza",
    "diamond": "kite",
    "star": "umbrella",
    "cross": "airplane",
}


def _others(rng, pool, exclude, k):
    rest = [p for p in pool if p not in exclude]
    return [rest[i] for i in rng.permutation(len(rest))[:k]]


def _feel(scene, rng, i, j):
    colour = scene.objects[i].colour
    temp = TEMPERATURE[colour]
    question = ["how", "does", [i], "feel", "?"]
    answers = [[[i], "feels", t, "to", "the", "touch", "."] for t in [temp] + _others(rng, TEMPERATURES, [temp], 3)]
    rationale = lambda c: [
        [i],
        "is",
        c,
        ",",
        "and",
        "everyone",
        "knows",
        "that",
        c,
        "things",
        "always",
        "feel",
        temp,
        ".",
    ]
    rationales = [rationale(c) for c in [colour] + _others(rng, COLOURS, [colour], 3)]
    return question, answers, rationales


def _weight(scene, rng, i, j):
    size = scene.objects[i].size
    other = "small" if size == "large" else "large"
    question = ["would", [i], "be", "heavy", "or", "light", "to", "carry", "?"]
    answers = [
        [[i], "would", "be", WEIGHT[s1], ",", "like", "every", s2, "shape", "."]
        for s1, s2 in [(size, size), (other, other), (size, other), (other, size)]
    ]
    shape = scene.objects[i].shape
    rationale = lambda s, sh: [
        [i],
        "is",
        "a",
        s,
        sh,
        ",",
        "and",
        "a",
        s,
        "shape",
        "is",
        WEIGHT[size],
        "because",
        "there",
        "is",
        "more",
        "or",
        "less",
        "of",
        "it",
        "to",
        "carry",
        ".",
    ]
    wrong_shapes = _others(rng, SHAPES, [shape], 2)
    rationales = [
        rationale(size, shape),
        rationale(other, shape),
        rationale(size, wrong_shapes[0]),
        rationale(other, wrong_shapes[1]),
    ]
    return question, answers, rationales


def _compare(scene, rng, i, j):
    bigger, smaller = (i, j) if scene.objects[i].size == "large" else (j, i)
    question = ["which", "is", "heavier", ",", [i], "or", [j], "?"]
    answers = [
        [[bigger], "is", "heavier", "than", [smaller], "."],
        [[smaller], "is", "heavier", "than", [bigger], "."],
        [[i], "and", [j], "weigh", "the", "same", "."],
        ["neither", [i], "nor", [j], "weighs", "anything", "."],
    ]
    rationale = lambda a, b: [
        [bigger],
        "is",
        a,
        "while",
        [smaller],
        "is",
        b,
        ",",
        "and",
        "a",
        "large",
        "shape",
        "weighs",
        "more",
        "than",
        "a",
        "small",
        "one",
        ".",
    ]
    rationales = [
        rationale("large", "small"),
        rationale("small", "large"),
        rationale("large", "large"),
        rationale("small", "small"),
    ]
    return question, answers, rationales


def _corners(scene, rng, i, j):
    shape = scene.objects[i].shape
    count = CORNERS[shape]
    counts = sorted(set(CORNERS.values()) - {count})
    question = ["how", "many", "corners", "does", [i], "have", "?"]
    answers = [[[i], "has", c, "corners", "."] for c in [count] + _others(rng, counts, [], 3)]
    rationale = lambda sh: [[i], "is", "a", sh, ",", "and", "every", sh, "has", count, "corners", "."]
    rationales = [rationale(sh) for sh in [shape] + _others(rng, SHAPES, [shape], 3)]
    return question, answers, rationales


def _same_feel(scene, rng, i, j):
    ci, cj = scene.objects[i].colour, scene.objects[j].colour
    ti, tj = TEMPERATURE[ci], TEMPERATURE[cj]
    question = ["do", [i], "and", [j], "feel", "the", "same", "?"]
    alt = _others(rng, TEMPERATURES, [ti], 1)[0]
    if ti == tj:
        answers = [
            ["yes", ",", [i], "and", [j], "both", "feel", ti, "."],
            ["no", ",", [i], "feels", ti, "but", [j], "feels", alt, "."],
            ["yes", ",", [i], "and", [j], "both", "feel", alt, "."],
            ["no", ",", [i], "feels", alt, "but", [j], "feels", ti, "."],
        ]
    else:
        answers = [
            ["no", ",", [i], "feels", ti, "but", [j], "feels", tj, "."],
            ["yes", ",", [i], "and", [j], "both", "feel", ti, "."],
            ["no", ",", [i], "feels", tj, "but", [j], "feels", ti, "."],
            ["yes", ",", [i], "and", [j], "both", "feel", tj, "."],
        ]
    rationale = lambda a, b: [
        [i],
        "is",
        a,
        "and",
        [j],
        "is",
        b,
        ",",
        "and",
        a,
        "things",
        "feel",
        TEMPERATURE[a],
        "while",
        b,
        "things",
        "feel",
        TEMPERATURE[b],
        ".",
    ]
    wrong = _others(rng, COLOURS, [ci, cj], 3)
    rationales = [rationale(ci, cj), rationale(wrong[0], cj), rationale(ci, wrong[1]), rationale(wrong[2], wrong[0])]
    return question, answers, rationales


_KINDS = [_feel, _weight, _compare, _corners, _same_feel]


def make_item(scene: Scene, rng: np.random.Generator) -> dict | None:
    """One VCR question about the scene, with shuffled choices and their labels."""
    n = len(scene.objects)
    i, j = (int(v) for v in rng.permutation(n)[:2]) if n >= 2 else (0, 0)
    # The kind first, then a pair it can be asked about: a comparison needs two sizes.
    other_size = [k for k in range(n) if scene.objects[k].size != scene.objects[i].size]
    kinds = [k for k in _KINDS if (n >= 2 or k not in (_compare, _same_feel)) and (other_size or k is not _compare)]
    kind = kinds[int(rng.integers(len(kinds)))]
    if kind is _compare and scene.objects[j].size == scene.objects[i].size:
        j = other_size[int(rng.integers(len(other_size)))]
    question, answers, rationales = kind(scene, rng, i, j)
    answer_order, rationale_order = rng.permutation(4), rng.permutation(4)
    return {
        "question": question,
        "answer_choices": [answers[k] for k in answer_order],
        "rationale_choices": [rationales[k] for k in rationale_order],
        "answer_label": int(np.flatnonzero(answer_order == 0)[0]),
        "rationale_label": int(np.flatnonzero(rationale_order == 0)[0]),
        "kind": kind.__name__.lstrip("_"),
    }
