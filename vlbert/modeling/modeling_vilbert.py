"""ViLBERT (Lu et al., NeurIPS 2019): two streams, words and regions, joined by co-attention.

The text stream is BERT (the same layers and initialisation as VL-BERT's encoder); the visual
stream has its own transformer layers over the regions, the first of which is `[IMG]`: the mean
of the image's region features with the whole-image box, as the released code adds it. In a
co-attention layer each stream's queries attend to the other stream's keys and values, each
direction with its own projections, output, residual and LayerNorm, then each stream's
feed-forward block. The layers interleave as the released code's `t_biattention_id` /
`v_biattention_id` say (ViLBertConfig).

The model reads the batches VL-BERT's heads read (vlbert.modeling.processing_study's layout):
the text stream takes the words and special tokens of the sequence, not its `[IMG]` / `[END]`
elements, and the visual stream takes the rows of `VisualInputs` (row 0 becomes `[IMG]`).

Reading order: region embeddings, the co-attention layer, `ViLBertPreTrainedModel` (the builder's
hooks and the readouts the task heads take), `ViLBertModel`, the pre-training model, then the task
models: heads.py's heads on ViLBERT's readouts. Weight init, BERT loading and checkpoints are every
family's (`StudyPreTrainedModel`, pretrained.py), as are `VisualInputs` (inputs.py) and the heads
and losses (heads.py): nothing is imported from VL-BERT's modeling module.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import BertModel
from transformers.masking_utils import create_bidirectional_mask
from transformers.models.bert.modeling_bert import (
    BertAttention,
    BertIntermediate,
    BertLayer,
    BertOutput,
)

from .configuration_vilbert import ViLBertConfig
from .heads import PreTrainingHeadMixin, RefCOCOHeadMixin, VCRHeadMixin, VQAHeadMixin
from .inputs import VisualInputs
from .pretrained import StudyPreTrainedModel

# Added to a tag word's co-attention score on its own region (tag_coattention_mask): the released
# code's `extended_co_attention_mask = co_attention_mask * 5.0`.
TAG_COATTENTION_BIAS = 5.0


class ViLBertRegionEmbeddings(nn.Module):
    """Per region: LayerNorm(Linear(appearance - appearance_mean) + Linear(5-d box)), the box as
    corners over the image size and the area fraction (the released code's `image_location`).
    Row 0, `[IMG]`, takes the mean appearance of the image's regions that are not masked; a masked
    region's centred appearance is zeroed (its box stays): the projection sees 0, as the released
    code's, whose features are not centred, sees a zeroed region."""

    def __init__(self, config: ViLBertConfig):
        super().__init__()
        self.appearance = nn.Linear(config.visual_feature_dim, config.hidden_size)
        self.location = nn.Linear(5, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        # The stores' features share a large common part, as for VL-BERT (its visual embeddings).
        self.register_buffer("appearance_mean", torch.zeros(config.visual_feature_dim))

    def forward(self, visual: VisualInputs) -> torch.Tensor:
        if visual.features is None:
            raise ValueError("ViLBERT reads the feature stores' region features: visual.features is None")
        features = visual.features - self.appearance_mean.to(visual.features.dtype)
        regions = visual.roi_mask.clone()
        regions[:, 0] = False  # row 0 is the whole image, replaced by the mean below
        if visual.masked is not None:
            features = features.masked_fill(visual.masked.unsqueeze(-1), 0.0)
            regions &= ~visual.masked
        counts = regions.sum(1, keepdim=True).clamp(min=1)
        mean = (features * regions.unsqueeze(-1)).sum(1) / counts
        features = torch.cat([mean.unsqueeze(1), features[:, 1:]], dim=1)
        size = visual.image_sizes.to(features.dtype).repeat(1, 2).unsqueeze(1)  # [B, 1, 4]
        corners = (visual.boxes.to(features.dtype) / size).clamp(0, 1)
        area = (corners[..., 2] - corners[..., 0]) * (corners[..., 3] - corners[..., 1])
        location = torch.cat([corners, area.unsqueeze(-1)], dim=-1)
        embedded = self.appearance(features) + self.location(location)
        return self.dropout(self.LayerNorm(embedded))


class ViLBertPooler(nn.Module):
    """Adapted from the released code's BertTextPooler / BertImagePooler: dense + ReLU on a
    stream's first element (BERT's pooler has tanh; ViLBERT's product of the two pooled vectors
    is then non-negative, as in the released code)."""

    def __init__(self, config: ViLBertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.relu(self.dense(hidden[:, 0]))


class ViLBertCoAttentionLayer(nn.Module):
    """Text queries attend to the regions and region queries to the words, both from the layer's
    inputs (the released code's BertBiAttention), then each stream's feed-forward block.

    Built from transformers' BERT parts: `BertAttention(is_cross_attention=True)` is one
    direction's query/key/value projections, output projection, residual and LayerNorm. Not
    `BertLayer` with `add_cross_attention`: that makes a causal decoder."""

    def __init__(self, config: ViLBertConfig):
        super().__init__()
        self.text_attends_regions = BertAttention(config, is_cross_attention=True)
        self.regions_attend_text = BertAttention(config, is_cross_attention=True)
        self.text_intermediate, self.text_output = BertIntermediate(config), BertOutput(config)
        self.visual_intermediate, self.visual_output = BertIntermediate(config), BertOutput(config)

    def forward(self, text, regions, text_keys_mask, region_keys_mask):
        attended_text, _ = self.text_attends_regions(
            text, encoder_hidden_states=regions, encoder_attention_mask=region_keys_mask
        )
        attended_regions, _ = self.regions_attend_text(
            regions, encoder_hidden_states=text, encoder_attention_mask=text_keys_mask
        )
        text = self.text_output(self.text_intermediate(attended_text), attended_text)
        regions = self.visual_output(self.visual_intermediate(attended_regions), attended_regions)
        return text, regions


@dataclass
class ViLBertOutput:
    """The encoder's outputs."""

    text: torch.Tensor  # [B, L, H] at the sequence's positions ([IMG] / [END] elements: unused)
    regions: torch.Tensor  # [B, R, H], row 0 `[IMG]`
    pooled_text: torch.Tensor  # [B, H] from `[CLS]`
    pooled_regions: torch.Tensor  # [B, H] from `[IMG]`


class ViLBertPreTrainedModel(StudyPreTrainedModel):
    """Every family's init, BERT loading and checkpoints (`StudyPreTrainedModel`), for ViLBERT's
    encoder and heads. No detector in the model: every module takes BERT's init."""

    config_class = ViLBertConfig
    base_model_prefix = "vilbert"

    # ---- what the study's builder calls on a new model (every model family has them) ---------

    def load_detector(self, detector_dir) -> None:
        """Nothing to load: ViLBERT reads the feature stores' region features (no detector inside)."""

    def center_appearance(self, mean: torch.Tensor) -> None:
        """Centre the regions' appearance features on `mean` (that of the training images)."""
        self.base_model.region_embeddings.appearance_mean.copy_(mean)

    # ---- what the heads read (StudyPreTrainedModel's readouts) ---------------------------------

    def build_encoder(self, config: ViLBertConfig) -> ViLBertModel:
        return ViLBertModel(config, initialise=False)

    def pooled_product(self, outputs: ViLBertOutput) -> torch.Tensor:
        """The element-wise product of the pooled `[CLS]` and `[IMG]`: what ViLBERT's alignment
        and its VQA and VCR heads read (the released code's `fusion_method: mul`)."""
        return outputs.pooled_text * outputs.pooled_regions

    def word_states(self, outputs: ViLBertOutput, mlm_labels: torch.Tensor | None) -> tuple:
        """The text stream's states, and the masked words' labels as they are (one per element)."""
        return outputs.text, mlm_labels

    def relation_state(self, outputs: ViLBertOutput) -> torch.Tensor:
        return self.pooled_product(outputs)

    def answer_state(self, outputs: ViLBertOutput, answer_positions: torch.Tensor | None) -> torch.Tensor:
        return self.pooled_product(outputs)

    def candidate_state(self, outputs: ViLBertOutput) -> torch.Tensor:
        return self.pooled_product(outputs)

    def region_states(self, outputs: ViLBertOutput, visual: VisualInputs, roi_positions: torch.Tensor) -> torch.Tensor:
        """[B, R, H]: the visual stream's output per region row (the rows VisualInputs holds)."""
        return outputs.regions


class ViLBertModel(ViLBertPreTrainedModel):
    """The two streams and their co-attention. `initialise=False`: a head holds it, and the head's
    `post_init` initialises it with the head, in one pass (as every family's encoder)."""

    def __init__(self, config: ViLBertConfig, initialise: bool = True):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)  # the text stream
        self.region_embeddings = ViLBertRegionEmbeddings(config)
        self.visual_layers = nn.ModuleList(BertLayer(config) for _ in range(config.num_visual_layers))
        self.coattention_layers = nn.ModuleList(
            ViLBertCoAttentionLayer(config) for _ in config.text_coattention_layers
        )
        self.text_pooler, self.visual_pooler = ViLBertPooler(config), ViLBertPooler(config)
        self._initialised_by_head = not initialise
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.bert.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.bert.embeddings.word_embeddings = value

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        visual_index: torch.Tensor | None = None,
        visual: VisualInputs | None = None,
        text_only: torch.Tensor | None = None,
    ) -> ViLBertOutput:
        """The VL-BERT batch layout in; `visual_index` is read only with `tag_coattention_mask` (a
        tag word's region row; regions are otherwise a stream of their own) and text-only input
        has no place in ViLBERT's objectives."""
        if visual is None or (text_only is not None and bool(text_only.any())):
            raise ValueError("ViLBERT needs an image for every example (no text-only input)")
        is_text = (input_ids != self.config.img_token_id) & (input_ids != self.config.end_token_id)
        text_mask = attention_mask.bool() & is_text
        text = self.bert.embeddings(input_ids=input_ids, token_type_ids=token_type_ids, position_ids=position_ids)
        regions = self.region_embeddings(visual)
        region_mask = visual.roi_mask
        # 4-d masks in the form the configured attention (SDPA) takes: keys of the same stream,
        # and keys of the other stream.
        text_self = create_bidirectional_mask(config=self.config, inputs_embeds=text, attention_mask=text_mask)
        region_self = create_bidirectional_mask(config=self.config, inputs_embeds=regions, attention_mask=region_mask)
        if self.config.tag_coattention_mask and visual_index is not None:
            text_to_regions = tag_coattention_mask(visual_index, text_mask, region_mask, text.dtype)
        else:
            text_to_regions = create_bidirectional_mask(
                config=self.config, inputs_embeds=text, attention_mask=region_mask, encoder_hidden_states=regions
            )
        regions_to_text = create_bidirectional_mask(
            config=self.config, inputs_embeds=regions, attention_mask=text_mask, encoder_hidden_states=text
        )
        # Adapted from the released code's BertEncoder.forward: each stream runs its layers up to
        # the next co-attention layer's place, then the co-attention layer; the rest after the last.
        text_layers, visual_layers = self.bert.encoder.layer, self.visual_layers
        next_text = next_visual = 0
        for coattention, text_at, visual_at in zip(
            self.coattention_layers, self.config.text_coattention_layers, self.config.visual_coattention_layers
        ):
            for layer in visual_layers[next_visual:visual_at]:
                regions = layer(regions, region_self)
            for layer in text_layers[next_text:text_at]:
                text = layer(text, text_self)
            text, regions = coattention(
                text, regions, text_keys_mask=regions_to_text, region_keys_mask=text_to_regions
            )
            next_text, next_visual = text_at, visual_at
        for layer in visual_layers[next_visual:]:
            regions = layer(regions, region_self)
        for layer in text_layers[next_text:]:
            text = layer(text, text_self)
        return ViLBertOutput(
            text=text, regions=regions, pooled_text=self.text_pooler(text), pooled_regions=self.visual_pooler(regions)
        )


def tag_coattention_mask(
    visual_index: torch.Tensor, text_mask: torch.Tensor, region_mask: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """The text queries' additive mask over the regions' keys [B, 1, L, R]: padded regions out,
    and TAG_COATTENTION_BIAS where a word names a region (its `visual_index` row, past row 0, the
    whole image every other word takes)."""
    rows = torch.arange(region_mask.shape[1], device=visual_index.device)
    names = (visual_index.unsqueeze(-1) == rows) & (rows > 0) & text_mask.unsqueeze(-1)  # [B, L, R]
    mask = torch.zeros(names.shape, dtype=dtype, device=visual_index.device)
    mask = mask.masked_fill(~region_mask.bool().unsqueeze(1), torch.finfo(dtype).min)
    return (mask + TAG_COATTENTION_BIAS * names.to(dtype)).unsqueeze(1)


def masked_region_kl(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
    """KL divergence from the detector's class distribution of each masked region (targets [B, R,
    C], all zeros where not masked) to the predicted one, averaged over masked regions: the
    released code's masked multi-modal modelling loss."""
    masked = targets.sum(-1) > 0
    if not bool(masked.any()):
        return None
    return F.kl_div(logits[masked].log_softmax(-1), targets[masked], reduction="batchmean")


# The pre-training and task models: the shared heads (heads.py) on ViLBERT's readouts.


class ViLBertForPreTraining(PreTrainingHeadMixin, ViLBertPreTrainedModel):
    """ViLBERT's objectives: masked words (BERT's 80/10/10, from the text stream), masked regions
    (features zeroed, the detector's class distribution as the target of a KL divergence) and
    image-text alignment on the pooled product (mismatched captions: the collator's relation
    labels; their words and regions are not masked)."""

    masked_region_loss = staticmethod(masked_region_kl)


class ViLBertForVQA(VQAHeadMixin, ViLBertPreTrainedModel):
    """The answer read on the pooled product."""


class ViLBertForVCR(VCRHeadMixin, ViLBertPreTrainedModel):
    """A candidate read on its pooled product."""


class ViLBertForRefCOCO(RefCOCOHeadMixin, ViLBertPreTrainedModel):
    """A region read on the visual stream's output."""
