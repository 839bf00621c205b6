"""VL-BERT: configuration, Fast R-CNN module, the single-stream model and its heads, the processor.

No MLflow, Ray or training-loop code lives here.
"""

from .configuration_vlbert import VLBertConfig
from .fast_rcnn import FastRCNN
from .modeling_vlbert import VLBertForPreTraining, VLBertForRefCOCO, VLBertForVCR, VLBertForVQA, VLBertModel
from .processing_vlbert import VLBertProcessor


def register_auto_classes() -> None:
    """AutoConfig for model_type "vlbert", AutoModel (the encoder) and AutoModelForPreTraining.
    The task heads have no Auto class whose inputs they take."""
    from transformers import AutoConfig, AutoModel, AutoModelForPreTraining

    AutoConfig.register(VLBertConfig.model_type, VLBertConfig, exist_ok=True)
    AutoModel.register(VLBertConfig, VLBertModel, exist_ok=True)
    AutoModelForPreTraining.register(VLBertConfig, VLBertForPreTraining, exist_ok=True)


__all__ = [
    "FastRCNN",
    "VLBertConfig",
    "VLBertForPreTraining",
    "VLBertForRefCOCO",
    "VLBertForVCR",
    "VLBertForVQA",
    "VLBertModel",
    "VLBertProcessor",
    "register_auto_classes",
]
