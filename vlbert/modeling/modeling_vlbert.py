"""VL-BERT (Su et al., ICLR 2020): a single-stream BERT over words and regions of interest.

Input: `[CLS] sentence A [SEP] (sentence B [SEP]) [IMG] x R [END]`. Every element's embedding is
token + visual feature + segment (A, B, C=image) + position, with one position shared by all
visual elements. The visual feature embedding is FC(concat(appearance - its training mean,
geometry)); text elements take the whole-image RoI's (times a learnt scale that starts at 0),
text-only input takes one learned embedding, a masked RoI a learned mask embedding in place of
its appearance (its geometry stays). The encoder is transformers' BertModel (attention through SDPA); token, segment
and position embeddings and the LayerNorm are BERT's own.

Reading order: weight init, visual embeddings, `VLBertModel`, then one class per head.
Checkpoints are safetensors plus a JSON config (`save_pretrained` / `from_pretrained`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import BertModel
from transformers.models.bert.modeling_bert import BertOnlyMLMHead

from .configuration_vlbert import VLBertConfig
from .fast_rcnn import FastRCNN

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
IGNORE_INDEX = -100


def init_weights(module: nn.Module, std: float = 0.02) -> None:
    """BERT's initialisation, for every new parameter: N(0, 0.02), LayerNorm 1 and 0, bias 0."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        module.weight.data.normal_(0.0, std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            module.bias.data.zero_()
    elif isinstance(module, nn.LayerNorm):
        module.weight.data.fill_(1.0)
        module.bias.data.zero_()


def geometry_embedding(boxes: torch.Tensor, wavelengths: int) -> torch.Tensor:
    """[..., 4] normalised corners (x1/W, y1/H, x2/W, y2/H) -> [..., 8 * wavelengths] sin/cos."""
    exponents = torch.arange(wavelengths, device=boxes.device, dtype=boxes.dtype) / wavelengths
    frequencies = 100.0 / (1000.0 ** exponents)                       # wave-lengths 2*pi/100 .. ~2*pi*10
    angles = boxes.unsqueeze(-1) * frequencies                          # [..., 4, K]
    return torch.cat([angles.sin(), angles.cos()], dim=-1).flatten(-2)  # [..., 4 * 2K]


@dataclass
class VisualInputs:
    """The regions of a batch. Row 0 of every image is the whole image.

    boxes: [B, R, 4] x1 y1 x2 y2 in image pixels; image_sizes: [B, 2] width, height;
    roi_mask: [B, R] bool, real rows (the rest is padding);
    features: [B, R, D] cached appearance features, or None to compute them from `images`;
    images: list of B float RGB [3, H, W] tensors in [0, 1] (needed when features is None; with
        features, None stands for an image without a masked RoI, which is never read);
    masked: [B, R] bool, RoIs masked for masked RoI classification (pixels zeroed, mask embedding).
    """
    boxes: torch.Tensor
    image_sizes: torch.Tensor
    roi_mask: torch.Tensor
    features: torch.Tensor | None = None
    images: list[torch.Tensor] | None = None
    masked: torch.Tensor | None = None


class VLBertVisualEmbeddings(nn.Module):
    """Per RoI: FC(concat(appearance - appearance_mean, geometry)). A masked RoI's appearance is
    the learned mask embedding and its geometry stays, as in VL-BERT's released code: the region
    still knows where it is, so the words can tell it what it is.

    `appearance_mean` (a buffer, saved with the weights) is the mean feature of the images the
    model was first trained on, set when it is built for training (zeros: no centring). Detector
    features share a large common part (norm 7.9 against 11.4 for a region's own part in the
    mini world); uncentred, pre-training grows its projection until every region of an image
    embeds alike, and the regions can no longer be told apart (RefCOCO+)."""

    def __init__(self, config: VLBertConfig):
        super().__init__()
        self.wavelengths = config.geometry_wavelengths
        self.projection = nn.Linear(config.visual_feature_dim + config.geometry_dim, config.hidden_size)
        self.mask_embedding = nn.Parameter(torch.zeros(config.visual_feature_dim))
        self.text_only_embedding = nn.Parameter(torch.zeros(config.hidden_size))
        # VL-BERT's `visual_scale_text`: a learnt scale on the visual embedding that words take,
        # from 0 in its released configs. At full scale the whole image's embedding drowns the
        # words (here: norm 2.6 against 0.7), and no region can find the words that describe it.
        self.text_scale = nn.Parameter(torch.tensor(float(config.visual_scale_text_init)))
        self.register_buffer("appearance_mean", torch.zeros(config.visual_feature_dim))

    def forward(self, appearance: torch.Tensor, visual: VisualInputs) -> torch.Tensor:
        size = visual.image_sizes.to(appearance.dtype).repeat(1, 2).unsqueeze(1)  # [B, 1, 4]
        geometry = geometry_embedding(visual.boxes.to(appearance.dtype) / size, self.wavelengths)
        appearance = appearance - self.appearance_mean.to(appearance.dtype)
        if visual.masked is not None:
            appearance = torch.where(visual.masked.unsqueeze(-1), self.mask_embedding.to(appearance.dtype), appearance)
        return self.projection(torch.cat([appearance, geometry], dim=-1))


