"""Pre-training one setting of the ablation on <Caption, Image> pairs (+ the text-only corpus).

The setting (vlbert.study.registry) decides the tasks: masked language modelling with visual
clues always; masked RoI classification with linguistic clues (b, c, d, full); sentence-image
relation prediction with 50% mismatched captions (c); the text-only corpus mixed 1:1 per batch
(d, full); the Fast R-CNN tuned (full) or frozen.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import torch

from ..data.feature_store import FeatureStore
from ..modeling import VLBertForPreTraining
from .build import build_model
from .device import move_to
from .data import CaptionDataset, CorpusDataset, PretrainCollator, TextOnlyCollator, feature_mean
from .loop import LoopConfig, TrainingLoop, loop_speed
from .optim import build_optimizer, build_scheduler
from .seeding import batch_generator, epoch_order

IGNORE = -100


def _merge_losses(outputs: list) -> tuple[torch.Tensor, dict]:
    losses = {}
    for prefix, out in outputs:
        for name, value in out.losses.items():
            losses[f"{prefix}{name}"] = value
    return sum(losses.values()), losses


@torch.no_grad()
def masked_lm_accuracy(model, batches) -> dict:
    """Validation: masked-word accuracy and loss with visual clues, on fixed masks."""
    model.eval()
    device = next(model.parameters()).device
    right = total = 0
    loss_sum = 0.0
    for batch in batches:
        batch = move_to(batch, device)
        out = model(**batch)
        labels = batch["mlm_labels"][batch["mlm_labels"] != IGNORE]
        right += int((out.mlm_logits.argmax(-1) == labels).sum())
        total += len(labels)
        loss_sum += float(out.losses["mlm"]) * len(labels) if "mlm" in out.losses else 0.0
    return {"mlm_accuracy": 100 * right / max(total, 1), "mlm_loss": loss_sum / max(total, 1)}


def pretrain(preset: dict, setting, bert, detector_dir, data_root, features_dir, out, tracker, processor,
             device: str = "cpu", progress: bool = True, max_steps: int | None = None) -> dict:
    from .distributed import wrap
    if not setting.pretrains:
        raise ValueError(f"setting {setting.name!r} has no pre-training: fine-tune from the BERT init")
    seed, options = preset["seed"], preset["pretrain"]
    torch.manual_seed(seed)
    data_root, features_dir, out = Path(data_root), Path(features_dir), Path(out)
    max_rois = preset.get("model", {}).get("max_rois")
    captions = CaptionDataset(data_root / "conceptual_captions", "train",
                              FeatureStore(features_dir / "conceptual_captions.train.det.h5", preload=True), max_rois)
    model, report = build_model(VLBertForPreTraining, preset, bert, detector_dir, tune_frcnn=setting.tune_frcnn,
                                appearance_mean=feature_mean(captions[i]["regions"] for i in range(len(captions))))
    model.to(device)
    val = CaptionDataset(data_root / "conceptual_captions", "val",
                         FeatureStore(features_dir / "conceptual_captions.val.det.h5", preload=True), max_rois)
    corpus = CorpusDataset(data_root / "text_corpus" / "corpus.txt") if setting.text_corpus else None
    collate, text_collate = PretrainCollator(processor, setting, captions), TextOnlyCollator(processor)
    batch_size = options["batch_size"]
    batches = math.ceil(len(captions) / batch_size)
    epochs = int(options["epochs"])
    optimizer = build_optimizer(model, options)
    scheduler = build_scheduler(optimizer, options, epochs * batches, batches)
    tracker.log_params({"pretrain": options, "model": preset.get("model", {}), "setting": setting.__dict__,
                        "captions": len(captions), "passages": len(corpus) if corpus else 0,
                        "new_parameters": len(report["new"])})

    def make_batch(epoch, b):
        order = epoch_order(len(captions), seed, epoch)
        batch = {"caption": collate([captions[i] for i in order[b * batch_size:(b + 1) * batch_size]],
                                    batch_generator(seed, epoch, b))}
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

    # Validation masks are fixed: the same words masked after every epoch and in every setting.
    val_setting = dataclasses.replace(setting, masked_roi=False, sentence_image=False)
    val_collate = PretrainCollator(processor, val_setting, val)
    val_batches = [val_collate([val[i] for i in range(k, min(k + batch_size, len(val)))], batch_generator(seed, 0, k, "val"))
                   for k in range(0, len(val), batch_size)]
    if setting.tune_frcnn:  # a tuned Fast R-CNN no longer matches the cached features: recompute
        from .data import visual_batch
        for k, b in zip(range(0, len(val), batch_size), val_batches):
            b["visual"] = visual_batch([val[i]["regions"] for i in range(k, min(k + batch_size, len(val)))], with_images=True)

    loop = TrainingLoop(wrap(model, device), optimizer, scheduler,
                        LoopConfig(epochs, batches, max_steps=max_steps, **preset.get("training", {})), out, make_batch, loss_fn, tracker,
                        evaluate=lambda m: masked_lm_accuracy(m, val_batches), progress=progress)
    state = loop.fit()
    if max_steps is not None and state.step >= max_steps:
        return loop_speed(loop, batch_size)
    processor.save_pretrained(out / "best")
    return {"steps": state.step, "epochs": epochs, "val": state.history[-1] if state.history else {},
            **loop_speed(loop, batch_size)}
