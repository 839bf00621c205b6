"""Blind floors: what a model that does not look at the image scores on each task, from the files.

A Table 4 cell says something about reading the image only where it clears these:
- VQA: the question-only prior (each question string's most common training answer, else its
  question type's), official accuracy and complementary-pair accuracy;
- VCR: the option-only prior and a text-only learner (a linear model over the words of the
  question, the choice and their pairs, trained on the training split) for Q->A and QA->R;
- RefCOCO+: a geometry-and-category rule that reads no colour word (the annotated objects of the
  expression's shape and size word, the referent's chance among them), on the whole split and on
  the expressions with a rare word (fewer than RARE_MAX_TRAIN training expressions use it).
Each figure is on the split that Table 4 reports and on the selection split (val).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from itertools import pairwise
from pathlib import Path

import numpy as np
import torch

from ..registry import TASKS
from .refcoco_eval import IOU_THRESHOLD, box_iou
from .vqa_eval import pair_accuracy, question_accuracy

RARE_MAX_TRAIN = 4  # a word of at most this many training expressions is rare (nocaps' novel words)
_FEATURES = 2**18  # hashed feature space of the text-only learner


def _pct(values) -> float:
    values = list(values)
    return round(100 * sum(values) / len(values), 2)


def accuracy_se(accuracy: float, n: float) -> float:
    """The standard error, in points, of an accuracy (in percent) measured on n items; nan where
    either is unknown."""
    if accuracy is None or n is None or math.isnan(accuracy) or math.isnan(n) or not n:
        return math.nan
    p = accuracy / 100
    return 100 * math.sqrt(max(p * (1 - p), 0.0) / n)


def _role_splits(task_name: str) -> dict[str, tuple[str, ...]]:
    """The data set splits of the selection split (val) and of the split Table 4 reports."""
    spec = TASKS[task_name]
    return {"val": spec.splits["val"], "reported": spec.splits[spec.table4_split or "val"]}


# --- VQA --------------------------------------------------------------------------------------


def vqa_floors(root) -> dict:
    """The question-only prior of the VQA files under `root` (the vqa/ folder)."""
    from ..data.vqa import complementary_pairs_name, read_annotations, read_complementary_pairs, read_vqa

    root = Path(root)

    def split(subtype):
        questions = read_vqa(
            root / f"v2_OpenEnded_mscoco_{subtype}_questions.json", root / f"v2_mscoco_{subtype}_annotations.json"
        )
        pairs_path = root / complementary_pairs_name(subtype)
        pairs = read_complementary_pairs(pairs_path) if pairs_path.is_file() else []
        return questions, read_annotations(root / f"v2_mscoco_{subtype}_annotations.json"), pairs

    (train_subtype,) = TASKS["vqa"].splits["train"]
    train, _, _ = split(train_subtype)
    by_question, by_type = defaultdict(Counter), defaultdict(Counter)
    for q in train:
        by_question[q.question][q.multiple_choice_answer] += 1
        by_type[q.question_type][q.multiple_choice_answer] += 1
    overall = Counter(q.multiple_choice_answer for q in train)
    top = lambda counts: min(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0]

    def prior(q) -> str:
        return top(by_question.get(q.question) or by_type.get(q.question_type) or overall)

    out = {}
    for role, (subtype,) in _role_splits("vqa").items():
        questions, annotations, pairs = split(subtype)
        predictions = {q.question_id: prior(q) for q in questions}
        out[role] = {
            "question_only": _pct(question_accuracy(predictions[q.question_id], list(q.answers)) for q in questions),
            "n": len(questions),
        }
        if pairs:
            out[role]["question_only_pairs"] = pair_accuracy(annotations, predictions, pairs)
            out[role]["n_pairs"] = len(pairs)
    return out


# --- VCR --------------------------------------------------------------------------------------


def _hashed(words: list[str], context: list[str]) -> list[int]:
    """Hashed features of a choice: its words, its word pairs, and each (context word, choice word)."""
    from zlib import crc32

    keys = [f"w:{w}" for w in words] + [f"b:{a}_{b}" for a, b in pairwise(words)]
    keys += [f"x:{c}|{w}" for c in set(context) for w in set(words)]
    return [crc32(k.encode()) % _FEATURES for k in keys]


class TextOnlyChooser(torch.nn.Module):
    """A linear scorer of (context, choice) over hashed word features, softmax over the choices."""

    def __init__(self):
        super().__init__()
        self.weights = torch.nn.EmbeddingBag(_FEATURES, 1, mode="sum")
        torch.nn.init.zeros_(self.weights.weight)

    def forward(self, features: list[list[int]]) -> torch.Tensor:
        flat = torch.tensor([f for fs in features for f in fs])
        offsets = torch.tensor([0] + [len(fs) for fs in features[:-1]]).cumsum(0)
        return self.weights(flat, offsets).view(-1, 4)


def train_text_only(items: list[tuple[list, list[list], int]], epochs: int = 8, seed: int = 0) -> TextOnlyChooser:
    """items: (context words, four choices' words, label); Adam on the softmax's cross-entropy."""
    torch.manual_seed(seed)
    model = TextOnlyChooser()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    encoded = [([_hashed(c, context) for c in choices], label) for context, choices, label in items]
    for epoch in range(epochs):
        order = np.random.default_rng([seed, epoch]).permutation(len(encoded))
        for k in range(0, len(order), 32):
            chunk = [encoded[int(i)] for i in order[k : k + 32]]
            logits = model([f for features, _ in chunk for f in features])
            loss = torch.nn.functional.cross_entropy(logits, torch.tensor([label for _, label in chunk]))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return model


@torch.no_grad()
def text_only_accuracy(model: TextOnlyChooser, items) -> float:
    features = [_hashed(c, context) for context, choices, _ in items for c in choices]
    predicted = model(features).argmax(-1).tolist()
    return _pct(p == label for p, (_, _, label) in zip(predicted, items))


def _vcr_items(examples, column: str) -> list[tuple[list, list[list], int]]:
    from ..data.vcr import vcr_text

    out = []
    for e in examples:
        question = vcr_text(e.question, e.objects).split()
        if column == "q2a":
            context, choices, label = question, e.answer_choices, e.answer_label
        else:
            context = question + vcr_text(e.answer_choices[e.answer_label], e.objects).split()
            choices, label = e.rationale_choices, e.rationale_label
        out.append((context, [vcr_text(c, e.objects).split() for c in choices], label))
    return out


def _option_prior(train_items, items) -> float:
    """Each choice scored by how often its text was right in training (option-only)."""
    right, seen = Counter(), Counter()
    for _, choices, label in train_items:
        for k, c in enumerate(choices):
            seen[" ".join(c)] += 1
            right[" ".join(c)] += k == label
    rate = lambda c: (right[" ".join(c)] + 1) / (seen[" ".join(c)] + 4)
    return _pct(max(range(4), key=lambda k: (rate(choices[k]), -k)) == label for _, choices, label in items)


def vcr_floors(root) -> dict:
    """The option-only prior and the text-only learner on the VCR files under `root` (vcr/)."""
    from ..data.vcr import read_vcr

    root = Path(root)
    read = lambda splits: [e for s in splits for e in read_vcr(root / f"{s}.jsonl")]
    train = read(TASKS["vcr_q2a"].splits["train"])
    # A split without labels (the real test's are the leaderboard's) has no floor to compute.
    evaluated = {role: read(splits) for role, splits in _role_splits("vcr_q2a").items()}
    evaluated = {role: examples for role, examples in evaluated.items() if examples[0].answer_label is not None}
    out = {}
    for column in ("q2a", "qa2r"):
        train_items = _vcr_items(train, column)
        model = train_text_only(train_items)
        for role, examples in evaluated.items():
            items = _vcr_items(examples, column)
            out.setdefault(role, {"n": len(items)})
            out[role][f"{column}_text_only"] = text_only_accuracy(model, items)
            out[role][f"{column}_option_only"] = _option_prior(train_items, items)
        out.setdefault("train", {})[f"{column}_text_only"] = text_only_accuracy(model, train_items)
    return out


# --- RefCOCO+ ---------------------------------------------------------------------------------


def rare_words(train_expressions, max_train: int = RARE_MAX_TRAIN):
    """A test of rarity: a word is rare when at most `max_train` training expressions use it."""
    counts = Counter(w for e in train_expressions for w in set(e.sentence.split()))
    return lambda word: counts[word] <= max_train


def word_subsets(expressions, train_expressions, max_train: int = RARE_MAX_TRAIN) -> dict[str, set[int]]:
    """The sent_ids of the expressions with a rare word ("rare") and of the others ("seen")."""
    is_rare = rare_words(train_expressions, max_train)
    rare = {e.sent_id for e in expressions if any(is_rare(w) for w in e.sentence.split())}
    return {"rare": rare, "seen": {e.sent_id for e in expressions} - rare}


def refcoco_floors(root) -> dict:
    """A rule that reads no colour word on the RefCOCO+ files under `root` (refcoco+/): of the
    image's annotated objects, those of the expression's shape (its category) and size word (by
    area, the threshold that best splits the training referents), the referent's chance among them."""
    from ..data.refcoco import RefCOCO

    data = RefCOCO(root)
    categories = {c["id"]: c["name"] for c in data.coco.dataset["categories"]}
    objects = defaultdict(list)
    for ann in data.coco.anns.values():
        objects[ann["image_id"]].append(ann)
    area = lambda ann: ann["bbox"][2] * ann["bbox"][3]
    train = [e for s in TASKS["refcoco_det"].splits["train"] for e in data.expressions(s)]
    sized = sorted((area(data.coco.anns[e.ann_id]), "large" in e.sentence.split()) for e in train
                   if {"small", "large"} & set(e.sentence.split()))  # fmt: skip
    threshold = _best_threshold(sized)

    def chance(e) -> float:
        words = set(e.sentence.split())
        candidates = objects[e.image_id]
        shape = words & set(categories.values())
        if shape:
            candidates = [a for a in candidates if categories[a["category_id"]] in shape]
        if "small" in words or "large" in words:
            candidates = [a for a in candidates if (area(a) >= threshold) == ("large" in words)] or candidates
        hits = [box_iou(a["bbox"], e.bbox) >= IOU_THRESHOLD for a in candidates]
        return sum(hits) / len(hits) if hits else 0.0

    out = {}
    for role, splits in _role_splits("refcoco_det").items():
        expressions = [e for s in splits for e in data.expressions(s)]
        subsets = word_subsets(expressions, train)
        by_id = {e.sent_id: chance(e) for e in expressions}
        out[role] = {"no_colour_rule": _pct(by_id.values()), "n": len(expressions)}
        for name, ids in subsets.items():
            if ids:
                out[role][f"no_colour_rule_{name}"] = _pct(by_id[i] for i in ids)
                out[role][f"n_{name}"] = len(ids)
    return out


def _best_threshold(sized: list[tuple[float, bool]]) -> float:
    """The area that best separates small from large referents (sized: (area, is large), sorted)."""
    if not sized:
        return float("inf")
    best, best_errors = sized[0][0], len(sized)
    larges_below = 0
    smalls_above = sum(not large for _, large in sized)
    for value, large in sized:
        errors = larges_below + smalls_above
        if errors < best_errors:
            best, best_errors = value, errors
        larges_below += large
        smalls_above -= not large
    return best


def blind_floors(roots: dict) -> dict:
    """Every task's blind floors, keyed by task (Table 4's names) and role (reported, val).
    roots: each data set's folder (vqa, vcr, refcoco+)."""
    vqa = vqa_floors(roots["vqa"])
    vcr = vcr_floors(roots["vcr"])
    refcoco = refcoco_floors(roots["refcoco+"])
    pick = lambda floors, prefix: {
        role: {k.removeprefix(prefix): v for k, v in figures.items() if k.startswith(prefix) or k == "n"}
        for role, figures in floors.items()
        if role != "train"
    }
    return {
        "vcr_q2a": pick(vcr, "q2a_"),
        "vcr_qa2r": pick(vcr, "qa2r_"),
        "vqa": vqa,
        "refcoco_det": refcoco,
    }
