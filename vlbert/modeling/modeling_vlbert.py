"""VL-BERT (Su et al., ICLR 2020): a single-stream BERT over words and regions of interest.

Input: `[CLS] sentence A [SEP] (sentence B [SEP]) [IMG] x R [END]`. Every element's embedding is
token + visual feature + segment (A, B, C=image) + position, with one position shared by all
visual elements. The visual feature embedding is FC(concat(appearance - its training mean,
geometry)); text elements take the whole-image RoI's (times a learnt scale that starts at 0),
text-only input takes one learned embedding, a masked RoI a learned mask embedding in place of
its appearance (its geometry stays). The encoder is transformers' BertModel (attention through SDPA); token, segment
and position embeddings and the LayerNorm are BERT's own.

Reading order: visual embeddings, `VLBertPreTrainedModel` (the builder's hooks), `VLBertModel`,
then one class per head. What every family shares is in its own modules: weight init, BERT
loading and checkpoints in `pretrained.py` (`StudyPreTrainedModel`, which `VLBertPreTrainedModel`
subclasses), the regions' inputs in `inputs.py` (`VisualInputs`), the heads and losses in
`heads.py`. The classes are transformers `PreTrainedModel`s: `save_pretrained` / `from_pretrained`
write and read safetensors plus config.json, and `import vlbert.modeling` registers them with
AutoConfig / AutoModel / AutoModelForPreTraining.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import BertModel
from transformers.models.bert.modeling_bert import BertOnlyMLMHead

from .configuration_vlbert import VLBertConfig
from .fast_rcnn import FastRCNN
from .heads import (
    IGNORE_INDEX,
    MaskedRoIHead,
    VLBertPreTrainingOutput,
    VLBertTaskOutput,
    candidate_logits,
    centre_regions,
    masked_roi_loss,
    referring_loss,
    relation_loss,
    task_classifier,
    vqa_loss,
)
from .inputs import VisualInputs
from .pretrained import StudyPreTrainedModel


def geometry_embedding(boxes: torch.Tensor, wavelengths: int) -> torch.Tensor:
    """[..., 4] normalised corners (x1/W, y1/H, x2/W, y2/H) -> [..., 8 * wavelengths] sin/cos."""
    exponents = torch.arange(wavelengths, device=boxes.device, dtype=boxes.dtype) / wavelengths
    frequencies = 100.0 / (1000.0**exponents)  # wave-lengths 2*pi/100 .. ~2*pi*10
    angles = boxes.unsqueeze(-1) * frequencies  # [..., 4, K]
    return torch.cat([angles.sin(), angles.cos()], dim=-1).flatten(-2)  # [..., 4 * 2K]


class VLBertVisualEmbeddings(nn.Module):
    """Per RoI: FC(concat(appearance - appearance_mean, geometry)). A masked RoI's appearance is
    the learned mask embedding and its geometry stays, as in VL-BERT's released code: the region
    still knows where it is, so the words can tell it what it is.

    `appearance_mean` (a buffer, saved with the weights) is the mean feature of the images the
    model was first trained on, set when it is built for training (zeros: no centring). Detector
    features share a large common part; uncentred, pre-training grows its projection until every
    region of an image embeds alike, and the regions can no longer be told apart (RefCOCO+;
    measurements: reports/reference/mini/README.md, "Measurements behind the code's comments")."""

    def __init__(self, config: VLBertConfig):
        super().__init__()
        self.wavelengths = config.geometry_wavelengths
        self.projection = nn.Linear(config.visual_feature_dim + config.geometry_dim, config.hidden_size)
        self.mask_embedding = nn.Parameter(torch.zeros(config.visual_feature_dim))
        self.text_only_embedding = nn.Parameter(torch.zeros(config.hidden_size))
        # VL-BERT's `visual_scale_text`: a learnt scale on the visual embedding that words take,
        # from 0 in its released configs. At full scale the whole image's embedding drowns the
        # words, and no region can find the words that describe it.
        self.text_scale = nn.Parameter(torch.tensor(float(config.visual_scale_text_init)))
        self.register_buffer("appearance_mean", torch.zeros(config.visual_feature_dim))

    def forward(self, appearance: torch.Tensor, visual: VisualInputs) -> torch.Tensor:
        size = visual.image_sizes.to(appearance.dtype).repeat(1, 2).unsqueeze(1)  # [B, 1, 4]
        geometry = geometry_embedding(visual.boxes.to(appearance.dtype) / size, self.wavelengths)
        appearance = appearance - self.appearance_mean.to(appearance.dtype)
        if visual.masked is not None:
            appearance = torch.where(visual.masked.unsqueeze(-1), self.mask_embedding.to(appearance.dtype), appearance)
        return self.projection(torch.cat([appearance, geometry], dim=-1))


class VLBertPreTrainedModel(StudyPreTrainedModel):
    """`StudyPreTrainedModel` (weight init, BERT loading, checkpoints) for VL-BERT's encoder and
    heads: the Fast R-CNN keeps its detector init until `load_detector`, and after a checkpoint
    loads, its parameters train only as `tune_frcnn` and `frozen_frcnn_stages` say."""

    config_class = VLBertConfig
    base_model_prefix = "vlbert"
    _detector_name = "fast_rcnn"

    # ---- what the study's builder calls on a new model (every model family has them) ---------

    def load_detector(self, detector_dir) -> None:
        """The Fast R-CNN module's backbone and C5 head from the trained detector."""
        if self.base_model.fast_rcnn is not None:
            self.base_model.fast_rcnn.load_detector_weights(detector_dir)

    def center_appearance(self, mean: torch.Tensor) -> None:
        """Centre the regions' appearance features on `mean` (that of the training images)."""
        self.base_model.visual_embeddings.appearance_mean.copy_(mean)

    # ---- what the heads read -----------------------------------------------------------------

    def roi_hidden(self, hidden: torch.Tensor, roi_positions: torch.Tensor) -> torch.Tensor:
        """[B, R, H]: the hidden state of each RoI's [IMG] element (zeros where there is none)."""
        index = roi_positions.clamp(min=0).unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
        return hidden.gather(1, index) * (roi_positions >= 0).unsqueeze(-1)


