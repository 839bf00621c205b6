"""VL-BERT: configuration, Fast R-CNN module, the single-stream model and its heads, the processor.

No MLflow, Ray or training-loop code lives here.
"""

from .configuration_vlbert import VLBertConfig
from .fast_rcnn import FastRCNN
from .modeling_vlbert import (VLBertForPreTraining, VLBertForRefCOCO, VLBertForVCR, VLBertForVQA,
                              VLBertModel)
from .processing_vlbert import VLBertProcessor

__all__ = ["VLBertConfig", "FastRCNN", "VLBertModel", "VLBertForPreTraining", "VLBertForVQA",
           "VLBertForVCR", "VLBertForRefCOCO", "VLBertProcessor"]
