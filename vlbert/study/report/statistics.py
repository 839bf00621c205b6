"""Table 4 and the paper's findings, computed from the chosen fine-tuning runs: pandas only, no I/O."""

from __future__ import annotations

import math

import pandas as pd

from ...evaluation.floors import accuracy_se
from ...registry import SETTINGS, TABLE4_SETTINGS, TABLE4_TASKS, TASKS

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


def findings(table: pd.DataFrame, paper: dict) -> list[dict]:
    """Each of the paper's findings: our deltas per task, whether they agree in sign and whether
    they exceed the seed spread (the larger of the two settings' standard deviations; none with a
    single seed). The verdict: "does not agree" when a measured task says otherwise, "no data"
    when a task or setting has no runs (a missing figure is not a disagreement), else "agrees"."""
    return compare(table, paper["ablation_table4"]["findings"], FINDING_TEXT)


def compare(table: pd.DataFrame, specs: list[dict], texts: dict[str, str]) -> list[dict]:
    """`findings` for any list of stated findings ({id, compare, tasks, sign}); a finding whose
    source states no sign (sign null) gets its deltas and the verdict "no sign stated"."""
    out = []
    for finding in specs:
        x, y = finding["compare"]
        sign = {"+": 1, "-": -1}.get(finding["sign"], 0)
        per_task = []
        for task in finding["tasks"]:
            delta = table.loc[x, f"{task}_mean"] - table.loc[y, f"{task}_mean"]
            spreads = (table.loc[x, f"{task}_std"], table.loc[y, f"{task}_std"])
            spread = math.nan if any(map(math.isnan, spreads)) else max(spreads)  # one seed on a side: unknown
            missing = [s for s in (x, y) if table.loc[s, f"{task}_n"] == 0]
            # The sampling error of the difference: the two settings are scored on the same items,
            # taken as independent (conservative for correlated runs).
            ses = [table.loc[s, f"{task}_se"] if f"{task}_se" in table else math.nan for s in (x, y)]
            se_diff = math.hypot(*ses) if not any(map(math.isnan, ses)) else math.nan
            noise = max((v for v in (spread, 2 * se_diff) if not math.isnan(v)), default=math.nan)
            per_task.append(
                {
                    "task": task,
                    "delta": delta,
                    "spread": spread,
                    "se_diff": se_diff,
                    "noise": noise,
                    "missing": missing,
                    "agrees": None if missing or not sign else bool(delta * sign > 0),
                    "beyond_spread": None if missing or math.isnan(spread) else bool(abs(delta) > spread),
                    # Beyond the larger of the seed spread and two standard errors of the difference.
                    "beyond_noise": None if missing or math.isnan(noise) else bool(abs(delta) > noise),
                }
            )
        measured = [t for t in per_task if not t["missing"]]
        largest = finding.get("largest_on")
        largest_ok = None
        if largest and measured and len(measured) == len(per_task):
            best = max(measured, key=lambda t: t["delta"])
            largest_ok = best["task"].startswith(largest)
        if any(t["agrees"] is False for t in measured) or largest_ok is False:
            verdict = "does not agree"
        elif len(measured) < len(per_task):
            verdict = "no data"
        elif not sign:
            verdict = "no sign stated"
        else:
            verdict = "agrees"
        out.append(
            {
                "id": finding["id"],
                "text": texts.get(finding["id"], finding["id"]),
                "compare": [x, y],
                "sign": finding["sign"],
                "tasks": per_task,
                "verdict": verdict,
                "agrees": {"agrees": True, "does not agree": False}.get(verdict),
                "beyond_spread": bool(measured) and all(t["beyond_spread"] is True for t in measured),
                "beyond_noise": bool(measured) and all(t["beyond_noise"] is True for t in measured),
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


def fraction_table(finetunes: pd.DataFrame, settings: tuple[str, str] = ("full", "no_pretrain")) -> pd.DataFrame:
    """Pre-training's effect against fine-tuning data: per task and training fraction (the whole
    set included), each of `settings`' mean, std and seeds on the reported split, their gap (first
    minus second), and the gap's noise (the larger of the seed spread and two SEs of the difference)."""
    records = []
    fractions = sorted(set(finetunes["train_fraction"]))
    for task in TABLE4_TASKS:
        split = TASKS[task].table4_split
        for fraction in fractions:
            row = {"task": task, "fraction": fraction}
            for setting in settings:
                runs = finetunes[
                    (finetunes["setting"] == setting)
                    & (finetunes["task"] == task)
                    & (finetunes["train_fraction"] == fraction)
                ]
                values = runs[f"{split}_accuracy"].dropna()
                items = runs[f"{split}_n"].dropna() if f"{split}_n" in runs else pd.Series(dtype=float)
                row[f"{setting}_mean"] = values.mean() if len(values) else math.nan
                row[f"{setting}_std"] = values.std(ddof=1) if len(values) > 1 else math.nan
                row[f"{setting}_n"] = len(values)
                row[f"{setting}_se"] = accuracy_se(row[f"{setting}_mean"], items.mean() if len(items) else math.nan)
            first, second = settings
            row["gap"] = row[f"{first}_mean"] - row[f"{second}_mean"]
            spread = max(row[f"{first}_std"], row[f"{second}_std"])
            se_diff = math.hypot(row[f"{first}_se"], row[f"{second}_se"])
            row["noise"] = max((v for v in (spread, 2 * se_diff) if not math.isnan(v)), default=math.nan)
            row["beyond_noise"] = (
                None if math.isnan(row["gap"]) or math.isnan(row["noise"]) else bool(abs(row["gap"]) > row["noise"])
            )
            records.append(row)
    return pd.DataFrame(records)
