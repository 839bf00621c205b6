"""The model families: VL-BERT (configuration, Fast R-CNN module, the single-stream model and its
heads, the processor), ViLBERT (two streams) and Pixel-BERT (pixels into one stream), each in its
configuration_* and modeling_* files.

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
    "ViLBertConfig": "configuration_vilbert",
    "ViLBertForPreTraining": "modeling_vilbert",
    "ViLBertForRefCOCO": "modeling_vilbert",
    "ViLBertForVCR": "modeling_vilbert",
    "ViLBertForVQA": "modeling_vilbert",
    "ViLBertModel": "modeling_vilbert",
    "PixelBertConfig": "configuration_pixelbert",
    "PixelBertForPreTraining": "modeling_pixelbert",
    "PixelBertForRefCOCO": "modeling_pixelbert",
    "PixelBertForVCR": "modeling_pixelbert",
    "PixelBertForVQA": "modeling_pixelbert",
    "PixelBertModel": "modeling_pixelbert",
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
