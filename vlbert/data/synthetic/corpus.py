"""Text-only corpus stand-in (BooksCorpus + Wikipedia): long multi-clause passages, one a line.

The passages talk about imagined shapes and state the world's lore (what each colour feels like,
what size means for weight, how many corners each shape has). The same lore is what VCR
rationales rely on, so a model pre-trained on this corpus has seen it; one that was not has
only the few VCR training sentences to learn it from.
"""

from __future__ import annotations

import numpy as np

from .language import article
from .world import COLOURS, CORNERS, SHAPES, SIZES, TEMPERATURE, WEIGHT


def _pick(rng: np.random.Generator, items):
    items = list(items)
    return items[int(rng.integers(len(items)))]


def _sentence(rng: np.random.Generator) -> str:
    colour, other_colour = _pick(rng, COLOURS), _pick(rng, COLOURS)
    shape, other_shape = _pick(rng, SHAPES), _pick(rng, SHAPES)
    size, other_size = _pick(rng, SIZES), _pick(rng, SIZES)
    kind = int(rng.integers(6))
    if kind == 0:
        return (
            f"the {colour} {shape} felt {TEMPERATURE[colour]} when the children touched it , "
            f"because {colour} things always feel {TEMPERATURE[colour]} ."
        )
    if kind == 1:
        return (
            f"everyone knows that {article(size + ' shape')} is {WEIGHT[size]} , so when the "
            f"{size} {colour} {shape} was lifted it turned out to be {WEIGHT[size]} as well ."
        )
    if kind == 2:
        return (
            f"{article(shape)} always has {CORNERS[shape]} corners , which is why the "
            f"{colour} {shape} that stood by the {other_colour} {other_shape} had "
            f"{CORNERS[shape]} corners too ."
        )
    if kind == 3:
        if size == other_size:
            return (
                f"the {size} {shape} was just as heavy as the {other_size} {other_shape} , "
                f"since both of them were {size} and {size} shapes are {WEIGHT[size]} ."
            )
        heavier = "heavier" if size == "large" else "lighter"
        return (
            f"the {size} {shape} was {heavier} than the {other_size} {other_shape} , "
            f"since a large shape weighs more than a small one ."
        )
    if kind == 4:
        same = TEMPERATURE[colour] == TEMPERATURE[other_colour]
        verdict = (
            f"both of them felt {TEMPERATURE[colour]}"
            if same
            else f"one felt {TEMPERATURE[colour]} while the other felt {TEMPERATURE[other_colour]}"
        )
        return (
            f"when the {colour} {shape} and the {other_colour} {other_shape} were put side by "
            f"side , {verdict} , because {colour} things feel {TEMPERATURE[colour]} and "
            f"{other_colour} things feel {TEMPERATURE[other_colour]} ."
        )
    return (
        f"if you hold {article(f'{size} {colour} {shape}')} you will find that it is "
        f"{WEIGHT[size]} and {TEMPERATURE[colour]} and that it has {CORNERS[shape]} corners ."
    )


def make_passage(rng: np.random.Generator, min_sentences: int = 3, max_sentences: int = 6) -> str:
    n = int(rng.integers(min_sentences, max_sentences + 1))
    return " ".join(_sentence(rng) for _ in range(n))
