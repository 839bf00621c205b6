"""ViLBERT configuration: the study's fields (`StudyConfig`, filled by the builder as for every
family) plus the visual stream and where the co-attention layers sit."""

from __future__ import annotations

from itertools import pairwise

from .configuration_study import StudyConfig


class ViLBertConfig(StudyConfig):
    """
    num_visual_layers: transformer layers of the visual stream. Its width is the text stream's
        (VOLTA's controlled setting): the two streams then differ from VL-BERT's single one in
        their wiring, not in their size, and the co-attention projections are square.
    text_coattention_layers / visual_coattention_layers: co-attention layer k runs before text
        layer text_coattention_layers[k] and before visual layer visual_coattention_layers[k] (an
        index equal to the stream's layer count: after its last layer), as the released code's
        `t_biattention_id` / `v_biattention_id` say. Empty: one co-attention before each of the
        last `num_visual_layers` text layers and before each visual layer, as the released
        ViLBERT interleaves 6 co-attention layers with the last 6 of BERT's 12.
    tag_coattention_mask (StudyConfig's field, read here alone): in each co-attention layer a
        word that names an object (VCR's tags: its `visual_index` is the object's region row)
        attends to that region with TAG_COATTENTION_BIAS added to its score, as the released
        code's `co_attention_mask` (its `use_co_attention_mask`; off in its released configs,
        where a tag points at no region). A fine-tuning switch (finetune.<section>.families.vilbert).

    The VL-BERT fields that describe its single stream's visual embedding (geometry_wavelengths,
    visual_scale_text_init, tags_at_region_scale, tune_frcnn) are unused: ViLBERT embeds a region's
    5-d box and reads the stores' features, and its words take no region's embedding.
    """

    model_type = "vilbert"

    def __init__(
        self,
        num_visual_layers: int = 2,
        text_coattention_layers: list[int] | None = None,
        visual_coattention_layers: list[int] | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_visual_layers = num_visual_layers
        text_layers = self.num_hidden_layers
        if not text_coattention_layers and not visual_coattention_layers:
            if num_visual_layers > text_layers:
                raise ValueError(
                    f"ViLBertConfig: {num_visual_layers} visual layers but {text_layers} text layers: "
                    "give text_coattention_layers and visual_coattention_layers"
                )
            text_coattention_layers = list(range(text_layers - num_visual_layers, text_layers))
            visual_coattention_layers = list(range(num_visual_layers))
        if not text_coattention_layers or not visual_coattention_layers:
            raise ValueError("ViLBertConfig: give text_coattention_layers and visual_coattention_layers, or neither")
        text_coattention_layers, visual_coattention_layers = (
            list(text_coattention_layers),
            list(visual_coattention_layers),
        )
        if len(text_coattention_layers) != len(visual_coattention_layers):
            raise ValueError("ViLBertConfig: text_coattention_layers and visual_coattention_layers differ in length")
        for name, layers, count in (
            ("text_coattention_layers", text_coattention_layers, text_layers),
            ("visual_coattention_layers", visual_coattention_layers, num_visual_layers),
        ):
            increasing = all(a < b for a, b in pairwise(layers))
            if not increasing or any(not 0 <= k <= count for k in layers):
                raise ValueError(f"ViLBertConfig: {name} {layers} must be increasing, each within 0..{count}")
        self.text_coattention_layers = text_coattention_layers
        self.visual_coattention_layers = visual_coattention_layers
