"""The systems table: VL-BERT, ViLBERT and Pixel-BERT under one protocol, beside their papers.

Rows are each system without and with pre-training (its ModelFamily.system_rows: VL-BERT's also
`c`, ViLBERT's objectives; Pixel-BERT's also without pixel sampling), columns Table 4's tasks; the
published figures sit beside ours with their provenance ("-" where none exists), then the published
controlled comparison (VOLTA), the findings the sources state, and each system's size.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: the study runs without a display
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ... import io
from ...registry import FAMILIES, SETTINGS, TABLE4_TASKS, TASKS
from .render import CONTROLS_LEGEND, INTERVAL_LEGEND, controls_lines, findings_lines, table4_cells
from .statistics import MISSING, compare, controls

SYSTEM_FINDING_TEXT = {
    "vilbert_pretrain_helps": "ViLBERT's pre-training helps (vilbert vs vilbert_no_pretrain)",
    "two_vs_single_stream": "two streams against one, with the same objectives (vilbert vs VL-BERT c)",
    "pixel_sampling_helps": "random pixel sampling helps (pixelbert vs pixelbert_no_sampling)",
    "pixelbert_pretrain_helps": "pre-training helps Pixel-BERT (pixelbert vs pixelbert_no_pretrain)",
}
# Each system's rows: without pre-training, (ablations,) pre-trained (ModelFamily.system_rows).
SYSTEM_ROWS = {name: family.system_rows for name, family in FAMILIES.items()}
RECALLED = " †"


def published_row(paper: dict, setting: str) -> tuple[list[float | None], str]:
    """The published figures for a setting's row, in TABLE4_TASKS' order (None: none published),
    and its mark (RECALLED when the source is recalled, not checked against the paper)."""
    family = SETTINGS[setting].family
    if family == "vlbert":
        table = paper["ablation_table4"]
        mark = RECALLED if table["provenance"] == "recalled" else ""
        return list(table["rows"][setting]), mark
    if family == "vilbert":
        table = paper["vilbert"]["ablation_table1"]
        mark = RECALLED if table["provenance"] == "recalled" else ""
        by_column = dict(zip(table["columns"], table["rows"][setting]))
        columns = {"vqa": "vqa_testdev", "refcoco_det": "refcoco_plus_val"}
        return [by_column.get(columns.get(t, t)) for t in TABLE4_TASKS], mark
    # Pixel-BERT: its ResNet-50 VQA figure; no VCR or RefCOCO+ figure, and its ablation gives deltas only.
    vqa = paper["pixelbert"]["vqa_testdev_r50"] if setting == "pixelbert" else None
    return [vqa if t == "vqa" else None for t in TABLE4_TASKS], ""


def system_settings(table: pd.DataFrame) -> list[str]:
    """The systems' rows that have runs, in SYSTEM_ROWS' order."""
    counts = table[[f"{t}_n" for t in TABLE4_TASKS]].sum(axis=1)
    return [s for rows in SYSTEM_ROWS.values() for s in rows if counts.get(s, 0) > 0]


def parameter_counts(finetunes: pd.DataFrame) -> dict[str, tuple[float, float]]:
    """Per setting: (all parameters, those fine-tuning trains) of its RefCOCO+ model (the head
    with no answer vocabulary), as its runs logged them."""
    counts = {}
    if "parameters" not in finetunes:
        return counts
    runs = finetunes[(finetunes["task"] == "refcoco_det") & finetunes["parameters"].notna()]
    for setting, group in runs.groupby("setting"):
        counts[setting] = (float(group["parameters"].iloc[0]), float(group["trainable_parameters"].iloc[0]))
    return counts


def _value(v: float | None) -> str:
    return "-" if v is None or math.isnan(v) else f"{v:.2f}"


def write_systems(
    table: pd.DataFrame, paper: dict, finetunes: pd.DataFrame, out: Path, floors: dict | None = None, items=None
) -> list[dict]:
    """systems.{md,csv,tex} and systems_findings.json; returns the findings. Each row's cells are
    put beside their controls (`floors`: `vlbert floors`' figures; none: no blind floors)."""
    rows = system_settings(table)
    sizes = parameter_counts(finetunes)
    header = ["system", "setting"] + [TASKS[t].table4_title for t in TABLE4_TASKS]
    header += [f"paper {TASKS[t].title}" for t in TABLE4_TASKS] + ["parameters (M)", "trained in fine-tuning (M)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    csv_rows, tex_rows = [], []
    for setting in rows:
        family = FAMILIES[SETTINGS[setting].family]
        theirs, mark = published_row(paper, setting)
        total, trained = sizes.get(setting, (math.nan, math.nan))
        size_cells = [_value(total / 1e6), _value(trained / 1e6)]
        published = ["-" if v is None else f"{v:g}{mark}" for v in theirs]
        ours = table4_cells(table, setting)
        lines.append("| " + " | ".join([family.title, setting, *ours, *published, *size_cells]) + " |")
        csv_rows.append(
            {
                "system": family.name,
                "setting": setting,
                **{
                    f"{t}_{k}": table.loc[setting, f"{t}_{k}"]
                    for t in TABLE4_TASKS
                    for k in ("mean", "std", "n", "se", "shuffled")
                },
                **{f"paper_{t}": v for t, v in zip(TABLE4_TASKS, theirs)},
                "parameters": total,
                "trainable_parameters": trained,
            }
        )
        tex_cells = [c.replace("±", "$\\pm$").replace(MISSING, "---") for c in ours]
        tex_rows.append(" & ".join([family.title, setting.replace("_", "\\_"), *tex_cells]) + " \\\\")
    results = compare(table, paper["systems_findings"], SYSTEM_FINDING_TEXT, items)
    results = [r for r in results if all(s in rows for s in r["compare"])]
    notes = [
        "",
        "Ours: mean ± standard deviation over seeds, accuracy in percent; the same data, BERT "
        "initialisation, detector, seeds and half fine-tuning schedule for every system, and as many "
        "swept rates a task (a system's own where the preset gives one, finetune.<section>.families). "
        "Paper: VL-BERT ICLR 2020 Table 4 and ViLBERT Table 1 (its single-stream baseline is its "
        f"own, not VL-BERT), {RECALLED.strip()} recalled, not checked against the paper; "
        "Pixel-BERT: VQA test-dev with ResNet-50 (it reports no VCR or RefCOCO+ figure, and its "
        "ablation only as deltas). - : no published figure.",
        "",
        "Pixel-BERT's RefCOCO+ head (RoIAlign over its last layer's pixel tokens for each candidate "
        "box) is this project's design: the paper has none.",
    ]
    if rows:
        notes += ["", "## Controls: what each cell owes to the image", "", CONTROLS_LEGEND, ""]
        notes += controls_lines(controls(table, floors or {}, rows))
    if sizes:
        notes += ["", *size_lines(sizes)]
    notes += ["", *volta_lines(paper)]
    io.write_text(out / "systems.md", "# The three systems under one protocol\n\n" + "\n".join(lines + notes) + "\n")
    io.write_text(out / "systems.csv", pd.DataFrame(csv_rows).to_csv(index=False))
    tex = [
        "\\begin{tabular}{ll" + "c" * len(TABLE4_TASKS) + "}",
        "\\hline",
        "system & setting & " + " & ".join(TASKS[t].table4_title.replace(">", "$>$") for t in TABLE4_TASKS) + " \\\\",
        "\\hline",
        *tex_rows,
        "\\hline",
        "\\end{tabular}",
    ]
    io.write_text(out / "systems.tex", "\n".join(tex) + "\n")
    header_lines = ["# The seed papers' findings about their systems, checked on this run", "", INTERVAL_LEGEND, ""]
    sources = {f["id"]: f.get("source", "") for f in paper["systems_findings"]}
    body = []
    for r in results:
        body += [*findings_lines(r), f"Source: {sources[r['id']]}.", ""]
    io.write_text(out / "systems_findings.md", "\n".join(header_lines + body) + "\n")
    io.write_json(out / "systems_findings.json", results, indent=2)
    return results


def size_lines(sizes: dict[str, tuple[float, float]]) -> list[str]:
    """How much larger each pre-trained system is than VL-BERT (`full`), in the parameters that
    fine-tuning trains: VL-BERT's frozen Fast R-CNN is not among them, Pixel-BERT's CNN is."""
    if "full" not in sizes:
        return []
    base = sizes["full"][1]
    lines = []
    for setting in ("vilbert", "pixelbert"):
        if setting in sizes:
            trained = sizes[setting][1]
            lines.append(
                f"{FAMILIES[SETTINGS[setting].family].title} trains {trained / 1e6:.2f} M parameters in "
                f"fine-tuning against VL-BERT's {base / 1e6:.2f} M ({100 * (trained / base - 1):+.0f}%; "
                "VL-BERT's frozen Fast R-CNN not counted, Pixel-BERT's CNN counted)."
            )
    return lines


def volta_lines(paper: dict) -> list[str]:
    volta = paper["volta_controlled"]
    columns = volta["columns"]
    lines = [
        "Published controlled comparison (VOLTA, e-bug/volta MODELS.md): " + volta["note"] + ".",
        "",
        "| model | " + " | ".join(columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    lines += [f"| {name} | " + " | ".join(f"{v:.2f}" for v in values) + " |" for name, values in volta["rows"].items()]
    return [*lines, "", f"VOLTA's finding: {volta['finding']}."]


def figure_systems(table: pd.DataFrame, path: Path) -> None:
    """Per task, each system's rows as bars (mean ± std over seeds)."""
    rows = system_settings(table)
    fig, axes = plt.subplots(1, len(TABLE4_TASKS), figsize=(4 * len(TABLE4_TASKS), 3.6), squeeze=False)
    # One colour a family, in FAMILIES' order (tab:blue, tab:orange, tab:green, ...), so a new family has one.
    colours = {name: plt.cm.tab10(k % 10) for k, name in enumerate(FAMILIES)}
    for k, task in enumerate(TABLE4_TASKS):
        ax = axes[0, k]
        means = [table.loc[s, f"{task}_mean"] for s in rows]
        stds = [np.nan_to_num(table.loc[s, f"{task}_std"]) for s in rows]
        ax.bar(range(len(rows)), means, yerr=stds, capsize=3, color=[colours[SETTINGS[s].family] for s in rows])
        ax.set_xticks(range(len(rows)), rows, rotation=60, ha="right", fontsize=7)
        ax.set_title(TASKS[task].table4_title, fontsize=9)
        ax.set_ylabel("accuracy (%)" if k == 0 else "")
    fig.suptitle("Three systems under one protocol (mean ± std over seeds)")
    fig.tight_layout()
    with io.atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
