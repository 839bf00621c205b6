"""ViLBERT's model: two streams, co-attention, its objectives and heads, on the smoke detector's regions."""

import json

import pytest
import torch
from head_helpers import assert_reads_centred_candidates, reloaded_far_from_its_build
from test_modeling import make_config, regions, text_inputs, visual_inputs  # noqa: F401  (a fixture)

from vlbert.modeling import (
    StudyProcessor,
    ViLBertConfig,
    ViLBertForPreTraining,
    ViLBertForRefCOCO,
    ViLBertForVCR,
    ViLBertForVQA,
    ViLBertModel,
)
from vlbert.modeling.inputs import VisualInputs
from vlbert.modeling.modeling_vilbert import masked_region_kl
from vlbert.modeling.processing_study import Word, default_tokenizer_path, pad_batch

HEADS = (ViLBertForPreTraining, ViLBertForVQA, ViLBertForVCR, ViLBertForRefCOCO)


@pytest.fixture(scope="module")
def processor():
    return StudyProcessor.from_pretrained()


def build(cls, smoke_detector, **overrides):
    torch.manual_seed(0)
    base = make_config(smoke_detector).to_dict()
    for key in ("model_type", "architectures", "transformers_version"):
        base.pop(key, None)
    config = ViLBertConfig(**{**base, "num_hidden_layers": 3, "num_visual_layers": 2, **overrides})
    return cls(config).eval()


def encoder_inputs(batch):
    return [batch[k] for k in ("input_ids", "token_type_ids", "position_ids", "attention_mask", "visual_index")]


def head_batches(processor, images, results, classes: int = 7):
    """Per head class: a batch in VL-BERT's layout with its targets."""
    visual = visual_inputs(images, results)
    rois = visual.boxes.shape[1]
    caption = text_inputs(processor, results)
    masked = torch.zeros(2, rois, dtype=torch.bool)
    masked[:, 1] = True
    roi_labels = torch.zeros(2, rois, classes)
    roi_labels[:, 1] = torch.softmax(torch.randn(2, classes), -1)
    pretraining = {
        **caption,
        "visual": VisualInputs(visual.boxes, visual.image_sizes, visual.roi_mask, visual.features, None, masked),
        "roi_positions": caption["roi_positions"],
        "roi_labels": roi_labels,
        "relation_labels": torch.tensor([1.0, 0.0]),
        "mlm_labels": torch.where(caption["input_ids"] == processor.mask_id, 2300, -100),
    }
    vqa = {
        **text_inputs(processor, results, "what color is the circle ?", "[MASK]"),
        "visual": visual,
        "answer_scores": torch.rand(2, 5),
    }
    question = [Word("how"), Word("does"), Word("circle", roi=1), Word("feel"), Word("?")]
    encodings = [
        processor.encode(question, f"it feels {t} .", num_rois=len(results[0].boxes) - 1)
        for t in ("hot", "warm", "cool", "cold")
    ]
    one = visual_inputs(images[:1], results[:1])
    four = VisualInputs(*(t.expand(4, *t.shape[1:]) for t in (one.boxes, one.image_sizes, one.roi_mask, one.features)))
    vcr = {**pad_batch(encodings), "visual": four, "labels": torch.tensor([0])}
    targets = torch.full((2, rois), -1)
    targets[:, 1:3] = torch.tensor([1, 0])
    ref = {**text_inputs(processor, results, "the large red circle"), "visual": visual, "roi_targets": targets}
    return {ViLBertForPreTraining: pretraining, ViLBertForVQA: vqa, ViLBertForVCR: vcr, ViLBertForRefCOCO: ref}


def test_the_default_interleaving_puts_coattention_before_the_last_text_layers():
    # As the released code's t_biattention_id [6..11], v_biattention_id [0..5] for 12 and 6 layers.
    config = ViLBertConfig(num_hidden_layers=12, num_visual_layers=6)
    assert config.text_coattention_layers == [6, 7, 8, 9, 10, 11]
    assert config.visual_coattention_layers == [0, 1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match="increasing"):
        ViLBertConfig(num_hidden_layers=3, text_coattention_layers=[2, 1], visual_coattention_layers=[0, 1])
    with pytest.raises(ValueError, match="visual layers"):
        ViLBertConfig(num_hidden_layers=2, num_visual_layers=3)


