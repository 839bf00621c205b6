"""Examples for every stage, read with the data set readers and the HDF5 feature stores.

An example is a plain dict: text (a string or a list of `Word`s with object references), the
image's regions (row 0: the whole image) and the targets. Collators turn a list of them into
model inputs; the random choices of pre-training (which words and RoIs to mask, which captions
to mismatch) come from a generator seeded by (seed, epoch, batch), so a resumed run makes the
same choices as an uninterrupted one.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..data.feature_store import FeatureStore
from ..data.images import load_image
from ..modeling.modeling_vlbert import IGNORE_INDEX, VisualInputs
from ..modeling.processing_vlbert import VLBertProcessor, pad_batch

MASK_PROBABILITY = 0.15


@dataclass
class Regions:
    boxes: np.ndarray  # [R+1, 4]
    labels: np.ndarray  # [R+1] detector class ids
    features: np.ndarray  # [R+1, D]
    box_ids: np.ndarray  # [R+1]
    width: int
    height: int
    image_path: Path | None = None
    probs: np.ndarray | None = None  # [R+1, C+1] the detector's class distribution (column 0: background)

    @property
    def num_rois(self) -> int:
        return len(self.boxes) - 1


def regions_of(store: FeatureStore, key: str, image_path: Path | None = None, max_rois: int | None = None) -> Regions:
    item = store[key]
    rows = slice(None) if max_rois is None else slice(0, max_rois + 1)
    return Regions(
        item["boxes"][rows],
        item["labels"][rows],
        item["features"][rows],
        item["box_ids"][rows],
        item["width"],
        item["height"],
        image_path,
        item["probs"][rows],
    )


def feature_mean(regions: Iterable[Regions], limit: int = 20_000) -> torch.Tensor:
    """The mean appearance feature over every row (the whole image and its RoIs) of the first
    `limit` examples' regions, each counted as often as training sees it: what the visual
    embeddings centre the features on."""
    rows = [r.features for r in itertools.islice(regions, limit)]
    if not rows:
        raise ValueError("no images to take the appearance features' mean from")
    return torch.from_numpy(np.concatenate(rows).astype(np.float64).mean(0)).float()


def visual_batch(
    regions: list[Regions], with_images: bool = False, masked: torch.Tensor | None = None, cached: bool = True
) -> VisualInputs:
    """The regions as model inputs. `with_images`: the images too, for the Fast R-CNN module;
    `cached`: the stores' features hold for this model (not for a Fast R-CNN tuned since), so that
    only the images with a masked RoI need the module."""
    rois = max(len(r.boxes) for r in regions)
    n = len(regions)
    boxes = torch.zeros(n, rois, 4)
    features = torch.zeros(n, rois, regions[0].features.shape[1])
    valid = torch.zeros(n, rois, dtype=torch.bool)
    for k, r in enumerate(regions):
        boxes[k, : len(r.boxes)] = torch.from_numpy(r.boxes)
        features[k, : len(r.boxes)] = torch.from_numpy(r.features)
        valid[k, : len(r.boxes)] = True
    sizes = torch.tensor([[r.width, r.height] for r in regions])
    # With cached features the Fast R-CNN sees only the images that have a masked RoI: load just those.
    needed = masked.any(1).tolist() if cached and masked is not None else [True] * n
    images = [load_image(r.image_path) if need else None for r, need in zip(regions, needed)] if with_images else None
    return VisualInputs(boxes, sizes, valid, features if cached else None, images, masked)


# ---- pre-training ----------------------------------------------------------------------------


def mask_tokens(
    input_ids: torch.Tensor, maskable: torch.Tensor, processor: VLBertProcessor, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masking: 15% of maskable tokens; of those 80% [MASK], 10% a random word, 10% kept."""
    chosen = (torch.rand(input_ids.shape, generator=generator) < MASK_PROBABILITY) & maskable
    labels = torch.where(chosen, input_ids, IGNORE_INDEX)
    action = torch.rand(input_ids.shape, generator=generator)
    random_words = torch.randint(
        processor.first_word_id, len(processor.tokenizer), input_ids.shape, generator=generator
    )
    masked_ids = torch.where(chosen & (action < 0.8), processor.mask_id, input_ids)
    masked_ids = torch.where(chosen & (action >= 0.8) & (action < 0.9), random_words, masked_ids)
    return masked_ids, labels


def _maskable(batch: dict, processor: VLBertProcessor) -> torch.Tensor:
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

    def __init__(self, processor: VLBertProcessor, setting, captions: CaptionDataset):
        self.processor, self.setting, self.captions = processor, setting, captions

    def __call__(self, examples: list[dict], generator: torch.Generator) -> dict:
        examples = list(examples)
        relation = None
        if self.setting.sentence_image:
            # Half the captions are swapped for another image's: the relation head tells which.
            mismatch = torch.rand(len(examples), generator=generator) < 0.5
            for k in torch.nonzero(mismatch).flatten().tolist():
                other = int(torch.randint(len(self.captions.captions), (1,), generator=generator))
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
        batch["input_ids"], batch["mlm_labels"] = mask_tokens(batch["input_ids"], maskable, self.processor, generator)
        masked_rois = None
        if self.setting.masked_roi:
            rows = batch["roi_positions"].shape[1]
            valid = batch["roi_positions"] >= 0
            masked_rois = (torch.rand(len(examples), rows, generator=generator) < MASK_PROBABILITY) & valid
            if relation is not None:
                masked_rois &= relation.bool().unsqueeze(1)
            # The target is the detector's class distribution for the RoI (soft cross-entropy), as
            # in VL-BERT's released code; rows that are not masked get all zeros.
            targets = torch.zeros(len(examples), rows, regions[0].probs.shape[1])
            for k, r in enumerate(regions):
                targets[k, : len(r.probs)] = torch.from_numpy(r.probs)
            batch["roi_labels"] = targets * masked_rois.unsqueeze(-1)
        # Masked RoIs need their pixels zeroed, so features are recomputed from the images.
        batch["visual"] = visual_batch(
            regions,
            with_images=masked_rois is not None or self.setting.tune_frcnn,
            masked=masked_rois,
            cached=not self.setting.tune_frcnn,
        )
        if relation is not None:
            batch["relation_labels"] = relation
        return batch


class TextOnlyCollator:
    def __init__(self, processor: VLBertProcessor):
        self.processor = processor

    def __call__(self, examples: list[dict], generator: torch.Generator) -> dict:
        batch = pad_batch([self.processor.encode(e["text"]) for e in examples], self.processor.pad_id)
        batch["input_ids"], batch["mlm_labels"] = mask_tokens(
            batch["input_ids"], _maskable(batch, self.processor), self.processor, generator
        )
        batch["roi_positions"] = None
        return batch
