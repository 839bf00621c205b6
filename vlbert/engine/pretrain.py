"""Pre-training one setting of the ablation on <Caption, Image> pairs (+ the text-only corpus).

The setting (vlbert.registry) decides the tasks: masked language modelling with visual
clues always; masked RoI classification with linguistic clues (b, c, d, full); sentence-image
relation prediction with 50% mismatched captions (c); the text-only corpus mixed 1:1 per batch
(d, full); the Fast R-CNN tuned (full) or frozen.

Validation (mlm_validation.py) scores the masked words of the val captions with each caption's own
image and with another's, on the same masks: the difference is how much the model reads the image
at all.
The grounding probe (vlbert.engine.grounding) does the same per word kind the captions' folder
names (the synthetic world's colour, shape and size), and measures the masked words' attention on
the image.

`PretrainStage` is the stage (stage.py); `pretrain` runs it.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import torch

from ..config import pretrain_curriculum
from ..data.conceptual_captions import WORD_KINDS_FILE, read_word_kinds
from ..detection.identity import study_detector
from ..registry import PRETRAINING_STORES, family_class
from ..tasks.pretraining import (
    CURRICULUM_MIN_SCORE,
    CaptionDataset,
    CorpusDataset,
    PretrainCollator,
    TextOnlyCollator,
    detected_objects,
)
from ..tasks.regions import feature_mean, features_path, open_store
from .build import build_model
from .checkpoint import dataset_digest, input_identity
from .context import TrainingContext
from .distributed import is_main_process
from .grounding import grounding_probe
from .mlm_validation import validation_batches, visual_clue_accuracy
from .optim import build_optimizer, build_scheduler
from .seeding import batch_generator, epoch_order
from .stage import Stage, run_stage
from .tuned_features import check_store_detector


def _merge_losses(outputs: list) -> tuple[torch.Tensor, dict]:
    losses = {}
    for prefix, out in outputs:
        for name, value in out.losses.items():
            losses[f"{prefix}{name}"] = value
    return sum(losses.values()), losses


class PretrainStage(Stage):
    """Pre-training `setting` from the BERT and the detector of `context.inputs` into `out`. Every
    epoch is validated; the last epoch's weights are the ones kept (best/, with the tokenizer)."""

    def __init__(self, context: TrainingContext, setting, out, seed: int | None = None):
        if not setting.pretrains:
            raise ValueError(f"setting {setting.name!r} has no pre-training: fine-tune from the BERT init")
        self.context, self.preset, self.device = context, context.preset, context.device
        self.setting, self.out = setting, Path(out)
        # Another seed than the preset's: a fine-tuning seed's own pre-training (pretrain.per_seed).
        self.seed = context.preset["seed"] if seed is None else seed

    def setup_data(self) -> None:
        preset, processor, setting = self.preset, self.context.processor, self.setting
        detector_dir = self.context.inputs.detector_dir
        self.options = options = preset["pretrain"]
        self.precision = options.get("precision")
        data_root, features_dir = Path(self.context.inputs.data_root), Path(self.context.inputs.features_dir)
        max_rois = preset.get("model", {}).get("max_rois")
        train_store, val_store = PRETRAINING_STORES["train"], PRETRAINING_STORES["val"]
        check_store_detector(
            [features_path(features_dir, s) for s in (train_store, val_store)], study_detector(preset, detector_dir)
        )
        self.captions = captions = CaptionDataset(
            data_root / "conceptual_captions", train_store.split, open_store(features_dir, train_store), max_rois
        )
        self.curriculum = pretrain_curriculum(preset, setting.name)  # its settings checked before the build
        val = CaptionDataset(
            data_root / "conceptual_captions", val_store.split, open_store(features_dir, val_store), max_rois
        )
        self.corpus = CorpusDataset(data_root / "text_corpus" / "corpus.txt") if setting.text_corpus else None
        # The grounding probe's words (None: the captions name none, and no probe runs).
        self.word_kinds = read_word_kinds(data_root / "conceptual_captions")
        if self.word_kinds is None and is_main_process():
            print(f"no {WORD_KINDS_FILE} in {data_root / 'conceptual_captions'}: no grounding probe", file=sys.stderr)
        if self.curriculum is not None:
            # Images with one object (or few): there a masked colour or shape word has one answer.
            most = self.curriculum["max_objects"]
            min_score = self.curriculum.get("min_score", CURRICULUM_MIN_SCORE)
            objects = [detected_objects(captions[i]["regions"], min_score) for i in range(len(captions))]
            self.few_object = [i for i, count in enumerate(objects) if count <= most]
            if not self.few_object:
                raise ValueError(f"pretrain.curriculum: no training caption's image has at most {most} objects")
        self.collate, self.text_collate = PretrainCollator(processor, setting, captions), TextOnlyCollator(processor)
        self.batch_size = batch_size = options["batch_size"]
        self.batches_per_epoch = math.ceil(len(captions) / batch_size)
        self.epochs = int(options["epochs"])
        # Validation masks are fixed: the same words masked after every epoch and in every setting,
        # scored with each caption's own image and with another's.
        val_setting = dataclasses.replace(setting, masked_roi=False, sentence_image=False)
        self.own_batches, self.other_batches = validation_batches(
            val, PretrainCollator(processor, val_setting, val), self.seed, batch_size
        )

    def setup_model(self) -> None:
        setting, captions, options = self.setting, self.captions, self.options
        model, self.report = build_model(
            family_class(setting.model_family, setting.model_family.pretraining_class),
            self.preset,
            self.context.inputs.bert,
            self.context.inputs.detector_dir,
            tune_frcnn=setting.tune_frcnn,
            **setting.pretraining_overrides,
            appearance_mean=feature_mean(captions[i]["regions"] for i in range(len(captions))),
            image_paths=(c.image_path for c in captions.captions),
        )
        self.model = model.to(self.device)
        # A pixel-sampling setting's first epochs without sampling (pixel_sampling_warmup_epochs).
        self.sampling_warmup = getattr(model.config, "pixel_sampling_warmup_epochs", 0)
        if getattr(model.config, "pixel_samples", 0) and self.sampling_warmup >= int(options["epochs"]):
            raise ValueError(
                f"model.{setting.family}.pixel_sampling_warmup_epochs ({self.sampling_warmup}) must be under "
                f"pretrain.epochs ({options['epochs']}): {setting.name} would never sample its pixels"
            )

    def setup_optimizer(self) -> None:
        self.optimizer = build_optimizer(self.model, self.options)
        self.scheduler = build_scheduler(
            self.optimizer, self.options, self.epochs * self.batches_per_epoch, self.batches_per_epoch
        )

    def params(self) -> dict:
        return {
            "pretrain": self.options,
            "model": self.preset.get("model", {}),
            "setting": self.setting.__dict__,
            "captions": len(self.captions),
            "passages": len(self.corpus) if self.corpus else 0,
            "new_parameters": len(self.report["new"]),
            **({"few_object_captions": len(self.few_object)} if self.curriculum is not None else {}),
        }

    def make_batch(self, epoch, b):
        seed, batch_size, captions, corpus = self.seed, self.batch_size, self.captions, self.corpus
        if self.curriculum is not None and epoch < self.curriculum["epochs"]:
            picks = self._few_object_picks(epoch, b)
        else:
            picks = epoch_order(len(captions), seed, epoch)[b * batch_size : (b + 1) * batch_size]
        batch = {"caption": self.collate([captions[i] for i in picks], batch_generator(seed, epoch, b))}
        if epoch < self.sampling_warmup:
            batch["caption"]["pixel_samples"] = 0  # every pixel token this step
        if corpus is not None:  # the text-only corpus, 1:1 with the captions in every step
            text_order = epoch_order(len(corpus), seed, epoch, "text")
            picks = [text_order[(b * batch_size + k) % len(corpus)] for k in range(batch_size)]
            batch["text"] = self.text_collate([corpus[i] for i in picks], batch_generator(seed, epoch, b, "text"))
        return batch

    def _few_object_picks(self, epoch: int, b: int) -> list[int]:
        """Batch b of a curriculum epoch: as many steps as a whole epoch, each over the few-object
        captions, passing over them in a fresh order each time round."""
        size, n = self.batch_size, len(self.few_object)
        orders, picks = {}, []
        for position in range(b * size, (b + 1) * size):
            round_, k = divmod(position, n)
            if round_ not in orders:
                orders[round_] = epoch_order(n, self.seed, epoch, f"curriculum{round_}")
            picks.append(self.few_object[orders[round_][k]])
        return picks

    def training_step(self, model, batch):
        outputs = [("", model(**batch["caption"]))]
        if "text" in batch:
            outputs.append(("text_", model(**batch["text"])))
        return _merge_losses(outputs)

    def validate(self, model):
        # Per word kind, with the own image and another's: the learning curve of grounding.
        own, processor = self.own_batches, self.context.processor
        metrics = visual_clue_accuracy(model, own, self.other_batches)
        if self.word_kinds:
            metrics |= grounding_probe(model, processor, own.collate, own.examples, self.word_kinds, self.batch_size)
        return metrics

    def datasets(self):
        # The captions' feature stores (their content's digest names them) and the text corpus.
        features_dir, data_root = Path(self.context.inputs.features_dir), Path(self.context.inputs.data_root)
        stores = [
            (f"captions {s.split}", features_path(features_dir, s), c)
            for s, c in ((PRETRAINING_STORES["train"], "training"), (PRETRAINING_STORES["val"], "validation"))
        ]
        if self.corpus is not None:
            stores.append(("text corpus", data_root / "text_corpus" / "corpus.txt", "training"))
        return [
            {"name": name, "digest": dataset_digest(path), "source": str(path), "context": context, "profile": {}}
            for name, path, context in stores
        ]

    def identity(self) -> dict:
        # What this run is made from: a checkpoint of any other run is not resumed.
        preset, inputs = self.preset, self.context.inputs
        data_root, features_dir = Path(inputs.data_root), Path(inputs.features_dir)
        return {
            "stage": "pretrain",
            "setting": self.setting.name,
            "seed": self.seed,
            # pretrain.per_seed says which pre-trainings the study makes, not what one is made from.
            "preset": {
                "model": preset.get("model"),
                "pretrain": {k: v for k, v in preset["pretrain"].items() if k != "per_seed"},
                "training": preset.get("training"),
            },
            "inputs": {
                "bert": input_identity(inputs.bert),
                "detector": input_identity(inputs.detector_dir),
                **{
                    f"captions.{split}": input_identity(data_root / "conceptual_captions" / f"{split}.tsv")
                    for split in ("train", "val")
                },
                **{
                    f"store.{split}": input_identity(features_path(features_dir, store))
                    for split, store in PRETRAINING_STORES.items()
                },
                "corpus": input_identity(data_root / "text_corpus" / "corpus.txt") if self.corpus else None,
            },
        }

    def result(self, state, speed):
        """The tokenizer beside the weights in best/; a summary: steps, epochs, the last validation."""
        self.context.processor.save_pretrained(self.out / "best")
        summary = {
            "steps": state.step,
            "epochs": self.epochs,
            "val": state.history[-1] if state.history else {},
            **speed,
        }
        return summary, {}


def pretrain(context: TrainingContext, setting, out, max_steps: int | None = None, seed: int | None = None) -> dict:
    """Pre-train `setting` from the BERT and the detector of `context.inputs` into `out` with `seed`
    (default: the preset's); a summary (with `max_steps`, only the loop's speed)."""
    stage = PretrainStage(context, setting, out, seed)
    return run_stage(
        stage, context.tracker, progress=context.progress, callbacks=context.callbacks, max_steps=max_steps
    )
