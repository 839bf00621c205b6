"""The study's report, read back from MLflow: Table 4, the paper's findings, figures, runs.csv.

Every figure comes from the MLflow store (runs searched with the client API; VCR Q->AR from the
prediction artifacts of each seed's Q->A and QA->R runs), so the report says what MLflow says.
The paper's numbers come from vlbert/reference/paper_numbers.yaml, with their provenance.
"""

from __future__ import annotations

import json
import math
from importlib import resources
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import yaml

from .. import io
from ..layout import Layout
from ..registry import DERIVED_TASKS, SETTINGS, TABLE4_TASKS, TASKS

# What pre-training's validation logs (vlbert.engine.pretrain): masked words right with each caption's
# own image and with another's, on the same masks, and their difference.
PRETRAINING_METRICS = ("mlm_accuracy", "mlm_accuracy_other_image", "visual_clue_gain")
# The grounding probe's word kinds and what it logs per epoch (vlbert.engine.grounding, not imported:
# it needs torch): per kind ground_<kind>_own/_other/_gain/_chance/_n, and attention_img_share(_layer<i>).
GROUNDING_KINDS = ("colour", "shape", "size")
GROUNDING_PREFIXES = ("val_ground_", "val_attention_img_")
FINDING_TEXT = {
    "pretrain_helps": "pre-training helps all tasks (full vs no_pretrain)",
    "mlm_helps": "MLM with visual clues helps (a vs no_pretrain)",
    "mrc_helps_ref": "masked RoI classification helps RefCOCO+ (b vs a)",
    "sirp_hurts": "sentence-image relation prediction hurts (c vs b)",
    "text_helps": "the text-only corpus helps, VCR most (d vs b)",
    "tune_frcnn_helps": "tuning Fast R-CNN helps (full vs d)",
}


def paper_numbers() -> dict:
    return yaml.safe_load(resources.files("vlbert.reference").joinpath("paper_numbers.yaml").read_text())


# ---- reading MLflow --------------------------------------------------------------------------


def collect_runs(uri: str, experiment: str) -> pd.DataFrame:
    """Every run of the study, a row each: ids, tags, status and final metrics."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise ValueError(f"no MLflow experiment {experiment!r} in {uri}")
    rows = []
    for run in client.search_runs([found.experiment_id], max_results=50000):
        tags, metrics = run.data.tags, run.data.metrics
        rows.append(
            {
                "run_id": run.info.run_id,
                "run_name": run.info.run_name,
                "status": run.info.status,
                "stage": tags.get("stage"),
                "setting": tags.get("setting"),
                "task": tags.get("task"),
                "seed": int(tags["seed"]) if tags.get("seed") not in (None, "") else None,
                "lr": float(tags["lr"]) if tags.get("lr") not in (None, "") else None,
                "parent_run_id": tags.get("mlflow.parentRunId"),
                "git_commit": tags.get("git_commit"),
                "ended": tags.get("vlbert.ended"),  # why a run was ended from outside (killed, not continued)
                "val_accuracy": metrics.get("final_val_accuracy"),
                "test_accuracy": metrics.get("final_test_accuracy"),
                "best_epoch": metrics.get("best_epoch"),
                "artifact_uri": run.info.artifact_uri,
                **{name: metrics.get(f"val_{name}") for name in PRETRAINING_METRICS},
                **{k[len("val_") :]: v for k, v in metrics.items() if k.startswith(GROUNDING_PREFIXES)},
            }
        )
    return pd.DataFrame(rows)


# What a run of each stage must have logged for the report to use it.
RESULT_COLUMNS = {"finetune": ["val_accuracy", "test_accuracy"], "pretrain": list(PRETRAINING_METRICS)}


def _what(run) -> str:
    """A run's place in the study: setting / task / seed (pre-training: the setting)."""
    parts = [run["setting"], run["task"], f"seed {int(run['seed'])}" if pd.notna(run["seed"]) else None]
    return " / ".join(str(p) for p in parts if pd.notna(p))


def latest_results(runs: pd.DataFrame, stage: str) -> tuple[pd.DataFrame, list[str]]:
    """One run per (setting, task, seed): the newest one with results, finished or not, so that
    a re-run's figures never give way to an older run's; and, for the report to say, what that
    choice rests on: a run that did not finish, or a newer run that left no results."""
    staged = runs[runs["stage"] == stage]
    keys = ["setting", "task", "seed"]
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


