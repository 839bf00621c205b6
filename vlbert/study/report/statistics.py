"""Table 4 and the paper's findings, computed from the chosen fine-tuning runs: pandas and numpy only, no I/O."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pandas as pd

from ...evaluation.floors import accuracy_se
from ...registry import SETTINGS, TABLE4_SETTINGS, TABLE4_TASKS, TASKS
from ..intervals import HELPS, HURTS, NOT_SHOWN, Delta, compare_scores, compare_summaries

# Per (setting, task, training fraction): the seeds of its runs and their scores per test item
# ([seeds, items], the task's items in one order for every run), as read.item_scores reads them.
ItemScores = dict[tuple[str, str, float], tuple[tuple[int, ...], np.ndarray]]

FINDING_TEXT = {
    "pretrain_helps": "pre-training helps all tasks (full vs no_pretrain)",
    "mlm_helps": "MLM with visual clues helps (a vs no_pretrain)",
    "mrc_helps_ref": "masked RoI classification helps RefCOCO+ (b vs a)",
    "sirp_hurts": "sentence-image relation prediction hurts (c vs b)",
    "text_helps": "the text-only corpus helps, VCR most (d vs b)",
    "tune_frcnn_helps": "tuning Fast R-CNN helps (full vs d)",
}

# A cell without runs, as the tables show it and the warnings name it; one whose runs were all
# killed before they had results.
MISSING = "—"
KILLED = "killed"


# The controls beside each cell, means over the seeds' runs of the reported split's figures.
CONTROL_COLUMNS = {
    "shuffled": "shuffled_images_accuracy",  # the same checkpoints with the images shuffled
    "pairs": "pair_accuracy",  # VQA: both members of a complementary pair right
    "rare": "accuracy_rare",  # RefCOCO+: expressions with a word rare in fine-tuning
    "seen": "accuracy_seen",
}


def table4(finetunes: pd.DataFrame, killed=()) -> pd.DataFrame:
    """Rows: every setting (Table 4's and the other systems'); per task: mean, std and n over
    seeds of the Table 4 metric, the standard error of one run's figure on the reported split
    (its items, not its seeds: every seed is scored on the same items), the controls' means, and
    whether a run of it was killed before it had results (`killed`: those (setting, task) pairs)."""
    killed = set(killed)
    records = []
    for setting in SETTINGS:
        row = {"setting": setting}
        for task in TABLE4_TASKS:
            split = TASKS[task].table4_split
            runs = finetunes[(finetunes["setting"] == setting) & (finetunes["task"] == task)]
            values = runs[f"{split}_accuracy"].dropna()
            row[f"{task}_mean"] = values.mean() if len(values) else math.nan
            row[f"{task}_std"] = values.std(ddof=1) if len(values) > 1 else math.nan  # one seed: no spread
            row[f"{task}_n"] = len(values)
            items = runs[f"{split}_n"].dropna() if f"{split}_n" in runs else pd.Series(dtype=float)
            row[f"{task}_se"] = accuracy_se(row[f"{task}_mean"], items.mean() if len(items) else math.nan)
            for name, column in CONTROL_COLUMNS.items():
                control = runs[f"{split}_{column}"].dropna() if f"{split}_{column}" in runs else []
                row[f"{task}_{name}"] = control.mean() if len(control) else math.nan
            row[f"{task}_killed"] = (setting, task) in killed
        records.append(row)
    return pd.DataFrame(records).set_index("setting")


def table_warnings(table: pd.DataFrame) -> list[str]:
    """What Table 4 lacks: settings without runs, cells without runs, cells on a single seed."""
    counts = table.loc[list(TABLE4_SETTINGS), [f"{t}_n" for t in TABLE4_TASKS]]
    empty = [s for s in TABLE4_SETTINGS if not counts.loc[s].any()]
    warnings = [f"setting {s} has no fine-tuning runs: its Table 4 row is empty ({MISSING})" for s in empty]
    missing = [
        f"{s} / {t}" for s in TABLE4_SETTINGS if s not in empty for t in TABLE4_TASKS if table.loc[s, f"{t}_n"] == 0
    ]
    killed = [p for p in missing if table.loc[p.split(" / ")[0], f"{p.split(' / ')[1]}_killed"]]
    missing = [p for p in missing if p not in killed]
    if missing:
        warnings.append(f"no run with results for {', '.join(missing)}: {MISSING} in Table 4")
    if killed:
        warnings.append(f"runs killed before they had results for {', '.join(killed)}: {KILLED} in Table 4")
    single = [f"{s} / {t}" for s in TABLE4_SETTINGS for t in TABLE4_TASKS if table.loc[s, f"{t}_n"] == 1]
    if single and len(single) == counts.astype(bool).to_numpy().sum():
        warnings.append("every cell of Table 4 rests on a single seed: no seed spread (n=1)")
    elif single:
        warnings.append(f"a single seed, so no seed spread (n=1), for {', '.join(single)}")
    return warnings


def findings(table: pd.DataFrame, paper: dict, items: ItemScores | None = None) -> list[dict]:
    """Each of the paper's findings: our deltas per task, each with its 95% interval, P(A>B) and
    verdict (`compare`)."""
    return compare(table, paper["ablation_table4"]["findings"], FINDING_TEXT, items)


def delta(table: pd.DataFrame, items: ItemScores | None, first: str, second: str, task: str, fraction=1.0) -> Delta:
    """`first` minus `second` on `task`'s reported split: from the runs' per-item scores where the
    report has them (intervals.compare_scores: seeds, then items, paired), else from the table's
    summaries (intervals.compare_summaries: seed spread and the items' standard errors)."""
    found = [(items or {}).get((s, task, fraction)) for s in (first, second)]
    if all(found):
        (seeds_a, scores_a), (seeds_b, scores_b) = found
        # A stable bootstrap seed per comparison: the report reads the same twice.
        key = zlib.crc32(f"{first}|{second}|{task}|{fraction}".encode())
        return compare_scores(scores_a, scores_b, paired_seeds=seeds_a == seeds_b, seed=key)
    row = lambda s, k: table.loc[s, f"{task}_{k}"]
    return compare_summaries(
        *(row(first, k) for k in ("mean", "std", "n", "se")), *(row(second, k) for k in ("mean", "std", "n", "se"))
    )


def compare(
    table: pd.DataFrame, specs: list[dict], texts: dict[str, str], items: ItemScores | None = None
) -> list[dict]:
    """`findings` for any list of stated findings ({id, compare, tasks, sign}). Per task the delta
    (`delta`) and its verdict: helps, hurts or not shown. A finding agrees when every task's verdict
    has the stated sign, does not agree when one has the other sign (or the gain is not largest where
    it says), is "not shown" otherwise; "no data" when a task or setting has no runs (a missing figure
    is not a disagreement); "no sign stated" where the source states none (sign null)."""
    out = []
    for finding in specs:
        x, y = finding["compare"]
        sign = {"+": 1, "-": -1}.get(finding["sign"], 0)
        expected = {1: HELPS, -1: HURTS}.get(sign)
        opposite = {1: HURTS, -1: HELPS}.get(sign)
        per_task = []
        for task in finding["tasks"]:
            missing = [s for s in (x, y) if table.loc[s, f"{task}_n"] == 0]
            if missing:
                unknown = dict.fromkeys(("delta", "low", "high", "half_width", "p_first_beats", "verdict"))
                per_task.append({"task": task, **unknown, "missing": missing, "shown": None, "agrees": None})
                continue
            result = delta(table, items, x, y, task).as_dict()
            per_task.append(
                {
                    "task": task,
                    **result,
                    "missing": [],
                    "agrees": None if not sign else bool(result["delta"] * sign > 0),  # the estimate's sign
                    "shown": None if not sign else result["verdict"] == expected,
                }
            )
        measured = [t for t in per_task if not t["missing"]]
        largest = finding.get("largest_on")
        largest_ok = None
        if largest and measured and len(measured) == len(per_task):
            best = max(measured, key=lambda t: t["delta"])
            largest_ok = best["task"].startswith(largest)
        if sign and (any(t["verdict"] == opposite for t in measured) or largest_ok is False):
            verdict = "does not agree"
        elif len(measured) < len(per_task):
            verdict = "no data"
        elif not sign:
            verdict = "no sign stated"
        elif all(t["shown"] for t in measured):
            verdict = "agrees"
        else:
            verdict = NOT_SHOWN
        out.append(
            {
                "id": finding["id"],
                "text": texts.get(finding["id"], finding["id"]),
                "compare": [x, y],
                "sign": finding["sign"],
                "tasks": per_task,
                "verdict": verdict,
                "agrees": {"agrees": True, "does not agree": False}.get(verdict),
                "largest_on": largest,
                "largest_ok": largest_ok,
            }
        )
    return out


def floor_of(floors: dict, task: str) -> float:
    """A task's blind floor on its reported split: the best score of a model that does not look
    (VCR: text-only learner or option prior; VQA: the question-only prior; RefCOCO+: the rule
    that reads no colour word); nan where floors.json has none."""
    figures = floors.get(task, {}).get("reported", {})
    keys = {"vqa": ["question_only"], "refcoco_det": ["no_colour_rule"]}.get(task, ["text_only", "option_only"])
    values = [figures[k] for k in keys if k in figures]
    return max(values) if values else math.nan


def controls(table: pd.DataFrame, floors: dict, settings=TABLE4_SETTINGS) -> pd.DataFrame:
    """Per setting (Table 4's unless given) and task: the cell, its standard error, the same
    checkpoints with the images shuffled, the image's share (the difference), the blind floor, and
    whether the cell clears each by more than two standard errors of the difference."""
    records = []
    for setting in settings:
        for task in TABLE4_TASKS:
            mean, se = table.loc[setting, f"{task}_mean"], table.loc[setting, f"{task}_se"]
            shuffled, floor = table.loc[setting, f"{task}_shuffled"], floor_of(floors, task)
            margin = 2 * math.sqrt(2) * se  # two SEs of a difference of two figures on n items each
            records.append(
                {
                    "setting": setting,
                    "task": task,
                    "mean": mean,
                    "se": se,
                    "shuffled": shuffled,
                    "image_share": mean - shuffled,
                    "floor": floor,
                    "clears_shuffled": None if math.isnan(mean - shuffled) else bool(mean - shuffled > margin),
                    "clears_floor": None if math.isnan(mean - floor) else bool(mean - floor > margin),
                    **{name: table.loc[setting, f"{task}_{name}"] for name in ("pairs", "rare", "seen")},
                }
            )
    return pd.DataFrame(records)


# A gap's interval as data_fractions.csv holds it: its bounds, P(A>B), and the parts a second run's
# chance of repeating its verdict is predicted from (bench/reproducibility.py).
GAP_INTERVAL = ("low", "high", "half_width", "p_first_beats", "seed_se", "item_se", "df")


def fraction_table(
    finetunes: pd.DataFrame, settings: tuple[str, str] = ("full", "no_pretrain"), items: ItemScores | None = None
) -> pd.DataFrame:
    """Pre-training's effect against fine-tuning data: per task and training fraction (the whole
    set included), each of `settings`' mean, std and seeds on the reported split, and their gap
    (first minus second) with its 95% interval, P(A>B) and verdict (`delta`)."""
    records = []
    fractions = sorted(set(finetunes["train_fraction"]))
    for task in TABLE4_TASKS:
        split = TASKS[task].table4_split
        for fraction in fractions:
            row = {"task": task, "fraction": fraction}
            summary = {}
            for setting in settings:
                runs = finetunes[
                    (finetunes["setting"] == setting)
                    & (finetunes["task"] == task)
                    & (finetunes["train_fraction"] == fraction)
                ]
                values = runs[f"{split}_accuracy"].dropna()
                n_items = runs[f"{split}_n"].dropna() if f"{split}_n" in runs else pd.Series(dtype=float)
                row[f"{setting}_mean"] = values.mean() if len(values) else math.nan
                row[f"{setting}_std"] = values.std(ddof=1) if len(values) > 1 else math.nan
                row[f"{setting}_n"] = len(values)
                row[f"{setting}_se"] = accuracy_se(
                    row[f"{setting}_mean"], n_items.mean() if len(n_items) else math.nan
                )
                summary[setting] = {f"{task}_{k}": row[f"{setting}_{k}"] for k in ("mean", "std", "n", "se")}
            first, second = settings
            row["gap"] = row[f"{first}_mean"] - row[f"{second}_mean"]
            if row[f"{first}_n"] and row[f"{second}_n"]:
                result = delta(pd.DataFrame(summary).T, items, first, second, task, fraction)
                row |= {k: result.as_dict()[k] for k in (*GAP_INTERVAL, "verdict")}
            else:
                row |= dict.fromkeys(GAP_INTERVAL, math.nan)
                row["verdict"] = None
            records.append(row)
    return pd.DataFrame(records)
