"""Diagnosis: where a VCR cell's accuracy comes from, by how many objects the image has and by the
kind of question.

A model that cannot tell which of several objects a tag names (a tag reads as a neutral name; a
Pixel-BERT tag, or a ViLBERT one without `tag_coattention_mask`, as its released code, points at no
region) answers one-object images as well as one that can, and falls behind only where several
objects are in view. This prints, per setting, the test accuracy (mean over its seeds, and each seed) on
images with 1, 2 and 3 or more objects, and per question kind where the annotations carry one
(the mini world's `question_type`), with each group's share of the questions.

On the synthetic world (its data folder holds the spec it was made from) each group also gets the
no-link ceiling: the best expected accuracy of a reader that sees every object's look exactly and
knows the lore, but not which object a tag names (synthetic/vcr.py's `no_link_accuracies`; the
test split is drawn again from its spec and checked against the files).

    python bench/vcr_breakdown.py --results results/mini --settings full vilbert vilbert_no_pretrain \
        [--task vcr_q2a]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from vlbert.data.synthetic import SPEC_STAMP, vcr_split
from vlbert.data.synthetic.vcr import answer_value, no_link_accuracies, rationale_looks

PROBS = {"vcr_q2a": ("answer_probs", "answer_label"), "vcr_qa2r": ("rationale_probs", "rationale_label")}


def read_annotations(path: Path) -> dict[str, dict]:
    with path.open() as f:
        return {record["annot_id"]: record for record in map(json.loads, filter(str.strip, f))}


def groups_of(record: dict) -> list[str]:
    objects = len(record["objects"])
    groups = [f"{objects if objects < 3 else '3+'} object{'s' if objects > 1 else ''}"]
    if "question_type" in record:
        groups.append(f"kind {record['question_type']}")
    return groups


def seed_accuracy(predictions: list[dict], annotations: dict[str, dict], task: str) -> dict[str, float]:
    """Accuracy in percent per group (and `all`) of one run's test predictions."""
    probs_key, label_key = PROBS[task]
    right = defaultdict(list)
    for prediction in predictions:
        record = annotations[prediction["annot_id"]]
        probs = prediction[probs_key]
        correct = max(range(len(probs)), key=probs.__getitem__) == record[label_key]
        for group in ["all", *groups_of(record)]:
            right[group].append(correct)
    return {group: 100 * sum(hits) / len(hits) for group, hits in right.items()}


def no_link_ceilings(data_root: Path, annotations: dict[str, dict], task: str) -> dict[str, float] | None:
    """Per test question, the no-link ceiling (a fraction) on `task`; None off the synthetic world."""
    stamp = data_root / "vcr" / SPEC_STAMP
    if not stamp.is_file():
        return None
    spec = {**json.loads(stamp.read_text()), "progress": False}
    items, scenes, tags, choices = vcr_split(spec, "test", spec["vcr"]["test"])
    ceilings = {}
    for index, (item, scene, item_tags, drawn) in enumerate(zip(items, scenes, tags, choices)):
        record = annotations.get(f"test-{index}")
        if record is None or any(record[key] != value for key, value in drawn.items()):
            raise SystemExit(f"{data_root / 'vcr' / 'test.jsonl'}: question test-{index} is not what {stamp} draws")
        q2a, qa2r = no_link_accuracies(
            item.kind,
            [(o.size, o.colour, o.shape) for o in scene.objects],
            len(item_tags),
            [answer_value(item.kind, answer, item_tags) for answer in record["answer_choices"]],
            record["answer_label"],
            [rationale_looks(rationale, len(item_tags)) for rationale in record["rationale_choices"]],
            record["rationale_label"],
        )
        ceilings[record["annot_id"]] = q2a if task == "vcr_q2a" else qa2r
    return ceilings


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("results/mini"))
    parser.add_argument("--data", type=Path, help="the data root (default: RESULTS/data)")
    parser.add_argument("--task", choices=sorted(PROBS), default="vcr_q2a")
    parser.add_argument("--settings", nargs="+", required=True)
    args = parser.parse_args(argv)
    data_root = args.data or args.results / "data"
    annotations = read_annotations(data_root / "vcr" / "test.jsonl")
    ceilings = no_link_ceilings(data_root, annotations, args.task)
    counts = defaultdict(int)
    for record in annotations.values():
        for group in ["all", *groups_of(record)]:
            counts[group] += 1
    groups = sorted(counts, key=lambda g: (g != "all", not g[0].isdigit(), g))
    rows = {}
    for setting in args.settings:
        runs = sorted((args.results / "finetune" / setting / args.task).glob("seed*/predictions_test.json"))
        if not runs:
            raise SystemExit(f"{args.results / 'finetune' / setting / args.task}: no seed*/predictions_test.json")
        rows[setting] = [seed_accuracy(json.loads(run.read_text()), annotations, args.task) for run in runs]
    width = max(len(s) for s in [*args.settings, "no-link ceiling"])
    print(f"{args.task} test accuracy by group (mean over seeds; each seed in brackets)")
    for group in groups:
        share = 100 * counts[group] / counts["all"]
        print(f"\n{group} ({counts[group]} questions, {share:.0f}%)")
        if ceilings is not None:
            members = [a for a, record in annotations.items() if group == "all" or group in groups_of(record)]
            ceiling = 100 * sum(ceilings[a] for a in members) / len(members)
            print(f"  {'no-link ceiling':<{width}}  {ceiling:5.1f}")
        for setting, seeds in rows.items():
            values = [seed[group] for seed in seeds if group in seed]
            each = " / ".join(f"{v:.1f}" for v in values)
            print(f"  {setting:<{width}}  {sum(values) / len(values):5.1f}  ({each})")


if __name__ == "__main__":
    main()
