"""VL-BERT (Su et al., ICLR 2020): a single-stream BERT over words and regions of interest.

Input: `[CLS] sentence A [SEP] (sentence B [SEP]) [IMG] x R [END]`. Every element's embedding is
token + visual feature + segment (A, B, C=image) + position, with one position shared by all
visual elements. The visual feature embedding is FC(concat(appearance - its training mean,
geometry)); text elements take the whole-image RoI's (times a learnt scale that starts at 0),
text-only input takes one learned embedding, a masked RoI a learned mask embedding in place of
its appearance (its geometry stays). The encoder is transformers' BertModel (attention through SDPA); token, segment
and position embeddings and the LayerNorm are BERT's own.

Reading order: weight init, visual embeddings, `VLBertPreTrainedModel` (init, checkpoints),
`VLBertModel`, then one class per head (the heads and losses every family shares: `heads.py`).
The classes are transformers `PreTrainedModel`s: `save_pretrained` / `from_pretrained` write and
read safetensors plus config.json, and `import vlbert` registers them with AutoConfig / AutoModel /
AutoModelForPreTraining.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import BertModel, PreTrainedModel
from transformers.models.bert.modeling_bert import BertOnlyMLMHead
from transformers.utils import SAFE_WEIGHTS_NAME

from .configuration_vlbert import VLBertConfig
from .fast_rcnn import FastRCNN
from .heads import (
    IGNORE_INDEX,
    MaskedRoIHead,
    VLBertPreTrainingOutput,
    VLBertTaskOutput,
    masked_roi_loss,
    referring_loss,
    relation_loss,
    task_classifier,
    vqa_loss,
)

_TRANSFORMERS_LOADER = "transformers.modeling_utils"  # the logger of transformers' LOAD REPORT


class _HeldLoadReport(logging.Filter):
    """Holds back transformers' LOAD REPORT records; `release` logs them after all."""

    def __init__(self):
        super().__init__()
        self.records = []

    def filter(self, record: logging.LogRecord) -> bool:
        if "LOAD REPORT" in record.getMessage():
            self.records.append(record)
            return False
        return True

    def release(self, logger: logging.Logger) -> None:
        for record in self.records:
            logger.handle(record)


# Adapted from transformers.models.bert.modeling_bert.BertPreTrainedModel._init_weights: the same
# distributions, without zeroing an embedding's padding row (the study's results were drawn so).
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
    frequencies = 100.0 / (1000.0**exponents)  # wave-lengths 2*pi/100 .. ~2*pi*10
    angles = boxes.unsqueeze(-1) * frequencies  # [..., 4, K]
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


