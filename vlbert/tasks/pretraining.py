"""Pre-training's task adapter: caption and text-only examples, masked and batched.

The random choices (which words and RoIs to mask, which captions to mismatch) come from a
generator seeded by (seed, epoch, batch), so a resumed run makes the same choices as an
uninterrupted one; each kind from a stream of its own, and a caption's word draws do not depend on
how long its batch is padded, so every setting of one seed masks the same words of a caption it
shows as it is (common random numbers, docs/reproducibility.md).
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import torch
from torchvision.ops import nms

from ..data.feature_store import FeatureStore
from ..modeling.heads import IGNORE_INDEX
from ..modeling.processing_study import StudyProcessor, pad_batch
from .regions import Regions, regions_of, visual_batch

MASK_PROBABILITY = 0.15
# Masking's draws are made this wide (tokens a row; at least `max_text_length`), whatever a batch's
# padded length.
DRAW_WIDTH = 128
# ViLBERT's masked regions: a region overlapping a masked one this much (IoU) is zeroed as well, as
# the released multi-task code does, else it would carry the masked region's content.
OVERLAP_ZEROED = 0.4
# pretrain.curriculum counts an image's objects: its regions of at least this best class
# probability, and a region overlapping a likelier one over SAME_OBJECT_IOU as that one.
CURRICULUM_MIN_SCORE = 0.5
SAME_OBJECT_IOU = 0.5


def substreams(generator: torch.Generator, *names: str) -> dict[str, torch.Generator]:
    """One generator per kind of random choice, all seeded by `generator`'s first draw: settings that
    make different choices of some kinds (one mismatches captions, another does not) still make the
    same choices of the kinds they share (common random numbers: a paired difference of two
    settings cancels them)."""
    base = int(torch.randint(2**62, (1,), generator=generator))
    return {name: torch.Generator().manual_seed(zlib.crc32(f"{base}/{name}".encode())) for name in names}


def mask_tokens(
    input_ids: torch.Tensor, maskable: torch.Tensor, processor: StudyProcessor, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masking: 15% of maskable tokens; of those 80% [MASK], 10% a random word, 10% kept.
    Each kind of draw is made for a fixed width of tokens a row, so a row's choices do not depend on
    how long its batch is padded. Only words are maskable, and they sit in a row's first
    `max_text_length` tokens (the image's follow), inside that width."""
    rows, length = input_ids.shape
    width = max(DRAW_WIDTH, processor.max_text_length)
    if length > width and bool(maskable[:, width:].any()):
        raise ValueError(f"maskable tokens past the first {width} of a row: the words come first, then the image's")

    def draw(sampler):
        drawn = sampler((rows, width))
        if length <= width:
            return drawn[:, :length]
        return torch.cat([drawn, drawn.new_zeros(rows, length - width)], 1)  # past the words: never chosen

    chosen = (draw(lambda shape: torch.rand(shape, generator=generator)) < MASK_PROBABILITY) & maskable
    labels = torch.where(chosen, input_ids, IGNORE_INDEX)
    action = draw(lambda shape: torch.rand(shape, generator=generator))
    random_words = draw(
        lambda shape: torch.randint(processor.first_word_id, len(processor.tokenizer), shape, generator=generator)
    )
    masked_ids = torch.where(chosen & (action < 0.8), processor.mask_id, input_ids)
    masked_ids = torch.where(chosen & (action >= 0.8) & (action < 0.9), random_words, masked_ids)
    return masked_ids, labels


def _maskable(batch: dict, processor: StudyProcessor) -> torch.Tensor:
    ids = batch["input_ids"]
    special = (ids == processor.cls_id) | (ids == processor.sep_id) | (ids == processor.pad_id)
    special |= (ids == processor.img_token_id) | (ids == processor.end_token_id)
    return ~special & (batch["attention_mask"] == 1)


class CaptionDataset(torch.utils.data.Dataset):
    """Conceptual Captions with detected regions: <Caption, Image> pairs."""

    def __init__(self, root, split: str, store: FeatureStore, max_rois: int | None = None):
        from ..data.conceptual_captions import read_captions

        self.root = Path(root)
        self.captions = [
            c for c in read_captions(self.root / f"{split}.tsv") if str(c.image_path.relative_to(self.root)) in store
        ]
        self.store, self.max_rois = store, max_rois

    def __len__(self):
        return len(self.captions)

    def __getitem__(self, index):
        c = self.captions[index]
        return {
            "text": c.caption,
            "regions": regions_of(self.store, str(c.image_path.relative_to(self.root)), c.image_path, self.max_rois),
        }


