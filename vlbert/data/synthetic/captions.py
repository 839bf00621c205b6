"""Conceptual Captions stand-in: one caption per image, `caption TAB image path` per line.

Like Conceptual Captions' alt-texts, a caption is short and about the image's salient one to
three objects (the large ones first); the other shapes of the scene are distractors it does not
name. Scenes are mostly simple (`world.SCENE_SIZES`): a masked colour, size or shape word must often be
resolvable by one look at the image, which is what lets masked language modelling with visual
clues learn to read the regions at all. Captions that named every object of a crowded scene
taught the text to stop looking (reports/reference/mini/README.md); the distractors keep binding (which
region is the named one?) part of the task.
"""

from __future__ import annotations

import numpy as np

from .language import article, join_list
from .world import Scene, relation

# P(number of objects a caption names), for 1, 2, 3 (at most the scene's).
NAMED = (0.55, 0.35, 0.10)


def salient(scene: Scene, rng: np.random.Generator) -> list:
    """The objects a caption names: how many drawn from NAMED, the large ones first."""
    k = min(len(scene.objects), 1 + int(rng.choice(len(NAMED), p=NAMED)))
    order = sorted(rng.permutation(len(scene.objects)), key=lambda i: scene.objects[i].size != "large")
    return [scene.objects[i] for i in order[:k]]


def make_caption(scene: Scene, rng: np.random.Generator) -> str:
    named = salient(scene, rng)
    with_size = bool(rng.random() < 0.8)
    phrases = [article(o.phrase(with_size)) for o in named]
    style = int(rng.integers(3))
    if len(named) == 2 and style == 0:
        return f"{phrases[0]} {relation(named[0], named[1])} {phrases[1]}"
    if style == 1:
        return f"{join_list(phrases)} on a grey background"
    if style == 2:
        return f"there is {join_list(phrases)} in this picture"
    return join_list(phrases)
