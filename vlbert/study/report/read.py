"""Reading the study's runs back: every run from MLflow, the run the report uses per place in the
study, VCR Q->AR from the prediction artifacts, metric histories; and the paper's numbers.

MLflow is read through vlbert.tracking, which knows the run format (tags, metric names)."""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path

import pandas as pd
import yaml
from mlflow.exceptions import MlflowException

from ...registry import DERIVED_TASKS, SETTINGS, TABLE4_TASKS, TASKS
from ...tracking import (
    BEST_EPOCH_METRIC,
    ENDED_TAG,
    EPOCH_METRIC,
    GIT_COMMIT_TAG,
    LR_TAG,
    PARAMETERS_METRIC,
    PARENT_RUN_TAG,
    SEED_TAG,
    SETTING_TAG,
    SHUFFLED_IMAGES_SPLIT,
    STAGE_TAG,
    TASK_TAG,
    TRAIN_FRACTION_TAG,
    TRAINABLE_PARAMETERS_METRIC,
    VAL_PREFIX,
    final_metric,
    metric_history,
    predictions_artifact,
    read_artifact_text,
    read_runs,
    val_metric,
)

# What pre-training's validation logs (vlbert.engine.pretrain): masked words right with each caption's
# own image and with another's, on the same masks, and their difference.
PRETRAINING_METRICS = ("mlm_accuracy", "mlm_accuracy_other_image", "visual_clue_gain")
# What the grounding probe logs per epoch (vlbert.engine.grounding, not imported: it needs torch):
# per word kind of the captions' folder ground_<kind>_own/_other/_gain/_chance/_n, and
# attention_img_share(_layer<i>).
GROUNDING_PREFIXES = (val_metric("ground_"), val_metric("attention_img_"))
GROUNDING_KIND = re.compile(r"^ground_(\w+)_own$")


def grounding_kinds(runs: pd.DataFrame) -> tuple[str, ...]:
    """The word kinds the runs' grounding probes measured (the synthetic world's colour, shape and
    size), in name order; none where no run has the probe's figures."""
    kinds = {match.group(1) for column in runs.columns if (match := GROUNDING_KIND.match(str(column)))}
    return tuple(sorted(kinds))


# Figures of the reported split beside its accuracy, where a task scores them (RefCOCO+'s test
# split is testA and testB).
SUBSET_METRICS = ("pair_accuracy", "accuracy_rare", "accuracy_seen", "accuracy_testA", "accuracy_testB")


def paper_numbers() -> dict:
    # By package name, not by this file's place: vlbert/reference/ ships as package data.
    return yaml.safe_load(resources.files("vlbert.reference").joinpath("paper_numbers.yaml").read_text())


def collect_runs(uri: str, experiment: str) -> pd.DataFrame:
    """Every run of the study, a row each: ids, tags, status and final metrics."""
    rows = []
    for run in read_runs(uri, experiment):
        tags, metrics = run.tags, run.metrics
        rows.append(
            {
                "run_id": run.run_id,
                "run_name": run.run_name,
                "status": run.status,
                "stage": tags.get(STAGE_TAG),
                "setting": tags.get(SETTING_TAG),
                "task": tags.get(TASK_TAG),
                "seed": int(tags[SEED_TAG]) if tags.get(SEED_TAG) not in (None, "") else None,
                "lr": float(tags[LR_TAG]) if tags.get(LR_TAG) not in (None, "") else None,
                "train_fraction": float(tags.get(TRAIN_FRACTION_TAG) or 1.0),
                "parent_run_id": tags.get(PARENT_RUN_TAG),
                "git_commit": tags.get(GIT_COMMIT_TAG),
                "ended": tags.get(ENDED_TAG),  # why a run was ended from outside (killed, not continued)
                "val_accuracy": metrics.get(final_metric("val")),
                "test_accuracy": metrics.get(final_metric("test")),
                # The controls: the same checkpoint on shuffled images, the items scored, and the
                # tasks' own subsets (VQA's complementary pairs, RefCOCO+'s rare and seen words).
                "test_shuffled_images_accuracy": metrics.get(final_metric(SHUFFLED_IMAGES_SPLIT)),
                "test_n": metrics.get(final_metric("test", "n")),
                **{f"test_{name}": metrics.get(final_metric("test", name)) for name in SUBSET_METRICS},
                "best_epoch": metrics.get(BEST_EPOCH_METRIC),
                "parameters": metrics.get(PARAMETERS_METRIC),
                "trainable_parameters": metrics.get(TRAINABLE_PARAMETERS_METRIC),
                "artifact_uri": run.artifact_uri,
                **{name: metrics.get(val_metric(name)) for name in PRETRAINING_METRICS},
                **{k[len(VAL_PREFIX) :]: v for k, v in metrics.items() if k.startswith(GROUNDING_PREFIXES)},
            }
        )
    return pd.DataFrame(rows)