class VLBertModel(nn.Module):
    def __init__(self, config: VLBertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=False)
        self.visual_embeddings = VLBertVisualEmbeddings(config)
        self.fast_rcnn = None
        if config.frcnn is not None:
            from ..detection.model import DetectorConfig
            self.fast_rcnn = FastRCNN(DetectorConfig.from_json(config.frcnn), trainable=config.tune_frcnn)

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
        out = (visual.features.clone() if visual.features is not None
               else visual.boxes.new_zeros(*visual.roi_mask.shape, self.fast_rcnn.config.feature_dim))
        rows = torch.nonzero(recompute).flatten().tolist()
        if not rows:
            return out
        valid = visual.roi_mask[rows]
        per_image = self.fast_rcnn([visual.images[k] for k in rows], [b[v] for b, v in zip(visual.boxes[rows], valid)],
                                   [m[v] for m, v in zip(masked[rows], valid)])
        recomputed = out[rows].masked_scatter(valid.unsqueeze(-1), torch.cat(per_image).to(out.dtype))
        return out.index_put((torch.tensor(rows, device=out.device),), recomputed)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, position_ids: torch.Tensor,
                attention_mask: torch.Tensor, visual_index: torch.Tensor, visual: VisualInputs | None = None,
                text_only: torch.Tensor | None = None) -> torch.Tensor:
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
            rois = self.visual_embeddings(self.appearance(visual), visual)                 # [B, R, H]
            element_visual = rois.gather(1, visual_index.unsqueeze(-1).expand(-1, -1, rois.shape[-1]))
            is_region = (input_ids == self.config.img_token_id).unsqueeze(-1)
            element_visual = torch.where(is_region, element_visual, self.visual_embeddings.text_scale * element_visual)
            if text_only is not None:
                element_visual = torch.where(text_only[:, None, None], text_only_row, element_visual)
        output = self.bert(inputs_embeds=words + element_visual, token_type_ids=token_type_ids,
                           position_ids=position_ids, attention_mask=attention_mask)
        return output.last_hidden_state


