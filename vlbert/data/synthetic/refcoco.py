"""RefCOCO+ stand-in: appearance-only referring expressions (no location words).

An expression names the fewest attributes (colour, size, shape) that single its region out from
the others in the image, so resolving it means reading attributes off one region among
distractors that share some of them.

As RefCOCO+ was collected, a referred object always has another object of its category (its
shape, the category in instances.json) in its image, and the two test splits divide the
categories by kind: RefCOCO+'s testA refers to people, testB to other objects; here testA refers
to the plain shapes and testB to the others (TEST_KINDS).

Two colours (RARE_COLOURS) name no training expression, as rare words of a Zipfian vocabulary do;
pre-training's captions name them as often as the others. No training referent or twin wears them
(the distractors of other shapes may), as nocaps' novel objects go unannotated in COCO.
"""

from __future__ import annotations

from collections import Counter
from itertools import combinations

import numpy as np

from .world import Scene, SceneObject

_ATTRIBUTES = ("size", "colour", "shape")
# A long tail, as real vocabularies have: these colours name no training expression, while the
# captions (pre-training) name them as often as any other; val and test score them as a subset.
RARE_COLOURS = ("orange", "purple")
# How often a referent's same-shape twins also share its size, so that colour tells them apart.
TWIN_SAME_SIZE = 0.75
# The world's stand-in for RefCOCO+'s people / other objects divide: two kinds of three shapes.
TEST_KINDS = {"testA": ("circle", "square", "triangle"), "testB": ("diamond", "star", "cross")}


def _describe(obj: SceneObject, attrs: tuple[str, ...]) -> str:
    words = [getattr(obj, a) for a in _ATTRIBUTES if a in attrs and a != "shape"]
    return " ".join(words + [obj.shape if "shape" in attrs else "one"])


def referable(scene: Scene) -> list[int]:
    """The objects a ref may point at: those whose shape another object in the image shares."""
    counts = Counter(o.shape for o in scene.objects)
    return [k for k, o in enumerate(scene.objects) if counts[o.shape] >= 2]


def expressions(scene: Scene, index: int, rng: np.random.Generator, n: int) -> list[str]:
    """Up to n different expressions that pick out object `index` alone; [] if none can."""
    target = scene.objects[index]
    others = [o for k, o in enumerate(scene.objects) if k != index]
    unique = []
    for r in (1, 2, 3):
        for attrs in combinations(_ATTRIBUTES, r):
            if all(any(getattr(o, a) != getattr(target, a) for a in attrs) for o in others):
                unique.append(attrs)
    if not unique:
        return []
    minimal = min(len(a) for a in unique)
    # Prefer the shortest unique descriptions, as people do, with a fuller one for variety.
    preferred = [a for a in unique if len(a) == minimal] + [a for a in unique if len(a) > minimal]
    texts = []
    for attrs in preferred[:n]:
        phrase = _describe(target, attrs)
        texts.append(phrase if rng.random() < 0.5 else f"the {phrase}")
    return texts


def names_rare_colour(text: str, rare_colours=RARE_COLOURS) -> bool:
    return any(word in rare_colours for word in text.split())
