"""VQA v2 stand-in, built as VQA v2 was built against language priors: complementary pairs.

Each question is asked of two images that differ only in what its answer depends on (the colour
of the one object the question names, its shape, its size, how many objects have a colour, or
whether an object is there), and the two answers differ. A question's answer is drawn first,
uniformly over its kind's values, so every question string has balanced answers: a model that
does not look scores its kind's chance on a member, and 0 on a pair (it gives both members one
answer). The five kinds come in equal shares. The pairs are written as VQA v2 releases them
(`v2_mscoco_<subtype>_complementary_pairs.json`, a list of [question_id, question_id]).

Annotators agree most of the time but not always (another colour, a count off by one),
so the official soft accuracy (min(#matches / 3, 1) over leave-one-out subsets) is exercised.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .world import COLOURS, RADIUS, SHAPES, SIZES, Scene, SceneObject, sample_scene

ANNOTATOR_AGREEMENT = 0.9
KINDS = ("color", "shape", "size", "count", "exist")
COUNTS = ("0", "1", "2", "3", "4")  # how many: the values a count question is drawn from
_COLOURS = tuple(COLOURS)


def _pick(rng: np.random.Generator, items, exclude=()):
    items = [i for i in items if i not in exclude]
    return items[int(rng.integers(len(items)))]


def _resized(obj: SceneObject, size: str, rng: np.random.Generator, cell: float) -> SceneObject:
    """`obj` at `size`, in the same grid cell (shapes never overlap: sample_scene's layout)."""
    lo, hi = RADIUS[size]
    radius = cell * rng.uniform(lo, hi)
    slack = cell / 2 - radius - 1
    col, row = int(obj.cx // cell), int(obj.cy // cell)
    centre_x, centre_y = (col + 0.5) * cell, (row + 0.5) * cell
    cx = centre_x + float(np.clip(obj.cx - centre_x, -slack, slack))
    cy = centre_y + float(np.clip(obj.cy - centre_y, -slack, slack))
    return dataclasses.replace(obj, size=size, radius=float(radius), cx=cx, cy=cy)


def _with(scene: Scene, changes: dict[int, SceneObject]) -> Scene:
    return dataclasses.replace(scene, objects=tuple(changes.get(k, o) for k, o in enumerate(scene.objects)))


def answer(scene: Scene, kind: str, subject: tuple) -> str | None:
    """The answer to a question of `kind` about `subject` in `scene`; None where the question does
    not hold (the object it names is not there, or not alone)."""
    objects = scene.objects
    if kind == "color":  # subject: (size, shape)
        hits = [o for o in objects if (o.size, o.shape) == subject]
        return hits[0].colour if len(hits) == 1 else None
    if kind == "shape":  # subject: (colour,)
        hits = [o for o in objects if o.colour == subject[0]]
        return hits[0].shape if len(hits) == 1 else None
    if kind == "size":  # subject: (colour, shape)
        hits = [o for o in objects if (o.colour, o.shape) == subject]
        return hits[0].size if len(hits) == 1 else None
    if kind == "count":  # subject: (colour,)
        return str(sum(o.colour == subject[0] for o in objects))
    if kind == "exist":  # subject: (size, colour, shape)
        return "yes" if any((o.size, o.colour, o.shape) == subject for o in objects) else "no"
    raise ValueError(f"unknown question kind {kind!r}")


def question(kind: str, subject: tuple) -> tuple[str, str, str]:
    """(question, answer_type, question_type) as VQA v2 files them."""
    if kind == "color":
        return f"what color is the {subject[0]} {subject[1]}?", "other", "what color is the"
    if kind == "shape":
        return f"what shape is the {subject[0]} object?", "other", "what shape is the"
    if kind == "size":
        return f"what size is the {subject[0]} {subject[1]}?", "other", "what size is the"
    if kind == "count":
        return f"how many {subject[0]} shapes are there?", "number", "how many"
    return f"is there a {subject[0]} {subject[1]} {subject[2]}?", "yes/no", "is there a"


def _clear(scene: Scene, rng, keep: int, clashes) -> Scene:
    """Re-draw every object but `keep` that `clashes` with the question's subject."""
    changes = {}
    for k, o in enumerate(scene.objects):
        while k != keep and clashes(o):
            o = changes[k] = dataclasses.replace(o, colour=_pick(rng, _COLOURS), shape=_pick(rng, SHAPES))
    return _with(scene, changes)


def complementary_pair(rng: np.random.Generator, image_size: int, kind: str, n_objects: int):
    """(question fields, scene A, answer A, scene B, answer B): one question, two scenes that
    differ only in what its answer depends on, answers drawn uniformly and different. A count
    question's scene holds at least as many objects as its larger answer."""
    cell = image_size / 3
    if kind == "count":
        a = _pick(rng, COUNTS)
        b = _pick(rng, COUNTS, exclude=[a])
        n_objects = max(n_objects, int(a), int(b))
    scene = sample_scene(rng, image_size, n_objects)
    t = int(rng.integers(n_objects))  # the object the question is about
    target = scene.objects[t]
    if kind == "color":
        subject = (target.size, target.shape)
        a = _pick(rng, _COLOURS)
        b = _pick(rng, _COLOURS, exclude=[a])
        scene = _clear(scene, rng, t, lambda o: (o.size, o.shape) == subject)
        scene_a = _with(scene, {t: dataclasses.replace(target, colour=a)})
        scene_b = _with(scene, {t: dataclasses.replace(target, colour=b)})
    elif kind == "shape":
        colour = target.colour
        subject = (colour,)
        a = _pick(rng, SHAPES)
        b = _pick(rng, SHAPES, exclude=[a])
        scene = _clear(scene, rng, t, lambda o: o.colour == colour)
        scene_a = _with(scene, {t: dataclasses.replace(target, shape=a)})
        scene_b = _with(scene, {t: dataclasses.replace(target, shape=b)})
    elif kind == "size":
        subject = (target.colour, target.shape)
        a = _pick(rng, SIZES)
        b = _pick(rng, SIZES, exclude=[a])
        scene = _clear(scene, rng, t, lambda o: (o.colour, o.shape) == subject)
        scene_a = _with(scene, {t: _resized(target, a, rng, cell)})
        scene_b = _with(scene, {t: _resized(target, b, rng, cell)})
    elif kind == "count":
        colour = _pick(rng, _COLOURS)
        subject = (colour,)
        order = [int(k) for k in rng.permutation(n_objects)]
        # The first max(a, b) objects in `order` carry the colour in the scene with more of it;
        # the other scene gives the surplus other colours: the rest is the same.
        others = {k: _pick(rng, _COLOURS, exclude=[colour]) for k in order}

        def coloured(count: int) -> Scene:
            changes = {}
            for rank, k in enumerate(order):
                new = colour if rank < count else others[k]
                changes[k] = dataclasses.replace(scene.objects[k], colour=new)
            return _with(scene, changes)

        scene_a, scene_b = coloured(int(a)), coloured(int(b))
    elif kind == "exist":
        subject = (target.size, target.colour, target.shape)
        a = _pick(rng, ("yes", "no"))
        b = "no" if a == "yes" else "yes"
        scene = _clear(scene, rng, t, lambda o: (o.size, o.colour, o.shape) == subject)
        absent = dataclasses.replace(target, colour=_pick(rng, _COLOURS, exclude=[target.colour]))
        scene_a = _with(scene, {t: target if a == "yes" else absent})
        scene_b = _with(scene, {t: target if b == "yes" else absent})
    else:
        raise ValueError(f"unknown question kind {kind!r}")
    for s, expected in ((scene_a, a), (scene_b, b)):
        if answer(s, kind, subject) != expected:  # the construction's own check
            raise AssertionError(f"{kind} pair: {subject} gives {answer(s, kind, subject)!r}, expected {expected!r}")
    text, answer_type, question_type = question(kind, subject)
    fields = {"question": text, "answer_type": answer_type, "question_type": question_type, "kind": kind}
    return fields, scene_a, a, scene_b, b


def _confusion(answer: str, answer_type: str, rng: np.random.Generator) -> str:
    if answer_type == "yes/no":
        return ("yes", "no")[int(rng.integers(2))]
    if answer_type == "number":
        return str(max(0, int(answer) + int(rng.choice([-1, 1]))))
    for pool in (list(COLOURS), list(SHAPES), list(SIZES)):
        if answer in pool:
            return pool[int(rng.integers(len(pool)))]
    return answer


def annotate(answer: str, answer_type: str, rng: np.random.Generator, n: int = 10) -> list[str]:
    return [answer if rng.random() < ANNOTATOR_AGREEMENT else _confusion(answer, answer_type, rng) for _ in range(n)]
