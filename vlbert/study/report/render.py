"""The report's text: Table 4 as markdown, CSV and LaTeX, the findings, VCR Q->AR, pre-training
and the RoI detector, from what read.py and statistics.py give."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from ... import io
from ...registry import FAMILIES, SETTINGS, TABLE4_SETTINGS, TABLE4_TASKS, TASKS
from .read import PRETRAINING_METRICS, grounding_kinds, latest_pretraining, pretraining_replicates
from .statistics import KILLED, MISSING, floor_of

# ---- Table 4 and the findings ----------------------------------------------------------------


def seed_cell(mean, std, n, seeds: int = 0, killed: bool = False) -> str:
    """mean ± std over seeds; a cell without runs is MISSING (KILLED when its runs were killed
    before they had results), one with a single seed says n=1 (it has no spread, not a spread of
    0), one with fewer seeds than the others says how many."""
    if pd.isna(mean) or not n:
        return KILLED if killed else MISSING
    if n == 1:
        return f"{mean:.1f} (n=1)"
    return f"{mean:.1f} ± {std:.1f}" + (f" (n={int(n)})" if n < seeds else "")


def table4_cells(table: pd.DataFrame, setting: str) -> list[str]:
    """A setting's row of Table 4's columns as `seed_cell`s, its seeds counted against the table's most."""
    seeds = int(table[[f"{t}_n" for t in TABLE4_TASKS]].max().max()) if len(table) else 0
    return [
        seed_cell(
            table.loc[setting, f"{t}_mean"],
            table.loc[setting, f"{t}_std"],
            table.loc[setting, f"{t}_n"],
            seeds,
            bool(table.loc[setting].get(f"{t}_killed", False)),
        )
        for t in TABLE4_TASKS
    ]