# What a run of each stage must have logged for the report to use it.
RESULT_COLUMNS = {"finetune": ["val_accuracy", "test_accuracy"], "pretrain": list(PRETRAINING_METRICS)}


def _what(run) -> str:
    """A run's place in the study: setting / task / seed (pre-training: the setting)."""
    parts = [run["setting"], run["task"], f"seed {int(run['seed'])}" if pd.notna(run["seed"]) else None]
    if run.get("train_fraction", 1.0) < 1:
        parts.append(f"{run['train_fraction']:g} of the training set")
    return " / ".join(str(p) for p in parts if pd.notna(p))


def latest_results(runs: pd.DataFrame, stage: str) -> tuple[pd.DataFrame, list[str]]:
    """One run per (setting, task, seed): the newest one with results, finished or not, so that
    a re-run's figures never give way to an older run's; and, for the report to say, what that
    choice rests on: a run that did not finish, or a newer run that left no results."""
    staged = runs[runs["stage"] == stage]
    keys = ["setting", "task", "seed", "train_fraction"]
    chosen = staged[staged[RESULT_COLUMNS[stage]].notna().any(axis=1)].drop_duplicates(
        keys
    )  # search_runs: newest first
    notes = [
        f"{_what(run)}: run {run['run_id']} did not finish (status {run['status']}"
        + (f": {run['ended']}" if isinstance(run.get("ended"), str) else "")
        + "); its figures are used"
        for _, run in chosen.iterrows()
        if run["status"] != "FINISHED"
    ]
    used = {_what(run): run["run_id"] for _, run in chosen.iterrows()}
    for _, run in staged.drop_duplicates(keys).iterrows():
        older = used.get(_what(run))
        if older is not None and older != run["run_id"]:
            notes.append(
                f"{_what(run)}: its newest run {run['run_id']} (status {run['status']}) has no results; "
                f"the figures come from the older run {older}"
            )
    return chosen, notes


def killed_without_results(runs: pd.DataFrame, stage: str) -> pd.DataFrame:
    """The newest run of each (setting, task, seed) that was killed before it had results, where no
    run of that place has any: a figure that is missing because its run was killed, not because it
    never ran."""
    keys = ["setting", "task", "seed", "train_fraction"]
    staged = runs[runs["stage"] == stage]
    done = {_what(run) for _, run in staged[staged[RESULT_COLUMNS[stage]].notna().any(axis=1)].iterrows()}
    newest = staged.drop_duplicates(keys)  # search_runs: newest first
    unfinished = pd.Series([_what(run) not in done for _, run in newest.iterrows()], index=newest.index, dtype=bool)
    return newest[(newest["status"] == "KILLED") & unfinished]


def killed_notes(killed: pd.DataFrame) -> list[str]:
    return [
        f"{_what(run)}: run {run['run_id']} was killed before it had results"
        + (f" ({run['ended']})" if isinstance(run.get("ended"), str) else "")
        for _, run in killed.iterrows()
    ]


def latest_pretraining(runs: pd.DataFrame) -> pd.DataFrame:
    """The latest pre-training run with results of each setting, in the study's order: the
    setting's own, not those fine-tuning seeds have of their own (pretrain.per_seed: tagged with
    their seed)."""
    done = latest_results(runs, "pretrain")[0]
    done = done[done["seed"].isna()].set_index("setting")
    return done.reindex([s for s in SETTINGS if s in done.index]).reset_index()


def pretraining_replicates(runs: pd.DataFrame) -> pd.DataFrame:
    """Every pre-training of each setting that has more than one (pretrain.per_seed): the
    setting's own and those of the fine-tuning seeds, the latest of each with results."""
    done = latest_results(runs, "pretrain")[0]
    counts = done.groupby("setting")["run_id"].transform("count")
    return done[counts > 1]


def vcr_labels(jsonl_path) -> dict:
    from ...data.vcr import read_vcr

    return {e.annot_id: (e.answer_label, e.rationale_label) for e in read_vcr(jsonl_path)}


def vcr_question_kinds(jsonl_path) -> dict[str, str]:
    """annot_id -> `question_type` when every question of the VCR file has one (the synthetic world
    writes its kind of question there); {} otherwise, as for the real VCR's files. Read after
    `vcr_labels`, which has checked the file line by line."""
    kinds = {}
    for line in Path(jsonl_path).read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            if "question_type" not in record:
                return {}
            kinds[record["annot_id"]] = str(record["question_type"])
    return kinds


