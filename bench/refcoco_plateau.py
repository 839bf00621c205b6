"""Benchmark: when does a RefCOCO+ run leave the box-guess plateau, and what in its start decides it?

Every RefCOCO+ run starts at 20 to 28% val (what a guess from the boxes gets) and climbs once its
region scores read the expression. For each checkpoint given (`default`: the setting's own start
in the study, the BERT init for a setting that does not pre-train) this prints
  - for ViLBERT, the visual stream stage by stage on val: the spread of an image's candidate regions
    around their mean (what tells them apart) and how far a region's state moves when the
    expression is another one of the same image (what the text puts there);
  - per head (`--heads`: the head's rate factor, `+centre` for candidate regions centred on their
    image's mean, `+warmup<steps>` for the run's warm-up, else the section's; the preset's
    `finetune.refcoco.families.<family>` entry: `10+centre+warmup74`), one RefCOCO+ run a
    seed at one rate: the epoch its val first reaches --exit-at, its best epoch, test and
    shuffled-image accuracy; and per checkpoint and head the mean and spread over the seeds.
Run it in the study's folder (it reads results/<preset>/ as `vlbert finetune` does); runs already
done in --out (results/<preset>/bench_refcoco_plateau) are read, not run again.

    python bench/refcoco_plateau.py --config experiments/mini.yaml --setting vilbert --lr 5e-4 \
        --pretrained default results/mini/pretrain/vilbert/seed2/best --heads 1 10+centre 10+centre+warmup74
"""

from __future__ import annotations

import argparse
import hashlib
import re
from pathlib import Path

import pandas as pd
import torch
import yaml

# bench/ is the script's folder: tag_scale's way of running a variant's seeds is shared.
from tag_scale import DEFAULT, fine_tune, start_checkpoint, write_tables

TEXT_INPUTS = ("input_ids", "token_type_ids", "position_ids", "attention_mask", "visual_index")


def with_another_expression(examples: list[dict]) -> tuple[list[dict], list[int]]:
    """Each example that has one with the text of another expression of its image (another
    referent), and the indices of those examples."""
    by_image: dict = {}
    for k, e in enumerate(examples):
        by_image.setdefault(e["regions"].image_path, []).append(k)
    swapped, kept = [], []
    for k, e in enumerate(examples):
        same_image = by_image[e["regions"].image_path]
        others = [j for j in same_image if not torch.equal(examples[j]["targets"], e["targets"])]
        if others:
            swapped.append({**e, "text": examples[others[0]]["text"]})
            kept.append(k)
    return swapped, kept


@torch.no_grad()
def stage_states(model, task, examples) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The visual stream's region states [N, R, H] after each stage, and the candidate rows [N, R]."""
    encoder, states = model.vilbert, {}

    def keep(name, pick):
        def hook(module, args, out):  # returns None: the module's output stays as it is
            states[name] = pick(out)

        return hook

    stages = [("embeddings", encoder.region_embeddings, lambda o: o)]
    for k, (coattention, layer) in enumerate(zip(encoder.coattention_layers, encoder.visual_layers)):
        stages += [(f"co-attention {k}", coattention, lambda o: o[1]), (f"visual layer {k}", layer, lambda o: o)]
    hooks = [module.register_forward_hook(keep(name, pick)) for name, module, pick in stages]
    try:
        batch = task.collate(examples)
        encoder(*[batch[k] for k in TEXT_INPUTS], batch["visual"])
    finally:
        for hook in hooks:
            hook.remove()
    return states, batch["roi_targets"] >= 0


def visual_stream_table(model, task) -> pd.DataFrame:
    val = task.examples("val")
    swapped, kept = with_another_expression(val)
    own, candidates = stage_states(model, task, [val[k] for k in kept])
    other, _ = stage_states(model, task, swapped)
    rows = []
    for name, states in own.items():
        weights = candidates.unsqueeze(-1).float()
        mean = (states * weights).sum(1, keepdim=True) / weights.sum(1, keepdim=True)
        rows.append(
            {
                "stage": name,
                "regions_spread": float((states - mean).norm(dim=-1)[candidates].mean()),
                "expression_change": float((states - other[name]).norm(dim=-1)[candidates].mean()),
            }
        )
    return pd.DataFrame(rows).round(2)


def start_model(args, start: Path | None):
    from vlbert import tasks
    from vlbert.config import finetune_options, load_config
    from vlbert.engine.build import load_processor
    from vlbert.engine.finetune import head_overrides
    from vlbert.layout import Layout

    preset = load_config(args.config)
    results = Layout(preset["name"]).results
    processor = load_processor(results / "bert_init" / "bert", preset["model"]["max_text_length"])
    task = tasks.build("refcoco_det", processor, results / "data", args.features or results / "features", "vilbert")
    overrides = {**task.model_overrides(), **head_overrides(finetune_options(preset, "refcoco_det", "vilbert"), start)}
    return task.model_class.from_pretrained(start, **overrides, tune_frcnn=False).eval(), task