def write_tables(
    table: pd.DataFrame,
    paper: dict,
    out: Path,
    notes: list[str] = (),
    floors: dict | None = None,
    pretraining_per_seed: bool = False,
) -> None:
    """table4.{md,csv,tex}; `notes`: what the figures rest on (runs that did not finish), said below
    the table; `floors` (floors.json): the blind floors, a first row of the markdown table;
    `pretraining_per_seed`: each seed fine-tuned a pre-training of its own (pretrain.per_seed)."""
    published = paper["ablation_table4"]
    marker = " †" if published["provenance"] == "recalled" else ""
    header = ["setting"] + [TASKS[t].table4_title for t in TABLE4_TASKS] + [f"paper {t}{marker}" for t in TABLE4_TASKS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    if floors:
        blind = [floor_of(floors, t) for t in TABLE4_TASKS]
        lines.append(
            "| blind floor | "
            + " | ".join(MISSING if math.isnan(v) else f"{v:.1f}" for v in blind)
            + " |" * (len(TABLE4_TASKS) + 1)
        )
    csv_rows = []
    for setting in TABLE4_SETTINGS:
        ours = table4_cells(table, setting)
        theirs = [f"{v:.1f}" for v in published["rows"][setting]]
        lines.append("| " + " | ".join([setting] + ours + theirs) + " |")
        csv_rows.append(
            {
                "setting": setting,
                **{f"{t}_{k}": table.loc[setting, f"{t}_{k}"] for t in TABLE4_TASKS for k in ("mean", "std", "n")},
                **{f"paper_{t}": v for t, v in zip(TABLE4_TASKS, published["rows"][setting])},
            }
        )
    n = int(table[[f"{t}_n" for t in TABLE4_TASKS]].max().max()) if len(table) else 0
    note = (
        f"\nOurs: mean ± standard deviation over seeds (up to {n} per cell), accuracy in percent. "
        f"Paper: ICLR 2020 Table 4, VL-BERT_BASE."
    )
    if pretraining_per_seed:
        note += (
            " Each seed of a setting that pre-trains fine-tunes a pre-training of its own, so a cell's "
            "spread holds pre-training's as well as fine-tuning's (pretraining.md: every pre-training)."
        )
    shown = " ".join(" ".join(table4_cells(table, s)) for s in TABLE4_SETTINGS)
    if MISSING in shown:
        note += f" {MISSING} no run with results for this setting and task."
    if KILLED in shown:
        note += f" {KILLED}: its runs were killed before they had results (the notes below name them)."
    if "(n=" in shown:
        note += " (n=k): only k seeds, (n=1) a single one, which has no spread."
    if floors:
        note += (
            " Blind floor: the best score of a model that does not look at the image (floors.json); "
            "each cell beside it and beside its runs' score with the images shuffled among the items: "
            "table4_controls.md."
        )
    if marker:
        note += (
            " † The paper's Table 4 numbers are recalled, not confirmed from the paper's text "
            "(the seed documents show the table only as an image); its findings are stated in the text."
        )
    if notes:
        note += "\n\nNotes on the runs behind these figures:\n\n" + "\n".join(f"- {line}" for line in notes)
    io.write_text(out / "table4.md", "# Table 4: pre-training ablation\n\n" + "\n".join(lines) + "\n" + note + "\n")
    io.write_text(out / "table4.csv", pd.DataFrame(csv_rows).to_csv(index=False))
    tex = [
        "\\begin{tabular}{l" + "c" * (2 * len(TABLE4_TASKS)) + "}",
        "\\toprule",
        "setting & "
        + " & ".join(TASKS[t].table4_title.replace(">", "$>$") for t in TABLE4_TASKS)
        + " & "
        + " & ".join(f"paper {i + 1}" for i in range(len(TABLE4_TASKS)))
        + " \\\\",
        "\\midrule",
    ]
    for setting in TABLE4_SETTINGS:
        ours = [c.replace("±", "$\\pm$").replace(MISSING, "---") for c in table4_cells(table, setting)]
        tex.append(
            f"{setting.replace('_', chr(92) + '_')} & "
            + " & ".join(ours + [f"{v:.1f}" for v in published["rows"][setting]])
            + " \\\\"
        )
    tex += ["\\bottomrule", "\\end{tabular}"]
    io.write_text(out / "table4.tex", "\n".join(tex) + "\n")


def controls_lines(controls: pd.DataFrame) -> list[str]:
    """The controls' table (setting, task, cell, SE, shuffled images, image's share, blind floor,
    the task's extra figures; ✗ where a cell does not clear a control), then the cells that do not."""
    fmt = lambda v: MISSING if pd.isna(v) else f"{v:.1f}"
    mark = lambda clears: "" if clears is None or pd.isna(clears) else "" if clears else " ✗"
    lines = [
        "| setting | task | cell | SE | shuffled images | image's share | blind floor | extra |",
        "|---|---|---|---|---|---|---|---|",
    ]
    not_clearing = {"shuffled images": [], "blind floor": []}
    for _, row in controls.iterrows():
        extra = ", ".join(
            f"{label} {row[name]:.1f}"
            for name, label in (("pairs", "pairs"), ("rare", "rare words"), ("seen", "seen words"))
            if not pd.isna(row[name])
        )
        lines.append(
            f"| {row['setting']} | {TASKS[row['task']].title} | {fmt(row['mean'])} | {fmt(row['se'])} "
            f"| {fmt(row['shuffled'])}{mark(row['clears_shuffled'])} | {fmt(row['image_share'])} "
            f"| {fmt(row['floor'])}{mark(row['clears_floor'])} | {extra} |"
        )
        for control, name in (("shuffled", "shuffled images"), ("floor", "blind floor")):
            if row[f"clears_{control}"] is False:
                not_clearing[name].append(f"{row['setting']} / {row['task']}")
    lines.append("")
    for name, cells in not_clearing.items():
        lines.append(f"Cells that do not clear their {name}: " + (", ".join(cells) if cells else "none") + ".")
    return lines


CONTROLS_LEGEND = (
    "Per setting and task (the reported split, mean over seeds): the cell; its standard error "
    "(sqrt(p(1-p)/n) over the split's n items); the same checkpoints scored with the images "
    "shuffled among the items (each reads another image's regions and pixels over its own "
    "boxes); the image's share (cell minus shuffled); the blind floor (the best model that does "
    "not look, computed from the files: floors.json). ✗: the cell does not clear it by two "
    "standard errors of a difference."
)


def write_controls(controls: pd.DataFrame, floors: dict, out: Path) -> None:
    """table4_controls.{md,csv}: each Table 4 cell beside its standard error, its checkpoints'
    score with the images shuffled, the image's share and the task's blind floor."""
    lines = ["# Table 4's controls: what each cell owes to the image", "", CONTROLS_LEGEND, ""]
    lines += controls_lines(controls)
    lines += ["", "## Blind floors (reported split; val in floors.json)", ""]
    for task, roles in floors.items():
        figures = roles.get("reported", {})
        lines.append(f"- {TASKS[task].title}: " + ", ".join(f"{k} {v}" for k, v in figures.items()))
    io.write_text(out / "table4_controls.md", "\n".join(lines) + "\n")
    io.write_text(out / "table4_controls.csv", controls.to_csv(index=False))


INTERVAL_LEGEND = (
    "A delta is ours: first setting minus second, accuracy points, with its 95% interval and "
    "P(A>B), the chance that a run of the first beats a run of the second; both from a "
    "hierarchical bootstrap of the runs' per-item scores (the seeds, paired where every setting "
    "ran the same seeds, then the test items, paired), three seeds giving the seed part t's "
    '2 degrees of freedom (docs/reproducibility.md, "Intervals and verdicts"). Verdict: '
    "*helps* where the interval is above 0, *hurts* below, *not shown* where it holds 0."
)


def interval_text(low: float, high: float) -> str:
    return MISSING if pd.isna(low) or pd.isna(high) else f"[{low:+.1f}, {high:+.1f}]"


def probability_text(p: float) -> str:
    return MISSING if pd.isna(p) else f"{p:.2f}"


def write_fractions(fractions: pd.DataFrame, out: Path) -> None:
    """data_fractions.{md,csv}: full and no_pretrain fine-tuned on shares of each training set."""
    fmt = lambda mean, std, n: seed_cell(mean, std, n)
    lines = [
        "# Pre-training's effect against fine-tuning data",
        "",
        "`full` and `no_pretrain` fine-tuned on a share of each training set (the same examples for "
        "both and every seed), for as many steps as the whole set gets, at the rate the whole set's "
        "sweep chose; scored on the reported split, mean ± std over seeds. Gap: full minus "
        "no_pretrain. " + INTERVAL_LEGEND,
        "",
        "| task | share | no_pretrain | full | gap | 95% interval | P(full>no_pretrain) | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for _, row in fractions.iterrows():
        gap = MISSING if pd.isna(row["gap"]) else f"{row['gap']:+.1f}"
        cells = [fmt(row[f"{s}_mean"], row[f"{s}_std"], row[f"{s}_n"]) for s in ("no_pretrain", "full")]
        lines.append(
            f"| {TASKS[row['task']].title} | {100 * row['fraction']:.0f}% | {' | '.join(cells)} "
            f"| {gap} | {interval_text(row['low'], row['high'])} | {probability_text(row['p_first_beats'])} "
            f"| {row['verdict'] or MISSING} |"
        )
    io.write_text(out / "data_fractions.md", "\n".join(lines) + "\n")
    io.write_text(out / "data_fractions.csv", fractions.to_csv(index=False))


def write_findings(results: list[dict], out: Path) -> None:
    lines = ["# The paper's findings, checked on this run", "", INTERVAL_LEGEND, ""]
    counts = {v: sum(r["verdict"] == v for r in results) for v in ("agrees", "does not agree", "not shown", "no data")}
    lines += [
        f"Of the paper's {len(results)} findings this run shows {counts['agrees']}: every task's delta has "
        f"the paper's sign beyond its interval. {counts['does not agree']} do not agree (a delta of the "
        f"other sign beyond its interval), {counts['not shown']} are not shown (an interval holds 0)"
        + (f", {counts['no data']} have no data (a setting or task without runs)" if counts["no data"] else "")
        + ".",
        "",
    ]
    for r in results:
        lines += findings_lines(r)
    io.write_text(out / "findings.md", "\n".join(lines))
    io.write_json(out / "findings.json", results, indent=2)


def findings_lines(r: dict) -> list[str]:
    """One finding's section: its verdict, and per task our delta with its interval and verdict."""
    lines = [f"## {r['text']}: {r['verdict']}", ""]
    lines.append("| task | delta | 95% interval | ± | P(A>B) | verdict | the paper's sign |")
    lines.append("|---|---|---|---|---|---|---|")
    for t in r["tasks"]:
        if t["missing"]:
            lines.append(f"| {t['task']} | no data |" + f" {MISSING} |" * 5)
            continue
        sign = "n/a (none stated)" if t["shown"] is None else "shown" if t["shown"] else "not shown"
        lines.append(
            f"| {t['task']} | {t['delta']:+.2f} | {interval_text(t['low'], t['high'])} "
            f"| {MISSING if pd.isna(t['half_width']) else format(t['half_width'], '.1f')} "
            f"| {probability_text(t['p_first_beats'])} | {t['verdict']} | {sign} |"
        )
    gaps = [f"{t['task']} ({' and '.join(t['missing'])})" for t in r["tasks"] if t["missing"]]
    if gaps:
        lines += ["", f"No runs with results for: {', '.join(gaps)}."]
    if r["largest_on"] and r["largest_ok"] is not None:
        lines.append("")
        lines.append(
            f"The paper says the gain is largest on {r['largest_on'].upper()}: "
            f"{'so it is here' if r['largest_ok'] else 'not so here'}."
        )
    lines.append("")
    return lines


def write_q2ar(derived: pd.DataFrame, out: Path, kinds: pd.DataFrame | None = None) -> None:
    """vcr_q2ar.md: VCR Q->AR per setting over seeds, from derive_q2ar's rows; with `kinds`
    (derive_vcr_kinds' rows), Q->A and QA->R per kind of question as well."""
    rows = [s for s in SETTINGS if s in TABLE4_SETTINGS or s in set(derived["setting"])]
    q2ar = derived.groupby("setting")["accuracy"].agg(["mean", "std", "count"]).reindex(rows)
    split = TASKS["vcr_q2a"].table4_split
    lines = [
        "# VCR Q->AR, from each seed's Q->A and QA->R runs",
        "",
        f"| setting | VCR Q->AR ({split}) |",
        "|---|---|",
    ]
    lines += [
        f"| {s} | {seed_cell(r['mean'], r['std'], r['count'], int(q2ar['count'].max()))} |" for s, r in q2ar.iterrows()
    ]
    if kinds is not None and not kinds.empty:
        lines += ["", *kind_lines(kinds)]
    io.write_text(out / "vcr_q2ar.md", "\n".join(lines) + "\n")


def kind_lines(kinds: pd.DataFrame) -> list[str]:
    """Q->A and QA->R accuracy on the reported split per kind of question and setting, mean ± std over seeds."""
    names = sorted(kinds["kind"].unique())
    size = kinds.groupby("kind")["n"].first()
    lines = [
        "## Per kind of question",
        "",
        f"Accuracy on the reported split ({TASKS['vcr_q2a'].table4_split}) on each kind of question the VCR "
        "file names (`question_type`), mean ± std over seeds; "
        "chance is 25% on every kind. A kind that every setting answers alike, with or without pre-training, "
        "does not tell the settings apart, whatever the column's mean does.",
    ]
    for task in ("vcr_q2a", "vcr_qa2r"):
        part = kinds[kinds["task"] == task]
        if part.empty:
            continue
        stats = part.groupby(["setting", "kind"])["accuracy"].agg(["mean", "std", "count"])
        seeds = int(stats["count"].max())
        lines += ["", f"### {TASKS[task].title}", ""]
        lines += ["| setting | " + " | ".join(f"{k} (n={size[k]})" for k in names) + " |"]
        lines += ["|---|" + "---|" * len(names)]
        for setting in (s for s in SETTINGS if s in stats.index.get_level_values("setting")):
            cells = (stats.loc[(setting, k)] if (setting, k) in stats.index else None for k in names)
            lines.append(
                f"| {setting} | "
                + " | ".join(
                    MISSING if c is None else seed_cell(c["mean"], c["std"], c["count"], seeds) for c in cells
                )
                + " |"
            )
    return lines


# ---- pre-training ----------------------------------------------------------------------------


def write_pretraining(runs: pd.DataFrame, out: Path, notes: list[str] = ()) -> None:
    """pretraining.md: each setting's masked words right on the val captions, with their own image
    and with another caption's, and the difference (how much the model reads the image). `notes`:
    what the figures rest on (runs that did not finish)."""
    lines = [
        "| setting | masked words right (%) | with another caption's image (%) | visual clue gain (points) |",
        "|---|---|---|---|",
    ]
    for _, run in latest_pretraining(runs).iterrows():
        cells = ["-" if run.get(k) is None or pd.isna(run.get(k)) else f"{run[k]:.1f}" for k in PRETRAINING_METRICS]
        lines.append(f"| {run['setting']} | " + " | ".join(cells) + " |")
    note = (
        "\nLast epoch of pre-training, on the val captions with fixed masks. The same masked words are "
        "scored twice: with each caption's own image, and with the image of another caption that has as "
        "many regions. A gain near 0 means the model fills the masks from the words alone: whatever else "
        "pre-training taught it, it has not learnt to read the image.\n"
    )
    if notes:
        note += "\nNotes on the runs behind these figures:\n\n" + "\n".join(f"- {line}" for line in notes) + "\n"
    grounding = [
        "## Per word kind",
        "",
        "Per kind of word (colour, shape, size), every word of that kind in a val caption (up to the "
        "first 300 captions) is masked at once and chosen among the kind's words only, with the caption's own "
        "image and with the other caption's image as above. No other mention of the kind is left to "
        "copy and the grammar does not tell which word of the kind it is: only the image does. Chance: "
        "one in the kind's words. Below each table: the attention probability mass of those masked "
        "words on the [IMG] elements, with the own image, against the mass uniform attention would "
        "put there.",
        "",
    ]
    kinds = grounding_kinds(runs)
    for _, run in latest_pretraining(runs).iterrows():
        grounding += [f"### {run['setting']}", "", *grounding_lines(run, kinds), ""]
    io.write_text(
        out / "pretraining.md",
        "# Pre-training: do the masked words use the image?\n\n"
        + "\n".join(lines)
        + "\n"
        + note
        + "\n"
        + "\n".join(grounding)
        + replicates_section(pretraining_replicates(runs), kinds),
    )


def replicate_columns(kinds: tuple[str, ...]) -> dict:
    """The replicates' columns: the read of the image overall and per word kind (own image minus another's)."""
    return {
        "visual clue gain": lambda run: _value(run, "visual_clue_gain"),
        **{
            f"{kind} gain": lambda run, kind=kind: _difference(
                _value(run, f"ground_{kind}_own"), _value(run, f"ground_{kind}_other")
            )
            for kind in kinds
        },
    }


def _difference(a, b):
    return None if a is None or b is None else a - b


def replicates_section(replicates: pd.DataFrame, kinds: tuple[str, ...]) -> str:
    """pretraining.md's section on a setting's several pre-trainings (pretrain.per_seed): each
    one's read of the image (overall and per word kind of `kinds`), and their mean and spread,
    which the fine-tuning cells' spread holds."""
    if replicates.empty:
        return ""
    columns = replicate_columns(kinds)
    lines = [
        "",
        "## Every pre-training of a setting",
        "",
        "Each fine-tuning seed starts from a pre-training of its own (`pretrain.per_seed`), so each Table 4 "
        "cell's spread holds pre-training's. Per pre-training (seed: the setting's own, then the fine-tuning "
        "seeds'), points of masked words right with the caption's own image over another's:",
        "",
        "| setting | seed | " + " | ".join(columns) + " |",
        "|---|---|" + "---|" * len(columns),
    ]
    for setting in [s for s in SETTINGS if s in set(replicates["setting"])]:
        runs = replicates[replicates["setting"] == setting].sort_values("seed", na_position="first")
        values = {name: [read(run) for _, run in runs.iterrows()] for name, read in columns.items()}
        for k, (_, run) in enumerate(runs.iterrows()):
            seed = "own" if pd.isna(run["seed"]) else str(int(run["seed"]))
            cells = ["-" if v[k] is None else f"{v[k]:+.1f}" for v in values.values()]
            lines.append(f"| {setting} | {seed} | " + " | ".join(cells) + " |")
        summary = []
        for column in values.values():
            known = [v for v in column if v is not None]
            summary.append(f"{np.mean(known):+.1f} ± {np.std(known, ddof=1):.1f}" if len(known) > 1 else "-")
        lines.append(f"| {setting} | mean ± std | " + " | ".join(summary) + " |")
    return "\n".join(lines) + "\n"


def _value(run, key):
    value = run.get(key)
    return None if value is None or pd.isna(value) else float(value)


def grounding_lines(run, kinds: tuple[str, ...]) -> list[str]:
    """One setting's grounding probe, last epoch: a row per word kind of `kinds`, then the
    attention share."""
    if not any(_value(run, f"ground_{kind}_own") is not None for kind in kinds):
        return ["Not measured (a run from before the grounding probe, or captions that name no word kinds)."]
    lines = ["| kind | own (%) | other (%) | gain (points) | chance (%) | n |", "|---|---|---|---|---|---|"]
    for kind in kinds:
        own, other, chance, n = (_value(run, f"ground_{kind}_{k}") for k in ("own", "other", "chance", "n"))
        if own is not None:
            lines.append(f"| {kind} | {own:.1f} | {other:.1f} | {own - other:+.1f} | {chance:.1f} | {int(n)} |")
    share, uniform = _value(run, "attention_img_share"), _value(run, "attention_img_uniform")
    if share is not None:
        layers = []
        while (layer := _value(run, f"attention_img_share_layer{len(layers)}")) is not None:
            layers.append(layer)
        family = FAMILIES[SETTINGS[run["setting"]].family] if run.get("setting") in SETTINGS else None
        elements = "pixel tokens" if family and family.reads_pixels else "[IMG]"
        lines += [
            "",
            f"Attention on {elements} (own image, mean over layers and heads): {share:.3f}, uniform "
            f"{uniform:.3f}; per layer: " + ", ".join(f"{v:.3f}" for v in layers) + ".",
        ]
    return lines


# ---- the RoI detector ------------------------------------------------------------------------

GROUND_TRUTH_CHECKS = {"class": "class right (%)", "shape": "shape right (%)", "colour": "colour right (%)"}
SIZE_ROWS = ("small", "medium", "large")  # metrics.json sorts its keys: the table orders them back


def ground_truth_table(accuracy: dict) -> list[str]:
    """Markdown rows: per size group, its ground-truth boxes and the shares the box head names right."""
    checks = [k for k in GROUND_TRUTH_CHECKS if k in accuracy["all"]]
    lines = [
        "| size | boxes | " + " | ".join(GROUND_TRUTH_CHECKS[k] for k in checks) + " |",
        "|---|---|" + "---|" * len(checks),
    ]
    groups = sorted(accuracy["by_size"], key=lambda g: (SIZE_ROWS.index(g) if g in SIZE_ROWS else len(SIZE_ROWS), g))
    for group, counts in [*((g, accuracy["by_size"][g]) for g in groups), ("all", accuracy["all"])]:
        lines.append(f"| {group} | {counts['boxes']} | " + " | ".join(f"{100 * counts[k]:.1f}" for k in checks) + " |")
    return lines


def write_detector(detector_dir, out: Path) -> None:
    """detector.md: which detector the study read. A trained one's val mAP and how well it names
    ground-truth boxes per size, from the metrics `vlbert train-detector` wrote, so that a preset
    change that degrades the features every later stage reads shows in the report; a given
    detectron2 model's files, whose quality figures are its own."""
    detector_dir = Path(detector_dir)
    metrics_path, config_path = detector_dir / "metrics.json", detector_dir / "detector_config.json"
    described = json.loads(config_path.read_text()) if config_path.is_file() else {}
    lines = []
    if described.get("backend") == "detectron2":
        lines += [
            "The study read a given detectron2 model and trained none (`detector.backend: detectron2`):",
            "",
            f"- config: `{described['config_file']}`",
            f"- weights: `{described['weights']}` ({described['weights_identity']})",
            f"- regions: {described['feature_dim']}-d res5 features, {len(described['class_names'])} classes",
            "",
            "Its quality figures are the weights' own (their source's), not measured by this study.",
        ]
    elif not metrics_path.is_file():
        lines.append(f"No detector metrics at {metrics_path}: the detector was not trained by this study.")
    else:
        metrics = json.loads(metrics_path.read_text())
        lines.append(
            f"COCO box mAP on the val split: {metrics['val_mAP']:.3f} (IoU .50:.95), "
            f"{metrics['val_mAP50']:.3f} (IoU 0.5)."
        )
        accuracy = metrics.get("val_gt_accuracy")
        if accuracy and accuracy["all"].get("boxes"):
            lines += [
                "",
                "The box head on the val split's ground-truth boxes (the boxes the study's "
                "ground-truth mode extracts): the share whose best class is right, and whose shape "
                "and colour are right, per object size.",
                "",
                *ground_truth_table(accuracy),
            ]
        else:
            lines += [
                "",
                "These metrics have no ground-truth box accuracy (a detector trained before it was "
                "measured): retrain it, or measure it with `python bench/detector_quality.py "
                "--detector <detector folder> --data <detector data folder>`.",
            ]
    io.write_text(out / "detector.md", "# The RoI detector\n\n" + "\n".join(lines) + "\n")