@pytest.mark.parametrize("cls", HEADS)
def test_every_head_runs_forward_and_backward(smoke_detector, regions, processor, cls):  # noqa: F811
    images, results = regions
    model = build(cls, smoke_detector).train()
    out = model(**head_batches(processor, images, results, model.config.num_visual_classes)[cls])
    assert torch.isfinite(out.loss)
    out.loss.backward()
    encoder = model.vilbert
    for part in (
        encoder.bert.encoder.layer[0].attention.self.query,
        encoder.visual_layers[0].attention.self.query,
        encoder.coattention_layers[0].text_attends_regions.self.key,
        encoder.coattention_layers[0].regions_attend_text.self.key,
        encoder.region_embeddings.appearance,
    ):
        assert part.weight.grad is not None and part.weight.grad.abs().sum() > 0, (cls.__name__, part)
    if cls is ViLBertForPreTraining:
        assert set(out.losses) == {"mlm", "masked_roi", "relation"}


def test_heads_give_the_protocol_shapes(smoke_detector, regions, processor):  # noqa: F811
    images, results = regions
    batches = head_batches(processor, images, results)
    rois = batches[ViLBertForRefCOCO]["visual"].boxes.shape[1]
    with torch.no_grad():
        assert build(ViLBertForVQA, smoke_detector)(**batches[ViLBertForVQA]).logits.shape == (2, 5)
        assert build(ViLBertForVCR, smoke_detector)(**batches[ViLBertForVCR]).logits.shape == (1, 4)
        ref = build(ViLBertForRefCOCO, smoke_detector)(**batches[ViLBertForRefCOCO]).logits
    assert ref.shape == (2, rois) and torch.isinf(ref[:, 0]).all() and torch.isfinite(ref[:, 1]).all()


def test_text_attention_is_not_causal_and_skips_the_region_elements(smoke_detector, regions, processor):  # noqa: F811
    # A later word changes an earlier word's output (not a causal decoder), and the sequence's
    # [IMG] elements are not keys of the text stream (regions reach words by co-attention only).
    images, results = regions
    model = build(ViLBertModel, smoke_detector)
    batch = text_inputs(processor, results, "a red circle next to a blue square")
    visual = visual_inputs(images, results)
    changed = {**batch, "input_ids": batch["input_ids"].clone()}
    changed["input_ids"][:, 6] = processor.tokenizer.convert_tokens_to_ids("green")
    img = batch["input_ids"] == processor.img_token_id
    embedded = {**batch, "input_ids": batch["input_ids"].clone()}
    embedded["input_ids"][img] = processor.tokenizer.convert_tokens_to_ids("green")
    with torch.no_grad():
        plain = model(*encoder_inputs(batch), visual=visual).text
        later_word = model(*encoder_inputs(changed), visual=visual).text
        # The [IMG] elements keep their ids where the stream looks them up; only their keys matter.
        model.config.img_token_id, img_id = -1, model.config.img_token_id
        try:
            attended = model(*encoder_inputs(embedded), visual=visual).text
        finally:
            model.config.img_token_id = img_id
    assert not torch.allclose(plain[:, 1], later_word[:, 1], atol=1e-5)
    assert not torch.allclose(plain[:, 1], attended[:, 1], atol=1e-5)  # were they keys, they would count
    for layer in model.bert.encoder.layer:
        assert layer.attention.self.is_causal is False


def test_img_is_the_mean_of_the_regions_that_are_not_masked(smoke_detector, regions):  # noqa: F811
    images, results = regions
    embed = build(ViLBertModel, smoke_detector).region_embeddings
    visual = visual_inputs(images, results)
    visual.masked = torch.zeros_like(visual.roi_mask)
    visual.masked[0, 1] = True
    with torch.no_grad():
        out = embed(visual)
        regions = visual.features[0, 2 : int(visual.roi_mask[0].sum())]
        width, height = visual.image_sizes[0].tolist()
        corners = visual.boxes[0, 0] / torch.tensor([width, height, width, height])
        location = torch.cat([corners, ((corners[2] - corners[0]) * (corners[3] - corners[1])).view(1)])
        expected = embed.LayerNorm(embed.appearance(regions.mean(0)) + embed.location(location))
        assert torch.allclose(out[0, 0], expected, atol=1e-5)
        # A masked region's appearance is zeroed; its box stays.
        zeroed = visual.features.clone()
        zeroed[0, 1] = 0
        plain = VisualInputs(visual.boxes, visual.image_sizes, visual.roi_mask, zeroed)
        assert torch.allclose(out[0, 1], embed(plain)[0, 1], atol=1e-5)


