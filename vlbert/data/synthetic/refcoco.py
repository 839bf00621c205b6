"""RefCOCO+ stand-in: appearance-only referring expressions (no location words).

An expression names the fewest attributes (colour, size, shape) that single its region out from
the others in the image, so resolving it means reading attributes off one region among
distractors that share some of them.
"""

from __future__ import annotations

from itertools import combinations

import numpy as np

from .world import Scene, SceneObject

_ATTRIBUTES = ("size", "colour", "shape")


def _describe(obj: SceneObject, attrs: tuple[str, ...]) -> str:
    words = [getattr(obj, a) for a in _ATTRIBUTES if a in attrs and a != "shape"]
    return " ".join(words + [obj.shape if "shape" in attrs else "one"])


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