@contextmanager
def _transformers_quiet():
    """transformers' warnings and progress bars off, for a load whose outcome we check ourselves."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


class VLBertPreTrainedModel(PreTrainedModel):
    """Weight init, BERT loading and checkpoints, shared by `VLBertModel` and every head.

    Initialisation draws from the RNG as the study's results were drawn, so that a seed gives the
    same model as before these classes moved onto transformers: the modules' construction
    defaults (BertModel's own init pass among them), then one pass of `init_weights` over every
    module but the Fast R-CNN's, in module order, the encoder's included (`init_weights` below;
    transformers' own pass would skip what BertModel initialised). `from_pretrained` builds the
    model that same way, on the CPU rather than on the meta device, and loads the checkpoint over
    it: a task head new on a pre-training checkpoint starts from the draws `cls(config)` makes,
    and leaves the RNG where `cls(config)` leaves it.
    """

    config_class = VLBertConfig
    base_model_prefix = "vlbert"
    _supports_sdpa = True  # the attention is BertModel's

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        init_weights(module, self.config.initializer_range)

    def init_weights(self) -> None:
        """`post_init`'s pass: every module but the Fast R-CNN's (it keeps its detector init until
        the detector's weights load), in module order, then the tying."""
        if getattr(self, "_initialised_by_head", False):
            return  # the head holding this model initialises it with its own weights, in one pass
        fast_rcnn = self.base_model.fast_rcnn
        detector = set(fast_rcnn.modules()) if fast_rcnn is not None else set()
        for module in self.modules():
            if module not in detector:
                self._init_weights(module)
            module._is_hf_initialized = True
        self.tie_weights(recompute_mapping=False)

    # ---- from_pretrained: built as cls(config) builds it --------------------------------------

    @classmethod
    def get_init_context(cls, dtype, is_quantized, _is_ds_init_called, allow_all_kernels=None):
        # transformers' contexts less the meta device: the build initialises every weight.
        contexts = super().get_init_context(dtype, is_quantized, _is_ds_init_called, allow_all_kernels)
        return [c for c in contexts if not (isinstance(c, torch.device) and c.type == "meta")]

    def _move_missing_keys_from_meta_to_device(self, missing_keys, device_map, device_mesh, hf_quantizer) -> None:
        # Nothing is on the meta device (get_init_context): what the checkpoint lacks (a new head,
        # the non-persistent buffers) keeps the values the build gave it, moved where the device
        # map puts it, instead of being emptied to be initialised again.
        if device_map is None:
            return
        from transformers.integrations.accelerate import get_device

        names = set(missing_keys) - set(self.all_tied_weights_keys)
        names |= {name for name, _ in self.named_non_persistent_buffers()}
        for name in sorted(names):
            owner, _, leaf = name.rpartition(".")
            module = self.get_submodule(owner)
            tensor = getattr(module, leaf)
            device = get_device(device_map, name, valid_torch_device=True)
            if isinstance(tensor, nn.Parameter):
                tensor.data = tensor.data.to(device)
            else:
                setattr(module, leaf, tensor.to(device))

    def _initialize_missing_keys(self, is_quantized: bool) -> None:
        pass  # the build initialised every weight, with the draws cls(config) makes

    @staticmethod
    def _load_pretrained_model(model, state_dict, checkpoint_files, load_config, expected_keys=None):
        # A checkpoint of another class (a pre-training one into a task head) gives the encoder
        # only: this model's head keeps the values the build drew, even where the two heads share
        # names (VCR's masked RoI head and pre-training's).
        new_head = {}
        if model._checkpoint_class() != type(model).__name__:
            new_head = {
                key: value.detach().clone()
                for key, value in model.state_dict().items()
                if not model._in_encoder(key) and key not in model.all_tied_weights_keys
            }
        info, offload_index = PreTrainedModel._load_pretrained_model(
            model, state_dict, checkpoint_files, load_config, expected_keys
        )
        with torch.no_grad():
            for key, value in new_head.items():
                tensor = model.get_parameter_or_buffer(key)
                tensor.copy_(value)
                tensor._is_hf_initialized = False  # not loaded: reported as new
        info.missing_keys.update(new_head)
        return info, offload_index

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        """transformers' from_pretrained (config fields as keyword arguments, e.g. tune_frcnn=False,
        num_answers=...), then the checkpoint must fit: the encoder (`vlbert.*`) loads whole, and a
        checkpoint of this class loads whole; one of another class (a pre-training checkpoint into
        a task head) leaves its head behind, and this model's own head starts new."""
        output_loading_info = kwargs.pop("output_loading_info", False)
        # transformers' LOAD REPORT lists the other class's head left behind and this one's new;
        # held back, and shown only if the checkpoint does not fit (or a weight's shape differs).
        held, fits = _HeldLoadReport(), False
        report_logger = logging.getLogger(_TRANSFORMERS_LOADER)
        report_logger.addFilter(held)
        try:
            model, info = super().from_pretrained(
                pretrained_model_name_or_path, *model_args, output_loading_info=True, **kwargs
            )
            model._check_checkpoint_fits(pretrained_model_name_or_path, info)
            fits = not info["mismatched_keys"]
        finally:
            report_logger.removeFilter(held)
            if not fits:
                held.release(report_logger)
        if model.base_model.fast_rcnn is not None:
            model.base_model.fast_rcnn.set_requires_grad()  # loading made every float parameter trainable
        return (model, info) if output_loading_info else model

    def _checkpoint_class(self) -> str:
        """The class that wrote the checkpoint loaded (its config's), this one's if unnamed."""
        return (self.config.architectures or [type(self).__name__])[0]

    def _in_encoder(self, key: str) -> bool:
        """Whether a weight's name is the encoder's, in either naming: its own or a head's."""
        parts = tuple(f"{name}." for name, _ in self.base_model.named_children())
        return key.removeprefix(f"{self.base_model_prefix}.").startswith(parts)

    def _check_checkpoint_fits(self, source, info: dict) -> None:
        stored = self._checkpoint_class()
        missing, unexpected = sorted(info["missing_keys"]), sorted(info["unexpected_keys"])
        if stored != type(self).__name__:  # another class's head stays behind; ours starts new
            missing = [k for k in missing if self._in_encoder(k)]
            unexpected = [k for k in unexpected if self._in_encoder(k)]
        if missing or unexpected:
            raise ValueError(
                f"{source}: checkpoint ({stored}) does not fit {type(self).__name__} "
                f"(missing {missing[:5]}, unexpected {unexpected[:5]})"
            )

    def save_pretrained(self, save_directory, *args, **kwargs) -> None:
        """transformers' save_pretrained, each file written whole: into a temporary folder beside
        `save_directory`, then renamed into it one by one, so that a crash leaves each file old or
        new, never half of one. Weight files of an earlier save that this one does not write go."""
        folder = Path(save_directory)
        folder.mkdir(parents=True, exist_ok=True)
        if kwargs.get("push_to_hub"):
            kwargs.setdefault("repo_id", folder.name)
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=folder.parent))
        try:
            super().save_pretrained(staging, *args, **kwargs)
            written = {path.name for path in staging.iterdir()}
            for name in sorted(written):
                os.replace(staging / name, folder / name)
            for stale in folder.glob(f"{Path(SAFE_WEIGHTS_NAME).stem}*.safetensors*"):
                if stale.name not in written:
                    stale.unlink()
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    # ---- BERT's text weights ------------------------------------------------------------------

    def load_bert(self, checkpoint: str | Path) -> dict:
        """Take text weights from a BERT checkpoint (local folder or hub id).

        Returns {"loaded": [...], "new": [...], "ignored": [...]}: "new" must be only visual and
        head parameters (and segment C, the third row of token_type_embeddings).
        """
        with _transformers_quiet():  # we report what was new ourselves, below
            bert = BertModel.from_pretrained(str(checkpoint), add_pooling_layer=False)
        encoder = self.base_model
        prefix = "" if encoder is self else f"{self.base_model_prefix}."
        state = bert.state_dict()
        segments = state.pop("embeddings.token_type_embeddings.weight")
        own = encoder.bert.state_dict()
        if own["embeddings.token_type_embeddings.weight"].shape[1] != segments.shape[1]:
            raise ValueError(f"{checkpoint}: hidden size {segments.shape[1]} differs from the config's")
        with torch.no_grad():
            encoder.bert.embeddings.token_type_embeddings.weight[: len(segments)] = segments
        missing, unexpected = encoder.bert.load_state_dict(state, strict=False)
        missing = [k for k in missing if k != "embeddings.token_type_embeddings.weight"]
        if missing:
            raise ValueError(f"{checkpoint}: BERT weights missing from the checkpoint: {missing[:5]}")
        text_names = {f"{prefix}bert.{k}" for k in state} | {f"{prefix}bert.embeddings.token_type_embeddings.weight"}
        tied = set(self.all_tied_weights_keys)
        new = [
            n
            for n, _ in self.named_parameters()
            if n not in text_names and n not in tied and not n.startswith(f"{prefix}fast_rcnn.")
        ]
        if len(segments) < self.config.type_vocab_size:
            new.append(f"{prefix}bert.embeddings.token_type_embeddings.weight[segment C]")
        return {"loaded": sorted(text_names), "new": new, "ignored": list(unexpected)}

    # ---- what the study's builder calls on a new model (every model family has them) ---------

    def load_detector(self, detector_dir) -> None:
        """The Fast R-CNN module's backbone and C5 head from the trained detector."""
        if self.base_model.fast_rcnn is not None:
            self.base_model.fast_rcnn.load_detector_weights(detector_dir)

    def center_appearance(self, mean: torch.Tensor) -> None:
        """Centre the regions' appearance features on `mean` (that of the training images)."""
        self.base_model.visual_embeddings.appearance_mean.copy_(mean)

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
            is_region = (input_ids == self.config.img_token_id).unsqueeze(-1)
            element_visual = torch.where(is_region, element_visual, self.visual_embeddings.text_scale * element_visual)
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
    Masked RoI classification is trained alongside, as in the paper's VCR fine-tuning."""

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
        logits = self.classifier(self.roi_hidden(hidden, roi_positions)).squeeze(-1)
        logits = logits.masked_fill(roi_positions < 0, -math.inf)
        losses = {}
        if roi_targets is not None:
            losses["ref"] = referring_loss(logits, roi_targets)
        return VLBertTaskOutput(losses.get("ref"), logits, losses)
