"""The grounding probe: masked colour, shape and size words with the own image and another's, the
masked words' attention on [IMG], and how the pre-training report shows them."""

from types import SimpleNamespace

import pytest
import torch

from vlbert.data.conceptual_captions import read_word_kinds
from vlbert.engine.grounding import (
    attention_share,
    grounding_probe,
    kind_vocabulary,
    mask_kind,
    probe_batches,
)
from vlbert.modeling.heads import IGNORE_INDEX

GROUNDING_KINDS = ("colour", "shape", "size")  # the smoke world's, in name order
SHAPES = ("circle", "square", "triangle", "diamond", "star", "cross", "circles", "squares", "crosses")


@pytest.fixture(scope="module")
def word_kinds(smoke_world):
    """The smoke world's word kinds, as it writes them beside its captions."""
    kinds = read_word_kinds(smoke_world / "conceptual_captions")
    assert tuple(kinds) == GROUNDING_KINDS
    return kinds


@pytest.fixture(scope="module")
def probe_inputs(smoke_validation):
    """The processor, validation's collator and the val captions, as pre-training's validation has them."""
    val, processor, collate = smoke_validation
    return processor, collate, [val[i] for i in range(len(val))]


@pytest.fixture(scope="module")
def blind_model(smoke_study, smoke_config):
    """A model whose visual projection is zero: every region embeds alike, the image tells nothing."""
    from vlbert.engine.build import build_model
    from vlbert.modeling import VLBertForPreTraining

    model, _ = build_model(VLBertForPreTraining, smoke_config, smoke_study["bert"], smoke_study["detector"])
    with torch.no_grad():
        model.vlbert.visual_embeddings.projection.weight.zero_()
    return model


def _clean(batch):
    """A collated batch's input ids before the collator's random masking."""
    return torch.where(batch["mlm_labels"] != IGNORE_INDEX, batch["mlm_labels"], batch["input_ids"])


def test_mask_kind_masks_every_word_of_the_kind_and_skips_those_of_several_tokens():
    vocabulary = {"circle": 11, "circles": 12, "square": 13}  # "crosses" is not one token here
    text, labels, skipped = mask_kind(
        "two small red circles , a blue square and three crosses", SHAPES, vocabulary, "[MASK]"
    )
    assert text == "two small red [MASK] , a blue [MASK] and three crosses"
    assert labels == [12, 13] and skipped == 1


def test_the_probe_masks_exactly_the_kinds_words(probe_inputs, word_kinds):
    processor, collate, examples = probe_inputs
    examples = examples[:8]
    original = _clean(collate(examples, torch.Generator().manual_seed(0)))
    for kind, words in word_kinds.items():
        vocabulary = kind_vocabulary(processor.tokenizer, words)
        kind_ids = torch.tensor(sorted(set(vocabulary.values())))
        [(batch, _, skipped)] = probe_batches(processor, collate, examples, words, batch_size=len(examples))
        assert skipped == 0  # the world's words are whole words in BERT's vocabulary
        chosen = batch["mlm_labels"] != IGNORE_INDEX
        assert chosen.any(), kind
        # Masked: exactly the positions that held a word of the kind, each labelled with its word.
        assert torch.equal(chosen, torch.isin(original, kind_ids)), kind
        assert torch.equal(batch["mlm_labels"][chosen], original[chosen])
        assert (batch["input_ids"][chosen] == processor.mask_id).all()
        # Every other element is as the caption and image encode it.
        assert torch.equal(batch["input_ids"][~chosen], original[~chosen])


def test_a_model_blind_to_the_image_scores_the_same_with_another_image(probe_inputs, blind_model, word_kinds):
    processor, collate, examples = probe_inputs
    # Another image, paired as validation pairs them: the same words, masks and layout, other regions;
    # so a model that cannot see the regions gives the same scores with either.
    blind_model.eval()
    for own, other, _ in probe_batches(processor, collate, examples, word_kinds["colour"], batch_size=8):
        for key in ("input_ids", "mlm_labels", "attention_mask", "position_ids", "token_type_ids", "visual_index"):
            assert torch.equal(own[key], other[key]), key
        assert not torch.equal(own["visual"].features, other["visual"].features)
        with torch.no_grad():
            torch.testing.assert_close(blind_model(**own).mlm_logits, blind_model(**other).mlm_logits)
    metrics = grounding_probe(blind_model, processor, collate, examples, word_kinds, batch_size=8)
    for kind, words in word_kinds.items():
        candidates = set(kind_vocabulary(processor.tokenizer, words).values())
        assert metrics[f"ground_{kind}_n"] > 0
        assert metrics[f"ground_{kind}_own"] == metrics[f"ground_{kind}_other"], kind
        assert metrics[f"ground_{kind}_gain"] == 0
        for image in ("own", "other"):
            assert 0 <= metrics[f"ground_{kind}_{image}"] <= 100
        assert metrics[f"ground_{kind}_chance"] == pytest.approx(100 / len(candidates))
    # The probe runs eager attention to see the probabilities, and gives the model its own back.
    assert blind_model.vlbert.bert.config._attn_implementation == "sdpa"


def test_attention_shares_lie_in_0_1_per_layer(probe_inputs, blind_model, word_kinds):
    processor, collate, examples = probe_inputs
    metrics = grounding_probe(blind_model, processor, collate, examples[:8], word_kinds, batch_size=4)
    layers = [metrics[f"attention_img_share_layer{i}"] for i in range(blind_model.config.num_hidden_layers)]
    assert f"attention_img_share_layer{len(layers)}" not in metrics
    assert all(0 <= share <= 1 for share in layers)
    assert metrics["attention_img_share"] == pytest.approx(sum(layers) / len(layers))
    assert 0 < metrics["attention_img_uniform"] < 1