def test_masked_region_loss_is_the_kl_divergence_to_the_detector_distribution():
    logits = torch.randn(1, 3, 4)
    targets = torch.zeros(1, 3, 4)
    targets[0, 1] = torch.tensor([0.1, 0.2, 0.3, 0.4])
    expected = (targets[0, 1] * (targets[0, 1].log() - logits[0, 1].log_softmax(-1))).sum()
    assert torch.allclose(masked_region_kl(logits, targets), expected)
    assert masked_region_kl(logits, torch.zeros(1, 3, 4)) is None


@pytest.mark.parametrize("cls", HEADS)
def test_save_and_load_give_the_same_outputs(smoke_detector, regions, processor, tmp_path, cls):  # noqa: F811
    images, results = regions
    model = build(cls, smoke_detector)
    batch = head_batches(processor, images, results, model.config.num_visual_classes)[cls]
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "vilbert"
    loaded = cls.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        first, second = model(**batch), loaded(**batch)
    assert torch.equal(first.loss, second.loss)


def test_a_pretraining_checkpoint_starts_every_task_head(smoke_detector, tmp_path):
    from transformers import AutoConfig, AutoModel, AutoModelForPreTraining

    model = build(ViLBertForPreTraining, smoke_detector)
    with torch.no_grad():
        model.vilbert.coattention_layers[0].text_attends_regions.self.key.weight.normal_()
    model.save_pretrained(tmp_path)
    for cls in (ViLBertForVQA, ViLBertForVCR, ViLBertForRefCOCO):
        head = cls.from_pretrained(tmp_path)
        assert torch.equal(
            head.vilbert.coattention_layers[0].text_attends_regions.self.key.weight,
            model.vilbert.coattention_layers[0].text_attends_regions.self.key.weight,
        )
    assert isinstance(AutoConfig.from_pretrained(tmp_path), ViLBertConfig)
    assert type(AutoModel.from_pretrained(tmp_path)) is ViLBertModel
    assert type(AutoModelForPreTraining.from_pretrained(tmp_path)) is ViLBertForPreTraining


def test_loading_bert_fills_the_text_stream_only(smoke_detector):
    bert = json.loads((default_tokenizer_path() / "config.json").read_text())
    sizes = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
    model = build(ViLBertForPreTraining, smoke_detector, **{k: bert[k] for k in sizes})
    report = model.load_bert(default_tokenizer_path())
    assert "vilbert.bert.encoder.layer.0.attention.self.query.weight" in report["loaded"]
    new_parts = (
        "vilbert.region_embeddings.",
        "vilbert.visual_layers.",
        "vilbert.coattention_layers.",
        "vilbert.text_pooler.",
        "vilbert.visual_pooler.",
        "mlm.predictions.transform.",
        "roi_head.",
        "relation_head.",
    )
    assert all(n.startswith(new_parts) for n in report["new"] if "segment C" not in n), report["new"]


def test_the_pooled_product_is_non_negative_as_the_released_code_pools(smoke_detector, regions, processor):  # noqa: F811
    # Dense + ReLU poolers (the released BertTextPooler / BertImagePooler), not BERT's tanh.
    images, results = regions
    model = build(ViLBertModel, smoke_detector)
    with torch.no_grad():
        out = model(*encoder_inputs(text_inputs(processor, results)), visual=visual_inputs(images, results))
    assert (out.pooled_text >= 0).all() and (out.pooled_regions >= 0).all()
    assert (out.pooled_text * out.pooled_regions > 0).any()


