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
done in --out (results/<preset>/bench_tag_scale) are read, not run again.

    python bench/tag_scale.py --config experiments/mini.yaml --setting d --lr 5e-4 \
        --pretrained results/mini/pretrain/d/best other/results/mini/pretrain/d/best --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd
import yaml

TEXT_SCALE = "vlbert.visual_embeddings.text_scale"
DEFAULT = "default"  # the setting's own start, as `vlbert finetune` takes it without --pretrained


def words_scale(checkpoint: str) -> float | None:
    """The visual-embedding scale a checkpoint's words learnt (None: no checkpoint)."""
    if checkpoint == DEFAULT:
        return None
    from safetensors import safe_open

    with safe_open(str(Path(checkpoint) / "model.safetensors"), "pt") as weights:
        return float(weights.get_tensor(TEXT_SCALE))


def preset_with_switch(preset: Path, on: bool, folder: Path) -> Path:
    """A copy of the preset whose VCR fine-tuning has `tags_at_region_scale` set to `on`."""
    config = yaml.safe_load(preset.read_text())
    config["finetune"]["vcr"]["tags_at_region_scale"] = on
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"preset_tags_at_region_scale_{str(on).lower()}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def fine_tune(args, checkpoint: str, on: bool, out: Path) -> list[dict]:
    """One run per seed (those without metrics), then every seed's metrics."""
    from vlbert.cli import main

    todo = [s for s in args.seeds if not (out / args.task / f"seed{s}" / "metrics.json").exists()]
    if todo:
        command = ["finetune", "--config", str(preset_with_switch(args.config, on, args.out / "presets"))]
        command += ["--setting", args.setting, "--task", args.task, "--lr", str(args.lr)]
        command += ["--seed", *map(str, todo), "--out", str(out), "--threads", str(args.threads)]
        command += ["--quiet", "--no-tracking"]
        if checkpoint != DEFAULT:
            command += ["--pretrained", checkpoint]
        if args.features:
            command += ["--features", str(args.features)]
        if main(command) != 0:
            raise SystemExit(f"fine-tuning from {checkpoint} (tags_at_region_scale={on}) failed: see above")
    return [json.loads((out / args.task / f"seed{s}" / "metrics.json").read_text()) for s in args.seeds]


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
    if args.out is None:  # inside the ignored results folder, not the repository's root
        from vlbert.layout import Layout

        args.out = Layout(yaml.safe_load(args.config.read_text())["name"]).results / "bench_tag_scale"

    rows = []
    for k, checkpoint in enumerate(args.pretrained):
        scale = words_scale(checkpoint)
        for on in (False, True):
            out = args.out / f"checkpoint{k}" / f"tags_at_region_scale_{str(on).lower()}"
            for metrics in fine_tune(args, checkpoint, on, out):
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
    runs.to_csv(args.out / "runs.csv", index=False)
    summary = (
        runs.groupby(["checkpoint", "words_scale", "tags_at_region_scale"], dropna=False, sort=False)
        .agg(test_mean=("test", "mean"), test_std=("test", "std"), shuffled_mean=("shuffled", "mean"))
        .round(2)
        .reset_index()
    )
    summary.to_csv(args.out / "summary.csv", index=False)
    with pd.option_context("display.width", 160, "display.max_colwidth", 60):
        print(f"{args.setting} {args.task} at lr {args.lr}, seeds {args.seeds}:")
        print(summary.to_string(index=False))


if __name__ == "__main__":
    main()
