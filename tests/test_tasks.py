"""A new fine-tuning task is one registry entry and one task adapter: both are defined in this file,
and `vlbert finetune` trains it, scores it and writes its predictions like any other task."""

import importlib
import json
from collections import Counter

import torch
from conftest import study_args

from vlbert import registry
from vlbert.cli import main
from vlbert.modeling.processing_study import pad_batch
from vlbert.tasks import build
from vlbert.tasks.base import Task
from vlbert.tasks.regions import open_store, regions_of

ANSWERS = ("no", "yes")


class YesNoTask(Task):
    """VQA's yes/no questions as a two-way choice, scored by the annotators' majority answer."""

    def examples(self, split):
        from vlbert.data.vqa import read_vqa

        (subtype,) = self.spec.splits[split]
        store = open_store(self.features_dir, self.spec.stores[split])
        root = self.data_root / "vqa"
        out = []
        for e in read_vqa(
            root / f"v2_OpenEnded_mscoco_{subtype}_questions.json", root / f"v2_mscoco_{subtype}_annotations.json"
        ):
            majority = Counter(e.answers).most_common(1)[0][0]
            if majority in ANSWERS:
                regions = regions_of(store, str(e.image_id), e.image_path)
                out.append({"id": e.question_id, "question": e.question, "label": majority, "regions": regions})
        return out

    def model_overrides(self):
        return {"num_answers": len(ANSWERS)}

    def collate(self, examples):
        regions = [e["regions"] for e in examples]
        batch = pad_batch(
            [self.processor.encode(e["question"], "[MASK]", num_rois=r.num_rois) for e, r in zip(examples, regions)],
            self.processor.pad_id,
        )
        batch["answer_positions"] = (batch["input_ids"] == self.processor.mask_id).int().argmax(1)
        labels = torch.tensor([ANSWERS.index(e["label"]) for e in examples])
        batch["answer_scores"] = torch.nn.functional.one_hot(labels, len(ANSWERS)).float()
        batch["visual"] = self._visual(regions)
        return batch

    def predictions(self, outputs, examples):
        best = outputs.logits.argmax(-1).tolist()
        return [{"question_id": e["id"], "answer": ANSWERS[b]} for e, b in zip(examples, best)]

    def score(self, predictions, split):
        labels = {e["id"]: e["label"] for e in self.examples(split)}
        right = sum(p["answer"] == labels[p["question_id"]] for p in predictions)
        return {"accuracy": round(100 * right / len(labels), 2)}


def yes_no_entry() -> registry.TaskSpec:
    vqa = registry.TASKS["vqa"]
    return registry.TaskSpec(
        "vqa_yes_no",
        adapter=f"{__name__}:YesNoTask",
        head="vqa",
        options_key="vqa",
        stores=vqa.stores,
        splits=vqa.splits,
        title="VQA yes/no",
    )


def test_every_registered_task_names_its_adapter_and_head():
    for spec in registry.TASKS.values():
        module, _, cls = spec.adapter.partition(":")
        assert issubclass(getattr(importlib.import_module(module), cls), Task)
        for family in registry.FAMILIES.values():
            assert registry.family_class(family, family.head_classes[spec.head]).config_class.model_type == family.name
        assert set(spec.stores) == set(spec.splits) == {"train", "val", "test"}
    assert all(registry.TASKS[t].table4_title for t in registry.TABLE4_TASKS)


def test_a_task_defined_here_fine_tunes_through_the_cli(smoke_study, monkeypatch, tmp_path):
    monkeypatch.setitem(registry.TASKS, "vqa_yes_no", yes_no_entry())
    out = tmp_path / "yes_no"
    args = ["--setting", "no_pretrain", "--task", "vqa_yes_no", "--lr", "0.001", "--seed", "0", "--out", str(out)]
    assert main(["finetune", *args, *study_args(smoke_study)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["task"] == "vqa_yes_no" and metrics["epochs"] == 1 and len(metrics["val_history"]) == 1
    # Its own examples, predictions and score: the yes/no questions of the VQA splits only.
    task = build("vqa_yes_no", None, smoke_study["data"], smoke_study["features"])
    test = task.examples("test")
    predictions = json.loads((out / "predictions_test.json").read_text())
    assert 0 < len(test) == len(predictions) and {p["answer"] for p in predictions} <= set(ANSWERS)
    assert metrics["test"] == task.score(predictions, "test")
    assert "vqa_yes_no" not in registry.TABLE4_TASKS  # no Table 4 column: the report leaves it out


def test_each_table4_task_s_item_scores_average_to_its_official_accuracy(smoke_study):
    """Task.item_scores (the report's paired statistics) per item, under the official metric: their
    mean is `score`'s accuracy, for predictions right on some items and wrong on others."""
    import pytest

    from vlbert.registry import TABLE4_TASKS, TASKS

    for name in TABLE4_TASKS:
        task = build(name, None, smoke_study["data"], smoke_study["features"])
        split = TASKS[name].table4_split
        if name == "vqa":
            ids = list(task.annotations(split))
            predictions = [{"question_id": q, "answer": ("yes", "no", "red")[k % 3]} for k, q in enumerate(ids)]
        elif name.startswith("vcr"):
            key = "answer" if name == "vcr_q2a" else "rationale"
            predictions = [{"annot_id": a, key: k % 4} for k, a in enumerate(task._labels(split))]
        else:
            expressions = [e for s in TASKS[name].splits[split] for e in task.dataset.expressions(s)]
            predictions = [
                {"sent_id": e.sent_id, "bbox": e.bbox if k % 2 else [0.0, 0.0, 1.0, 1.0]}
                for k, e in enumerate(expressions)
            ]
        items = task.item_scores(predictions, split)
        assert len(items) == len(predictions) and 0 < sum(items.values()) < 100 * len(items), name
        assert sum(items.values()) / len(items) == pytest.approx(task.score(predictions, split)["accuracy"], abs=0.006)
