"""The report's figures (matplotlib, no display): Table 4 against the paper, the sweeps' curves,
and pre-training's loss, visual clue gain and grounding over training."""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: the study runs without a display
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ...registry import SETTINGS, TABLE4_SETTINGS, TABLE4_TASKS, TASKS
from .read import grounding_kinds, history, latest_pretraining, per_epoch


def figure_bars(table: pd.DataFrame, paper: dict, path: Path) -> None:
    settings = list(TABLE4_SETTINGS)
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
    settings = [s for s in TABLE4_SETTINGS if s != "no_pretrain"]
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


def figure_pretraining(uri: str, runs: pd.DataFrame, path: Path) -> None:
    fig, (loss_ax, gain_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for _, run in latest_pretraining(runs).iterrows():
        for ax, metric in ((loss_ax, "loss"), (gain_ax, "val_visual_clue_gain")):
            points = history(uri, run["run_id"], metric)
            if points:
                steps, values = zip(*points)
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


def figure_grounding(uri: str, runs: pd.DataFrame, path: Path) -> None:
    """Learning dynamics of grounding: per epoch and setting, each word kind's own-minus-other gain,
    and the masked words' attention share on [IMG] against its uniform share (dashed)."""
    kinds = grounding_kinds(runs)
    fig, axes = plt.subplots(1, len(kinds) + 1, figsize=(4 * (len(kinds) + 1), 3.8), squeeze=False)
    axes = list(axes[0])
    for _, run in latest_pretraining(runs).iterrows():
        colour = plt.cm.tab10(list(SETTINGS).index(run["setting"]) % 10)
        for ax, kind in zip(axes, kinds):
            epochs, values = per_epoch(uri, run["run_id"], f"val_ground_{kind}_gain")
            if epochs:
                ax.plot(epochs, values, marker="o", color=colour, label=run["setting"])
        epochs, values = per_epoch(uri, run["run_id"], "val_attention_img_share")
        if epochs:
            axes[-1].plot(epochs, values, marker="o", color=colour, label=run["setting"])
            axes[-1].plot(*per_epoch(uri, run["run_id"], "val_attention_img_uniform"), linestyle="--", color=colour)
    for ax, kind in zip(axes, kinds):
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


def figure_fractions(fractions: pd.DataFrame, path: Path) -> None:
    """Pre-training's gain (full minus no_pretrain) against the share of each training set, with
    its 95% interval as a band."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for task, rows in fractions.groupby("task", sort=False):
        rows = rows.sort_values("fraction")
        x = 100 * rows["fraction"]
        ax.plot(x, rows["gap"], marker="o", label=TASKS[task].title)
        ax.fill_between(x, rows["low"], rows["high"], alpha=0.12)
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set_xscale("log")
    shares = sorted({round(100 * f) for f in fractions["fraction"]})
    ax.set_xticks(shares, [f"{v}%" for v in shares])
    ax.set_xlabel("share of the fine-tuning training set")
    ax.set_ylabel("full - no_pretrain (points)")
    ax.set_title("Pre-training's gain against fine-tuning data")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
