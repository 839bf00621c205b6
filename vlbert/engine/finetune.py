"""Fine-tuning one (setting, task, learning rate, seed) with the paper's protocol.

The model starts from the setting's pre-trained checkpoint (no_pretrain: from the BERT init and
the detector). Every epoch is scored on val; the best epoch's weights are kept; the test split
is scored once, on them. Predictions are written as `vlbert evaluate` reads them, and metrics.json
holds the final figures, the chosen epoch, the seed and the learning rate.

`FinetuneStage` is the stage (stage.py) for every task family: what differs between them is the
task adapter's (vlbert.tasks: examples, collation, predictions, score); `finetune` runs it.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from transformers import PretrainedConfig

from .. import io, tasks
from ..config import finetune_epochs, finetune_options
from ..detection.identity import study_detector
from ..registry import FAMILIES
from ..tasks.regions import feature_mean, features_path, with_other_images
from ..tracking import (
    BEST_EPOCH_METRIC,
    PARAMETERS_METRIC,
    SHUFFLED_IMAGES_SPLIT,
    TRAINABLE_PARAMETERS_METRIC,
    final_metric,
)
from .build import build_model
from .checkpoint import dataset_digest, input_identity
from .context import TrainingContext
from .device import move_to
from .distributed import is_main_process, world_size
from .head_input import fit_head_standardisers
from .optim import build_optimizer, build_scheduler
from .seeding import epoch_order, training_subset
from .stage import Stage, run_stage
from .tuned_features import check_store_features

# Training items the head's input statistics are taken on (standardise_head_input).
HEAD_STATISTICS_ROWS = 2048
# The task model's config switches a preset's fine-tuning section turns on (off where it is silent).
HEAD_SWITCHES = ("standardise_head_input", "centre_candidates", "tags_at_region_scale", "tag_coattention_mask")


def head_overrides(options: dict, start) -> dict:
    """The task model's config fields a preset's fine-tuning section sets: the head's standardised
    input, VCR's centred candidates, its tags at their regions' scale or pointing at their regions
    in co-attention (whichever its family's config has), and the body's dropout
    (`dropout`; the new head keeps the start's, as transformers' classifier_dropout does).
    `start`: the checkpoint fine-tuning starts from."""
    # Each switch set either way: a start whose config has one on (a fine-tuned checkpoint) keeps it
    # only where the preset says so.
    overrides = {switch: bool(options.get(switch, False)) for switch in HEAD_SWITCHES}
    if "dropout" in options:
        start_config, _ = PretrainedConfig.get_config_dict(str(start))
        head = start_config.get("classifier_dropout")
        overrides |= {
            "hidden_dropout_prob": options["dropout"],
            "attention_probs_dropout_prob": options["dropout"],
            "classifier_dropout": start_config.get("hidden_dropout_prob", 0.1) if head is None else head,
        }
    return overrides


@torch.inference_mode()
def predict(model, task, examples: list[dict], batch_size: int) -> list[dict]:
    model.eval()
    device = next(model.parameters()).device
    predictions = []
    for k in range(0, len(examples), batch_size):
        chunk = examples[k : k + batch_size]
        predictions += task.predictions(model(**move_to(task.collate(chunk), device)), chunk)
    return predictions


class FinetuneStage(Stage):
    """Fine-tuning `setting` on `task_name` with `lr` and `seed` into `out`, through the task's
    adapter (vlbert.tasks). The best validation epoch (accuracy) is kept; the test split is scored
    once, on it (unless `score_test` is False, as in a sweep's trials)."""

    select_metric = "accuracy"

    def __init__(
        self,
        context: TrainingContext,
        setting,
        task_name: str,
        lr: float,
        seed: int,
        out,
        score_test: bool = True,
        train_fraction: float = 1.0,
    ):
        self.context, self.preset, self.device = context, context.preset, context.device
        self.setting, self.task_name, self.lr, self.seed = setting, task_name, lr, seed
        self.out, self.score_test, self.train_fraction = Path(out), score_test, train_fraction

    def setup_data(self) -> None:
        preset, inputs, setting = self.preset, self.context.inputs, self.setting
        if world_size() > 1 and is_main_process():
            print(f"data-parallel fine-tuning: {world_size()} processes")
        if setting.pretrains and inputs.pretrained is None:
            raise ValueError(f"setting {setting.name!r} fine-tunes from its pre-trained checkpoint: give --pretrained")
        # A Fast R-CNN tuned in pre-training no longer matches the detector's features: such a setting
        # reads the stores its frozen copy made (`vlbert tune-features`), every other one the detector's.
        self.task = task = tasks.build(
            self.task_name, self.context.processor, inputs.data_root, inputs.features_dir, setting.family
        )
        check_store_features(
            setting, task.store_paths(), inputs.pretrained, study_detector(preset, inputs.detector_dir)
        )
        train, self.val = task.examples("train"), task.examples("val")
        full_train = len(train)
        if self.train_fraction < 1:
            train = [train[i] for i in training_subset(len(train), self.train_fraction)]
        self.train = train
        self.options = options = finetune_options(preset, self.task_name, setting.family)
        self.batch_size = batch_size = options["batch_size"]
        self.batches_per_epoch = batches = math.ceil(len(train) / batch_size)
        # A fraction of the data gets the whole set's steps: more epochs over fewer examples.
        self.epochs = epochs = max(
            1, round(finetune_epochs(preset, self.task_name) * math.ceil(full_train / batch_size) / batches)
        )
        # ... and is validated as often as the whole set's run, at the same steps: a fraction's
        # run would otherwise spend most of its time scoring val, and choose among more epochs.
        self.validate_every = max(1, epochs // finetune_epochs(preset, self.task_name))

    def setup_model(self) -> None:
        inputs, setting, task, options = self.context.inputs, self.setting, self.task, self.options
        pretrained = inputs.pretrained
        start = pretrained if setting.pretrains else inputs.bert
        overrides = {**task.model_overrides(), **head_overrides(options, start)}
        if FAMILIES[setting.family].reads_pixels and "cnn_trainable_layers" in options:
            overrides["cnn_trainable_layers"] = options["cnn_trainable_layers"]
        if setting.pretrains:
            # The features stay centred on the pre-training images' mean, saved with the weights.
            model = task.model_class.from_pretrained(pretrained, **overrides, tune_frcnn=False)
            # Modules pre-training's objective shaped that the task should not start from.
            model.reinitialise(options.get("reinitialise", {}).get(setting.family, []))
        else:
            model, _ = build_model(
                task.model_class,
                self.preset,
                inputs.bert,
                inputs.detector_dir,
                **overrides,
                appearance_mean=feature_mean(e["regions"] for e in self.train),
                image_paths=(e["regions"].image_path for e in self.train),
            )
        self.model = model.to(self.device)
        # Before the first step and again on a resume, where the checkpoint's copy of them replaces them.
        statistics_batches = min(self.batches_per_epoch, math.ceil(HEAD_STATISTICS_ROWS / self.batch_size))
        fit_head_standardisers(self.model, (self.make_batch(0, b) for b in range(statistics_batches)))

    def setup_optimizer(self) -> None:
        options = self.options
        self.optimizer = build_optimizer(self.model, options, self.lr)
        # Step decay epochs scale with the schedule (0.5x epochs: decays at half the epochs too).
        factor = self.epochs / options["epochs"]
        scaled = {**options, "step_epochs": [max(1, round(e * factor)) for e in options.get("step_epochs", [])]}
        batches = self.batches_per_epoch
        self.scheduler = build_scheduler(self.optimizer, scaled, self.epochs * batches, batches)

    def params(self) -> dict:
        return {
            "finetune": {**self.options, "lr": self.lr, "epochs_run": self.epochs},
            "seed": self.seed,
            "train_fraction": self.train_fraction,
            "train_examples": len(self.train),
            "val_examples": len(self.val),
        }

    def datasets(self):
        # The feature store each split reads: its content's digest (as the run's identity has it) names it.
        splits = {"train": ("training", len(self.train)), "val": ("validation", len(self.val))}
        if self.score_test:
            splits["test"] = ("test", None)
        return [
            {
                "name": f"{self.task_name} {split}"
                + (f" ({self.train_fraction:.0%})" if split == "train" and self.train_fraction < 1 else ""),
                "digest": dataset_digest(path),
                "source": str(path),
                "context": context,
                "profile": {"items": items, "train_fraction": self.train_fraction} if items else {},
            }
            for split, (context, items) in splits.items()
            for path in [features_path(self.context.inputs.features_dir, self.task.spec.stores[split])]
        ]

    def make_batch(self, epoch, b):
        order = epoch_order(len(self.train), self.seed, epoch)
        return self.task.collate([self.train[i] for i in order[b * self.batch_size : (b + 1) * self.batch_size]])

    def training_step(self, model, batch):
        out = model(**batch)
        return out.loss, out.losses

    def validate(self, model):
        # n: the items the score rests on (a sweep weighs two rates' scores by their standard error).
        return {**self.task.score(predict(model, self.task, self.val, self.batch_size), "val"), "n": len(self.val)}

    def identity(self) -> dict:
        # What this run is made from: a checkpoint of any other run (another rate, seed, preset value,
        # starting checkpoint or store) is not resumed, a sweep trial's included (--continue-trial).
        preset, inputs, setting = self.preset, self.context.inputs, self.setting
        return {
            "stage": "finetune",
            "setting": setting.name,
            "task": self.task_name,
            "lr": self.lr,
            "seed": self.seed,
            **({"train_fraction": self.train_fraction} if self.train_fraction < 1 else {}),
            "preset": {
                "model": preset.get("model"),
                "training": preset.get("training"),
                "finetune": {"epoch_factor": preset["finetune"].get("epoch_factor", 1.0), **self.options},
            },
            "inputs": {
                "start": input_identity(inputs.pretrained if setting.pretrains else inputs.bert),
                "detector": None if setting.pretrains else input_identity(inputs.detector_dir),
                **{f"store.{path.name}": input_identity(path) for path in self.task.store_paths()},
            },
        }

    def result(self, state, speed):
        """The best epoch's predictions and figures on val (and test: its own images, and shuffled
        among the questions), written to `out` with metrics.json."""
        if not is_main_process():
            return {}, {}
        task, out, batch_size, val = self.task, self.out, self.batch_size, self.val
        best = task.model_class.from_pretrained(out / "best").to(self.device)
        val_predictions = predict(best, task, val, batch_size)
        io.write_json(out / "predictions_val.json", val_predictions)
        test, test_shuffled, test_examples = {}, {}, []
        if self.score_test:  # sweeps select on val and never get here; the chosen runs look at test once
            test_examples = task.examples("test")
            test_predictions = predict(best, task, test_examples, batch_size)
            io.write_json(out / "predictions_test.json", test_predictions)
            test = task.score(test_predictions, "test")
            # The same checkpoint with the test images shuffled among the questions: the image's share.
            test_shuffled = task.score(
                predict(best, task, with_other_images(test_examples, self.seed), batch_size), "test"
            )
        metrics = {
            "setting": self.setting.name,
            "task": self.task_name,
            "seed": self.seed,
            "lr": self.lr,
            "train_fraction": self.train_fraction,
            "train_examples": len(self.train),
            "best_epoch": state.best_epoch + 1,
            "epochs": self.epochs,
            "val": task.score(val_predictions, "val"),
            "test": test,
            "test_shuffled_images": test_shuffled,
            "test_items": len(test_examples),  # what the test figures' standard errors rest on
            "val_history": state.history,
            "data_wait_share": round(speed["data_wait_share"], 4),
        }
        io.write_json(out / "metrics.json", metrics, indent=2)
        final = {
            BEST_EPOCH_METRIC: metrics["best_epoch"],
            PARAMETERS_METRIC: sum(p.numel() for p in best.parameters()),
            TRAINABLE_PARAMETERS_METRIC: sum(p.numel() for p in self.model.parameters() if p.requires_grad),
            **{final_metric("val", k): v for k, v in metrics["val"].items()},
            **{final_metric("test", k): v for k, v in test.items()},
            **({final_metric("test", "n"): len(test_examples)} if self.score_test else {}),
            **{final_metric(SHUFFLED_IMAGES_SPLIT, k): v for k, v in test_shuffled.items()},
        }
        return metrics, final


def finetune(  # noqa: PLR0913 - a run's identity: what it trains, how long, on which share of the data
    context: TrainingContext,
    setting,
    task_name: str,
    lr: float,
    seed: int,
    out,
    max_steps: int | None = None,
    score_test: bool = True,
    train_fraction: float = 1.0,
) -> dict:
    """Fine-tune `setting` on `task_name` with `lr` and `seed` into `out`; its metrics (with
    `max_steps`, only the loop's speed). `train_fraction`: train on that share of the training set
    (training_subset) for as many steps as the whole set gets, so that fractions differ in data,
    not in compute."""
    stage = FinetuneStage(context, setting, task_name, lr, seed, out, score_test, train_fraction)
    # A sweep's Ray reporting (context.callbacks) comes before the best epoch is saved.
    return run_stage(
        stage, context.tracker, progress=context.progress, callbacks=context.callbacks, max_steps=max_steps
    )
