"""VL-BERT configuration: the study's fields (`StudyConfig`), under VL-BERT's model type."""

from __future__ import annotations

from .configuration_study import StudyConfig


class VLBertConfig(StudyConfig):
    """VL-BERT reads every field of `StudyConfig` but `tag_coattention_mask` (ViLBERT's)."""

    model_type = "vlbert"

    def __init__(self, **kwargs):  # its own, as transformers wants of a config subclass
        super().__init__(**kwargs)
