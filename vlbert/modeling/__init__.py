"""The model families: VL-BERT (configuration, Fast R-CNN module, the single-stream model and its
heads, the processor), ViLBERT (two streams) and Pixel-BERT (pixels into one stream), each in its
configuration_* and modeling_* files; what they share in modules of its own: pretrained.py (the
base class: init, BERT loading, checkpoints), inputs.py (VisualInputs), heads.py (heads, losses).

No MLflow, Ray or training-loop code lives here. The names load on first use, so that the
configuration (vlbert/auto.py registers it) comes without torch's model code.
"""

from __future__ import annotations

import importlib

from ..registry import FAMILIES as _FAMILIES

# Each name and the module that defines it: the family-independent ones, then each family's
# classes as its registry entry names them (a family whose entry names a `module` of its own is
# looked up there, by vlbert.registry.family_class).
_MODULES = {
    "FastRCNN": "fast_rcnn",
    "VLBertProcessor": "processing_vlbert",
    **{f.config_class: f.configuration_module for f in _FAMILIES.values() if f.module is None},
    **{
        name: f.modeling_module
        for f in _FAMILIES.values()
        if f.module is None
        for name in (f.model_class, f.pretraining_class, *f.head_classes.values())
    },
}


def __getattr__(name: str):
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_MODULES[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted([*globals(), *_MODULES])


def register_auto_classes() -> None:
    """AutoConfig for every family's model_type, AutoModel (the encoder) and
    AutoModelForPreTraining. The task heads have no Auto class whose inputs they take."""
    from transformers import AutoConfig

    from ..auto import register_config, register_models

    register_config(AutoConfig)
    register_models()


__all__ = [*_MODULES, "register_auto_classes"]
