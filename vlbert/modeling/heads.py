"""The task heads, losses and outputs every model family shares: a family's task model names its
new head `classifier` (a `task_classifier`), and the engine trains and standardises it by that name."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .configuration_vlbert import VLBertConfig

IGNORE_INDEX = -100


class MaskedRoIHead(nn.Module):
    def __init__(self, config: VLBertConfig):
        super().__init__()
        # Adapted from transformers.models.bert.modeling_bert.BertPredictionHeadTransform (dense,
        # GELU, LayerNorm), then a classifier over the detector's classes.
        self.transform = nn.Sequential(
            nn.Linear(config.hidden_size, config.hidden_size),
            nn.GELU(),
            nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps),
        )
        self.classifier = nn.Linear(config.hidden_size, config.num_visual_classes)

    def forward(self, roi_hidden: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.transform(roi_hidden))


def masked_roi_loss(logits: torch.Tensor, labels: torch.Tensor | None) -> torch.Tensor | None:
    """labels: [B, R] class ids (IGNORE_INDEX where not masked), or [B, R, C] class distributions
    (all zeros where not masked): soft cross-entropy, as VL-BERT's released code trains it on the
    detector's class probabilities. The mean is over masked RoIs."""
    if labels is None:
        return None
    if labels.dim() == logits.dim():
        masked = labels.sum(-1) > 0
        if not bool(masked.any()):
            return None
        return -(labels[masked] * logits[masked].log_softmax(-1)).sum(-1).mean()
    if not bool((labels != IGNORE_INDEX).any()):
        return None
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)


def relation_loss(logits: torch.Tensor, labels: torch.Tensor | None) -> torch.Tensor | None:
    """Binary cross-entropy of the sentence-image relation (1: the caption is the image's, 0:
    another image's) over the examples that have one (label >= 0); None without any."""
    if labels is None or not bool((labels >= 0).any()):
        return None
    keep = labels >= 0
    return F.binary_cross_entropy_with_logits(logits[keep], labels[keep].float())


def vqa_loss(logits: torch.Tensor, answer_scores: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy on the soft VQA scores, summed over answers as VL-BERT does: the mean
    would shrink with the vocabulary."""
    return F.binary_cross_entropy_with_logits(logits, answer_scores) * answer_scores.shape[1]


def referring_loss(logits: torch.Tensor, roi_targets: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy per candidate region (targets 1 / 0; -1: not a candidate)."""
    keep = roi_targets >= 0
    return F.binary_cross_entropy_with_logits(logits[keep], roi_targets[keep].float())


@dataclass
class VLBertPreTrainingOutput:
    loss: torch.Tensor | None
    losses: dict[str, torch.Tensor]
    mlm_logits: torch.Tensor  # [B, L, V]; with mlm_labels, [masked positions, V]
    roi_logits: torch.Tensor
    relation_logits: torch.Tensor


@dataclass
class VLBertTaskOutput:
    loss: torch.Tensor | None
    logits: torch.Tensor
    losses: dict[str, torch.Tensor]


class HeadInputStandardiser(nn.Module):
    """(x - mean) / std per feature, with the fine-tuning set's statistics (buffers, saved with the
    weights; set by `vlbert.engine.head_input` before the first step). A pre-trained encoder's states
    share a large common part; what tells an item's candidates apart is small beside it, and a new
    head at its initial scale does not see it."""

    def __init__(self, size: int):
        super().__init__()
        self.register_buffer("mean", torch.zeros(size))
        self.register_buffer("std", torch.ones(size))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return (features - self.mean) / self.std


def candidate_logits(classifier: nn.Module, states: torch.Tensor, num_choices: int, centre: bool) -> torch.Tensor:
    """[B * num_choices, H] candidate states (a question's adjacent) to [B, num_choices] scores.
    `centre`: each state minus its question's mean over the candidates first. The candidates of a
    question share most of their state (its question, its image); a head that reads the whole state
    learns from that shared part slowly, and whether a run left chance depended on its seed."""
    if centre:
        grouped = states.view(-1, num_choices, states.shape[-1])
        states = (grouped - grouped.mean(1, keepdim=True)).flatten(0, 1)
    return classifier(states).view(-1, num_choices)


def centre_regions(states: torch.Tensor, roi_positions: torch.Tensor) -> torch.Tensor:
    """[B, R, H] region states to each candidate's state minus the mean of its item's candidates
    (rows whose roi_positions are >= 0); zeros elsewhere, as the padding the head's statistics
    leave out. What tells an image's regions apart, without the part they share (the expression,
    the image), which after pre-training can outweigh it many times."""
    candidates = (roi_positions >= 0).unsqueeze(-1).to(states.dtype)
    mean = (states * candidates).sum(1, keepdim=True) / candidates.sum(1, keepdim=True).clamp(min=1)
    return (states - mean) * candidates


def task_classifier(config: VLBertConfig, outputs: int) -> nn.Sequential:
    # As transformers' BertForSequenceClassification: its classifier_dropout, else the hidden dropout.
    dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
    layers = [
        nn.Dropout(dropout),
        nn.Linear(config.hidden_size, config.hidden_size),
        nn.GELU(),
        nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps),
        nn.Linear(config.hidden_size, outputs),
    ]
    if getattr(config, "standardise_head_input", False):
        layers.insert(0, HeadInputStandardiser(config.hidden_size))
    return nn.Sequential(*layers)