def test_regions_overlapping_a_masked_one_are_zeroed_too_but_not_scored():
    # The released multi-task code zeroes them (IoU > 0.4), else they would carry the masked content.
    import numpy as np

    from vlbert.tasks.pretraining import overlapping
    from vlbert.tasks.regions import Regions

    boxes = np.array([[0, 0, 96, 96], [10, 10, 40, 40], [12, 12, 42, 42], [60, 60, 90, 90]], dtype=np.float32)
    region = Regions(boxes, np.zeros(4), np.zeros((4, 8), np.float32), np.arange(4), 96, 96)
    masked = torch.tensor([[False, True, False, False]])
    candidates = torch.tensor([[False, True, True, True]])
    assert overlapping([region], masked, candidates).tolist() == [[False, True, True, False]]


def test_moving_a_batch_keeps_a_tensor_it_holds_twice_one_tensor():
    from vlbert.engine.device import move_to

    image = torch.rand(3, 4, 4)
    moved = move_to(
        {
            "visual": VisualInputs(
                torch.zeros(2, 1, 4), torch.ones(2, 2), torch.ones(2, 1, dtype=torch.bool), None, [image, image]
            )
        },
        torch.device("cpu"),
    )
    assert moved["visual"].images[0] is moved["visual"].images[1]


def test_vcr_head_reads_centred_candidates_when_its_config_says(smoke_detector, regions, processor):  # noqa: F811
    images, results = regions
    batch = head_batches(processor, images, results)[ViLBertForVCR]
    assert_reads_centred_candidates(lambda **config: build(ViLBertForVCR, smoke_detector, **config), batch)


def test_reinitialise_draws_the_named_modules_new_and_leaves_the_rest(smoke_detector, tmp_path):
    head, before = reloaded_far_from_its_build(build(ViLBertForPreTraining, smoke_detector), ViLBertForVQA, tmp_path)
    head.reinitialise(["text_pooler", "visual_pooler"])
    changed = {name for name, p in head.named_parameters() if not torch.equal(p, before[name])}
    pooler_weights = {"vilbert.text_pooler.dense.weight", "vilbert.visual_pooler.dense.weight"}
    assert pooler_weights <= changed and all(".pooler." in n or "_pooler." in n for n in changed)
    assert head.vilbert.text_pooler.dense.weight.std() < 0.1  # BERT's init (0.02), not the loaded values
    with pytest.raises(ValueError, match="no module 'pooler'"):
        head.reinitialise(["pooler"])


@pytest.mark.parametrize("switch", [False, True])
def test_a_tag_word_attends_to_its_own_region_with_the_released_bias_only_when_switched_on(
    smoke_detector,
    regions,  # noqa: F811
    processor,
    switch,
):
    # With the co-attention's text queries zeroed every raw score is 0, so the weights are the
    # softmax of the mask alone: the tag word ("circle", region row 1) puts e^5 / (e^5 + n - 1) on
    # its region with the switch on, and every other word 1 / n on each of the n regions.
    images, results = regions
    batch = head_batches(processor, images, results)[ViLBertForVCR]
    model = build(ViLBertForVCR, smoke_detector, tag_coattention_mask=switch)
    attention = model.vilbert.coattention_layers[0].text_attends_regions.self
    attention.config._attn_implementation = "eager"  # SDPA returns no weights
    with torch.no_grad():
        attention.query.weight.zero_()
        attention.query.bias.zero_()
    captured = []
    attention.register_forward_hook(lambda module, args, output: captured.append(output[1]))
    with torch.no_grad():
        model(**batch)
    weights = captured[0][0, 0]  # first candidate, first head: [words, regions]
    regions_in_view = int(batch["visual"].roi_mask[0].sum())
    tag = int((batch["visual_index"][0] == 1).nonzero()[0])
    other = int((batch["input_ids"][0] == processor.tokenizer.convert_tokens_to_ids("feel")).nonzero()[0])
    uniform = torch.full((regions_in_view,), 1 / regions_in_view)
    torch.testing.assert_close(weights[other, :regions_in_view], uniform)
    if switch:
        expected = torch.full((regions_in_view,), 1.0)
        expected[1] = torch.exp(torch.tensor(5.0))
        torch.testing.assert_close(weights[tag, :regions_in_view], expected / expected.sum())
    else:
        torch.testing.assert_close(weights[tag, :regions_in_view], uniform)
