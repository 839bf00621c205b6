"""Validation of masked-word prediction in pre-training: the val captions scored with each
caption's own image and with another's, on the same masks (`visual_clue_accuracy`). The grounding
probe (grounding.py) pairs the captions with other images the same way (`other_image_order`)."""

from __future__ import annotations

import torch

from .device import move_to
from .seeding import batch_generator

IGNORE = -100


@torch.inference_mode()
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


def other_image_order(num_rois: list[int]) -> list[int]:
    """For each example, another example whose image has as many regions: each group of equal
    counts rolled by one. A caption then encodes to the same tokens with either image and draws
    the same masks. An example alone in its group keeps its own image."""
    groups: dict[int, list[int]] = {}
    for index, count in enumerate(num_rois):
        groups.setdefault(count, []).append(index)
    order = list(range(len(num_rois)))
    for members in groups.values():
        for index, other in zip(members, members[1:] + members[:1]):
            order[index] = other
    return order


def visual_clue_accuracy(model, own_batches, other_batches) -> dict:
    """Masked-word accuracy with each caption's own image and with another caption's, on the same
    masks. Their difference, `visual_clue_gain`, is what the image adds: 0 for a model that has
    not learnt to read it, whatever its accuracy on the words the text alone gives away."""
    own, other = masked_lm_accuracy(model, own_batches), masked_lm_accuracy(model, other_batches)
    return {
        **own,
        "mlm_accuracy_other_image": other["mlm_accuracy"],
        "visual_clue_gain": own["mlm_accuracy"] - other["mlm_accuracy"],
    }


class ValidationBatches:
    """Validation batches, collated each time they are iterated (collated once and kept, a real
    val set's features would sit in memory twice over), with the same masks every time: each
    batch's generator is seeded by its first example's index."""

    def __init__(self, examples: list[dict], collate, seed: int, batch_size: int):
        self.examples, self.collate, self.seed, self.batch_size = examples, collate, seed, batch_size

    def __iter__(self):
        for k in range(0, len(self.examples), self.batch_size):
            yield self.collate(self.examples[k : k + self.batch_size], batch_generator(self.seed, 0, k, "val"))


def validation_batches(val, collate, seed: int, batch_size: int) -> tuple[ValidationBatches, ValidationBatches]:
    """The validation batches with each caption's own image and with another's (same masks). The
    collator gives a setting that tunes Fast R-CNN the images, whose features it recomputes."""
    examples = [val[i] for i in range(len(val))]
    order = other_image_order([e["regions"].num_rois for e in examples])
    swapped = [{**e, "regions": examples[j]["regions"]} for e, j in zip(examples, order)]
    return ValidationBatches(examples, collate, seed, batch_size), ValidationBatches(
        swapped, collate, seed, batch_size
    )
