"""Pixel-BERT's model: every head on VL-BERT's batches, end to end through the detector's trunk."""

import dataclasses
import json

import numpy as np
import pytest
import torch
from head_helpers import assert_reads_centred_candidates, reloaded_far_from_its_build
from safetensors.torch import load_file

from vlbert.data.images import load_image
from vlbert.detection.model import CONFIG_FILE, WEIGHTS_FILE
from vlbert.detection.sources import image_items
from vlbert.modeling import (
    PixelBertConfig,
    PixelBertForPreTraining,
    PixelBertForRefCOCO,
    PixelBertForVCR,
    PixelBertForVQA,
    PixelBertModel,
    StudyProcessor,
)
from vlbert.modeling.inputs import VisualInputs
from vlbert.modeling.processing_study import pad_batch

HEADS = (PixelBertForPreTraining, PixelBertForVQA, PixelBertForVCR, PixelBertForRefCOCO)
TASK_HEADS = HEADS[1:]
# Three regions besides the whole image, in the 96-px images' pixels.
BOXES = [[8.0, 8.0, 40.0, 40.0], [50.0, 20.0, 90.0, 60.0], [30.0, 50.0, 70.0, 90.0]]


@pytest.fixture(scope="module")
def processor():
    return StudyProcessor.from_pretrained()


@pytest.fixture(scope="module")
def images(smoke_world):
    return [load_image(i.path) for i in image_items(smoke_world / "vqa", "vqa", "val2014")[:2]]


def make_config(smoke_detector, **overrides):
    frcnn = json.loads((smoke_detector / CONFIG_FILE).read_text())
    base = dict(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        num_answers=5,
        frcnn=frcnn,
    )
    return PixelBertConfig(**{**base, **overrides})


def build(cls, smoke_detector, **overrides):
    torch.manual_seed(0)
    model = cls(make_config(smoke_detector, **overrides))
    model.load_detector(smoke_detector)
    return model.eval()


def visual_inputs(images, boxes=BOXES):
    """Row 0 the whole image, then `boxes`, as VL-BERT's batches carry them."""
    rows = [[[0.0, 0.0, i.shape[2], i.shape[1]], *boxes] for i in images]
    return VisualInputs(
        boxes=torch.tensor(rows),
        image_sizes=torch.tensor([[i.shape[2], i.shape[1]] for i in images]),
        roi_mask=torch.ones(len(images), len(boxes) + 1, dtype=torch.bool),
        images=images,
    )


def head_batch(cls, processor, images, num_rois=3):
    """A batch of `cls`'s task with its labels, in VL-BERT's layout: its [IMG] elements, one per
    row of visual.boxes (the whole image and BOXES' three)."""
    if cls is PixelBertForVCR:  # one question, four candidates
        encodings = [
            processor.encode("how does the circle feel ?", f"it feels {t} .", num_rois=num_rois)
            for t in ("hot", "warm", "cool", "cold")
        ]
        return {**pad_batch(encodings), "visual": visual_inputs(images[:1] * 4), "labels": torch.tensor([2])}
    if cls is PixelBertForVQA:
        batch = pad_batch([processor.encode("what color is the circle ?", "[MASK]", num_rois=num_rois)] * 2)
        answer_positions = (batch["input_ids"] == processor.mask_id).int().argmax(1)
        return {
            **batch,
            "visual": visual_inputs(images),
            "answer_positions": answer_positions,
            "answer_scores": torch.rand(2, 5),
        }
    texts = ["a red circle next to a [MASK] square", "the large [MASK] circle"]
    batch = pad_batch([processor.encode(t, num_rois=num_rois) for t in texts])
    batch["visual"] = visual_inputs(images)
    if cls is PixelBertForRefCOCO:
        targets = torch.full(batch["roi_positions"].shape, -1)
        targets[:, 1:] = torch.tensor([1, 0, 0])
        return {**batch, "roi_targets": targets}
    mlm_labels = torch.where(batch["input_ids"] == processor.mask_id, 2417, -100)
    return {**batch, "mlm_labels": mlm_labels, "relation_labels": torch.tensor([1.0, 0.0])}


def outputs(out):
    return [out.mlm_logits, out.relation_logits] if hasattr(out, "mlm_logits") else [out.logits]


