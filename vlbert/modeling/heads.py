"""The heads, losses and outputs every model family shares.

Pre-training's heads and those of VQA, VCR and RefCOCO+ are written once, here, against the
readouts a family's `StudyPreTrainedModel` subclass provides (`word_states`, `relation_state`,
`answer_state`, `candidate_state`, `region_states`): a family's pre-training and task models are
its base class with one of these mixins, and nothing else. A task head is named `classifier` (a
`task_classifier`); the engine trains and standardises it by that name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.bert.modeling_bert import BertOnlyMLMHead
from transformers.utils import ModelOutput

from .configuration_study import StudyConfig

IGNORE_INDEX = -100


class MaskedRoIHead(nn.Module):
    def __init__(self, config: StudyConfig):
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
class StudyPreTrainingOutput(ModelOutput):
    """A pre-training model's output: the summed loss, each objective's loss by name, and each
    objective's logits (an empty tensor where a family has no such objective)."""

    loss: torch.Tensor | None = None
    losses: dict[str, torch.Tensor] | None = None
    mlm_logits: torch.Tensor | None = None  # [B, L, V]; with mlm_labels, [masked positions, V]
    roi_logits: torch.Tensor | None = None
    relation_logits: torch.Tensor | None = None


@dataclass
class StudyTaskOutput(ModelOutput):
    """A task model's output: the summed loss, each loss by name, and the task's logits."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    losses: dict[str, torch.Tensor] | None = None


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


def task_classifier(config: StudyConfig, outputs: int) -> nn.Sequential:
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


# ---- the task models, written once ------------------------------------------------------------
# Each mixin goes before a family's `StudyPreTrainedModel` subclass (`class XForVQA(VQAHeadMixin,
# XPreTrainedModel)`): it builds the family's encoder (`build_encoder`), then its own head, then
# `post_init` draws both in one pass, in that module order (the draws of the study's results).


class TaskHeadMixin:
    """What every task model does: hold its family's encoder under the family's prefix, build its
    head (`build_head`), and run the encoder on the study's inputs, a `StudyProcessor` batch
    (input_ids, token_type_ids, position_ids, attention_mask, visual_index, visual). A head's
    `forward` names its own inputs and targets and hands the rest to `encode_inputs`, which leaves
    out what the encoder does not read (another head's inputs: the batches share one layout)."""

    def __init__(self, config: StudyConfig):
        super().__init__(config)
        setattr(self, self.base_model_prefix, self.build_encoder(config))
        self.build_head(config)
        self.post_init()

    def build_head(self, config: StudyConfig) -> None:
        raise NotImplementedError

    def encode_inputs(
        self,
        input_ids,
        token_type_ids,
        position_ids,
        attention_mask,
        visual_index=None,
        visual=None,
        text_only=None,
        **_,
    ):
        """The encoder on a batch (a pre-training batch of the text corpus: no image, `text_only`)."""
        inputs = (input_ids, token_type_ids, position_ids, attention_mask, visual_index, visual, text_only)
        return self.base_model(*inputs)


class PreTrainingHeadMixin(TaskHeadMixin):
    """Pre-training: masked language modelling with visual clues (every family), masked region
    modelling where the family has it (`masked_region_loss`: VL-BERT's classification, ViLBERT's
    KL divergence; None: none, as Pixel-BERT's), and the sentence-image relation, a logit on the
    family's `relation_state` (mismatched captions: the collator's relation labels)."""

    masked_region_loss = None  # (logits, labels) -> loss or None: the family's masked region objective

    def __init_subclass__(cls, **kwargs):
        # Adapted from transformers.models.bert.modeling_bert.BertForPreTraining._tied_weights_keys:
        # the decoder is the word embedding matrix (under the family's prefix), and the head's
        # `bias` is the decoder's, stored once under the decoder's name (as checkpoints written
        # before this declaration have it).
        cls._tied_weights_keys = {
            "mlm.predictions.decoder.weight": f"{cls.base_model_prefix}.bert.embeddings.word_embeddings.weight",
            "mlm.predictions.bias": "mlm.predictions.decoder.bias",
        }
        super().__init_subclass__(**kwargs)

    def build_head(self, config: StudyConfig) -> None:
        self.mlm = BertOnlyMLMHead(config)
        if self.masked_region_loss is not None:
            self.roi_head = MaskedRoIHead(config)
        self.relation_head = nn.Linear(config.hidden_size, 1)

    # Copied from transformers.models.bert.modeling_bert.BertForPreTraining.get_output_embeddings with cls->mlm
    def get_output_embeddings(self):
        return self.mlm.predictions.decoder

    # Copied from transformers.models.bert.modeling_bert.BertForPreTraining.set_output_embeddings with cls->mlm
    def set_output_embeddings(self, new_embeddings):
        self.mlm.predictions.decoder = new_embeddings
        self.mlm.predictions.bias = new_embeddings.bias

    def forward(
        self, mlm_labels=None, roi_positions=None, roi_labels=None, relation_labels=None, **inputs
    ) -> StudyPreTrainingOutput:
        """mlm_labels [B, L]: the masked words' ids (IGNORE_INDEX elsewhere); with them, mlm_logits
        holds the masked positions alone, in `word_states`' order (the vocabulary projection is
        most of a step's cost, and most of its output would be thrown away). roi_positions [B, R]
        and roi_labels: the masked regions and their targets; relation_labels [B]: 1 where the
        caption is the image's, 0 where it is another's."""
        encoded = self.encode_inputs(**inputs)
        words, labels = self.word_states(encoded, mlm_labels)
        masked = labels != IGNORE_INDEX if labels is not None else None
        mlm_logits = self.mlm(words[masked] if masked is not None else words)
        regions = None
        if self.masked_region_loss is not None:
            regions = self.region_states(encoded, inputs.get("visual"), roi_positions)
        roi_logits = self.roi_head(regions) if regions is not None else words.new_zeros(0)
        relation_logits = self.relation_head(self.relation_state(encoded)).squeeze(-1)
        losses = {}
        if masked is not None and bool(masked.any()):
            losses["mlm"] = F.cross_entropy(mlm_logits, labels[masked])
        if regions is not None and roi_labels is not None:
            region_loss = self.masked_region_loss(roi_logits, roi_labels)
            if region_loss is not None:
                losses["masked_roi"] = region_loss
        relation = relation_loss(relation_logits, relation_labels)
        if relation is not None:
            losses["relation"] = relation
        loss = sum(losses.values()) if losses else None
        return StudyPreTrainingOutput(loss, losses, mlm_logits, roi_logits, relation_logits)


class VQAHeadMixin(TaskHeadMixin):
    """VQA: a classifier over the answer vocabulary on the family's answer state, trained with
    binary cross-entropy on the soft VQA scores."""

    def build_head(self, config: StudyConfig) -> None:
        if config.num_answers < 1:
            raise ValueError(f"{type(self).__name__} needs config.num_answers (the answer vocabulary size)")
        self.classifier = task_classifier(config, config.num_answers)

    def forward(self, answer_positions=None, answer_scores=None, **inputs) -> StudyTaskOutput:
        """answer_positions [B]: each item's answer slot (the families that read it there);
        answer_scores [B, answers]: the soft VQA scores, the target."""
        encoded = self.encode_inputs(**inputs)
        logits = self.classifier(self.answer_state(encoded, answer_positions))
        losses = {}
        if answer_scores is not None:
            losses["vqa"] = vqa_loss(logits, answer_scores)
        return StudyTaskOutput(losses.get("vqa"), logits, losses)


class VCRHeadMixin(TaskHeadMixin):
    """VCR: each of a question's candidates is one sequence; a score per candidate from its state,
    softmax over the candidates. A family whose `vcr_classifies_rois` is set (VL-BERT, as its
    paper) also classifies masked RoIs given `roi_positions` and `roi_labels`; the study's VCR
    batches carry no labels (a probe of it: reports/reference/mini/README.md)."""

    def build_head(self, config: StudyConfig) -> None:
        self.classifier = task_classifier(config, 1)
        if self.vcr_classifies_rois:
            self.roi_head = MaskedRoIHead(config)

    def forward(self, labels=None, roi_positions=None, roi_labels=None, num_choices: int = 4, **inputs):
        """Inputs are [B * num_choices, ...] (candidates of one question adjacent); labels [B]: the
        right candidate."""
        encoded = self.encode_inputs(**inputs)
        logits = candidate_logits(
            self.classifier, self.candidate_state(encoded), num_choices, self.config.centre_candidates
        )
        losses = {}
        if labels is not None:
            losses["choice"] = F.cross_entropy(logits, labels)
        if self.vcr_classifies_rois and roi_positions is not None and roi_labels is not None:
            roi_logits = self.roi_head(self.region_states(encoded, inputs["visual"], roi_positions))
            roi_loss = masked_roi_loss(roi_logits, roi_labels)
            if roi_loss is not None:
                losses["masked_roi"] = roi_loss
        return StudyTaskOutput(sum(losses.values()) if losses else None, logits, losses)


class RefCOCOHeadMixin(TaskHeadMixin):
    """RefCOCO+: a binary score per candidate region from its state; the prediction is the
    best-scoring region."""

    def build_head(self, config: StudyConfig) -> None:
        self.classifier = task_classifier(config, 1)

    def forward(self, roi_positions, roi_targets=None, **inputs) -> StudyTaskOutput:
        """roi_positions [B, R]: >= 0 for the candidate regions (the rows of `visual`), < 0 for rows
        that are none (padding, the whole image); roi_targets [B, R]: 1 where the region overlaps
        the referent with IoU >= 0.5, 0 for the other candidates, -1 elsewhere."""
        encoded = self.encode_inputs(**inputs)
        regions = self.region_states(encoded, inputs["visual"], roi_positions)
        if self.config.centre_candidates:
            regions = centre_regions(regions, roi_positions)
        logits = self.classifier(regions).squeeze(-1)
        logits = logits.masked_fill(roi_positions < 0, -math.inf)
        losses = {}
        if roi_targets is not None:
            losses["ref"] = referring_loss(logits, roi_targets)
        return StudyTaskOutput(losses.get("ref"), logits, losses)
