"""The model families: VL-BERT (a single stream over words and regions, its Fast R-CNN module),
ViLBERT (two streams) and Pixel-BERT (pixels into one stream), each in its configuration_* and
modeling_* files (its config, encoder, pre-training model, the readouts the task heads take, and
its task models); what they share in modules of its own: configuration_study.py (the config base),
processing_study.py (the input layout every family reads), pretrained.py (the base class: init,
BERT loading, checkpoints, the readouts' contract), inputs.py (VisualInputs), heads.py (the task
heads of VQA, VCR and RefCOCO+, written once; losses; outputs).

Importing this package puts every family of `vlbert.registry.FAMILIES` on transformers' Auto
classes (`register_family`): after `import vlbert.modeling`, AutoConfig, AutoModel and
AutoModelForPreTraining load a checkpoint the study wrote. `import vlbert` alone does not import
it, so that the data and report jobs load neither torch nor transformers.

No MLflow, Ray or training-loop code lives here.
"""

from __future__ import annotations

from ..registry import FAMILIES, ModelFamily, family_class
from .configuration_pixelbert import PixelBertConfig
from .configuration_study import StudyConfig
from .configuration_vilbert import ViLBertConfig
from .configuration_vlbert import VLBertConfig
from .fast_rcnn import FastRCNN
from .modeling_pixelbert import (
    PixelBertForPreTraining,
    PixelBertForRefCOCO,
    PixelBertForVCR,
    PixelBertForVQA,
    PixelBertModel,
)
from .modeling_vilbert import ViLBertForPreTraining, ViLBertForRefCOCO, ViLBertForVCR, ViLBertForVQA, ViLBertModel
from .modeling_vlbert import VLBertForPreTraining, VLBertForRefCOCO, VLBertForVCR, VLBertForVQA, VLBertModel
from .processing_study import StudyProcessor


def register_family(family: ModelFamily | str) -> None:
    """A family on transformers' Auto classes: its config on AutoConfig (under its model_type, the
    key a checkpoint's config.json names), its encoder on AutoModel, its pre-training model on
    AutoModelForPreTraining. The task heads have no Auto class whose inputs they take. A family
    whose classes live in a module of its own (`ModelFamily.module`) calls this for itself."""
    from transformers import AutoConfig, AutoModel, AutoModelForPreTraining

    family = FAMILIES[family] if isinstance(family, str) else family
    config_class = family_class(family, family.config_class)
    if config_class.model_type != family.name:
        raise ValueError(f"{config_class.__name__}.model_type is {config_class.model_type!r}, not {family.name!r}")
    AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
    AutoModel.register(config_class, family_class(family, family.model_class), exist_ok=True)
    AutoModelForPreTraining.register(config_class, family_class(family, family.pretraining_class), exist_ok=True)


for _family in FAMILIES.values():
    if _family.module is None:
        register_family(_family)

__all__ = [
    "FastRCNN",
    "PixelBertConfig",
    "PixelBertForPreTraining",
    "PixelBertForRefCOCO",
    "PixelBertForVCR",
    "PixelBertForVQA",
    "PixelBertModel",
    "StudyConfig",
    "StudyProcessor",
    "VLBertConfig",
    "VLBertForPreTraining",
    "VLBertForRefCOCO",
    "VLBertForVCR",
    "VLBertForVQA",
    "VLBertModel",
    "ViLBertConfig",
    "ViLBertForPreTraining",
    "ViLBertForRefCOCO",
    "ViLBertForVCR",
    "ViLBertForVQA",
    "ViLBertModel",
    "register_family",
]