def parse_head(head: str) -> tuple[float, bool, int | None]:
    """`10+centre+warmup74` -> (10.0, True, 74): the head's rate factor, whether it reads centred
    candidates, and the run's warm-up steps (None: the section's)."""
    factor, *options = head.split("+")
    warmups = [int(o.removeprefix("warmup")) for o in options if re.fullmatch(r"warmup\d+", o)]
    if any(o != "centre" and not re.fullmatch(r"warmup\d+", o) for o in options) or len(warmups) > 1:
        raise SystemExit(f"--heads {head}: a rate factor, optionally followed by +centre and +warmup<steps>")
    return float(factor), "centre" in options, warmups[0] if warmups else None


def preset_with_head(args, family: str, head: str) -> Path:
    """A copy of the preset whose RefCOCO+ section gives `family` this head and warm-up (the
    family's entry; without +warmup the section's warm-up, not the entry's)."""
    factor, centre, warmup = parse_head(head)
    config = yaml.safe_load(args.config.read_text())
    entry = config["finetune"]["refcoco"].setdefault("families", {}).setdefault(family, {})
    entry |= {"head_lr_factor": factor, "centre_candidates": centre}
    entry.pop("warmup_steps", None)
    if warmup is not None:
        entry["warmup_steps"] = warmup
    folder = args.out / "presets"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"preset_{family}_head_{head}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def fine_tune_head(args, family: str, checkpoint: str, head: str) -> list[dict]:
    """One run per seed (those without metrics run), in a folder named by everything that makes it
    (the preset's text included: a run of an edited preset is not read in its place)."""
    start = checkpoint if checkpoint == DEFAULT else str(Path(checkpoint).resolve())
    made_of = f"{args.setting}|{args.lr}|{args.features}|{start}|{args.config.read_text()}"
    key = hashlib.sha256(made_of.encode()).hexdigest()[:10]
    out = args.out / f"{args.setting}_lr{args.lr:g}_{key}" / f"head_{head}"
    return fine_tune(args, checkpoint, preset_with_head(args, family, head), out, f"head {head}")


def exit_epoch(metrics: dict, exit_at: float) -> int | None:
    """The first epoch (from 1) whose val accuracy reaches `exit_at`; None if none does."""
    return next((k + 1 for k, epoch in enumerate(metrics["val_history"]) if epoch["accuracy"] >= exit_at), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True, help="the study's preset")
    parser.add_argument("--setting", default="vilbert")
    parser.add_argument("--pretrained", nargs="+", default=[DEFAULT], help=f"checkpoint folders, or {DEFAULT}")
    parser.add_argument(
        "--heads", nargs="+", default=["1", "10+centre+warmup74"], help="rate factor[+centre][+warmup<steps>]"
    )
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--exit-at", type=float, default=40.0, help="val accuracy that counts as off the plateau")
    parser.add_argument("--features", type=Path, help="feature stores (default: the study's, as the DAG)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, help="runs and tables (default: results/<preset>/bench_refcoco_plateau)")
    parser.set_defaults(task="refcoco_det")
    args = parser.parse_args()
    from vlbert.layout import Layout
    from vlbert.registry import setting as registered

    preset = yaml.safe_load(args.config.read_text())["name"]
    args.out = args.out or Layout(preset).results / "bench_refcoco_plateau"
    family = registered(args.setting).family

    rows = []
    for checkpoint in args.pretrained:
        start = start_checkpoint(checkpoint, args.setting, preset)
        if family == "vilbert" and start is not None:
            print(f"{checkpoint}: the visual stream on val (an image's regions; another expression of the image)")
            print(visual_stream_table(*start_model(args, start)).to_string(index=False))
        for head in args.heads:
            for metrics in fine_tune_head(args, family, checkpoint, head):
                rows.append(
                    {
                        "checkpoint": checkpoint,
                        "head": head,
                        "seed": metrics["seed"],
                        "exit_epoch": exit_epoch(metrics, args.exit_at),
                        "best_epoch": metrics["best_epoch"],
                        "test": metrics["test"]["accuracy"],
                        "shuffled": metrics["test_shuffled_images"]["accuracy"],
                    }
                )
    runs = pd.DataFrame(rows)
    summary = runs.groupby(["checkpoint", "head"], sort=False).agg(
        exit_mean=("exit_epoch", "mean"),
        exit_latest=("exit_epoch", "max"),
        never_left=("exit_epoch", lambda epochs: int(epochs.isna().sum())),
        test_mean=("test", "mean"),
        test_std=("test", "std"),
        shuffled_mean=("shuffled", "mean"),
    )
    title = f"{args.setting} refcoco_det at lr {args.lr:g}, seeds {args.seeds} (exit: val >= {args.exit_at:g}):"
    write_tables(args.out, runs, summary, title, show_runs=True)


if __name__ == "__main__":
    main()