@pytest.mark.parametrize("cls", HEADS, ids=lambda c: c.__name__)
def test_every_head_trains_end_to_end_into_the_cnn(cls, smoke_detector, images, processor):
    model = build(cls, smoke_detector).train()
    out = model(**head_batch(cls, processor, images))
    expected = {
        PixelBertForPreTraining: {"mlm", "relation"},
        PixelBertForVQA: {"vqa"},
        PixelBertForVCR: {"choice"},
        PixelBertForRefCOCO: {"ref"},
    }[cls]
    assert set(out.losses) == expected and torch.isfinite(out.loss)
    out.loss.backward()
    cnn = model.pixelbert.cnn
    batchnorm = {id(p) for m in cnn.modules() if isinstance(m, torch.nn.BatchNorm2d) for p in m.parameters()}
    assert not any(m.training for m in cnn.modules() if isinstance(m, torch.nn.BatchNorm2d))  # running statistics
    for name, param in cnn.named_parameters():
        if id(param) in batchnorm:  # frozen, as in the Fast R-CNN module
            assert not param.requires_grad and param.grad is None, name
        else:
            assert param.grad is not None and bool(param.grad.abs().sum() > 0), name
    reached = [model.pixelbert.pixel_embeddings.conv.weight, model.pixelbert.pixel_embeddings.visual_embedding]
    reached += [layer.attention.self.query.weight for layer in model.pixelbert.bert.encoder.layer]
    assert all(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in reached)
    if cls is PixelBertForRefCOCO:
        assert out.logits.shape == (2, 4) and torch.isinf(out.logits[:, 0]).all()
    elif cls is PixelBertForVCR:
        assert out.logits.shape == (1, 4)
    elif cls is PixelBertForPreTraining:
        assert out.mlm_logits.shape == (2, 30522) and out.roi_logits.numel() == 0  # the two [MASK]s


@pytest.mark.parametrize("cls", HEADS, ids=lambda c: c.__name__)
def test_save_and_load_give_the_same_outputs(cls, smoke_detector, images, processor, tmp_path):
    model = build(cls, smoke_detector)
    batch = head_batch(cls, processor, images)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "pixelbert" and config["architectures"] == [cls.__name__]
    loaded = cls.from_pretrained(tmp_path).eval()
    saved, restored = model.state_dict(), loaded.state_dict()
    assert saved.keys() == restored.keys() and all(torch.equal(saved[k], restored[k]) for k in saved)
    with torch.no_grad():  # the CNN's kernels may pick another algorithm for the new tensors: last bits differ
        for a, b in zip(outputs(model(**batch)), outputs(loaded(**batch))):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert {n: p.requires_grad for n, p in loaded.named_parameters()} == {
        n: p.requires_grad for n, p in model.named_parameters()
    }  # BatchNorm frozen again after loading
    if cls is PixelBertForPreTraining:
        assert loaded.get_output_embeddings().weight is loaded.get_input_embeddings().weight


def test_a_pretraining_checkpoint_starts_every_task_head_and_loads_through_the_auto_classes(smoke_detector, tmp_path):
    from transformers import AutoConfig, AutoModel, AutoModelForPreTraining

    import vlbert  # noqa: F401  (registers the Auto classes)

    pretraining = build(PixelBertForPreTraining, smoke_detector)
    with torch.no_grad():  # so that "loaded" cannot be "built the same way"
        for param in pretraining.pixelbert.parameters():
            param.add_(0.01)
    pretraining.save_pretrained(tmp_path)
    encoder = {k: v for k, v in pretraining.state_dict().items() if k.startswith("pixelbert.")}
    for cls in TASK_HEADS:
        torch.manual_seed(3)
        new = cls(make_config(smoke_detector)).classifier.state_dict()
        torch.manual_seed(3)
        model = cls.from_pretrained(tmp_path, num_answers=5)
        state = model.state_dict()
        assert all(torch.equal(state[k], v) for k, v in encoder.items()), cls.__name__
        assert all(torch.equal(a, b) for a, b in zip(model.classifier.state_dict().values(), new.values()))
    assert isinstance(AutoConfig.from_pretrained(tmp_path), PixelBertConfig)
    assert type(AutoModel.from_pretrained(tmp_path)) is PixelBertModel
    assert type(AutoModelForPreTraining.from_pretrained(tmp_path)) is PixelBertForPreTraining