def vcr_labels(jsonl_path) -> dict:
    from ..data.vcr import read_vcr

    return {e.annot_id: (e.answer_label, e.rationale_label) for e in read_vcr(jsonl_path)}


def derive_q2ar(uri: str, finetunes: pd.DataFrame, labels: dict, split: str = "val") -> pd.DataFrame:
    """VCR Q->AR per (setting, seed) from the Q->A and QA->R runs' prediction artifacts."""
    import mlflow.artifacts

    from ..evaluation.vcr_eval import vcr_accuracy

    rows = []
    q2ar = DERIVED_TASKS["vcr_q2ar"]
    q2a, qa2r = (finetunes[finetunes["task"] == part].set_index(["setting", "seed"]) for part in q2ar.parts)
    for key in q2a.index.intersection(qa2r.index):
        predictions = {}
        for frame in (q2a, qa2r):
            path = mlflow.artifacts.download_artifacts(
                run_id=frame.loc[key, "run_id"], artifact_path=f"predictions_{split}.json", tracking_uri=uri
            )
            for p in json.loads(Path(path).read_text()):
                predictions.setdefault(p["annot_id"], {}).update(p)
        rows.append(
            {
                "setting": key[0],
                "seed": key[1],
                "task": q2ar.name,
                "stage": "derived",
                f"{split}_accuracy": vcr_accuracy(labels, predictions)["q2ar"],
            }
        )
    return pd.DataFrame(rows)


# ---- tables ----------------------------------------------------------------------------------


def table4(finetunes: pd.DataFrame) -> pd.DataFrame:
    """Rows: settings; per task: mean, std and n over seeds of the Table 4 metric."""
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
        records.append(row)
    return pd.DataFrame(records).set_index("setting")


MISSING = "—"


def _cell(mean, std, n, seeds: int = 0) -> str:
    """mean ± std over seeds; a cell without runs is MISSING, one with a single seed says n=1
    (it has no spread, not a spread of 0), one with fewer seeds than the others says how many."""
    if pd.isna(mean) or not n:
        return MISSING
    if n == 1:
        return f"{mean:.1f} (n=1)"
    return f"{mean:.1f} ± {std:.1f}" + (f" (n={int(n)})" if n < seeds else "")


def _cells(table: pd.DataFrame, setting: str) -> list[str]:
    seeds = int(table[[f"{t}_n" for t in TABLE4_TASKS]].max().max()) if len(table) else 0
    return [
        _cell(table.loc[setting, f"{t}_mean"], table.loc[setting, f"{t}_std"], table.loc[setting, f"{t}_n"], seeds)
        for t in TABLE4_TASKS
    ]


def table_warnings(table: pd.DataFrame) -> list[str]:
    """What Table 4 lacks: settings without runs, cells without runs, cells on a single seed."""
    counts = table[[f"{t}_n" for t in TABLE4_TASKS]]
    empty = [s for s in SETTINGS if not counts.loc[s].any()]
    warnings = [f"setting {s} has no fine-tuning runs: its Table 4 row is empty ({MISSING})" for s in empty]
    missing = [f"{s} / {t}" for s in SETTINGS if s not in empty for t in TABLE4_TASKS if table.loc[s, f"{t}_n"] == 0]
    if missing:
        warnings.append(f"no run with results for {', '.join(missing)}: {MISSING} in Table 4")
    single = [f"{s} / {t}" for s in SETTINGS for t in TABLE4_TASKS if table.loc[s, f"{t}_n"] == 1]
    if single and len(single) == counts.astype(bool).to_numpy().sum():
        warnings.append("every cell of Table 4 rests on a single seed: no seed spread (n=1)")
    elif single:
        warnings.append(f"a single seed, so no seed spread (n=1), for {', '.join(single)}")
    return warnings


