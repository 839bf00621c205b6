"""Benchmark: does a VCR cell follow which way its setting's one pre-training went, and does a tag
that takes its object at the region's scale (`finetune.vcr.tags_at_region_scale`) stop that?

A VCR tag word reads its object through the visual embedding it is given. At the words' learnt
scale (VL-BERT's released code) that scale is the one pre-training learnt on the whole image alone;
at the region's scale it is the scale every [IMG] element is read at. For each pre-trained
checkpoint given (two pre-training seeds of one setting, say; `default`: the setting's own start
in the study, the BERT init for `no_pretrain`), this fine-tunes a VCR task with the switch off and on, at
one rate, for each seed, and prints the checkpoint's learnt words' scale, each run's test and
shuffled-image accuracy, and per checkpoint and switch the mean and spread over the seeds.
Run it in the study's folder (it reads results/<preset>/ as `vlbert finetune` does); runs already
done in --out (results/<preset>/bench_tag_scale, one folder per setting, task, rate, checkpoint and
switch) are read, not run again.

    python bench/tag_scale.py --config experiments/mini.yaml --setting d --lr 5e-4 \
        --pretrained results/mini/pretrain/d/best other/results/mini/pretrain/d/best --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import pandas as pd
import yaml

TEXT_SCALE = "vlbert.visual_embeddings.text_scale"
DEFAULT = "default"  # the setting's own start, as `vlbert finetune` takes it without --pretrained


def start_checkpoint(checkpoint: str, setting: str, preset: str) -> Path | None:
    """The folder a run starts from: the one given, or for `default` the setting's pre-training
    checkpoint in the study (None for a setting that does not pre-train: it starts from BERT)."""
    from vlbert.layout import Layout
    from vlbert.registry import setting as registered

    if checkpoint != DEFAULT:
        return Path(checkpoint)
    return Layout(preset).pretrained(setting) if registered(setting).pretrains else None


def words_scale(start: Path | None) -> float:
    """The visual-embedding scale a checkpoint's words learnt (0 for BERT: VL-BERT starts it at 0)."""
    if start is None:
        return 0.0
    from safetensors import safe_open

    with safe_open(str(start / "model.safetensors"), "pt") as weights:
        return float(weights.get_tensor(TEXT_SCALE))


def run_folder(args, checkpoint: str, on: bool) -> Path:
    """Where one (start, rate, switch) pair's seeds run: named by everything that makes the run, so
    that a run of another rate, setting or checkpoint is never read in its place."""
    start = checkpoint if checkpoint == DEFAULT else str(Path(checkpoint).resolve())
    key = hashlib.sha256(f"{args.setting}|{args.task}|{args.lr}|{args.features}|{start}".encode()).hexdigest()[:10]
    return args.out / f"{args.setting}_{args.task}_lr{args.lr:g}_{key}" / f"tags_at_region_scale_{str(on).lower()}"


def preset_with_switch(preset: Path, on: bool, folder: Path) -> Path:
    """A copy of the preset whose VCR fine-tuning has `tags_at_region_scale` set to `on`."""
    config = yaml.safe_load(preset.read_text())
    config["finetune"]["vcr"]["tags_at_region_scale"] = on
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"preset_tags_at_region_scale_{str(on).lower()}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def fine_tune(args, checkpoint: str, preset: Path, out: Path, label: str) -> list[dict]:
    """One run of args.task per seed from `checkpoint` with `preset`, each in out/seed<N> (those
    without metrics run), then every seed's metrics; `label` names the variant in an error.
    bench/refcoco_plateau.py runs its variants with it too."""
    from vlbert.cli import main

    for seed in args.seeds:
        if (out / f"seed{seed}" / "metrics.json").exists():
            continue
        command = ["finetune", "--config", str(preset), "--setting", args.setting, "--task", args.task]
        command += ["--lr", str(args.lr), "--seed", str(seed), "--out", str(out / f"seed{seed}")]
        command += ["--threads", str(args.threads), "--quiet", "--no-tracking"]
        if checkpoint != DEFAULT:
            command += ["--pretrained", checkpoint]
        if args.features:
            command += ["--features", str(args.features)]
        if main(command) != 0:
            raise SystemExit(f"fine-tuning from {checkpoint} ({label}, seed {seed}) failed")
    return [json.loads((out / f"seed{s}" / "metrics.json").read_text()) for s in args.seeds]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True, help="the study's preset")
    parser.add_argument("--setting", required=True)
    parser.add_argument("--pretrained", nargs="+", required=True, help=f"checkpoint folders, or {DEFAULT}")
    parser.add_argument("--task", default="vcr_q2a", choices=["vcr_q2a", "vcr_qa2r"])
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--features", type=Path, help="feature stores (default: the setting's, as the DAG)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, help="runs and tables (default: results/<preset>/bench_tag_scale)")
    args = parser.parse_args()
    preset = yaml.safe_load(args.config.read_text())["name"]
    if args.out is None:  # inside the ignored results folder, not the repository's root
        from vlbert.layout import Layout

        args.out = Layout(preset).results / "bench_tag_scale"

    rows = []
    for checkpoint in args.pretrained:
        scale = words_scale(start_checkpoint(checkpoint, args.setting, preset))
        for on in (False, True):
            preset = preset_with_switch(args.config, on, args.out / "presets")
            runs = fine_tune(args, checkpoint, preset, run_folder(args, checkpoint, on), f"tags_at_region_scale={on}")
            for metrics in runs:
                rows.append(
                    {
                        "checkpoint": checkpoint,
                        "words_scale": scale,
                        "tags_at_region_scale": on,
                        "seed": metrics["seed"],
                        "test": metrics["test"]["accuracy"],
                        "shuffled": metrics["test_shuffled_images"]["accuracy"],
                    }
                )
    runs = pd.DataFrame(rows)
    summary = runs.groupby(["checkpoint", "words_scale", "tags_at_region_scale"], dropna=False, sort=False).agg(
        test_mean=("test", "mean"), test_std=("test", "std"), shuffled_mean=("shuffled", "mean")
    )
    write_tables(args.out, runs, summary, f"{args.setting} {args.task} at lr {args.lr}, seeds {args.seeds}:")


def write_tables(out: Path, runs: pd.DataFrame, summary: pd.DataFrame, title: str, show_runs: bool = False) -> None:
    """runs.csv and summary.csv (rounded, its groups as columns) in `out`; then the title and the
    summary (the runs first, with `show_runs`) on the terminal."""
    summary = summary.round(2).reset_index()
    out.mkdir(parents=True, exist_ok=True)
    runs.to_csv(out / "runs.csv", index=False)
    summary.to_csv(out / "summary.csv", index=False)
    with pd.option_context("display.width", 160, "display.max_colwidth", 60):
        print(title)
        if show_runs:
            print(runs.to_string(index=False))
        print(summary.to_string(index=False))


if __name__ == "__main__":
    main()