def test_the_cnn_starts_as_the_detector_trunk(smoke_detector):
    model = build(PixelBertForVQA, smoke_detector)
    detector = load_file(str(smoke_detector / WEIGHTS_FILE))
    cnn = model.pixelbert.cnn.state_dict()
    expected = {k: v for k, v in detector.items() if k.startswith("backbone.")}
    expected |= {k.removeprefix("roi_heads.box_head."): v for k, v in detector.items() if "box_head.layer4." in k}
    assert set(cnn) == set(expected)  # BatchNorm's running statistics too
    assert all(torch.equal(cnn[k], v) for k, v in expected.items())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.center_appearance(torch.ones(7))  # no region features: nothing to centre
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_the_cnn_trains_at_the_section_s_cnn_rate_factor(smoke_detector):
    from vlbert.engine.optim import build_optimizer

    model = build(PixelBertForVQA, smoke_detector, cnn_trainable_layers=2)
    optimizer = build_optimizer(model, {"lr": 1.0, "cnn_lr_factor": 0.1, "head_lr_factor": 3.0})
    rates = {id(p): group["lr"] for group in optimizer.param_groups for p in group["params"]}
    trained = {name: rates[id(p)] for name, p in model.named_parameters() if p.requires_grad}
    assert {round(r, 6) for n, r in trained.items() if n.startswith("pixelbert.cnn.")} == {0.1}
    assert {r for n, r in trained.items() if n.startswith("classifier.")} == {3.0}
    assert {r for n, r in trained.items() if n.startswith("pixelbert.bert.")} == {1.0}


def test_pixel_sampling_only_in_pretraining_steps(smoke_detector, images, processor):
    seen = []

    def record(module, args, kwargs, out):
        seen.append(out.pixels)

    for cls in HEADS:
        model = build(cls, smoke_detector, pixel_samples=12)
        model.pixelbert.register_forward_hook(record, with_kwargs=True)
        batch = head_batch(cls, processor, images)
        seen.clear()
        model.train()
        model(**batch)
        model(**batch)
        if cls is PixelBertForPreTraining:
            first, second = seen
            assert first.mask.shape == (2, 12) and first.mask.all()
            assert all(len(set(row.tolist())) == 12 for row in first.cells)
            assert not torch.equal(first.cells, second.cells)  # a fresh draw each step
        else:
            assert all(p.cells is None and p.mask.shape[1] == 36 for p in seen), cls.__name__
        seen.clear()
        model.eval()
        with torch.no_grad():
            once, twice = outputs(model(**batch)), outputs(model(**batch))
        assert all(p.cells is None and p.mask.shape[1] == 36 for p in seen), cls.__name__
        assert all(torch.equal(a, b) for a, b in zip(once, twice)), cls.__name__
    # The sampled tokens are the draw's cells of the whole map.
    encoder = build(PixelBertModel, smoke_detector)
    with torch.no_grad():
        whole, sampled = encoder.pixel_tokens(images), encoder.pixel_tokens(images, sample_pixels=12)
    index = sampled.cells.unsqueeze(-1).expand(-1, -1, whole.tokens.shape[-1])
    assert torch.equal(sampled.tokens, whole.tokens.gather(1, index))


def test_the_region_layout_is_dropped_and_the_pixels_follow_the_words(smoke_detector, images, processor):
    # VL-BERT's [IMG] x (R + 1) [END] elements are not Pixel-BERT's input: any number gives the same model.
    model = build(PixelBertForPreTraining, smoke_detector)
    few, many = (head_batch(PixelBertForPreTraining, processor, images, num_rois=n) for n in (1, 6))
    assert few["input_ids"].shape[1] < many["input_ids"].shape[1]
    with torch.no_grad():
        a, b = model(**few), model(**many)
        keys = ("input_ids", "token_type_ids", "position_ids", "attention_mask", "visual")
        encoded = model.pixelbert(**{k: few[k] for k in keys})
    assert torch.allclose(a.mlm_logits, b.mlm_logits, atol=1e-5)
    assert torch.allclose(a.relation_logits, b.relation_logits, atol=1e-5)
    words = (few["input_ids"] != processor.img_token_id) & (few["input_ids"] != processor.end_token_id)
    assert encoded.text_mask.sum(1).tolist() == (words & few["attention_mask"].bool()).sum(1).tolist()
    assert encoded.last_hidden_state.shape[1] == encoded.text_index.shape[1] + 36  # 6 x 6 pixel tokens
    assert encoded.pixel_map().shape == (2, 32, 6, 6)


