"""VQA v2 stand-in: questions about colour, shape, size, counts and existence, 10 answers each.

Annotators agree most of the time but not always (a neighbouring colour, a count off by one),
so the official soft accuracy (min(#matches / 3, 1) over leave-one-out subsets) is exercised.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from .world import COLOURS, SHAPES, SIZES, Scene

ANNOTATOR_AGREEMENT = 0.85


def _unique(scene: Scene, key) -> list:
    counts = Counter(key(o) for o in scene.objects)
    return [o for o in scene.objects if counts[key(o)] == 1]


def _confusion(answer: str, answer_type: str, rng: np.random.Generator) -> str:
    if answer_type == "yes/no":
        return "no" if answer == "yes" else "yes"
    if answer_type == "number":
        return str(max(0, int(answer) + int(rng.choice([-1, 1]))))
    for pool in (list(COLOURS), list(SHAPES), list(SIZES)):
        if answer in pool:
            return pool[int(rng.integers(len(pool)))]
    return answer


def make_questions(scene: Scene, rng: np.random.Generator, n: int) -> list[dict]:
    """Return up to n distinct {question, answer, answer_type, question_type} for the scene."""
    candidates = []
    for o in _unique(scene, lambda o: (o.size, o.shape)):
        candidates.append((f"what color is the {o.size} {o.shape}?", o.colour, "other", "what color is the"))
    for o in _unique(scene, lambda o: o.colour):
        candidates.append((f"what shape is the {o.colour} object?", o.shape, "other", "what shape is the"))
    for o in _unique(scene, lambda o: (o.colour, o.shape)):
        candidates.append((f"what size is the {o.colour} {o.shape}?", o.size, "other", "what size is the"))
    colour = list(COLOURS)[int(rng.integers(len(COLOURS)))]
    count = sum(o.colour == colour for o in scene.objects)
    candidates.append((f"how many {colour} shapes are there?", str(count), "number", "how many"))
    shape = SHAPES[int(rng.integers(len(SHAPES)))]
    count = sum(o.shape == shape for o in scene.objects)
    candidates.append((f"how many {shape}s are there?", str(count), "number", "how many"))
    size, colour, shape = (
        SIZES[int(rng.integers(2))],
        list(COLOURS)[int(rng.integers(len(COLOURS)))],
        SHAPES[int(rng.integers(len(SHAPES)))],
    )
    if rng.random() < 0.5:  # ask about an object that is there half the time: balanced yes/no
        o = scene.objects[int(rng.integers(len(scene.objects)))]
        size, colour, shape = o.size, o.colour, o.shape
    present = any((o.size, o.colour, o.shape) == (size, colour, shape) for o in scene.objects)
    candidates.append((f"is there a {size} {colour} {shape}?", "yes" if present else "no", "yes/no", "is there a"))
    order = rng.permutation(len(candidates))[:n]
    return [dict(zip(("question", "answer", "answer_type", "question_type"), candidates[i])) for i in order]


def annotate(answer: str, answer_type: str, rng: np.random.Generator, n: int = 10) -> list[str]:
    return [answer if rng.random() < ANNOTATOR_AGREEMENT else _confusion(answer, answer_type, rng) for _ in range(n)]