def detected_objects(regions: Regions, min_score: float = CURRICULUM_MIN_SCORE) -> int:
    """The objects the detector found in an image: its regions (not the whole image) whose best
    class probability is at least `min_score`, boxes of one object under several classes
    (IoU over `SAME_OBJECT_IOU`) counted once."""
    if regions.probs is None:
        raise ValueError(f"{regions.image_path}: the feature store keeps no class probabilities to count objects by")
    scores = torch.from_numpy(regions.probs[1:, 1:].astype(np.float32)).max(1).values
    keep = scores >= min_score
    boxes = torch.from_numpy(regions.boxes[1:].astype(np.float32))[keep]
    return len(nms(boxes, scores[keep], SAME_OBJECT_IOU))


class CorpusDataset(torch.utils.data.Dataset):
    def __init__(self, path):
        from ..data.text_corpus import read_corpus

        self.passages = read_corpus(path)

    def __len__(self):
        return len(self.passages)

    def __getitem__(self, index):
        return {"text": self.passages[index]}


class PretrainCollator:
    """Caption batches with the setting's tasks: MLM with visual clues always, masked RoI
    classification and sentence-image mismatches when the setting has them."""

    def __init__(self, processor: StudyProcessor, setting, captions: CaptionDataset):
        self.processor, self.setting, self.captions = processor, setting, captions

    def __call__(self, examples: list[dict], generator: torch.Generator) -> dict:
        examples = list(examples)
        streams = substreams(generator, "relation", "words", "rois")
        relation = None
        if self.setting.sentence_image:
            # Half the captions are swapped for another image's: the relation head tells which.
            mismatch = torch.rand(len(examples), generator=streams["relation"]) < 0.5
            for k in torch.nonzero(mismatch).flatten().tolist():
                other = int(torch.randint(len(self.captions.captions), (1,), generator=streams["relation"]))
                examples[k] = {**examples[k], "text": self.captions.captions[other].caption}
            relation = (~mismatch).float()
        regions = [e["regions"] for e in examples]
        batch = pad_batch(
            [self.processor.encode(e["text"], num_rois=r.num_rois) for e, r in zip(examples, regions)],
            self.processor.pad_id,
        )
        maskable = _maskable(batch, self.processor)
        if relation is not None:  # a mismatched caption does not describe the image: no MLM there
            maskable &= relation.bool().unsqueeze(1)
        batch["input_ids"], batch["mlm_labels"] = mask_tokens(
            batch["input_ids"], maskable, self.processor, streams["words"]
        )
        masked_rois = None
        if self.setting.masked_roi:
            rows = batch["roi_positions"].shape[1]
            valid = batch["roi_positions"] >= 0
            masked_rois = (torch.rand(len(examples), rows, generator=streams["rois"]) < MASK_PROBABILITY) & valid
            if relation is not None:
                masked_rois &= relation.bool().unsqueeze(1)
            # The target is the detector's class distribution for the RoI (soft cross-entropy), as
            # in VL-BERT's released code; rows that are not masked get all zeros.
            targets = torch.zeros(len(examples), rows, regions[0].probs.shape[1])
            for k, r in enumerate(regions):
                targets[k, : len(r.probs)] = torch.from_numpy(r.probs)
            batch["roi_labels"] = targets * masked_rois.unsqueeze(-1)
        family = self.setting.model_family
        zeroed = masked_rois
        if masked_rois is not None and not family.masks_region_pixels:
            zeroed = masked_rois | overlapping(regions, masked_rois, batch["roi_positions"] >= 0)
        # Masked RoIs need their pixels zeroed, so VL-BERT recomputes their features from the
        # images; ViLBERT zeroes their features (and those of the regions overlapping them);
        # Pixel-BERT reads every image.
        batch["visual"] = visual_batch(
            regions,
            with_images=(masked_rois is not None and family.masks_region_pixels)
            or self.setting.tune_frcnn
            or family.reads_pixels,
            masked=zeroed,
            cached=not self.setting.tune_frcnn,
        )
        if relation is not None:
            batch["relation_labels"] = relation
        return batch


def overlapping(regions: list, masked: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """[B, R] the candidate rows whose box overlaps a masked row's by IoU > OVERLAP_ZEROED."""
    from torchvision.ops import box_iou

    out = torch.zeros_like(masked)
    for k, r in enumerate(regions):
        rows = len(r.boxes)
        if bool(masked[k, :rows].any()):
            boxes = torch.from_numpy(r.boxes).float()
            iou = box_iou(boxes, boxes[masked[k, :rows]])
            out[k, :rows] = (iou > OVERLAP_ZEROED).any(1) & candidates[k, :rows]
    return out


class TextOnlyCollator:
    def __init__(self, processor: StudyProcessor):
        self.processor = processor

    def __call__(self, examples: list[dict], generator: torch.Generator) -> dict:
        batch = pad_batch([self.processor.encode(e["text"]) for e in examples], self.processor.pad_id)
        batch["input_ids"], batch["mlm_labels"] = mask_tokens(
            batch["input_ids"], _maskable(batch, self.processor), self.processor, generator
        )
        batch["roi_positions"] = None
        return batch