def test_boxes_land_on_the_map_through_the_resize(smoke_detector, images):
    # A 48 x 72 image is resized to 64 x 96 and padded to 96 x 96 in the batch: a 4 x 6 map of
    # its own in the 6 x 6 one, whose other cells are masked.
    model = build(PixelBertModel, smoke_detector)
    small = torch.nn.functional.interpolate(images[1][None], size=(48, 72), mode="bilinear")[0]
    with torch.no_grad():
        pixels = model.pixel_tokens([images[0], small])
    assert pixels.map_size == (6, 6)
    assert pixels.mask.sum(1).tolist() == [36, 24]
    assert pixels.mask[1].view(6, 6)[:4].all() and not pixels.mask[1].view(6, 6)[4:].any()
    whole = torch.tensor([[96.0, 96.0], [72.0, 48.0]])
    assert torch.allclose(whole * pixels.box_scale, torch.tensor([[6.0, 6.0], [6.0, 4.0]]))


def test_the_max_pool_applies_where_the_map_is_large_enough(smoke_detector, images):
    def embeddings(**overrides):
        return PixelBertModel(make_config(smoke_detector, **overrides)).pixel_embeddings

    assert isinstance(embeddings().pool, torch.nn.Identity) and embeddings().stride == 16  # 96 px: 6 cells
    assert embeddings(image_min_size=256).stride == 32  # 16 cells: pooled
    model = build(PixelBertModel, smoke_detector, pixel_pool=True)
    with torch.no_grad():
        pixels = model.pixel_tokens(images)
    assert pixels.map_size == (3, 3) and pixels.mask.all()


