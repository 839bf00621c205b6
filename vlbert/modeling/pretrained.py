"""The base of every model family's classes: `StudyPreTrainedModel`, a transformers `PreTrainedModel`
with the study's weight init, BERT's text weights, checkpoint loading and saving, and the hooks the
study's builder calls on a new model (`vlbert.engine.build.build_model`).

Named after transformers' `PreTrainedModel`, which it extends: what it holds is not loading alone,
but everything a family's classes share beside their layers, heads (`heads.py`) and inputs
(`inputs.py`). A family's own base (`VLBertPreTrainedModel`, `ViLBertPreTrainedModel`,
`PixelBertPreTrainedModel`) subclasses it with its `config_class` and `base_model_prefix`, and
defines the builder's hooks `load_detector` and `center_appearance` for its encoder. What the base
reads of a family's encoder (its `base_model`):

- `bert`: transformers' `BertModel`, the text weights `load_bert` fills;
- `_initialised_by_head`: True when a head holds the encoder and initialises it with its own
  weights, in one pass (the head's `post_init`);
- the class attribute `_detector_name`: the encoder's submodule, if any, that keeps its own
  initialisation until the trained detector's weights load, and that `load_bert` does not count
  as new (VL-BERT's `fast_rcnn`; None: every module takes BERT's init).

Loading (`from_pretrained`, which transformers' Auto classes call too) builds the model as
`cls(config)` builds it, every weight drawn from the RNG in module order as the study's results
were drawn, then loads the checkpoint's weights over it with torch's `load_state_dict`: a task
head new on a pre-training checkpoint starts from the draws `cls(config)` makes, and leaves the
RNG where `cls(config)` leaves it. Only transformers' public API is used (configs, `cached_file`,
`save_pretrained`).

Reading order: weight init, transformers' quiet loading, then `StudyPreTrainedModel`: init,
from_pretrained and the checkpoint's checks, save_pretrained, load_bert, the builder's hooks.
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn
from transformers import BertModel, PreTrainedModel
from transformers.utils import SAFE_WEIGHTS_NAME, cached_file

from ..io import DIGESTS_FILE, CorruptCheckpointError, check_checkpoint, write_digests, writing

# transformers' from_pretrained arguments that say where a checkpoint is (the Hub's); the Auto
# classes pass them on.
HUB_ARGUMENTS = ("cache_dir", "force_download", "local_files_only", "proxies", "revision", "subfolder", "token")
# What the Auto classes add for their own loader, which this one has no use for.
AUTO_CLASS_ARGUMENTS = ("_from_auto", "trust_remote_code", "code_revision", "adapter_kwargs")


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


class StudyPreTrainedModel(PreTrainedModel):
    """Weight init, BERT loading and checkpoints, shared by every family's encoder and heads.

    Initialisation draws from the RNG as the study's results were drawn, so that a seed gives the
    same model as before these classes moved onto transformers: the modules' construction
    defaults (BertModel's own init pass among them), then one pass of `init_weights` over every
    module but the detector's (VL-BERT's Fast R-CNN), in module order, the encoder's included
    (`init_weights` below; transformers' own pass would skip what BertModel initialised).
    `from_pretrained` builds the model that same way, on the CPU rather than on the meta device,
    and loads the checkpoint over it: a task head new on a pre-training checkpoint starts from the
    draws `cls(config)` makes, and leaves the RNG where `cls(config)` leaves it.
    """

    _supports_sdpa = True  # the attention is BertModel's
    # A single-stream encoder: the words and the visual elements share one attention, its
    # BertModel's (`bert`), and `attention_columns` says which of its columns are which. A
    # two-stream encoder's words reach the visual elements through co-attention alone.
    single_stream: bool = False
    # The encoder's submodule that keeps its own init until the detector's weights load (None: none).
    _detector_name: str | None = None

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        init_weights(module, self.config.initializer_range)

    # ---- the readouts: what the shared heads (heads.py) take from a family's encoder ------------
    # `encoded` is the family's encoder output on the batch (its base model's forward).

    vcr_classifies_rois: bool = False  # VCR's task model also classifies masked RoIs

    def build_encoder(self, config) -> nn.Module:
        """The family's encoder, for a task model to hold (`initialise=False`: the task model's
        `post_init` draws it with the head, in one pass)."""
        raise NotImplementedError(f"{type(self).__name__} builds no encoder")

    def word_states(self, encoded, mlm_labels: torch.Tensor | None) -> tuple:
        """The words' states [B, T, H] that masked language modelling scores, and `mlm_labels`
        ([B, L], per input element) as [B, T] on those states (None without)."""
        raise NotImplementedError(f"{type(self).__name__} has no word states")

    def relation_state(self, encoded) -> torch.Tensor:
        """[B, H]: the state the sentence-image relation is read on."""
        raise NotImplementedError(f"{type(self).__name__} has no relation state")

    def answer_state(self, encoded, answer_positions: torch.Tensor | None) -> torch.Tensor:
        """[B, H]: the state VQA's classifier reads (`answer_positions`: each item's answer slot)."""
        raise NotImplementedError(f"{type(self).__name__} has no answer state")

    def candidate_state(self, encoded) -> torch.Tensor:
        """[B * C, H]: the state a multiple-choice candidate (VCR's) is scored on."""
        raise NotImplementedError(f"{type(self).__name__} has no candidate state")

    def region_states(self, encoded, visual, roi_positions: torch.Tensor | None) -> torch.Tensor | None:
        """[B, R, H]: each region row's state (`visual`'s rows; `roi_positions` < 0 where a row
        is no region), what RefCOCO+ scores and masked region modelling reads; None where the
        batch has no regions to read."""
        raise NotImplementedError(f"{type(self).__name__} has no region states")

    def attention_columns(self, batch: dict, encoded) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A single-stream encoder's sequence, [B, L] masks each: its visual elements, its masked
        words (the batch's `mlm_labels`), and the elements it attends. `encoded`: its forward's
        output on the batch."""
        raise NotImplementedError(f"{type(self).__name__} is no single-stream encoder")

    def _detector(self) -> nn.Module | None:
        return getattr(self.base_model, self._detector_name) if self._detector_name else None

    def init_weights(self) -> None:
        """`post_init`'s pass: every module but the detector's (it keeps its detector init until
        the detector's weights load), in module order, then the tying."""
        if getattr(self, "_initialised_by_head", False):
            return  # the head holding this model initialises it with its own weights, in one pass
        detector_module = self._detector()
        detector = set(detector_module.modules()) if detector_module is not None else set()
        for module in self.modules():
            if module not in detector:
                self._init_weights(module)
            module._is_hf_initialized = True
        self.tie_weights(recompute_mapping=False)

    def reinitialise(self, names: list[str]) -> None:
        """The encoder's modules `names` (e.g. ViLBERT's `text_pooler`) drawn new, as the build
        draws them: a part that pre-training's own objective shaped and a task should not inherit.
        Every parameter is drawn again: a module's own `reset_parameters` (torch's layers, e.g. a
        convolution, and the families' modules with parameters of their own), then BERT's init for
        Linear, Embedding and LayerNorm; a parameter neither reaches is an error, not kept."""
        for name in names:
            try:
                module = self.base_model.get_submodule(name)
            except AttributeError:
                raise ValueError(f"{type(self).__name__} has no module {name!r} to re-initialise") from None
            for part_name, part in module.named_modules(prefix=name):
                own = [p for p, _ in part.named_parameters(recurse=False)]
                if isinstance(part, (nn.Linear, nn.Embedding, nn.LayerNorm)) or not own:
                    continue
                if not hasattr(part, "reset_parameters"):
                    raise ValueError(
                        f"{type(self).__name__}.{part_name} ({type(part).__name__}) has parameters "
                        f"{own} that re-initialising cannot draw again: give it reset_parameters()"
                    )
                part.reset_parameters()
            module.apply(self._init_weights)

    # ---- from_pretrained: built as cls(config) builds it, then loaded ----------------------------

    @classmethod
    def from_pretrained(
        cls, pretrained_model_name_or_path, *model_args, config=None, output_loading_info: bool = False, **kwargs
    ):
        """The model `cls(config)` builds, with a checkpoint's weights loaded over it (a local folder
        or a Hub id; config fields as keyword arguments, e.g. tune_frcnn=False, num_answers=...).
        The checkpoint must fit: the encoder (`<base_model_prefix>.*`, or an encoder's own
        checkpoint) loads whole, and a checkpoint of this class loads whole; one of another class (a
        pre-training checkpoint into a task head) leaves its head behind, and this model's own head
        keeps the values the build drew, even where the two heads share names (VCR's masked RoI
        head and pre-training's). In eval mode, as transformers returns a model."""
        if model_args:
            raise TypeError(f"{cls.__name__}.from_pretrained takes the checkpoint and keyword arguments only")
        source = str(pretrained_model_name_or_path)
        hub = {name: kwargs.pop(name) for name in HUB_ARGUMENTS if name in kwargs}
        for name in AUTO_CLASS_ARGUMENTS:
            kwargs.pop(name, None)
        dtype, torch_dtype = kwargs.pop("dtype", None), kwargs.pop("torch_dtype", None)
        dtype = dtype or torch_dtype
        dtype = None if dtype == "auto" else dtype  # the checkpoint's: the build's float32
        if Path(source).is_dir():
            check_checkpoint(source)
        if config is None:
            config, kwargs = cls.config_class.from_pretrained(source, return_unused_kwargs=True, **hub, **kwargs)
        else:
            config = copy.deepcopy(config)
            for name in [name for name in kwargs if hasattr(config, name)]:
                setattr(config, name, kwargs.pop(name))
        if kwargs:
            raise TypeError(f"{cls.__name__}.from_pretrained: unknown arguments {sorted(kwargs)}")
        try:
            state = load_file(cached_file(source, SAFE_WEIGHTS_NAME, **hub))
        except SafetensorError as exc:  # one written before digests were kept, cut short
            raise CorruptCheckpointError(
                f"{source}: its weights cannot be read ({exc}): make the checkpoint again"
            ) from None
        model = cls(config)
        info = model._load_checkpoint_state(source, state)
        if dtype is not None:
            model = model.to(dtype if isinstance(dtype, torch.dtype) else getattr(torch, dtype))
        model.eval()
        return (model, info) if output_loading_info else model

    def _load_checkpoint_state(self, source, state: dict[str, torch.Tensor]) -> dict:
        """A checkpoint's weights over this model, in either naming (an encoder's or a head's);
        returns what was missing and unexpected, as transformers' loading info names them."""
        prefix = f"{self.base_model_prefix}."
        prefixed = any(key.startswith(prefix) for key in state)
        if self.base_model is self and prefixed:  # a head's checkpoint into the encoder alone
            state = {key.removeprefix(prefix): value for key, value in state.items()}
        elif self.base_model is not self and not prefixed:  # an encoder's checkpoint into a head
            state = {f"{prefix}{key}": value for key, value in state.items()}
        left_behind = set()
        if self._checkpoint_class() != type(self).__name__:  # another class's head stays behind
            left_behind = {key for key in state if not self._in_encoder(key)}
            state = {key: value for key, value in state.items() if key not in left_behind}
        own = self.state_dict()
        mismatched = [
            f"{key} {tuple(value.shape)} against {tuple(own[key].shape)}"
            for key, value in state.items()
            if key in own and own[key].shape != value.shape
        ]
        if mismatched:
            raise ValueError(
                f"{source}: checkpoint ({self._checkpoint_class()}) does not fit {type(self).__name__} "
                f"(shapes differ: {mismatched[:5]})"
            )
        with torch.no_grad():
            result = self.load_state_dict(state, strict=False)
        tied = set(self.all_tied_weights_keys)
        info = {
            "missing_keys": {key for key in result.missing_keys if key not in tied},
            "unexpected_keys": set(result.unexpected_keys) | left_behind,
            "mismatched_keys": [],
            "error_msgs": [],
        }
        self._check_checkpoint_fits(source, info)
        return info

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
            with writing(folder):
                super().save_pretrained(staging, *args, **kwargs)
            written = {path.name for path in staging.iterdir()}
            # The old files' digests go first: a crash while the new ones move in leaves a folder
            # unchecked, as before digests, not one that fails its own check.
            (folder / DIGESTS_FILE).unlink(missing_ok=True)
            for name in sorted(written):
                os.replace(staging / name, folder / name)
            for stale in folder.glob(f"{Path(SAFE_WEIGHTS_NAME).stem}*.safetensors*"):
                if stale.name not in written:
                    stale.unlink()
            write_digests(folder)  # what a load checks the files against
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    # ---- BERT's text weights ------------------------------------------------------------------

    def load_bert(self, checkpoint: str | Path) -> dict:
        """Take text weights from a BERT checkpoint (local folder or hub id).

        Returns {"loaded": [...], "new": [...], "ignored": [...]}: "new" must be only visual and
        head parameters (and segment C, the third row of token_type_embeddings); the detector's
        (`_detector_name`) are neither loaded nor new.
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
        detector = (f"{prefix}{self._detector_name}.",) if self._detector_name else ()
        new = [
            n
            for n, _ in self.named_parameters()
            if n not in text_names and n not in tied and not n.startswith(detector)
        ]
        if len(segments) < self.config.type_vocab_size:
            new.append(f"{prefix}bert.embeddings.token_type_embeddings.weight[segment C]")
        return {"loaded": sorted(text_names), "new": new, "ignored": list(unexpected)}

    # ---- what the study's builder calls on a new model (every model family defines them) -----

    def load_detector(self, detector_dir) -> None:
        """The encoder's weights from the trained detector (a `vlbert train-detector` folder)."""
        raise NotImplementedError(f"{type(self).__name__}.load_detector")

    def center_appearance(self, mean: torch.Tensor) -> None:
        """Centre the regions' appearance features on `mean` (that of the training images)."""
        raise NotImplementedError(f"{type(self).__name__}.center_appearance")

    def fit_pixel_statistics(self, images) -> None:
        """Statistics of the training images' pixels, for a family that reads them (Pixel-BERT);
        `images` an iterable of float RGB [3, H, W], read only where needed. Others: nothing."""
