"""VCR stand-in, built as VCR was built against text-only shortcuts: adversarial matching.

Objects are referred to as index lists inside token lists (`["how", "does", [0], "feel", "?"]`),
as in the real VCR jsonl, and every object is written as a `person`, so that readers give a tag a
neutral name as VCR's readers do for people (`GENDER_NEUTRAL_NAMES`): a tag never says what its
object looks like.

A question's answer needs the tagged region's colour, shape or size (which only the image shows)
combined with the world's lore (which the text corpus states). Each kind's answer values are
drawn in equal shares. The wrong answers are right answers of other questions of the same kind,
re-targeted to this question's tags; the wrong rationales are right rationales of other questions
of the same kind *and answer*, re-targeted: they agree with the right answer under the lore and
differ only in what they say the image shows. A model that reads no image is at chance on both.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import permutations
from math import prod

import numpy as np

from .world import COLOURS, CORNERS, SHAPES, SIZES, TEMPERATURE, TEMPERATURES, WEIGHT, Scene, sample_scene

# What the files name every object: VCR's readers replace a person's tag with a neutral name.
OBJECT_NAME = "person"
WEIGHTS = tuple(sorted(set(WEIGHT.values())))
CORNER_COUNTS = tuple(sorted(set(CORNERS.values())))

# Each kind: how many objects its question tags, and its answer values (drawn in equal shares).
KIND_VALUES = {
    "feel": (1, TEMPERATURES),
    "corners": (1, CORNER_COUNTS),
    "carry": (1, tuple((w, t) for w in WEIGHTS for t in TEMPERATURES)),
    "compare": (2, ("first", "second", "both heavy", "both light")),
    "same_feel": (2, tuple((a, b) for a in TEMPERATURES for b in TEMPERATURES)),
}
KINDS = tuple(KIND_VALUES)
_COMPARE_SIZES = {
    "first": ("large", "small"),
    "second": ("small", "large"),
    "both heavy": ("large", "large"),
    "both light": ("small", "small"),
}
Look = tuple[str, str, str]  # (size, colour, shape): what the image shows of a tagged object


@dataclass(frozen=True)
class Item:
    """One question before its wrong choices are matched: kind, answer value, and the looks of
    its tagged objects (what its right rationale says)."""

    kind: str
    value: object
    looks: tuple[Look, ...]


def consistent_looks(kind: str, value, rng: np.random.Generator) -> tuple[Look, ...]:
    """Looks of the tagged objects drawn uniformly among those that give `value` under the lore."""

    def look(size=None, colours=COLOURS, shapes=SHAPES) -> Look:
        colours, shapes = list(colours), list(shapes)
        return (
            size or SIZES[int(rng.integers(len(SIZES)))],
            colours[int(rng.integers(len(colours)))],
            shapes[int(rng.integers(len(shapes)))],
        )

    with_temperature = lambda t: [c for c in COLOURS if TEMPERATURE[c] == t]
    if kind == "feel":
        return (look(colours=with_temperature(value)),)
    if kind == "corners":
        return (look(shapes=[s for s in SHAPES if CORNERS[s] == value]),)
    if kind == "carry":
        weight, temperature = value
        size = next(s for s in SIZES if WEIGHT[s] == weight)
        return (look(size=size, colours=with_temperature(temperature)),)
    if kind == "compare":
        first, second = _COMPARE_SIZES[value]
        return (look(size=first), look(size=second))
    if kind == "same_feel":
        return (look(colours=with_temperature(value[0])), look(colours=with_temperature(value[1])))
    raise ValueError(f"unknown VCR question kind {kind!r}")


def value_of(kind: str, looks: tuple[Look, ...]):
    """The answer value that the lore gives for these looks (the inverse of consistent_looks)."""
    (size, colour, shape), *rest = looks
    if kind == "feel":
        return TEMPERATURE[colour]
    if kind == "corners":
        return CORNERS[shape]
    if kind == "carry":
        return (WEIGHT[size], TEMPERATURE[colour])
    if kind == "compare":
        return next(v for v, sizes in _COMPARE_SIZES.items() if sizes == (size, rest[0][0]))
    if kind == "same_feel":
        return (TEMPERATURE[colour], TEMPERATURE[rest[0][1]])
    raise ValueError(f"unknown VCR question kind {kind!r}")


def question_tokens(kind: str, tags: tuple[int, ...]) -> list:
    i, *rest = ([t] for t in tags)
    if kind == "feel":
        return ["how", "does", i, "feel", "?"]
    if kind == "corners":
        return ["how", "many", "corners", "does", i, "have", "?"]
    if kind == "carry":
        return ["what", "is", i, "like", "to", "carry", "and", "to", "touch", "?"]
    if kind == "compare":
        return ["which", "is", "heavier", ",", i, "or", rest[0], "?"]
    return ["do", i, "and", rest[0], "feel", "the", "same", "?"]


def answer_tokens(kind: str, value, tags: tuple[int, ...]) -> list:
    i, *rest = ([t] for t in tags)
    if kind == "feel":
        return [i, "feels", value, "to", "the", "touch", "."]
    if kind == "corners":
        return [i, "has", value, "corners", "."]
    if kind == "carry":
        return [i, "is", value[0], "to", "carry", "and", "feels", value[1], "."]
    if kind == "compare":
        j = rest[0]
        if value in ("first", "second"):
            heavy, light = (i, j) if value == "first" else (j, i)
            return [heavy, "is", "heavier", "than", light, "."]
        return [i, "and", j, "are", "both", value.split()[1], "."]
    same = value[0] == value[1]
    if same:
        return ["yes", ",", i, "and", rest[0], "both", "feel", value[0], "."]
    return ["no", ",", i, "feels", value[0], "but", rest[0], "feels", value[1], "."]


def rationale_tokens(kind: str, value, looks: tuple[Look, ...], tags: tuple[int, ...]) -> list:
    """What the image shows of the tagged objects, then the lore that turns it into the answer."""
    seen = []
    for n, (tag, look) in enumerate(zip(tags, looks)):
        seen += (["and"] if n else []) + [[tag], "is", *look]
    (size, colour, shape), *rest = looks
    if kind == "feel":
        lore = [colour, "things", "always", "feel", value]
    elif kind == "corners":
        lore = ["every", shape, "has", value, "corners"]
    elif kind == "carry":
        lore = ["a", size, "shape", "is", value[0], "while", colour, "things", "feel", value[1]]
    elif kind == "compare":
        lore = {
            "both heavy": ["large", "shapes", "are", "heavy"],
            "both light": ["small", "shapes", "are", "light"],
        }.get(value, ["a", "large", "shape", "weighs", "more", "than", "a", "small", "one"])
    else:
        other = rest[0][1]
        lore = [colour, "things", "feel", value[0], "and", other, "things", "feel", value[1]]
    return seen + [",", *lore, "."]


def rationale_looks(tokens: list, n_tags: int) -> tuple[Look, ...]:
    """What a rationale (rationale_tokens) says the image shows of its `n_tags` tagged objects."""
    return tuple(tuple(tokens[6 * n + 2 : 6 * n + 5]) for n in range(n_tags))


def draw_items(rng: np.random.Generator, count: int) -> list[Item]:
    """`count` questions: the kinds in equal shares, each kind's values in equal shares."""
    kinds = [KINDS[k % len(KINDS)] for k in range(count)]
    items = []
    for kind in KINDS:
        n = kinds.count(kind)
        values = KIND_VALUES[kind][1]
        drawn = [values[k % len(values)] for k in range(n)]
        for k in rng.permutation(n):
            value = drawn[int(k)]
            items.append(Item(kind, value, consistent_looks(kind, value, rng)))
    return [items[int(k)] for k in rng.permutation(len(items))]


