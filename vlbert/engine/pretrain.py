"""Pre-training one setting of the ablation on <Caption, Image> pairs (+ the text-only corpus).

The setting (vlbert.registry) decides the tasks: masked language modelling with visual
clues always; masked RoI classification with linguistic clues (b, c, d, full); sentence-image
relation prediction with 50% mismatched captions (c); the text-only corpus mixed 1:1 per batch
(d, full); the Fast R-CNN tuned (full) or frozen.

Validation (mlm_validation.py) scores the masked words of the val captions with each caption's own
image and with another's, on the same masks: the difference is how much the model reads the image
at all.
The grounding probe (vlbert.engine.grounding) does the same per word kind (colour, shape, size),
and measures the masked words' attention on the image.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import torch

from .. import modeling
from ..detection.identity import study_detector
from ..registry import PRETRAINING_STORES
from ..tasks.pretraining import CaptionDataset, CorpusDataset, PretrainCollator, TextOnlyCollator
from ..tasks.regions import feature_mean, features_path, open_store
from .build import build_model
from .callbacks import BestEpoch, Tracking
from .checkpoint import input_identity
from .context import TrainingContext
from .grounding import grounding_probe
from .loop import LoopConfig, LoopSteps, TrainingLoop, loading_options, loop_speed
from .mlm_validation import validation_batches, visual_clue_accuracy
from .optim import build_optimizer, build_scheduler
from .seeding import batch_generator, epoch_order
from .tuned_features import check_store_detector


def _merge_losses(outputs: list) -> tuple[torch.Tensor, dict]:
    losses = {}
    for prefix, out in outputs:
        for name, value in out.losses.items():
            losses[f"{prefix}{name}"] = value
    return sum(losses.values()), losses


def pretrain(context: TrainingContext, setting, out, max_steps: int | None = None) -> dict:
    """Pre-train `setting` from the BERT and the detector of `context.inputs` into `out`; a summary
    (with `max_steps`, only the loop's speed)."""
    from .distributed import wrap

    if not setting.pretrains:
        raise ValueError(f"setting {setting.name!r} has no pre-training: fine-tune from the BERT init")
    preset, processor, tracker, device = context.preset, context.processor, context.tracker, context.device
    bert, detector_dir = context.inputs.bert, context.inputs.detector_dir
    seed, options = preset["seed"], preset["pretrain"]
    torch.manual_seed(seed)
    data_root, features_dir, out = Path(context.inputs.data_root), Path(context.inputs.features_dir), Path(out)
    max_rois = preset.get("model", {}).get("max_rois")
    train_store, val_store = PRETRAINING_STORES["train"], PRETRAINING_STORES["val"]
    check_store_detector(
        [features_path(features_dir, s) for s in (train_store, val_store)], study_detector(preset, detector_dir)
    )
    captions = CaptionDataset(
        data_root / "conceptual_captions", train_store.split, open_store(features_dir, train_store), max_rois
    )
    # Pixel-BERT without pixel sampling keeps every pixel token (the preset's pixel_samples: with it).
    sampling = {"pixel_samples": 0} if setting.family == "pixelbert" and not setting.pixel_sampling else {}
    model, report = build_model(
        getattr(modeling, setting.model_family.pretraining_class),
        preset,
        bert,
        detector_dir,
        tune_frcnn=setting.tune_frcnn,
        **sampling,
        appearance_mean=feature_mean(captions[i]["regions"] for i in range(len(captions))),
    )
    model.to(device)
    val = CaptionDataset(
        data_root / "conceptual_captions", val_store.split, open_store(features_dir, val_store), max_rois
    )
    corpus = CorpusDataset(data_root / "text_corpus" / "corpus.txt") if setting.text_corpus else None
    collate, text_collate = PretrainCollator(processor, setting, captions), TextOnlyCollator(processor)
    batch_size = options["batch_size"]
    batches = math.ceil(len(captions) / batch_size)
    epochs = int(options["epochs"])
    optimizer = build_optimizer(model, options)
    scheduler = build_scheduler(optimizer, options, epochs * batches, batches)
    tracker.log_params(
        {
            "pretrain": options,
            "model": preset.get("model", {}),
            "setting": setting.__dict__,
            "captions": len(captions),
            "passages": len(corpus) if corpus else 0,
            "new_parameters": len(report["new"]),
        }
    )

    def make_batch(epoch, b):
        order = epoch_order(len(captions), seed, epoch)
        batch = {
            "caption": collate(
                [captions[i] for i in order[b * batch_size : (b + 1) * batch_size]], batch_generator(seed, epoch, b)
            )
        }
        if corpus is not None:  # the text-only corpus, 1:1 with the captions in every step
            text_order = epoch_order(len(corpus), seed, epoch, "text")
            picks = [text_order[(b * batch_size + k) % len(corpus)] for k in range(batch_size)]
            batch["text"] = text_collate([corpus[i] for i in picks], batch_generator(seed, epoch, b, "text"))
        return batch

    def loss_fn(model, batch):
        outputs = [("", model(**batch["caption"]))]
        if "text" in batch:
            outputs.append(("text_", model(**batch["text"])))
        return _merge_losses(outputs)

    # Validation masks are fixed: the same words masked after every epoch and in every setting,
    # scored with each caption's own image and with another's.
    val_setting = dataclasses.replace(setting, masked_roi=False, sentence_image=False)
    own_batches, other_batches = validation_batches(
        val, PretrainCollator(processor, val_setting, val), seed, batch_size
    )

    def evaluate(m):
        # Per word kind, with the own image and another's: the learning curve of grounding.
        return {
            **visual_clue_accuracy(m, own_batches, other_batches),
            **grounding_probe(m, processor, own_batches.collate, own_batches.examples, batch_size),
        }

    # What this run is made from: a checkpoint of any other run is not resumed.
    identity = {
        "stage": "pretrain",
        "setting": setting.name,
        "seed": seed,
        "preset": {key: preset.get(key) for key in ("model", "pretrain", "training")},
        "inputs": {
            "bert": input_identity(bert),
            "detector": input_identity(detector_dir),
            **{
                f"captions.{split}": input_identity(data_root / "conceptual_captions" / f"{split}.tsv")
                for split in ("train", "val")
            },
            **{
                f"store.{split}": input_identity(features_path(features_dir, store))
                for split, store in PRETRAINING_STORES.items()
            },
            "corpus": input_identity(data_root / "text_corpus" / "corpus.txt") if corpus else None,
        },
    }
    loop = TrainingLoop(
        wrap(model, device),
        optimizer,
        scheduler,
        LoopConfig(
            epochs,
            batches,
            max_steps=max_steps,
            progress=context.progress,
            **preset.get("training", {}),
            **loading_options(preset),
        ),
        out,
        LoopSteps(make_batch, loss_fn, evaluate),
        [Tracking(tracker), *context.callbacks, BestEpoch()],  # the last epoch's weights are the best
        identity=identity,
    )
    state = loop.fit()
    if max_steps is not None and state.step >= max_steps:
        return loop_speed(loop, batch_size)
    processor.save_pretrained(out / "best")
    return {
        "steps": state.step,
        "epochs": epochs,
        "val": state.history[-1] if state.history else {},
        **loop_speed(loop, batch_size),
    }