def vcr_predictions(uri: str, finetunes: pd.DataFrame, split: str = "val") -> dict[str, dict[str, dict]]:
    """run_id -> {annot_id: prediction} of every VCR Q->A and QA->R run, each artifact read once."""
    runs = finetunes[finetunes["task"].isin(DERIVED_TASKS["vcr_q2ar"].parts)]
    predictions = {}
    for run_id in runs["run_id"]:
        text = read_artifact_text(uri, run_id, predictions_artifact(split))
        predictions[run_id] = {p["annot_id"]: p for p in json.loads(text)}
    return predictions


def derive_vcr_kinds(finetunes: pd.DataFrame, predictions: dict, labels: dict, kinds: dict) -> pd.DataFrame:
    """Each VCR Q->A and QA->R run's accuracy per kind of question (on `vcr_predictions`' rows):
    one row per (setting, seed, task, kind), with the kind's number of questions `n`."""
    from ...evaluation.vcr_eval import vcr_choices

    rows = []
    by_kind = {kind: [a for a in labels if kinds[a] == kind] for kind in sorted(set(kinds.values()))}
    for task, key, label in (("vcr_q2a", "answer", 0), ("vcr_qa2r", "rationale", 1)):
        for run in finetunes[finetunes["task"] == task].itertuples():
            chosen = vcr_choices(labels, predictions[run.run_id])[key]
            rows += [
                {
                    "setting": run.setting,
                    "seed": run.seed,
                    "task": task,
                    "kind": kind,
                    "n": len(ids),
                    "accuracy": 100 * sum(chosen[a] == labels[a][label] for a in ids) / len(ids),
                }
                for kind, ids in by_kind.items()
            ]
    return pd.DataFrame(rows)


def derive_q2ar(finetunes: pd.DataFrame, predictions: dict, labels: dict) -> pd.DataFrame:
    """VCR Q->AR per (setting, seed) from its Q->A and QA->R runs' predictions (`vcr_predictions`)."""
    from ...evaluation.vcr_eval import vcr_accuracy

    rows = []
    q2ar = DERIVED_TASKS["vcr_q2ar"]
    q2a, qa2r = (finetunes[finetunes["task"] == part].set_index(["setting", "seed"]) for part in q2ar.parts)
    for key in q2a.index.intersection(qa2r.index):
        merged = {}
        for frame in (q2a, qa2r):
            for annot_id, p in predictions[frame.loc[key, "run_id"]].items():
                merged.setdefault(annot_id, {}).update(p)
        rows.append(
            {
                "setting": key[0],
                "seed": key[1],
                "task": q2ar.name,
                "stage": "derived",
                "accuracy": vcr_accuracy(labels, merged)["q2ar"],
            }
        )
    return pd.DataFrame(rows)


def item_scores(uri: str, finetunes: pd.DataFrame, data_root, features_dir) -> dict:
    """Per (setting, task, training fraction) of Table 4's tasks: the seeds of its runs and their
    score per item of the reported split ([seeds, items], the task's items in one order), from each
    run's predictions artifact under the task's official metric (Task.item_scores), for the paired
    statistics (statistics.ItemScores). A group with a run whose predictions cannot be read is
    left out, and its deltas come from the table's summaries."""
    import numpy as np

    from ... import tasks

    scores = {}
    for task_name, by_task in finetunes[finetunes["task"].isin(TABLE4_TASKS)].groupby("task"):
        try:
            adapter = tasks.build(task_name, None, data_root, features_dir)
        except (OSError, ValueError):  # its data is not where the preset says: summaries only
            continue
        split, order = TASKS[task_name].table4_split, None
        for (setting, fraction), runs in by_task.groupby(["setting", "train_fraction"]):
            rows, seeds = [], []
            for run in runs.sort_values("seed").itertuples():
                try:
                    predictions = json.loads(read_artifact_text(uri, run.run_id, predictions_artifact(split)))
                except (OSError, ValueError, MlflowException):
                    rows = None
                    break
                item = adapter.item_scores(predictions, split)
                order = order or sorted(item)
                rows.append([item[i] for i in order])
                seeds.append(int(run.seed))
            if rows:
                scores[(setting, task_name, float(fraction))] = (tuple(seeds), np.array(rows))
    return scores


def history(uri: str, run_id: str, metric: str) -> list[tuple[int, float]]:
    """Every (step, value) a run logged of `metric`, in step order."""
    return sorted(metric_history(uri, run_id, metric))


def per_epoch(uri: str, run_id: str, metric: str) -> tuple[list, list]:
    """A validation metric's history against the epoch: the loop logs `epoch` at the same step."""
    epochs = dict(metric_history(uri, run_id, EPOCH_METRIC))
    points = sorted((epochs[step], value) for step, value in metric_history(uri, run_id, metric) if step in epochs)
    return [e for e, _ in points], [v for _, v in points]
