"""The study's configuration base: transformers' BertConfig plus the visual inputs and the
fine-tuning switches every model family takes (each family's config subclasses it and names its
own `model_type`), and the special tokens and segments of the sequences the processor builds."""

from __future__ import annotations

from transformers import BertConfig

# BERT's uncased WordPiece vocabulary reserves [unused0..993]; VL-BERT's two new tokens take the
# first two, so a BERT checkpoint's embedding matrix is used as it is (no resize, no new rows).
IMG_TOKEN = "[unused0]"
END_TOKEN = "[unused1]"
SEGMENT_A, SEGMENT_B, SEGMENT_IMAGE = 0, 1, 2


class StudyConfig(BertConfig):
    """Every family's fields (a family's config adds its own).

    visual_feature_dim: size of a RoI's appearance feature (the detector's pooled C5 output).
    geometry_wavelengths: sin/cos wave-lengths per box coordinate; the geometry embedding has
        4 * 2 * geometry_wavelengths dimensions.
    num_visual_classes: detector classes including background (masked RoI classification).
    num_answers: VQA answer vocabulary size (0 when there is no VQA head).
    frcnn: the study's detector's config (its folder's `detector_config.json`: a trained detector's
        DetectorConfig.to_json(), or a detectron2 model's description); None: features always
        come cached.
    tune_frcnn: whether the Fast R-CNN module receives gradients.
    frozen_frcnn_stages: with tune_frcnn, how many of the trunk's first stages stay frozen: 2, the
        stem and C2, as VL-BERT's released configs (`IMAGE_FROZEN_BACKBONE_STAGES: [1, 2]`).
    visual_scale_text_init: initial value of the learnt scale on the visual embedding that text
        elements take (VL-BERT's `visual_scale_text_init`, 0 in its released configs).
    tags_at_region_scale: a word that names an object (VCR's tags: its `visual_index` is the
        object's row) takes the object's visual embedding at the scale the object's own [IMG]
        element takes it, not at the words' learnt scale. VL-BERT's released code scales it as
        any word's; that scale is learnt in pre-training from the whole image alone, which no loss
        pins down, so how much of its object a tag carried was its checkpoint's accident.
    tag_coattention_mask: ViLBERT's pointer from a tag to its region (ViLBertConfig says how);
        every family's config takes it, as every family's task model gets the fine-tuning
        switches, and only ViLBERT reads it.
    standardise_head_input: a task head standardises its input per feature with statistics of
        the fine-tuning set, stored with the weights (`vlbert.engine.head_input` takes them).
    centre_candidates: a multiple-choice head (VCR) reads each candidate's state minus the mean
        of its question's candidates, a RefCOCO+ head each candidate region's minus the mean of
        its expression's candidate regions: what tells them apart, without the part they share.
    classifier_dropout: a task head's dropout (transformers' BertConfig field); None: hidden_dropout_prob.
    """

    def __init__(
        self,
        visual_feature_dim: int = 128,
        geometry_wavelengths: int = 8,
        num_visual_classes: int = 7,
        num_answers: int = 0,
        frcnn: dict | None = None,
        tune_frcnn: bool = False,
        frozen_frcnn_stages: int = 2,
        img_token_id: int = 1,
        end_token_id: int = 2,
        type_vocab_size: int = 3,
        visual_scale_text_init: float = 0.0,
        standardise_head_input: bool = False,
        centre_candidates: bool = False,
        tags_at_region_scale: bool = False,
        tag_coattention_mask: bool = False,
        **kwargs,
    ):
        kwargs.setdefault("attn_implementation", "sdpa")
        # Checkpoints written before the models were transformers PreTrainedModels name their class
        # in "architecture"; transformers reads "architectures". They load as they are.
        legacy = kwargs.pop("architecture", None)
        if legacy is not None and not kwargs.get("architectures"):
            kwargs["architectures"] = [legacy]
        super().__init__(type_vocab_size=type_vocab_size, **kwargs)
        self.visual_feature_dim = visual_feature_dim
        self.geometry_wavelengths = geometry_wavelengths
        self.num_visual_classes = num_visual_classes
        self.num_answers = num_answers
        self.frcnn = frcnn
        self.tune_frcnn = tune_frcnn
        self.frozen_frcnn_stages = frozen_frcnn_stages
        self.img_token_id = img_token_id
        self.end_token_id = end_token_id
        self.visual_scale_text_init = visual_scale_text_init
        self.standardise_head_input = standardise_head_input
        self.centre_candidates = centre_candidates
        self.tags_at_region_scale = tags_at_region_scale
        self.tag_coattention_mask = tag_coattention_mask

    @property
    def geometry_dim(self) -> int:
        return 8 * self.geometry_wavelengths

    def to_json_file(self, json_file_path, use_diff: bool = False):
        # Every field, defaults included (transformers writes only those that differ): a
        # checkpoint's config.json tells its reader what it is (tune_frcnn, num_answers, ...).
        super().to_json_file(json_file_path, use_diff=use_diff)