def resnet50_config(**overrides) -> PixelBertConfig:
    """A small BERT over torchvision's ResNet-50 at 64 px."""
    base = dict(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    return PixelBertConfig(**base, cnn="resnet50", image_min_size=64, image_max_size=64, **overrides)


def test_a_resnet50_cnn_takes_torchvision_weights():
    from torchvision.models import resnet50

    model = PixelBertModel(resnet50_config()).eval()
    reference = resnet50().state_dict()
    model.cnn.load_resnet_state(reference)
    cnn = model.cnn.state_dict()
    assert cnn["backbone.stem.0.weight"] is not reference["conv1.weight"]
    assert torch.equal(cnn["backbone.stem.0.weight"], reference["conv1.weight"])
    assert torch.equal(cnn["layer4.2.conv3.weight"], reference["layer4.2.conv3.weight"])
    assert len(cnn) == len(reference) - 2  # all but fc
    with torch.no_grad():
        pixels = model.pixel_tokens([torch.rand(3, 64, 64)])
    assert pixels.map_size == (2, 2) and model.cnn.out_channels == 2048


def test_c5_dilation_keeps_the_weights_and_gives_the_map_at_c4_s_stride(smoke_detector, images):
    strided = build(PixelBertModel, smoke_detector)
    dilated = build(PixelBertModel, smoke_detector, c5_dilation=True)
    dilated.load_state_dict(strided.state_dict())
    with torch.no_grad():
        coarse, fine = strided.pixel_tokens(images), dilated.pixel_tokens(images)
    assert (coarse.map_size, fine.map_size) == ((6, 6), (12, 12)) and fine.mask.all()
    assert dilated.pixel_embeddings.stride == 8
    assert torch.allclose(fine.box_scale, 2 * coarse.box_scale)  # a box spans twice the cells each way


def test_c5_dilation_of_a_resnet50_is_torchvision_s_replace_stride_with_dilation():
    from torchvision.models import resnet50

    model = PixelBertModel(resnet50_config(c5_dilation=True)).eval()
    torch.manual_seed(0)
    reference = resnet50(replace_stride_with_dilation=[False, False, True]).eval()
    model.cnn.load_resnet_state(reference.state_dict())
    image = torch.rand(3, 64, 64)
    with torch.no_grad():
        features, _ = model.cnn([image])
        batch, _ = model.cnn.transform([image])
        trunk = torch.nn.Sequential(*list(reference.children())[:-2])
        expected = trunk(batch.tensors)
    assert features.shape[-2:] == (4, 4) and torch.allclose(features, expected, atol=1e-4)


def test_reinitialise_draws_every_parameter_of_the_pixel_embedding_new(smoke_detector, tmp_path):
    head, before = reloaded_far_from_its_build(
        build(PixelBertForPreTraining, smoke_detector), PixelBertForRefCOCO, tmp_path
    )
    head.reinitialise(["pixel_embeddings"])
    changed = {name for name, p in head.named_parameters() if not torch.equal(p, before[name])}
    embedding = {n for n in before if n.startswith("pixelbert.pixel_embeddings.")}
    assert embedding == {f"pixelbert.pixel_embeddings.{n}" for n in ("conv.weight", "conv.bias", "visual_embedding")}
    assert changed == embedding
    assert head.pixelbert.pixel_embeddings.visual_embedding.abs().max() < 0.2  # N(0, 0.02), not the loaded values
    head.pixelbert.pixel_embeddings.extra = torch.nn.Module()
    head.pixelbert.pixel_embeddings.extra.scale = torch.nn.Parameter(torch.ones(1))
    with pytest.raises(ValueError, match=r"pixel_embeddings\.extra .*\['scale'\].*reset_parameters"):
        head.reinitialise(["pixel_embeddings"])


def test_loading_bert_reports_only_the_cnn_pixel_and_head_parameters_as_new(smoke_detector):
    from vlbert.modeling.processing_study import default_tokenizer_path

    bert = json.loads((default_tokenizer_path() / "config.json").read_text())
    sizes = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
    model = build(PixelBertForPreTraining, smoke_detector, **{k: bert[k] for k in sizes})
    report = model.load_bert(default_tokenizer_path())
    visual_and_heads = (
        "pixelbert.cnn.",
        "pixelbert.pixel_embeddings.",
        "mlm.predictions.transform.",
        "relation_head.",
    )
    assert all(n.startswith(visual_and_heads) for n in report["new"] if "segment C" not in n), report["new"]
    assert "pixelbert.bert.encoder.layer.0.attention.self.query.weight" in report["loaded"]


def test_an_image_given_several_times_runs_through_the_cnn_once(smoke_detector, images, processor):
    # VCR's four candidates share their image: the batch holds one tensor four times.
    model = build(PixelBertForVCR, smoke_detector)
    shared = head_batch(PixelBertForVCR, processor, images)
    copies = {**shared, "visual": visual_inputs([images[0].clone() for _ in range(4)])}
    calls = []
    hook = model.pixelbert.cnn.register_forward_hook(lambda module, args, out: calls.append(len(args[0])))
    with torch.no_grad():
        once, four_times = model(**shared).logits, model(**copies).logits
    hook.remove()
    assert calls == [1, 4]
    assert torch.allclose(once, four_times, atol=1e-6)


def test_a_batch_loads_an_image_it_holds_several_times_once(smoke_world):
    from vlbert.tasks.regions import Regions, visual_batch

    path = image_items(smoke_world / "vqa", "vqa", "val2014")[0].path
    boxes = np.array([[0, 0, 96, 96], [4, 4, 20, 20]], dtype=np.float32)
    region = Regions(boxes, np.zeros(2), np.zeros((2, 8), np.float32), np.arange(2), 96, 96, path)
    visual = visual_batch([region] * 3, with_images=True)
    assert visual.images[0] is visual.images[1] is visual.images[2]


def test_vcr_head_reads_centred_candidates_when_its_config_says(smoke_detector, images, processor):
    batch = head_batch(PixelBertForVCR, processor, images)
    assert_reads_centred_candidates(lambda **config: build(PixelBertForVCR, smoke_detector, **config), batch)


def test_standardised_pixels_read_the_cnn_map_on_its_training_images_statistics(smoke_detector, images, tmp_path):
    model = build(PixelBertForPreTraining, smoke_detector, pixel_standardise=True)
    embeddings, cnn = model.pixelbert.pixel_embeddings, model.pixelbert.cnn
    assert torch.equal(embeddings.feature_mean, torch.zeros_like(embeddings.feature_mean))
    model.fit_pixel_statistics(iter(images * 3))
    with torch.no_grad():
        features, _ = cnn(images)
    standardised = (features - embeddings.feature_mean[:, None, None]) / embeddings.feature_std[:, None, None]
    per_channel = standardised.transpose(0, 1).flatten(1)  # every cell of both images is on its image
    from vlbert.modeling.modeling_pixelbert import STANDARDISE_MIN_STD_SHARE

    raw = features.transpose(0, 1).flatten(1).std(1, unbiased=False)
    live = raw > 1.01 * STANDARDISE_MIN_STD_SHARE * raw.median()  # the others' deviation is floored
    torch.testing.assert_close(per_channel.mean(1), torch.zeros(len(per_channel)), atol=1e-4, rtol=0)
    deviations = per_channel[live].std(1, unbiased=False)
    torch.testing.assert_close(deviations, torch.ones(int(live.sum())), atol=1e-3, rtol=0)
    # The conv reads the standardised map: the tokens move with the statistics.
    with torch.no_grad():
        tokens, _ = embeddings(features)
        embeddings.feature_mean.add_(1.0)
        moved, _ = embeddings(features)
        embeddings.feature_mean.sub_(1.0)
    assert not torch.allclose(tokens, moved)
    # The statistics are saved with the weights and loaded back.
    model.save_pretrained(tmp_path)
    loaded = PixelBertForVQA.from_pretrained(tmp_path, num_answers=5).pixelbert.pixel_embeddings
    assert torch.equal(loaded.feature_mean, embeddings.feature_mean)
    assert torch.equal(loaded.feature_std, embeddings.feature_std)


def test_whitened_pixels_read_the_cnn_map_with_its_cells_decorrelated(smoke_detector, images, tmp_path):
    from vlbert.modeling.modeling_pixelbert import WHITEN_EPSILON_SHARE

    model = build(PixelBertForPreTraining, smoke_detector, pixel_whiten=True)
    embeddings, cnn = model.pixelbert.pixel_embeddings, model.pixelbert.cnn
    assert torch.equal(embeddings.whitening, torch.eye(len(embeddings.whitening)))
    model.fit_pixel_statistics(iter(images * 3))
    with torch.no_grad():
        features, _ = cnn(images)
    cells = features.permute(0, 2, 3, 1).flatten(0, 2).double()  # every cell of both images is on its image
    torch.testing.assert_close(embeddings.feature_mean.double(), cells.mean(0), atol=1e-4, rtol=1e-4)
    whitened = (cells - cells.mean(0)) @ embeddings.whitening.double()
    # Each direction's variance is the mean variance shrunk by ZCA's epsilon: decorrelated, and the
    # directions the map varies along most come out near the mean channel's scale.
    eigenvalues, vectors = torch.linalg.eigh(torch.cov(cells.T, correction=0))
    eigenvalues = eigenvalues.clamp_min(0)
    expected = eigenvalues / (eigenvalues + WHITEN_EPSILON_SHARE * eigenvalues.max()) * eigenvalues.mean()
    rotated = vectors.T @ torch.cov(whitened.T, correction=0) @ vectors  # in the map's own principal axes
    torch.testing.assert_close(rotated.diagonal(), expected, atol=1e-3 * float(eigenvalues.mean()), rtol=1e-3)
    off_diagonal = rotated - torch.diag(rotated.diagonal())
    assert off_diagonal.abs().max() < 1e-3 * float(eigenvalues.mean())
    # The conv reads the whitened map: the tokens are those of the map whitened by hand.
    with torch.no_grad():
        tokens, _ = embeddings(features)
        by_hand = torch.relu(
            embeddings.pool(
                embeddings.conv(whitened.float().unflatten(0, (2, *features.shape[2:])).permute(0, 3, 1, 2))
            )
        )
    torch.testing.assert_close(
        tokens, by_hand.flatten(2).transpose(1, 2) + embeddings.visual_embedding, atol=1e-4, rtol=1e-4
    )
    model.save_pretrained(tmp_path)
    loaded = PixelBertForVQA.from_pretrained(tmp_path, num_answers=5).pixelbert.pixel_embeddings
    assert torch.equal(loaded.whitening, embeddings.whitening)
    with pytest.raises(ValueError, match="set one"):
        build(PixelBertForVQA, smoke_detector, pixel_standardise=True, pixel_whiten=True)


def test_without_standardised_pixels_the_training_images_are_not_read(smoke_detector):
    def unread():
        raise AssertionError("read an image")
        yield

    model = build(PixelBertForVQA, smoke_detector)
    model.fit_pixel_statistics(unread())
    assert not hasattr(model.pixelbert.pixel_embeddings, "feature_mean")
    with pytest.raises(ValueError, match="no images"):
        build(PixelBertForVQA, smoke_detector, pixel_standardise=True).fit_pixel_statistics(iter([]))


@pytest.mark.parametrize("trainable, cached", [(0, "c5"), (1, "c4")])
def test_a_frozen_trunk_computes_each_keyed_image_once_and_gives_the_same_logits(
    trainable, cached, smoke_detector, images, processor
):
    batch = head_batch(PixelBertForVQA, processor, images)
    with torch.no_grad():
        every_stage_trains = build(PixelBertForVQA, smoke_detector)(**batch).logits
    model = build(PixelBertForVQA, smoke_detector, cnn_trainable_layers=trainable)
    cnn = model.pixelbert.cnn
    assert not any(p.requires_grad for p in cnn.backbone.parameters())
    assert any(p.requires_grad for p in cnn.layer4.parameters()) == (trainable == 1)
    keyed = {**batch, "visual": dataclasses.replace(batch["visual"], image_keys=["a.jpg", "b.jpg"])}
    computed, trunk = [], cnn._trunk
    cnn._trunk = lambda imgs: computed.append(len(imgs)) or trunk(imgs)
    first, second = model(**keyed).logits, model(**keyed).logits
    assert computed == [2] and set(cnn.cached_maps) == {"a.jpg", "b.jpg"} and cnn.cached_stage == cached
    assert torch.allclose(first, every_stage_trains, atol=1e-5) and torch.equal(first, second)
    # The kept maps carry no autograd; what trains after them still learns.
    first.sum().backward()
    assert model.pixelbert.pixel_embeddings.conv.weight.grad is not None
    assert (cnn.layer4[0].conv1.weight.grad is not None) == (trainable == 1)
    # New weights void the cache, and so does a trunk that trains again.
    model.load_state_dict(model.state_dict())
    assert not cnn.cached_maps
    model(**keyed)
    cnn.backbone.layer3.requires_grad_(True)
    model(**keyed)
    assert not cnn.cached_maps and computed == [2, 2, 2]


def test_trainable_layers_hold_after_a_checkpoint_loads(smoke_detector, tmp_path):
    build(PixelBertForVQA, smoke_detector, cnn_trainable_layers=1).save_pretrained(tmp_path)
    cnn = PixelBertForVQA.from_pretrained(tmp_path).pixelbert.cnn
    assert not any(p.requires_grad for p in cnn.backbone.parameters())
    assert any(p.requires_grad for p in cnn.layer4.parameters())
    with pytest.raises(ValueError, match="cnn_trainable_layers"):
        make_config(smoke_detector, cnn_trainable_layers=6)


def test_a_batch_keys_its_images_by_path(smoke_world):
    from vlbert.tasks.regions import Regions, visual_batch

    paths = [i.path for i in image_items(smoke_world / "vqa", "vqa", "val2014")[:2]]
    boxes = np.array([[0, 0, 96, 96]], dtype=np.float32)
    regions = [Regions(boxes, np.zeros(1), np.zeros((1, 8), np.float32), np.arange(1), 96, 96, p) for p in paths]
    assert visual_batch(regions + regions[:1], with_images=True).image_keys == [str(p) for p in paths + paths[:1]]
    assert visual_batch(regions).image_keys is None
