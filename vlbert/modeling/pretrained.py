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
  as new (VL-BERT's `fast_rcnn`; None: every module takes BERT's init);
- `_after_loading`: what the family puts back after transformers' load (which makes every float
  parameter trainable), e.g. a frozen detector's `requires_grad`.

Why transformers' private loader methods are overridden (transformers 5, pinned in pyproject.toml):
transformers builds a model on the meta device and initialises only what the checkpoint lacks; the
study's results were drawn from models built as `cls(config)` builds them, every weight drawn from
the RNG in module order. `get_init_context` drops the meta device, so the build draws every weight;
`_move_missing_keys_from_meta_to_device` and `_initialize_missing_keys` then leave what the
checkpoint lacks with the values the build drew; `_load_pretrained_model` keeps a new head's draws
where a checkpoint of another class shares its names. The comments at each say more.

Reading order: weight init, the held LOAD REPORT and transformers' quiet loading, then
`StudyPreTrainedModel`: init, from_pretrained and the loader overrides, the checkpoint's checks,
save_pretrained, load_bert, the builder's hooks.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import SafetensorError
from torch import nn
from transformers import BertModel, PreTrainedModel
from transformers.utils import SAFE_WEIGHTS_NAME

from ..io import DIGESTS_FILE, CorruptCheckpointError, check_checkpoint, write_digests, writing

_TRANSFORMERS_LOADER = "transformers.modeling_utils"  # the logger of transformers' LOAD REPORT


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
    # The encoder's submodule that keeps its own init until the detector's weights load (None: none).
    _detector_name: str | None = None

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        init_weights(module, self.config.initializer_range)

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
        num_answers=...), then the checkpoint must fit: the encoder (`<base_model_prefix>.*`)
        loads whole, and a checkpoint of this class loads whole; one of another class (a
        pre-training checkpoint into a task head) leaves its head behind, and this model's own
        head starts new."""
        output_loading_info = kwargs.pop("output_loading_info", False)
        if Path(pretrained_model_name_or_path).is_dir():
            check_checkpoint(pretrained_model_name_or_path)
        # transformers' LOAD REPORT lists the other class's head left behind and this one's new;
        # held back, and shown only if the checkpoint does not fit (or a weight's shape differs).
        held, fits = _HeldLoadReport(), False
        report_logger = logging.getLogger(_TRANSFORMERS_LOADER)
        report_logger.addFilter(held)
        try:
            try:
                model, info = super().from_pretrained(
                    pretrained_model_name_or_path, *model_args, output_loading_info=True, **kwargs
                )
            except SafetensorError as exc:  # one written before digests were kept, cut short
                raise CorruptCheckpointError(
                    f"{pretrained_model_name_or_path}: its weights cannot be read ({exc}): make the checkpoint again"
                ) from None
            model._check_checkpoint_fits(pretrained_model_name_or_path, info)
            fits = not info["mismatched_keys"]
        finally:
            report_logger.removeFilter(held)
            if not fits:
                held.release(report_logger)
        model._after_loading()
        return (model, info) if output_loading_info else model

    def _after_loading(self) -> None:
        """What the family puts back once the checkpoint is loaded (loading made every float
        parameter trainable): nothing here."""

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
