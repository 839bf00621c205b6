"""VL-BERT (Su et al., ICLR 2020): a single-stream BERT over words and regions of interest.

Input: `[CLS] sentence A [SEP] (sentence B [SEP]) [IMG] x R [END]`. Every element's embedding is
token + visual feature + segment (A, B, C=image) + position, with one position shared by all
visual elements. The visual feature embedding is FC(concat(appearance - its training mean,
geometry)); text elements take the whole-image RoI's (times a learnt scale that starts at 0),
text-only input takes one learned embedding, a masked RoI a learned mask embedding in place of
its appearance (its geometry stays). The encoder is transformers' BertModel (attention through SDPA); token, segment
and position embeddings and the LayerNorm are BERT's own.

Reading order: visual embeddings, `VLBertPreTrainedModel` (the builder's hooks and the readouts
the task heads take), `VLBertModel`, the pre-training model, then the task models: heads.py's
heads on VL-BERT's readouts. What every family shares is in its own modules: weight init, BERT
loading and checkpoints in `pretrained.py` (`StudyPreTrainedModel`, which `VLBertPreTrainedModel`
subclasses), the regions' inputs in `inputs.py` (`VisualInputs`), the heads and losses in
`heads.py`. The classes are transformers `PreTrainedModel`s: `save_pretrained` / `from_pretrained`
write and read safetensors plus config.json, and `import vlbert.modeling` registers them with
AutoConfig / AutoModel / AutoModelForPreTraining.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import BertModel

from .configuration_vlbert import VLBertConfig
from .fast_rcnn import build_region_cnn
from .heads import IGNORE_INDEX, PreTrainingHeadMixin, RefCOCOHeadMixin, VCRHeadMixin, VQAHeadMixin, masked_roi_loss
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
        """The Fast R-CNN module's trunk and C5 head from the study's detector (its folder)."""
        if self.base_model.fast_rcnn is not None:
            self.base_model.fast_rcnn.load_detector_weights(detector_dir)

    def center_appearance(self, mean: torch.Tensor) -> None:
        """Centre the regions' appearance features on `mean` (that of the training images)."""
        self.base_model.visual_embeddings.appearance_mean.copy_(mean)

    # ---- what the heads read (StudyPreTrainedModel's readouts) ---------------------------------

    vcr_classifies_rois = True  # the paper's VCR also classifies masked RoIs

    def build_encoder(self, config: VLBertConfig) -> VLBertModel:
        return VLBertModel(config, initialise=False)

    def word_states(self, hidden: torch.Tensor, mlm_labels: torch.Tensor | None) -> tuple:
        """The sequence's states, and the masked words' labels as they are (one per element)."""
        return hidden, mlm_labels

    def relation_state(self, hidden: torch.Tensor) -> torch.Tensor:
        """[B, H]: [CLS]."""
        return hidden[:, 0]

    def answer_state(self, hidden: torch.Tensor, answer_positions: torch.Tensor | None) -> torch.Tensor:
        """[B, H]: the [MASK] in the answer slot."""
        if answer_positions is None:
            raise ValueError(f"{type(self).__name__} reads the answer at answer_positions: give them")
        return hidden[torch.arange(len(hidden)), answer_positions]

    def candidate_state(self, hidden: torch.Tensor) -> torch.Tensor:
        """[B * C, H]: each candidate's [CLS]."""
        return hidden[:, 0]

    def region_states(self, hidden: torch.Tensor, visual: VisualInputs, roi_positions: torch.Tensor | None):
        """Each region row's [IMG] element (`roi_hidden`); None without roi_positions (text-only input)."""
        return None if roi_positions is None else self.roi_hidden(hidden, roi_positions)

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
            self.fast_rcnn = build_region_cnn(
                config.frcnn, trainable=config.tune_frcnn, frozen_stages=config.frozen_frcnn_stages
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
            else visual.boxes.new_zeros(*visual.roi_mask.shape, self.fast_rcnn.feature_dim)
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


# The pre-training and task models: the shared heads (heads.py) on VL-BERT's readouts.


class VLBertForPreTraining(PreTrainingHeadMixin, VLBertPreTrainedModel):
    """Masked language modelling with visual clues (and on text-only input), masked RoI
    classification with linguistic clues, and sentence-image relation prediction on [CLS]."""

    masked_region_loss = staticmethod(masked_roi_loss)


class VLBertForVQA(VQAHeadMixin, VLBertPreTrainedModel):
    """The answer read at a [MASK] in the answer slot."""


class VLBertForVCR(VCRHeadMixin, VLBertPreTrainedModel):
    """A candidate read at its [CLS]; with `roi_positions` and `roi_labels`, the paper's masked
    RoI classification beside the choice."""


class VLBertForRefCOCO(RefCOCOHeadMixin, VLBertPreTrainedModel):
    """A region read at its [IMG] element."""