def write_tables(table: pd.DataFrame, paper: dict, out: Path, notes: list[str] = ()) -> None:
    """table4.{md,csv,tex}; `notes`: what the figures rest on (runs that did not finish), said below the table."""
    published = paper["ablation_table4"]
    marker = " †" if published["provenance"] == "recalled" else ""
    header = ["setting"] + [TASKS[t].table4_title for t in TABLE4_TASKS] + [f"paper {t}{marker}" for t in TABLE4_TASKS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    csv_rows = []
    for setting in SETTINGS:
        ours = _cells(table, setting)
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
    shown = " ".join(" ".join(_cells(table, s)) for s in SETTINGS)
    if MISSING in shown:
        note += f" {MISSING} no run with results for this setting and task."
    if "(n=" in shown:
        note += " (n=k): only k seeds, (n=1) a single one, which has no spread."
    if marker:
        note += (
            " † The paper's Table 4 numbers are recalled, not confirmed from the paper's text "
            "(the seed documents show the table only as an image); its findings are stated in the text."
        )
    if notes:
        note += "\n\nNotes on the runs behind these figures:\n\n" + "\n".join(f"- {line}" for line in notes)
    io.write_text(out / "table4.md", "# Table 4: pre-training ablation\n\n" + "\n".join(lines) + "\n" + note + "\n")
    pd.DataFrame(csv_rows).to_csv(out / "table4.csv", index=False)
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
    for setting in SETTINGS:
        ours = [c.replace("±", "$\\pm$").replace(MISSING, "---") for c in _cells(table, setting)]
        tex.append(
            f"{setting.replace('_', chr(92) + '_')} & "
            + " & ".join(ours + [f"{v:.1f}" for v in published["rows"][setting]])
            + " \\\\"
        )
    tex += ["\\bottomrule", "\\end{tabular}"]
    io.write_text(out / "table4.tex", "\n".join(tex) + "\n")


def findings(table: pd.DataFrame, paper: dict) -> list[dict]:
    """Each of the paper's findings: our deltas per task, whether they agree in sign and whether
    they exceed the seed spread (the larger of the two settings' standard deviations; none with a
    single seed). The verdict: "does not agree" when a measured task says otherwise, "no data"
    when a task or setting has no runs (a missing figure is not a disagreement), else "agrees"."""
    out = []
    for finding in paper["ablation_table4"]["findings"]:
        x, y = finding["compare"]
        sign = 1 if finding["sign"] == "+" else -1
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
                    "agrees": None if missing else bool(delta * sign > 0),
                    "beyond_spread": None if missing or math.isnan(spread) else bool(abs(delta) > spread),
                }
            )
        measured = [t for t in per_task if t["agrees"] is not None]
        largest = finding.get("largest_on")
        largest_ok = None
        if largest and measured and len(measured) == len(per_task):
            best = max(measured, key=lambda t: t["delta"])
            largest_ok = best["task"].startswith(largest)
        if any(t["agrees"] is False for t in measured) or largest_ok is False:
            verdict = "does not agree"
        elif len(measured) < len(per_task):
            verdict = "no data"
        else:
            verdict = "agrees"
        out.append(
            {
                "id": finding["id"],
                "text": FINDING_TEXT.get(finding["id"], finding["id"]),
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


def write_findings(results: list[dict], out: Path) -> None:
    lines = [
        "# The paper's findings, checked on this run",
        "",
        "A delta is ours (first setting minus second, accuracy points); it is *beyond the spread* "
        "when larger than the larger of the two settings' seed standard deviations.",
        "",
    ]
    agree = sum(r["verdict"] == "agrees" for r in results)
    no_data = sum(r["verdict"] == "no data" for r in results)
    separated = sum(any(t["beyond_spread"] for t in r["tasks"]) for r in results if r["verdict"] == "agrees")
    lines += [
        f"This run agrees with {agree} of {len(results)} findings"
        + (f"; {no_data} have no data (a setting or task without runs)" if no_data else "")
        + f". In {separated} of the agreeing ones at least one task's delta is beyond the seed spread.",
        "",
    ]
    for r in results:
        lines.append(f"## {r['text']}: {r['verdict']}")
        lines.append("")
        lines.append("| task | delta | seed spread | sign as the paper's | beyond spread |")
        lines.append("|---|---|---|---|---|")
        for t in r["tasks"]:
            if t["agrees"] is None:
                lines.append(f"| {t['task']} | no data | {MISSING} | {MISSING} | {MISSING} |")
                continue
            spread = "n/a (n=1)" if math.isnan(t["spread"]) else f"{t['spread']:.2f}"
            beyond = "n/a" if t["beyond_spread"] is None else "yes" if t["beyond_spread"] else "no"
            lines.append(
                f"| {t['task']} | {t['delta']:+.2f} | {spread} | {'yes' if t['agrees'] else 'no'} | {beyond} |"
            )
        gaps = [f"{t['task']} ({' and '.join(t['missing'])})" for t in r["tasks"] if t["missing"]]
        if gaps:
            measured = [t for t in r["tasks"] if t["agrees"] is not None]
            agreeing = "; the measured tasks agree in sign" if measured and r["verdict"] == "no data" else ""
            lines += ["", f"No runs with results for: {', '.join(gaps)}{agreeing}."]
        if r["largest_on"] and r["largest_ok"] is not None:
            lines.append("")
            lines.append(
                f"The paper says the gain is largest on {r['largest_on'].upper()}: "
                f"{'so it is here' if r['largest_ok'] else 'not so here'}."
            )
        lines.append("")
    io.write_text(out / "findings.md", "\n".join(lines))
    io.write_json(out / "findings.json", results, indent=2)


# ---- figures ---------------------------------------------------------------------------------


def figure_bars(table: pd.DataFrame, paper: dict, path: Path) -> None:
    settings = list(SETTINGS)
    fig, axes = plt.subplots(2, len(TABLE4_TASKS), figsize=(4 * len(TABLE4_TASKS), 6.5), squeeze=False)
    colours = plt.cm.viridis(np.linspace(0.1, 0.9, len(settings)))
    for k, task in enumerate(TABLE4_TASKS):
        means = [table.loc[s, f"{task}_mean"] for s in settings]
        stds = [0.0 if math.isnan(v) else v for v in (table.loc[s, f"{task}_std"] for s in settings)]  # n < 2: no bar
        axes[0, k].bar(settings, means, yerr=stds, color=colours, capsize=3)
        axes[0, k].set_title(f"ours: {TASKS[task].table4_title}")
        published = [paper["ablation_table4"]["rows"][s][k] for s in settings]
        axes[1, k].bar(settings, published, color=colours, alpha=0.8)
        axes[1, k].set_title(f"paper: {TASKS[task].table4_title}")
        for row in (0, 1):
            values = [v for v in (means if row == 0 else published) if not math.isnan(v)]
            if values:
                low = min(values) - 3 * (max(max(stds), 1e-9) if row == 0 else 1)
                # The top leaves room for the error bars, which a large seed spread makes long.
                tops = [m + s for m, s in zip(means, stds)] if row == 0 else values
                axes[row, k].set_ylim(max(0, low), max(t for t in tops if not math.isnan(t)) + 2)
            axes[row, k].tick_params(axis="x", rotation=45)
    axes[0, 0].set_ylabel("accuracy (%)")
    axes[1, 0].set_ylabel("accuracy (%)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def figure_heatmap(table: pd.DataFrame, paper: dict, path: Path) -> None:
    settings = [s for s in SETTINGS if s != "no_pretrain"]
    ours = np.array(
        [[table.loc[s, f"{t}_mean"] - table.loc["no_pretrain", f"{t}_mean"] for t in TABLE4_TASKS] for s in settings]
    )
    rows = paper["ablation_table4"]["rows"]
    theirs = np.array([[rows[s][k] - rows["no_pretrain"][k] for k in range(len(TABLE4_TASKS))] for s in settings])
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for ax, values, title in ((axes[0], ours, "ours"), (axes[1], theirs, "paper")):
        limit = np.nanmax(np.abs(values)) if np.isfinite(values).any() else 1.0
        image = ax.imshow(values, cmap="RdBu", vmin=-limit, vmax=limit)
        ax.set_xticks(range(len(TABLE4_TASKS)), [TASKS[t].table4_title for t in TABLE4_TASKS], rotation=30, ha="right")
        ax.set_yticks(range(len(settings)), settings)
        for i in range(len(settings)):
            for j in range(len(TABLE4_TASKS)):
                if np.isfinite(values[i, j]):
                    ax.text(j, i, f"{values[i, j]:+.1f}", ha="center", va="center", fontsize=8)
        ax.set_title(f"{title}: accuracy minus no_pretrain")
        fig.colorbar(image, ax=ax, shrink=0.8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def figure_sweeps(sweep_files: list[Path], path: Path) -> None:
    summaries = [json.loads(p.read_text()) for p in sweep_files if p.is_file()]
    tasks = sorted({s["task"] for s in summaries})
    fig, axes = plt.subplots(1, max(1, len(tasks)), figsize=(4 * max(1, len(tasks)), 3.6), squeeze=False)
    for k, task in enumerate(tasks):
        ax = axes[0, k]
        for s in sorted((s for s in summaries if s["task"] == task), key=lambda s: list(SETTINGS).index(s["setting"])):
            points = [(t["lr"], t["best_val_accuracy"]) for t in s["trials"] if t["best_val_accuracy"] is not None]
            if points:
                ax.plot(*zip(*sorted(points)), marker="o", label=s["setting"])
        ax.set_xscale("log")
        ax.set_title(f"LR sweep: {TASKS[task].title if task in TASKS else task} (val)")
        ax.set_xlabel("learning rate")
        ax.set_ylabel("best val accuracy (%)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def latest_pretraining(runs: pd.DataFrame) -> pd.DataFrame:
    """The latest pre-training run with results of each setting, in the study's order."""
    done = latest_results(runs, "pretrain")[0].set_index("setting")
    return done.reindex([s for s in SETTINGS if s in done.index]).reset_index()


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
    for _, run in latest_pretraining(runs).iterrows():
        grounding += [f"### {run['setting']}", "", *grounding_lines(run), ""]
    io.write_text(
        out / "pretraining.md",
        "# Pre-training: do the masked words use the image?\n\n"
        + "\n".join(lines)
        + "\n"
        + note
        + "\n"
        + "\n".join(grounding),
    )


def _value(run, key):
    value = run.get(key)
    return None if value is None or pd.isna(value) else float(value)


def grounding_lines(run) -> list[str]:
    """One setting's grounding probe, last epoch: a row per word kind, then the attention share."""
    if _value(run, f"ground_{GROUNDING_KINDS[0]}_own") is None:
        return ["Not measured (a run from before the grounding probe)."]
    lines = ["| kind | own (%) | other (%) | gain (points) | chance (%) | n |", "|---|---|---|---|---|---|"]
    for kind in GROUNDING_KINDS:
        own, other, chance, n = (_value(run, f"ground_{kind}_{k}") for k in ("own", "other", "chance", "n"))
        if own is not None:
            lines.append(f"| {kind} | {own:.1f} | {other:.1f} | {own - other:+.1f} | {chance:.1f} | {int(n)} |")
    share, uniform = _value(run, "attention_img_share"), _value(run, "attention_img_uniform")
    if share is not None:
        layers = []
        while (layer := _value(run, f"attention_img_share_layer{len(layers)}")) is not None:
            layers.append(layer)
        lines += [
            "",
            f"Attention on [IMG] (own image, mean over layers and heads): {share:.3f}, uniform "
            f"{uniform:.3f}; per layer: " + ", ".join(f"{v:.3f}" for v in layers) + ".",
        ]
    return lines


def figure_pretraining(uri: str, runs: pd.DataFrame, path: Path) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    fig, (loss_ax, gain_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for _, run in latest_pretraining(runs).iterrows():
        for ax, metric in ((loss_ax, "loss"), (gain_ax, "val_visual_clue_gain")):
            history = client.get_metric_history(run["run_id"], metric)
            if history:
                steps, values = zip(*sorted((m.step, m.value) for m in history))
                ax.plot(steps, values, label=run["setting"], marker="o" if metric != "loss" else None)
    loss_ax.set_xlabel("step")
    loss_ax.set_ylabel("pre-training loss (sum of the setting's losses)")
    loss_ax.set_title("Pre-training loss")
    gain_ax.axhline(0, color="grey", linewidth=0.8)
    gain_ax.set_xlabel("step (end of each epoch)")
    gain_ax.set_ylabel("own image minus another's (points)")
    gain_ax.set_title("Visual clue gain (val captions)")
    for ax in (loss_ax, gain_ax):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _per_epoch(client, run_id: str, metric: str) -> tuple[list, list]:
    """A validation metric's history against the epoch: the loop logs `epoch` at the same step."""
    epochs = {m.step: m.value for m in client.get_metric_history(run_id, "epoch")}
    points = sorted((epochs[m.step], m.value) for m in client.get_metric_history(run_id, metric) if m.step in epochs)
    return [e for e, _ in points], [v for _, v in points]


def figure_grounding(uri: str, runs: pd.DataFrame, path: Path) -> None:
    """Learning dynamics of grounding: per epoch and setting, each word kind's own-minus-other gain,
    and the masked words' attention share on [IMG] against its uniform share (dashed)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    fig, axes = plt.subplots(1, len(GROUNDING_KINDS) + 1, figsize=(4 * (len(GROUNDING_KINDS) + 1), 3.8))
    for _, run in latest_pretraining(runs).iterrows():
        colour = plt.cm.tab10(list(SETTINGS).index(run["setting"]) % 10)
        for ax, kind in zip(axes, GROUNDING_KINDS):
            epochs, values = _per_epoch(client, run["run_id"], f"val_ground_{kind}_gain")
            if epochs:
                ax.plot(epochs, values, marker="o", color=colour, label=run["setting"])
        epochs, values = _per_epoch(client, run["run_id"], "val_attention_img_share")
        if epochs:
            axes[-1].plot(epochs, values, marker="o", color=colour, label=run["setting"])
            axes[-1].plot(
                *_per_epoch(client, run["run_id"], "val_attention_img_uniform"), linestyle="--", color=colour
            )
    for ax, kind in zip(axes, GROUNDING_KINDS):
        ax.axhline(0, color="grey", linewidth=0.8)
        ax.set_title(f"{kind} words: own image minus another's")
        ax.set_ylabel("accuracy gain (points)")
    axes[-1].set_title("attention of masked words on [IMG]")
    axes[-1].set_ylabel("share (dashed: uniform)")
    for ax in axes:
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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


def write_detector(metrics_path, out: Path) -> None:
    """detector.md: the RoI detector's val mAP and how well it names ground-truth boxes per size,
    from the metrics `vlbert train-detector` wrote, so that a preset change that degrades the
    features every later stage reads shows in the report."""
    metrics_path = Path(metrics_path)
    lines = []
    if not metrics_path.is_file():
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


def write_report(
    uri: str, experiment: str, out, sweep_files: list[Path] = (), vcr_val=None, detector_metrics=None
) -> dict:
    """vcr_val: the VCR val.jsonl, whose labels Q->AR is scored against (no Q->AR without it).
    detector_metrics: `vlbert train-detector`'s metrics.json; by default results/<preset>/detector's,
    <preset> being the report folder's name (reports/<preset>), as the workflow lays them out."""
    out = Path(out)
    (out / "figures").mkdir(parents=True, exist_ok=True)
    paper = paper_numbers()
    runs = collect_runs(uri, experiment)
    if runs.empty:
        raise ValueError(f"MLflow experiment {experiment!r} has no runs yet")
    runs.sort_values(["stage", "setting", "task", "seed"], na_position="last").to_csv(out / "runs.csv", index=False)
    finetunes, finetune_notes = latest_results(runs, "finetune")
    pretrain_notes = latest_results(runs, "pretrain")[1]
    derived = (
        derive_q2ar(uri, finetunes, vcr_labels(vcr_val))
        if vcr_val and {"vcr_q2a", "vcr_qa2r"} <= set(finetunes["task"])
        else pd.DataFrame()
    )
    table = table4(finetunes)
    write_tables(table, paper, out, finetune_notes)
    if not derived.empty:
        q2ar = derived.groupby("setting")["val_accuracy"].agg(["mean", "std", "count"]).reindex(list(SETTINGS))
        lines = ["| setting | VCR Q->AR (val) |", "|---|---|"]
        lines += [
            f"| {s} | {_cell(r['mean'], r['std'], r['count'], int(q2ar['count'].max()))} |" for s, r in q2ar.iterrows()
        ]
        io.write_text(
            out / "vcr_q2ar.md", "# VCR Q->AR, from each seed's Q->A and QA->R runs\n\n" + "\n".join(lines) + "\n"
        )
    results = findings(table, paper)
    write_findings(results, out)
    figure_bars(table, paper, out / "figures" / "table4_bars.png")
    figure_heatmap(table, paper, out / "figures" / "delta_heatmap.png")
    figure_sweeps(list(sweep_files), out / "figures" / "lr_sweeps.png")
    write_pretraining(runs, out, pretrain_notes)
    figure_pretraining(uri, runs, out / "figures" / "pretraining_loss.png")
    figure_grounding(uri, runs, out / "figures" / "pretraining_grounding.png")
    write_detector(detector_metrics or Layout(out.name).detector / "metrics.json", out)
    return {
        "runs": len(runs),
        "finetune_runs": len(finetunes),
        "findings_agreeing": sum(r["verdict"] == "agrees" for r in results),
        "findings_no_data": sum(r["verdict"] == "no data" for r in results),
        "warnings": table_warnings(table) + finetune_notes + pretrain_notes,
    }
