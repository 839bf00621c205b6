"""refcoco.{md,csv}: RefCOCO+ on both of its tracks and both test splits.

Table 4 reports RefCOCO+ on the detected regions over testA and testB together. The paper's main
results give both tracks, the detected regions and the ground-truth boxes, on val, testA and testB:
this file puts every setting's runs of both tracks beside them, so that what the detector costs a
setting (ground truth minus detected) and where a setting's RefCOCO+ comes from (testA's kinds of
object against testB's) can be read, with the ground-truth track's own controls.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from ... import io
from ...evaluation.floors import accuracy_se
from ...registry import FAMILIES, SETTINGS, TASKS
from .render import seed_cell
from .statistics import MISSING

# The two tracks, in the paper's order: its detected regions first (Table 4's column).
TRACKS = ("refcoco_det", "refcoco_gt")
TEST_SPLITS = ("testA", "testB")
# The columns read per track: the reported split's figures as read.py names them.
FIGURES = {
    "test": "test_accuracy",
    "testA": "test_accuracy_testA",
    "testB": "test_accuracy_testB",
    "shuffled": "test_shuffled_images_accuracy",
    "rare": "test_accuracy_rare",
    "seen": "test_accuracy_seen",
    "items": "test_n",
}
# The paper's rows (main_results_arxiv_v1: VL-BERT_BASE, full fine-tuning) beside the study's.
PAPER_ROWS = {"no_pretrain": "paper (arXiv v1): without pre-training", "vlbert": "paper (arXiv v1): VL-BERT_BASE"}


def refcoco_table(finetunes: pd.DataFrame) -> pd.DataFrame:
    """Rows: the settings with a run of either track, in the registry's order; per track and
    figure of FIGURES, the mean over seeds (the test figure's std and n beside it)."""
    runs = finetunes[finetunes["task"].isin(TRACKS)]
    records = []
    for setting in (s for s in SETTINGS if s in set(runs["setting"])):
        row = {"setting": setting}
        for track in TRACKS:
            mine = runs[(runs["setting"] == setting) & (runs["task"] == track)]
            for name, column in FIGURES.items():
                values = mine[column].dropna() if column in mine else pd.Series(dtype=float)
                row[f"{track}_{name}"] = values.mean() if len(values) else math.nan
            tests = mine["test_accuracy"].dropna()
            row[f"{track}_std"] = tests.std(ddof=1) if len(tests) > 1 else math.nan
            row[f"{track}_n"] = len(tests)
        records.append(row)
    return pd.DataFrame(records)


def _mean(value) -> str:
    return MISSING if pd.isna(value) else f"{value:.1f}"


def refcoco_lines(table: pd.DataFrame, paper: dict) -> list[str]:
    det, gt = (TASKS[t].title for t in TRACKS)
    det_only = " and ".join(f.title for f in FAMILIES.values() if f.table4_tasks_only)
    det_only_note = f" {det_only} fine-tune Table 4's tasks alone: their {gt} cells are empty." if det_only else ""
    lines = [
        "# RefCOCO+: detected regions and ground-truth boxes, per test split",
        "",
        f"Accuracy (IoU >= 0.5 with the referent) on testA, testB and both (Table 4's {det} column is "
        "'both' on the detected regions), mean over seeds (± std over seeds on 'both'). Ground truth "
        "minus detected: what the detector's boxes cost the setting. testA's referents and testB's "
        "are of different kinds of object, as RefCOCO+'s people and other objects." + det_only_note,
        "",
        f"| setting | {det} testA | {det} testB | {det} both | {gt} testA | {gt} testB | {gt} both "
        "| ground truth minus detected |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for _, row in table.iterrows():
        gap = row["refcoco_gt_test"] - row["refcoco_det_test"]
        cells = []
        for track in TRACKS:
            cells += [_mean(row[f"{track}_{split}"]) for split in TEST_SPLITS]
            cells.append(seed_cell(row[f"{track}_test"], row[f"{track}_std"], row[f"{track}_n"]))
        lines.append(
            f"| {row['setting']} | " + " | ".join(cells) + f" | {MISSING if pd.isna(gap) else f'{gap:+.1f}'} |"
        )
    published = paper.get("main_results_arxiv_v1", {}).get("refcoco_plus", {})
    for key, label in PAPER_ROWS.items():
        if key in published:  # val / testA / testB per track; the paper gives no testA+B figure
            det_a, det_b = published[key]["det"][1:3]
            gt_a, gt_b = published[key]["gt"][1:3]
            cells = [f"{det_a:.1f}", f"{det_b:.1f}", MISSING, f"{gt_a:.1f}", f"{gt_b:.1f}", MISSING, MISSING]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"## {gt}: its controls",
        "",
        "The ground-truth track's reported split as Table 4's controls give the detected one's: its "
        "standard error (over its items), the same checkpoints with the images shuffled among the "
        "items, the image's share (the cell minus that), and the expressions whose colour word is "
        "rare or seen in fine-tuning.",
        "",
        "| setting | cell | SE | shuffled images | image's share | rare words | seen words |",
        "|---|---|---|---|---|---|---|",
    ]
    for _, row in table[table["refcoco_gt_n"] > 0].iterrows():
        cell, shuffled = row["refcoco_gt_test"], row["refcoco_gt_shuffled"]
        se = accuracy_se(cell, row["refcoco_gt_items"])
        share = cell - shuffled
        lines.append(
            f"| {row['setting']} | {_mean(cell)} | {_mean(se)} | {_mean(shuffled)} | {_mean(share)} "
            f"| {_mean(row['refcoco_gt_rare'])} | {_mean(row['refcoco_gt_seen'])} |"
        )
    return lines


def write_refcoco(finetunes: pd.DataFrame, paper: dict, out: Path) -> pd.DataFrame:
    """refcoco.md and refcoco.csv (the table's figures); nothing when no run is of either track."""
    table = refcoco_table(finetunes)
    if not table.empty:
        io.write_text(Path(out) / "refcoco.md", "\n".join(refcoco_lines(table, paper)) + "\n")
        io.write_text(Path(out) / "refcoco.csv", table.to_csv(index=False))
    return table
