"""Building a model of any family for training: sizes from the preset or the BERT checkpoint,
visual sizes from the detector, text weights from BERT, the detector's weights where the family
takes them."""

from __future__ import annotations

from pathlib import Path

from ..data.images import load_image
from ..detection.model import read_detector_config, visual_sizes
from ..modeling import StudyConfig, StudyProcessor
from ..modeling.configuration_study import END_TOKEN, IMG_TOKEN
from ..modeling.processing_study import default_tokenizer_path

SIZE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


def load_processor(bert: str | Path | None, max_text_length: int) -> StudyProcessor:
    """The BERT checkpoint's own tokenizer (a local folder or hub id); None: BERT's uncased WordPiece."""
    if bert is None:
        return StudyProcessor.from_pretrained(default_tokenizer_path(), max_text_length)
    if isinstance(bert, Path) and not bert.exists():
        raise FileNotFoundError(f"BERT checkpoint not found: {bert} (run `vlbert bert-init`, or set model.bert)")
    return StudyProcessor.from_pretrained(bert, max_text_length)


def model_config(config_class, preset: dict, bert: str | Path, detector_dir, **overrides) -> StudyConfig:
    """A model family's config (a StudyConfig subclass): text sizes from the BERT checkpoint,
    visual sizes from the detector, the family's own fields from the preset's `model.<family>`."""
    from transformers import BertConfig

    bert_config = BertConfig.from_pretrained(str(bert))
    detector = read_detector_config(detector_dir)
    feature_dim, num_classes = visual_sizes(detector)
    # The [IMG] and [END] ids are the checkpoint's tokenizer's (a trained vocabulary puts them elsewhere).
    vocab = load_processor(bert, 8).tokenizer.get_vocab()
    family_fields = preset.get("model", {}).get(config_class.model_type, {})
    from_bert = ("vocab_size", "max_position_embeddings", "hidden_dropout_prob", "attention_probs_dropout_prob")
    return config_class(
        img_token_id=vocab[IMG_TOKEN],
        end_token_id=vocab[END_TOKEN],
        visual_feature_dim=feature_dim,
        num_visual_classes=num_classes,
        frcnn=detector,
        # A fine-tuning section's dropout overrides BERT's.
        **{**{k: getattr(bert_config, k) for k in SIZE_KEYS + from_bert}, **family_fields, **overrides},
    )


def build_model(cls, preset: dict, bert, detector_dir, appearance_mean=None, image_paths=None, **overrides):
    """A new model of `cls` (a pre-training model or task head): text weights from `bert`, the
    detector's weights where its family takes them, and the appearance features centred on
    `appearance_mean` (that of its training images, from `data.feature_mean`; None: not centred).
    `image_paths`: the training images in order, for a family that takes statistics of their
    pixels (`fit_pixel_statistics`; read lazily, only if it does). Returns (model, load report)."""
    model = cls(model_config(cls.config_class, preset, bert, detector_dir, **overrides))
    report = model.load_bert(bert)
    model.load_detector(detector_dir)
    if appearance_mean is not None:
        model.center_appearance(appearance_mean)
    if image_paths is not None:
        model.fit_pixel_statistics(load_image(path) for path in _distinct(image_paths))
    return model, report


def _distinct(paths):
    """Each path once, in order (a VQA or VCR image is asked about several times), lazily."""
    seen = set()
    for path in paths:
        if path not in seen:
            seen.add(path)
            yield path
