"""VL-BERT: configuration, Fast R-CNN module, the single-stream model and its heads, the processor.

No MLflow, Ray or training-loop code lives here. The names load on first use, so that the
configuration (vlbert/auto.py registers it) comes without torch's model code.
"""

from __future__ import annotations

import importlib

# Each name and the module that defines it.
_MODULES = {
    "VLBertConfig": "configuration_vlbert",
    "FastRCNN": "fast_rcnn",
    "VLBertForPreTraining": "modeling_vlbert",
    "VLBertForRefCOCO": "modeling_vlbert",
    "VLBertForVCR": "modeling_vlbert",
    "VLBertForVQA": "modeling_vlbert",
    "VLBertModel": "modeling_vlbert",
    "VLBertProcessor": "processing_vlbert",
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
    """AutoConfig for model_type "vlbert", AutoModel (the encoder) and AutoModelForPreTraining.
    The task heads have no Auto class whose inputs they take."""
    from transformers import AutoConfig, AutoModel, AutoModelForPreTraining

    from .configuration_vlbert import VLBertConfig
    from .modeling_vlbert import VLBertForPreTraining, VLBertModel

    AutoConfig.register(VLBertConfig.model_type, VLBertConfig, exist_ok=True)
    AutoModel.register(VLBertConfig, VLBertModel, exist_ok=True)
    AutoModelForPreTraining.register(VLBertConfig, VLBertForPreTraining, exist_ok=True)


__all__ = [*_MODULES, "register_auto_classes"]