def scene_for(item: Item, rng: np.random.Generator, image_size: int, n_objects: int) -> tuple[Scene, tuple[int, ...]]:
    """A scene holding the item's tagged objects among others, and the tags (their indices)."""
    forced = [{"size": s, "colour": c, "shape": sh} for s, c, sh in item.looks]
    scene = sample_scene(rng, image_size, max(n_objects, len(forced)), forced=forced)
    order = [int(k) for k in rng.permutation(len(scene.objects))]
    objects = tuple(scene.objects[k] for k in order)
    tags = tuple(order.index(k) for k in range(len(forced)))
    return Scene(scene.width, scene.height, scene.background, objects), tags


def _match(own, pool, rng: np.random.Generator, draw, k: int = 3) -> list:
    """`k` entries of `pool` (shuffled), distinct and unlike `own`; `draw()` tops up a short pool."""
    chosen = []
    for n in rng.permutation(len(pool)):
        if pool[int(n)] != own and pool[int(n)] not in chosen:
            chosen.append(pool[int(n)])
            if len(chosen) == k:
                return chosen
    for _ in range(1000):
        candidate = draw()
        if candidate != own and candidate not in chosen:
            chosen.append(candidate)
            if len(chosen) == k:
                return chosen
    raise ValueError(f"could not find {k} wrong choices unlike {own!r}")