class VLBertModel(VLBertPreTrainedModel):
    """The encoder: BERT over words and regions, and the Fast R-CNN that computes the regions'
    features. `initialise=False`: a head holds it, and the head's `post_init` initialises it with
    the head, in one pass (the draws of the study's results)."""

    def __init__(self, config: VLBertConfig, initialise: bool = True):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.visual_embeddings = VLBertVisualEmbeddings(config)
        self.fast_rcnn = None
        if config.frcnn is not None:
            from ..detection.model import DetectorConfig

            self.fast_rcnn = FastRCNN(
                DetectorConfig.from_json(config.frcnn),
                trainable=config.tune_frcnn,
                frozen_stages=config.frozen_frcnn_stages,
            )
        self._initialised_by_head = not initialise
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.bert.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.bert.embeddings.word_embeddings = value

    def appearance(self, visual: VisualInputs) -> torch.Tensor:
        """[B, R, D] appearance features: the cached ones, or the Fast R-CNN's on the images.
        With both, the cached features stand for the images without a masked RoI (they are what a
        frozen module computes there) and only the others run through the Fast R-CNN."""
        masked = visual.masked if visual.masked is not None else torch.zeros_like(visual.roi_mask)
        if visual.images is None:
            if visual.features is None:
                raise ValueError("no cached features and no images to compute them")
            if bool(masked.any()):
                # Cached features saw the masked pixels: the paper's protocol recomputes instead.
                raise ValueError("masked RoIs need features recomputed from zeroed pixels: pass images too")
            return visual.features
        if self.fast_rcnn is None:
            raise ValueError("images given but the model has no Fast R-CNN module to compute their features")
        recompute = masked.any(1) if visual.features is not None else torch.ones_like(masked[:, 0])
        out = (
            visual.features.clone()
            if visual.features is not None
            else visual.boxes.new_zeros(*visual.roi_mask.shape, self.fast_rcnn.config.feature_dim)
        )
        rows = torch.nonzero(recompute).flatten().tolist()
        if not rows:
            return out
        valid = visual.roi_mask[rows]
        per_image = self.fast_rcnn(
            [visual.images[k] for k in rows],
            [b[v] for b, v in zip(visual.boxes[rows], valid)],
            [m[v] for m, v in zip(masked[rows], valid)],
        )
        recomputed = out[rows].masked_scatter(valid.unsqueeze(-1), torch.cat(per_image).to(out.dtype))
        return out.index_put((torch.tensor(rows, device=out.device),), recomputed)

    single_stream = True

    def attention_columns(self, batch: dict, encoded) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Its sequence is the batch's: the [IMG] elements are the visual ones."""
        return (
            batch["input_ids"] == self.config.img_token_id,
            batch["mlm_labels"] != IGNORE_INDEX,
            batch["attention_mask"].bool(),
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        visual_index: torch.Tensor,
        visual: VisualInputs | None = None,
        text_only: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Sequence of hidden states [B, L, H].

        visual_index: [B, L], the RoI row whose visual embedding each element takes (0: the whole
        image, for words and special tokens). text_only: [B] bool, examples with no image; with
        visual None every example is text-only.
        """
        words = self.bert.embeddings.word_embeddings(input_ids)
        text_only_row = self.visual_embeddings.text_only_embedding
        if visual is None:
            element_visual = text_only_row.expand_as(words)
        else:
            rois = self.visual_embeddings(self.appearance(visual), visual)  # [B, R, H]
            element_visual = rois.gather(1, visual_index.unsqueeze(-1).expand(-1, -1, rois.shape[-1]))
            full_scale = input_ids == self.config.img_token_id
            if self.config.tags_at_region_scale:
                full_scale = full_scale | (visual_index > 0)  # words that name an object
            element_visual = torch.where(
                full_scale.unsqueeze(-1), element_visual, self.visual_embeddings.text_scale * element_visual
            )
            if text_only is not None:
                element_visual = torch.where(text_only[:, None, None], text_only_row, element_visual)
        output = self.bert(
            inputs_embeds=words + element_visual,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            attention_mask=attention_mask,
        )
        return output.last_hidden_state


class VLBertForPreTraining(VLBertPreTrainedModel):
    """Masked language modelling with visual clues (and on text-only input), masked RoI
    classification with linguistic clues, and sentence-image relation prediction on [CLS]."""

    # Adapted from transformers.models.bert.modeling_bert.BertForPreTraining._tied_weights_keys:
    # the decoder is the word embedding matrix, and the head's `bias` is the decoder's, stored
    # once under the decoder's name (as checkpoints written before this declaration have it).
    _tied_weights_keys = {
        "mlm.predictions.decoder.weight": "vlbert.bert.embeddings.word_embeddings.weight",
        "mlm.predictions.bias": "mlm.predictions.decoder.bias",
    }

    def __init__(self, config: VLBertConfig):
        super().__init__(config)
        self.vlbert = VLBertModel(config, initialise=False)
        self.mlm = BertOnlyMLMHead(config)
        self.roi_head = MaskedRoIHead(config)
        self.relation_head = nn.Linear(config.hidden_size, 1)
        self.post_init()

    # Copied from transformers.models.bert.modeling_bert.BertForPreTraining.get_output_embeddings with cls->mlm
    def get_output_embeddings(self):
        return self.mlm.predictions.decoder

    # Copied from transformers.models.bert.modeling_bert.BertForPreTraining.set_output_embeddings with cls->mlm
    def set_output_embeddings(self, new_embeddings):
        self.mlm.predictions.decoder = new_embeddings
        self.mlm.predictions.bias = new_embeddings.bias

    def forward(
        self,
        input_ids,
        token_type_ids,
        position_ids,
        attention_mask,
        visual_index,
        visual=None,
        text_only=None,
        roi_positions=None,
        mlm_labels=None,
        roi_labels=None,
        relation_labels=None,
    ):
        hidden = self.vlbert(input_ids, token_type_ids, position_ids, attention_mask, visual_index, visual, text_only)
        # With labels, only the masked positions are scored: the vocabulary projection is most of
        # a step's cost, and most of its output would be thrown away.
        masked = mlm_labels != IGNORE_INDEX if mlm_labels is not None else None
        mlm_logits = self.mlm(hidden[masked] if masked is not None else hidden)
        roi_logits = (
            self.roi_head(self.roi_hidden(hidden, roi_positions)) if roi_positions is not None else hidden.new_zeros(0)
        )
        relation_logits = self.relation_head(hidden[:, 0]).squeeze(-1)
        losses = {}
        if masked is not None and bool(masked.any()):
            losses["mlm"] = F.cross_entropy(mlm_logits, mlm_labels[masked])
        roi_loss = masked_roi_loss(roi_logits, roi_labels) if roi_positions is not None else None
        if roi_loss is not None:
            losses["masked_roi"] = roi_loss
        relation = relation_loss(relation_logits, relation_labels)
        if relation is not None:
            losses["relation"] = relation
        loss = sum(losses.values()) if losses else None
        return VLBertPreTrainingOutput(loss, losses, mlm_logits, roi_logits, relation_logits)


class VLBertForVQA(VLBertPreTrainedModel):
    """The answer is read at a [MASK] in the answer slot: a classifier over the answer vocabulary,
    trained with binary cross-entropy on the soft VQA scores."""

    def __init__(self, config: VLBertConfig):
        super().__init__(config)
        self.vlbert = VLBertModel(config, initialise=False)
        if config.num_answers < 1:
            raise ValueError("VLBertForVQA needs config.num_answers (the answer vocabulary size)")
        self.classifier = task_classifier(config, config.num_answers)
        self.post_init()

    def forward(
        self,
        input_ids,
        token_type_ids,
        position_ids,
        attention_mask,
        visual_index,
        visual,
        answer_positions,
        answer_scores=None,
        **_,
    ):
        hidden = self.vlbert(input_ids, token_type_ids, position_ids, attention_mask, visual_index, visual)
        logits = self.classifier(hidden[torch.arange(len(hidden)), answer_positions])
        losses = {}
        if answer_scores is not None:
            losses["vqa"] = vqa_loss(logits, answer_scores)
        return VLBertTaskOutput(losses.get("vqa"), logits, losses)


class VLBertForVCR(VLBertPreTrainedModel):
    """Each of the 4 candidates is one sequence; [CLS] gives its score, softmax over the 4.
    Given `roi_positions` and `roi_labels`, its RoI head adds the paper's RoI classification loss;
    the study's VCR batches carry none (a probe of it: reports/reference/mini/README.md)."""

    def __init__(self, config: VLBertConfig):
        super().__init__(config)
        self.vlbert = VLBertModel(config, initialise=False)
        self.classifier = task_classifier(config, 1)
        self.roi_head = MaskedRoIHead(config)
        self.post_init()

    def forward(
        self,
        input_ids,
        token_type_ids,
        position_ids,
        attention_mask,
        visual_index,
        visual,
        labels=None,
        roi_positions=None,
        roi_labels=None,
        num_choices: int = 4,
        **_,
    ):
        """Inputs are [B * num_choices, ...] (candidates of one question adjacent)."""
        hidden = self.vlbert(input_ids, token_type_ids, position_ids, attention_mask, visual_index, visual)
        logits = candidate_logits(self.classifier, hidden[:, 0], num_choices, self.config.centre_candidates)
        losses = {}
        if labels is not None:
            losses["choice"] = F.cross_entropy(logits, labels)
        if roi_positions is not None:
            roi_loss = masked_roi_loss(self.roi_head(self.roi_hidden(hidden, roi_positions)), roi_labels)
            if roi_loss is not None:
                losses["masked_roi"] = roi_loss
        return VLBertTaskOutput(sum(losses.values()) if losses else None, logits, losses)


class VLBertForRefCOCO(VLBertPreTrainedModel):
    """A binary score per RoI from its [IMG] element; the prediction is the best-scoring RoI."""

    def __init__(self, config: VLBertConfig):
        super().__init__(config)
        self.vlbert = VLBertModel(config, initialise=False)
        self.classifier = task_classifier(config, 1)
        self.post_init()

    def forward(
        self,
        input_ids,
        token_type_ids,
        position_ids,
        attention_mask,
        visual_index,
        visual,
        roi_positions,
        roi_targets=None,
        **_,
    ):
        """roi_targets: [B, R] 1 where the RoI overlaps the referent with IoU >= 0.5, 0 elsewhere,
        -1 for rows that are not candidates (padding, the whole image)."""
        hidden = self.vlbert(input_ids, token_type_ids, position_ids, attention_mask, visual_index, visual)
        regions = self.roi_hidden(hidden, roi_positions)
        if self.config.centre_candidates:
            regions = centre_regions(regions, roi_positions)
        logits = self.classifier(regions).squeeze(-1)
        logits = logits.masked_fill(roi_positions < 0, -math.inf)
        losses = {}
        if roi_targets is not None:
            losses["ref"] = referring_loss(logits, roi_targets)
        return VLBertTaskOutput(losses.get("ref"), logits, losses)