class VLBertPreTrainedModel(nn.Module):
    """Weight init, BERT loading and safetensors checkpoints, shared by every head."""

    def __init__(self, config: VLBertConfig):
        super().__init__()
        self.config = config
        self.vlbert = VLBertModel(config)

    def post_init(self) -> None:
        # The Fast R-CNN keeps its detector initialisation until the detector's weights load.
        for name, module in self.named_modules():
            if not name.startswith("vlbert.fast_rcnn"):
                init_weights(module)

    def load_bert(self, checkpoint: str | Path) -> dict:
        """Take text weights from a BERT checkpoint (local folder or hub id).

        Returns {"loaded": [...], "new": [...], "ignored": [...]}: "new" must be only visual and
        head parameters (and segment C, the third row of token_type_embeddings).
        """
        from transformers.utils import logging as hf_logging
        verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
        hf_logging.set_verbosity_error()  # we report what was new ourselves, below
        hf_logging.disable_progress_bar()
        try:
            bert = BertModel.from_pretrained(str(checkpoint), add_pooling_layer=False)
        finally:
            hf_logging.set_verbosity(verbosity)
            if bars:
                hf_logging.enable_progress_bar()
        state = bert.state_dict()
        segments = state.pop("embeddings.token_type_embeddings.weight")
        own = self.vlbert.bert.state_dict()
        if own["embeddings.token_type_embeddings.weight"].shape[1] != segments.shape[1]:
            raise ValueError(f"{checkpoint}: hidden size {segments.shape[1]} differs from the config's")
        with torch.no_grad():
            self.vlbert.bert.embeddings.token_type_embeddings.weight[: len(segments)] = segments
        missing, unexpected = self.vlbert.bert.load_state_dict(state, strict=False)
        missing = [k for k in missing if k != "embeddings.token_type_embeddings.weight"]
        if missing:
            raise ValueError(f"{checkpoint}: BERT weights missing from the checkpoint: {missing[:5]}")
        text_names = {f"vlbert.bert.{k}" for k in state} | {"vlbert.bert.embeddings.token_type_embeddings.weight"}
        tied = self._tied_parameter_names()
        new = [n for n, _ in self.named_parameters() if n not in text_names and n not in tied
               and not n.startswith("vlbert.fast_rcnn.")]
        if len(segments) < self.config.type_vocab_size:
            new.append("vlbert.bert.embeddings.token_type_embeddings.weight[segment C]")
        return {"loaded": sorted(text_names), "new": new, "ignored": list(unexpected)}

    def _tied_parameter_names(self) -> set[str]:
        return set()

    def save_pretrained(self, folder) -> None:
        from .. import io
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        # Tied parameters are stored once, under the encoder's name.
        tied = self._tied_parameter_names()
        state = {k: v.detach().contiguous() for k, v in self.state_dict().items() if k not in tied}
        with io.atomic_path(folder / WEIGHTS_NAME) as tmp:
            save_file(state, str(tmp))
        io.write_json(folder / CONFIG_NAME, {"architecture": type(self).__name__, **self.config.to_dict()}, indent=2)

    @classmethod
    def from_pretrained(cls, folder, **overrides):
        """Load a checkpoint written by save_pretrained. `overrides` change config fields
        (e.g. tune_frcnn); a pre-training checkpoint loads into any task head, whose own
        parameters then start new."""
        folder = Path(folder)
        data = json.loads((folder / CONFIG_NAME).read_text())
        architecture = data.pop("architecture", cls.__name__)
        config = VLBertConfig(**{**data, **overrides})
        model = cls(config)
        state = load_file(str(folder / WEIGHTS_NAME))
        same_architecture = architecture == cls.__name__
        if not same_architecture:  # a task head starts new on top of the loaded encoder
            state = {k: v for k, v in state.items() if k.startswith("vlbert.")}
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [k for k in missing if k not in model._tied_parameter_names()
                   and (same_architecture or k.startswith("vlbert."))]
        if missing or unexpected:
            raise ValueError(f"{folder}: checkpoint does not fit {cls.__name__} "
                             f"(missing {missing[:5]}, unexpected {unexpected[:5]})")
        return model

    def roi_hidden(self, hidden: torch.Tensor, roi_positions: torch.Tensor) -> torch.Tensor:
        """[B, R, H]: the hidden state of each RoI's [IMG] element (zeros where there is none)."""
        index = roi_positions.clamp(min=0).unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
        return hidden.gather(1, index) * (roi_positions >= 0).unsqueeze(-1)


class MaskedRoIHead(nn.Module):
    def __init__(self, config: VLBertConfig):
        super().__init__()
        self.transform = nn.Sequential(nn.Linear(config.hidden_size, config.hidden_size), nn.GELU(),
                                       nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps))
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


@dataclass
class VLBertPreTrainingOutput:
    loss: torch.Tensor | None
    losses: dict[str, torch.Tensor]
    mlm_logits: torch.Tensor        # [B, L, V]; with mlm_labels, [masked positions, V]
    roi_logits: torch.Tensor
    relation_logits: torch.Tensor


class VLBertForPreTraining(VLBertPreTrainedModel):
    """Masked language modelling with visual clues (and on text-only input), masked RoI
    classification with linguistic clues, and sentence-image relation prediction on [CLS]."""

    def __init__(self, config: VLBertConfig):
        super().__init__(config)
        self.mlm = BertOnlyMLMHead(config)
        self.roi_head = MaskedRoIHead(config)
        self.relation_head = nn.Linear(config.hidden_size, 1)
        self.post_init()
        # BERT's tying: the decoder is the word embedding matrix, its bias the head's `bias`.
        self.mlm.predictions.decoder.weight = self.vlbert.bert.embeddings.word_embeddings.weight
        self.mlm.predictions.bias = self.mlm.predictions.decoder.bias

    def _tied_parameter_names(self) -> set[str]:
        return {"mlm.predictions.decoder.weight", "mlm.predictions.bias"}

    def forward(self, input_ids, token_type_ids, position_ids, attention_mask, visual_index, visual=None,
                text_only=None, roi_positions=None, mlm_labels=None, roi_labels=None, relation_labels=None):
        hidden = self.vlbert(input_ids, token_type_ids, position_ids, attention_mask, visual_index, visual, text_only)
        # With labels, only the masked positions are scored: the vocabulary projection is most of
        # a step's cost, and 85% of its output would be thrown away.
        masked = mlm_labels != IGNORE_INDEX if mlm_labels is not None else None
        mlm_logits = self.mlm(hidden[masked] if masked is not None else hidden)
        roi_logits = (self.roi_head(self.roi_hidden(hidden, roi_positions)) if roi_positions is not None
                      else hidden.new_zeros(0))
        relation_logits = self.relation_head(hidden[:, 0]).squeeze(-1)
        losses = {}
        if masked is not None and bool(masked.any()):
            losses["mlm"] = F.cross_entropy(mlm_logits, mlm_labels[masked])
        roi_loss = masked_roi_loss(roi_logits, roi_labels) if roi_positions is not None else None
        if roi_loss is not None:
            losses["masked_roi"] = roi_loss
        if relation_labels is not None and bool((relation_labels >= 0).any()):
            keep = relation_labels >= 0
            losses["relation"] = F.binary_cross_entropy_with_logits(relation_logits[keep], relation_labels[keep].float())
        loss = sum(losses.values()) if losses else None
        return VLBertPreTrainingOutput(loss, losses, mlm_logits, roi_logits, relation_logits)