def test_attention_share_and_its_uniform_baseline_on_a_hand_made_batch():
    CLS, MASK, SEP, IMG, END, PAD, WORD = 1, 2, 3, 4, 5, 0, 9
    batch = {
        "input_ids": torch.tensor([[CLS, MASK, SEP, IMG, IMG, END], [CLS, WORD, MASK, SEP, IMG, END]]),
        "attention_mask": torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]]),
        "mlm_labels": torch.full((2, 6), IGNORE_INDEX),
    }
    batch["input_ids"][1, 5], batch["attention_mask"][1, 5] = PAD, 0  # one padded element
    batch["mlm_labels"][0, 1] = batch["mlm_labels"][1, 2] = WORD
    # Two heads: one puts everything on the first [IMG], the other is uniform over attended elements.
    focused = torch.zeros(2, 6, 6)
    focused[0, :, 3] = focused[1, :, 4] = 1
    uniform = batch["attention_mask"].float().unsqueeze(1).expand(2, 6, 6) / batch["attention_mask"].sum(1).view(
        2, 1, 1
    )
    layer = torch.stack([focused, uniform], 1)  # [B, heads, L, L]
    from vlbert.modeling import VLBertModel

    encoder = SimpleNamespace(config=SimpleNamespace(img_token_id=IMG))  # its attention_columns read no more
    shares, baseline = attention_share(
        [layer, uniform.unsqueeze(1)], *VLBertModel.attention_columns(encoder, batch, None)
    )
    assert baseline.tolist() == pytest.approx([2 / 6, 1 / 5])
    torch.testing.assert_close(shares, torch.tensor([[(1 + 2 / 6) / 2, 2 / 6], [(1 + 1 / 5) / 2, 1 / 5]]))


def test_pixel_bert_attention_share_maps_the_masked_words_through_the_text_slots():
    """Pixel-BERT's encoder holds the words at the front (text_index), then the pixel tokens: a
    masked word's share is the mass on the pixel tokens, its baseline their share of the attended."""
    from vlbert.modeling import PixelBertModel

    WORD = 9
    batch = {"mlm_labels": torch.full((2, 6), IGNORE_INDEX)}  # input columns:
    batch["mlm_labels"][0, 1] = WORD  # [CLS, MASK, SEP, IMG, END, PAD]
    batch["mlm_labels"][1, 2] = WORD  # [CLS, WORD, MASK, SEP, IMG, END]
    encoded = SimpleNamespace(
        text_index=torch.tensor([[0, 1, 2, 3], [0, 1, 2, 3]]),
        text_mask=torch.tensor([[True, True, True, False], [True, True, True, True]]),
        pixels=SimpleNamespace(mask=torch.tensor([[True, True], [True, False]])),  # one padded cell
    )
    attended = torch.cat([encoded.text_mask, encoded.pixels.mask], 1).float()  # [2, 6]
    focused = torch.zeros(2, 6, 6)
    focused[:, :, 4] = 1  # all on the first pixel token
    uniform = (attended / attended.sum(1, keepdim=True)).unsqueeze(1).expand(2, 6, 6)
    columns = PixelBertModel.attention_columns(None, batch, encoded)
    shares, baseline = attention_share([torch.stack([focused, uniform], 1)], *columns)
    assert baseline.tolist() == pytest.approx([2 / 5, 1 / 5])
    torch.testing.assert_close(shares, torch.tensor([[(1 + 2 / 5) / 2], [(1 + 1 / 5) / 2]]))


def test_pretraining_report_holds_the_grounding_table_and_figure_of_the_kinds_measured(tmp_path):
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    from vlbert.study.report import collect_runs, figure_grounding, write_pretraining

    KINDS = ("colour", "texture")  # the report reads the kinds the runs measured, whichever they are
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("grounding")
    for setting, gain in (("a", 10.0), ("b", 5.0)):
        run = client.create_run(experiment, tags={"stage": "pretrain", "setting": setting})
        for epoch in (1, 2):
            step = 10 * epoch
            values = {
                "epoch": epoch,
                "val_visual_clue_gain": gain,
                "val_attention_img_share_layer0": 0.2,
                "val_attention_img_share_layer1": 0.4,
                "val_attention_img_share": 0.3,
                "val_attention_img_uniform": 0.25,
            }
            for kind in KINDS:
                values |= {
                    f"val_ground_{kind}_own": 50 + gain * epoch,
                    f"val_ground_{kind}_other": 50.0,
                    f"val_ground_{kind}_gain": gain * epoch,
                    f"val_ground_{kind}_chance": 14.3,
                    f"val_ground_{kind}_n": 40,
                }
            client.log_batch(run.info.run_id, metrics=[Metric(k, v, 0, step) for k, v in values.items()])
        client.set_terminated(run.info.run_id)
    runs = collect_runs(uri, "grounding")
    write_pretraining(runs, tmp_path)
    text = (tmp_path / "pretraining.md").read_text()
    for setting, gain in (("a", 10.0), ("b", 5.0)):
        section = text.split(f"### {setting}\n")[1].split("###")[0]
        for kind in KINDS:
            assert f"| {kind} | {50 + 2 * gain:.1f} | 50.0 | {2 * gain:+.1f} | 14.3 | 40 |" in section
        assert "0.300, uniform 0.250; per layer: 0.200, 0.400." in section
    figure_grounding(uri, runs, tmp_path / "pretraining_grounding.png")
    assert (tmp_path / "pretraining_grounding.png").stat().st_size > 10_000