def adversarial_choices(items: list[Item], tags: list[tuple[int, ...]], rng: np.random.Generator) -> list[dict]:
    """Each item's four answers and four rationales, shuffled, with their labels.

    Wrong answers: the values of other questions of the same kind; wrong rationales: the looks of
    other questions of the same kind and value (right under the lore, wrong about the image)."""
    by_kind: dict[str, list] = {}
    by_value: dict[tuple, list] = {}
    for item in items:
        by_kind.setdefault(item.kind, []).append(item.value)
        by_value.setdefault((item.kind, item.value), []).append(item.looks)
    out = []
    for item, item_tags in zip(items, tags):
        values = KIND_VALUES[item.kind][1]
        wrong_values = _match(item.value, by_kind[item.kind], rng, lambda: values[int(rng.integers(len(values)))])
        wrong_looks = _match(
            item.looks,
            by_value[item.kind, item.value],
            rng,
            lambda: consistent_looks(item.kind, item.value, rng),
        )
        answers = [answer_tokens(item.kind, v, item_tags) for v in [item.value, *wrong_values]]
        rationales = [
            rationale_tokens(item.kind, item.value, looks, item_tags) for looks in [item.looks, *wrong_looks]
        ]
        answer_order, rationale_order = rng.permutation(4), rng.permutation(4)
        out.append(
            {
                "question": question_tokens(item.kind, item_tags),
                "answer_choices": [answers[k] for k in answer_order],
                "rationale_choices": [rationales[k] for k in rationale_order],
                "answer_label": int(np.flatnonzero(answer_order == 0)[0]),
                "rationale_label": int(np.flatnonzero(rationale_order == 0)[0]),
            }
        )
    return out


def _allowed(kind: str, value, tag: int) -> tuple[list, list, list]:
    """The (sizes, colours, shapes) that `consistent_looks` draws the look of tagged object `tag`
    from, uniformly, for `value`."""
    sizes, colours, shapes = list(SIZES), list(COLOURS), list(SHAPES)
    feeling = lambda t: [c for c in colours if TEMPERATURE[c] == t]
    if kind == "feel":
        return sizes, feeling(value), shapes
    if kind == "corners":
        return sizes, colours, [s for s in shapes if CORNERS[s] == value]
    if kind == "carry":
        return [s for s in sizes if WEIGHT[s] == value[0]], feeling(value[1]), shapes
    if kind == "compare":
        return [_COMPARE_SIZES[value][tag]], colours, shapes
    if kind == "same_feel":
        return sizes, feeling(value[tag]), shapes
    raise ValueError(f"unknown VCR question kind {kind!r}")


def _look_likelihood(kind: str, value, tag: int, look: Look) -> float:
    likelihood = 1.0
    for attribute, allowed in zip(look, _allowed(kind, value, tag)):
        likelihood *= (attribute in allowed) / len(allowed)
    return likelihood


def _expected_accuracy(weights: list[float], label: int) -> float:
    """A reader that picks a choice of the highest weight, at random among ties."""
    best = max(weights)
    if best <= 0:
        return 1 / len(weights)
    winners = [k for k, w in enumerate(weights) if w == best]
    return (label in winners) / len(winners)


def no_link_accuracies(
    kind: str,
    looks: list[Look],
    n_tags: int,
    answer_values: list,
    answer_label: int,
    rationale_looks_: list[tuple[Look, ...]],
    rationale_label: int,
) -> tuple[float, float]:
    """The best expected Q->A and QA->R accuracy on one question of a reader that sees the look of
    every object in view exactly, and knows the lore, but not which objects the tags name: the
    scene's objects are shuffled (`scene_for`), so every assignment of the tags to distinct objects
    is a priori equal, and a choice's weight is its likelihood summed over them (an untagged
    object's look is uniform whatever the answer, so it cancels)."""
    assignments = list(permutations(range(len(looks)), n_tags))
    answers = [
        sum(prod(_look_likelihood(kind, value, t, looks[a[t]]) for t in range(n_tags)) for a in assignments)
        for value in answer_values
    ]
    rationales = [
        sum(all(looks[a[t]] == tuple(said[t]) for t in range(n_tags)) for a in assignments)
        for said in rationale_looks_
    ]
    return _expected_accuracy(answers, answer_label), _expected_accuracy(rationales, rationale_label)


def answer_value(kind: str, tokens: list, tags: tuple[int, ...]):
    """The answer value an answer choice (answer_tokens) states."""
    for value in KIND_VALUES[kind][1]:
        if answer_tokens(kind, value, tags) == tokens:
            return value
    raise ValueError(f"not a {kind} answer about objects {tags}: {tokens}")