@dataclass
class VLBertTaskOutput:
    loss: torch.Tensor | None
    logits: torch.Tensor
    losses: dict[str, torch.Tensor]


def _classifier(config: VLBertConfig, outputs: int) -> nn.Sequential:
    return nn.Sequential(nn.Dropout(config.hidden_dropout_prob), nn.Linear(config.hidden_size, config.hidden_size),
                         nn.GELU(), nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps),
                         nn.Linear(config.hidden_size, outputs))


class VLBertForVQA(VLBertPreTrainedModel):
    """The answer is read at a [MASK] in the answer slot: a classifier over the answer vocabulary,
    trained with binary cross-entropy on the soft VQA scores."""

    def __init__(self, config: VLBertConfig):
        super().__init__(config)
        if config.num_answers < 1:
            raise ValueError("VLBertForVQA needs config.num_answers (the answer vocabulary size)")
        self.classifier = _classifier(config, config.num_answers)
        self.post_init()

    def forward(self, input_ids, token_type_ids, position_ids, attention_mask, visual_index, visual,
                answer_positions, answer_scores=None, **_):
        hidden = self.vlbert(input_ids, token_type_ids, position_ids, attention_mask, visual_index, visual)
        logits = self.classifier(hidden[torch.arange(len(hidden)), answer_positions])
        losses = {}
        if answer_scores is not None:
            # Summed over answers, as VL-BERT does: the mean would shrink with the vocabulary.
            losses["vqa"] = F.binary_cross_entropy_with_logits(logits, answer_scores) * answer_scores.shape[1]
        return VLBertTaskOutput(losses.get("vqa"), logits, losses)


class VLBertForVCR(VLBertPreTrainedModel):
    """Each of the 4 candidates is one sequence; [CLS] gives its score, softmax over the 4.
    Masked RoI classification is trained alongside, as in the paper's VCR fine-tuning."""

    def __init__(self, config: VLBertConfig):
        super().__init__(config)
        self.classifier = _classifier(config, 1)
        self.roi_head = MaskedRoIHead(config)
        self.post_init()

    def forward(self, input_ids, token_type_ids, position_ids, attention_mask, visual_index, visual,
                labels=None, roi_positions=None, roi_labels=None, num_choices: int = 4, **_):
        """Inputs are [B * num_choices, ...] (candidates of one question adjacent)."""
        hidden = self.vlbert(input_ids, token_type_ids, position_ids, attention_mask, visual_index, visual)
        logits = self.classifier(hidden[:, 0]).view(-1, num_choices)
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
        self.classifier = _classifier(config, 1)
        self.post_init()

    def forward(self, input_ids, token_type_ids, position_ids, attention_mask, visual_index, visual,
                roi_positions, roi_targets=None, **_):
        """roi_targets: [B, R] 1 where the RoI overlaps the referent with IoU >= 0.5, 0 elsewhere,
        -1 for rows that are not candidates (padding, the whole image)."""
        hidden = self.vlbert(input_ids, token_type_ids, position_ids, attention_mask, visual_index, visual)
        logits = self.classifier(self.roi_hidden(hidden, roi_positions)).squeeze(-1)
        logits = logits.masked_fill(roi_positions < 0, -math.inf)
        losses = {}
        if roi_targets is not None:
            keep = roi_targets >= 0
            losses["ref"] = F.binary_cross_entropy_with_logits(logits[keep], roi_targets[keep].float())
        return VLBertTaskOutput(losses.get("ref"), logits, losses)
