"""Table 4 and the paper's findings, computed from the chosen fine-tuning runs: pandas only, no I/O."""

from __future__ import annotations

import math

import pandas as pd

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


def table4(finetunes: pd.DataFrame, killed=()) -> pd.DataFrame:
    """Rows: every setting (Table 4's and the other systems'); per task: mean, std and n over
    seeds of the Table 4 metric, and whether a run of it was killed before it had results
    (`killed`: those (setting, task) pairs)."""
    killed = set(killed)
    records = []
    for setting in SETTINGS:
        row = {"setting": setting}
        for task in TABLE4_TASKS:
            values = finetunes[(finetunes["setting"] == setting) & (finetunes["task"] == task)][
                f"{TASKS[task].table4_split}_accuracy"
            ].dropna()
            row[f"{task}_mean"] = values.mean() if len(values) else math.nan
            row[f"{task}_std"] = values.std(ddof=1) if len(values) > 1 else math.nan  # one seed: no spread
            row[f"{task}_n"] = len(values)
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
            per_task.append(
                {
                    "task": task,
                    "delta": delta,
                    "spread": spread,
                    "missing": missing,
                    "agrees": None if missing or not sign else bool(delta * sign > 0),
                    "beyond_spread": None if missing or math.isnan(spread) else bool(abs(delta) > spread),
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
                "largest_on": largest,
                "largest_ok": largest_ok,
            }
        )
    return out
