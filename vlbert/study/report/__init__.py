"""The study's report, read back from MLflow: Table 4, the paper's findings, figures, runs.csv.

Every figure comes from the MLflow store (runs searched with the client API; VCR Q->AR from the
prediction artifacts of each seed's Q->A and QA->R runs), so the report says what MLflow says.
The paper's numbers come from vlbert/reference/paper_numbers.yaml, with their provenance.

read.py reads the runs, statistics.py computes Table 4 and the findings, render.py writes the text
files and figures.py the figures, systems.py the three systems' table, refcoco.py RefCOCO+'s two
tracks per test split; `write_report` below runs them in that order.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ... import io
from ...layout import Layout
from ...registry import TASKS
from .figures import figure_bars, figure_fractions, figure_grounding, figure_heatmap, figure_pretraining, figure_sweeps
from .read import (
    collect_runs,
    derive_q2ar,
    derive_vcr_kinds,
    item_scores,
    killed_notes,
    killed_without_results,
    latest_pretraining,
    latest_results,
    paper_numbers,
    pretraining_replicates,
    vcr_labels,
    vcr_predictions,
    vcr_question_kinds,
)
from .refcoco import write_refcoco
from .render import (
    ground_truth_table,
    grounding_lines,
    write_controls,
    write_detector,
    write_findings,
    write_fractions,
    write_pretraining,
    write_q2ar,
    write_tables,
)
from .statistics import controls, findings, fraction_table, table4, table_warnings
from .systems import figure_systems, write_systems

__all__ = [
    "collect_runs",
    "derive_q2ar",
    "derive_vcr_kinds",
    "figure_grounding",
    "findings",
    "ground_truth_table",
    "grounding_lines",
    "latest_pretraining",
    "latest_results",
    "paper_numbers",
    "table4",
    "table_warnings",
    "vcr_question_kinds",
    "write_detector",
    "write_pretraining",
    "write_report",
]


def write_report(  # noqa: PLR0913 - what the report reads: the store, the data, the workflow files
    uri: str,
    experiment: str,
    out,
    sweep_files: list[Path] = (),
    vcr_val=None,
    detector_dir=None,
    floors_path=None,
    data_root=None,
    features_dir=None,
) -> dict:
    """data_root, features_dir: the study's data and feature stores, which the runs' per-item scores
    are read against (without them, each delta's interval comes from the table's summaries).
    vcr_val: the VCR jsonl of the split Table 4 reports, whose labels Q->AR is scored against
    (no Q->AR without it). floors_path: `vlbert floors`' JSON (no blind floors without it).
    detector_dir: the study's detector folder (`vlbert train-detector`'s or `vlbert describe-detector`'s);
    by default results/<preset>/detector, <preset> being the report folder's name (reports/<preset>),
    as the workflow lays them out."""
    out = Path(out)
    (out / "figures").mkdir(parents=True, exist_ok=True)
    paper = paper_numbers()
    runs = collect_runs(uri, experiment)
    if runs.empty:
        raise ValueError(f"MLflow experiment {experiment!r} has no runs yet")
    ordered = runs.sort_values(["stage", "setting", "task", "seed"], na_position="last")
    io.write_text(out / "runs.csv", ordered.to_csv(index=False))
    every_finetune, finetune_notes = latest_results(runs, "finetune")
    # Runs on a share of a training set (data_fractions.md) stay out of every other table.
    finetunes = every_finetune[every_finetune["train_fraction"] == 1]
    killed = killed_without_results(runs, "finetune")
    killed = killed[killed["train_fraction"] == 1]
    finetune_notes += killed_notes(killed)
    pretrain_notes = latest_results(runs, "pretrain")[1]
    derived, by_kind = pd.DataFrame(), None
    if vcr_val and {"vcr_q2a", "vcr_qa2r"} <= set(finetunes["task"]):
        split = TASKS["vcr_q2a"].table4_split
        labels, predictions = vcr_labels(vcr_val), vcr_predictions(uri, finetunes, split)
        derived = derive_q2ar(finetunes, predictions, labels)
        kinds = vcr_question_kinds(vcr_val)
        by_kind = derive_vcr_kinds(finetunes, predictions, labels, kinds) if kinds else None
    table = table4(finetunes, zip(killed["setting"], killed["task"]))
    items = item_scores(uri, every_finetune, data_root, features_dir) if data_root and features_dir else None
    floors = json.loads(Path(floors_path).read_text()) if floors_path and Path(floors_path).is_file() else {}
    write_tables(table, paper, out, finetune_notes, floors, not pretraining_replicates(runs).empty)
    write_controls(controls(table, floors), floors, out)
    if (every_finetune["train_fraction"] < 1).any():
        fractions = fraction_table(every_finetune, items=items)
        write_fractions(fractions, out)
        figure_fractions(fractions, out / "figures" / "data_fractions.png")
    if not derived.empty:
        write_q2ar(derived, out, by_kind)
    write_refcoco(finetunes, paper, out)
    results = findings(table, paper, items)
    write_findings(results, out)
    systems_findings = write_systems(table, paper, finetunes, out, floors, items)
    figure_systems(table, out / "figures" / "systems.png")
    figure_bars(table, paper, out / "figures" / "table4_bars.png")
    figure_heatmap(table, paper, out / "figures" / "delta_heatmap.png")
    figure_sweeps(list(sweep_files), out / "figures" / "lr_sweeps.png")
    write_pretraining(runs, out, pretrain_notes)
    figure_pretraining(uri, runs, out / "figures" / "pretraining_loss.png")
    figure_grounding(uri, runs, out / "figures" / "pretraining_grounding.png")
    write_detector(detector_dir or Layout(out.name).detector, out)
    return {
        "runs": len(runs),
        "finetune_runs": len(finetunes),
        "findings_agreeing": sum(r["verdict"] == "agrees" for r in results),
        "findings_no_data": sum(r["verdict"] == "no data" for r in results),
        "systems_findings_agreeing": sum(r["verdict"] == "agrees" for r in systems_findings),
        "warnings": table_warnings(table) + finetune_notes + pretrain_notes,
    }
