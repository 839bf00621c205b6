"""Conceptual Captions stand-in: one caption per image, `caption TAB image path` per line.

Captions name colours, sizes, shapes, counts and spatial relations: words that only the image
can resolve, which is what masked language modelling with visual clues learns to use.
"""

from __future__ import annotations

import numpy as np

from .language import article, grouped_phrases, join_list
from .world import Scene, relation


def make_caption(scene: Scene, rng: np.random.Generator) -> str:
    objects = [scene.objects[i] for i in rng.permutation(len(scene.objects))]
    with_size = bool(rng.random() < 0.8)
    style = int(rng.integers(3))
    if style == 0 and len(objects) >= 2:
        a, b = objects[0], objects[1]
        text = f"{article(a.phrase(with_size))} {relation(a, b)} {article(b.phrase(with_size))}"
        if len(objects) > 2 and rng.random() < 0.5:
            text += f" , next to {join_list(grouped_phrases(objects[2:], with_size))}"
        return text
    phrases = grouped_phrases(objects, with_size)
    if style == 1:
        return f"{join_list(phrases)} on a grey background"
    return f"there is {join_list(phrases)} in this picture"
