"""Training: BERT init, the pre-training settings, fine-tuning with the evaluation protocol,
MLflow runs, crash-safe resume, determinism, non-finite losses, DDP."""

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml
from conftest import study_args

from vlbert.cli import main
from vlbert.engine.checkpoint import read_state
from vlbert.engine.optim import build_optimizer, build_scheduler
from vlbert.registry import SETTINGS
from vlbert.tracking import NullTracker


class Tiny(torch.nn.Module):
    """The smallest model the training loop can checkpoint."""

    def __init__(self, inputs: int):
        super().__init__()
        self.linear = torch.nn.Linear(inputs, 1)

    def save_pretrained(self, folder):
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        save_file(self.state_dict(), str(folder / "model.safetensors"))


def _metrics(path):
    metrics = json.loads((path / "metrics.json").read_text())
    metrics.pop("data_wait_share")
    return metrics


# ---- optimisers and schedules ----------------------------------------------------------------


def test_linear_warmup_then_linear_decay():
    model = torch.nn.Linear(2, 2)
    optimizer = build_optimizer(model, {"optimizer": "adamw", "lr": 1.0})
    scheduler = build_scheduler(optimizer, {"warmup_steps": 4, "schedule": "linear_decay"}, 20, 10)
    rates = []
    for _ in range(20):
        rates.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    assert rates[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0]) and rates[4] == pytest.approx(1.0)
    assert rates[12] == pytest.approx(0.5) and rates[-1] == pytest.approx(1 / 16)


def test_sgd_step_decay_for_vcr():
    model = torch.nn.Linear(2, 2)
    optimizer = build_optimizer(model, {"optimizer": "sgd", "lr": 2.0, "momentum": 0.9})
    assert isinstance(optimizer, torch.optim.SGD) and optimizer.param_groups[0]["momentum"] == 0.9
    scheduler = build_scheduler(optimizer, {"warmup_steps": 0, "schedule": "step", "step_epochs": [2, 3]}, 40, 10)
    rates = []
    for _ in range(40):
        rates.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    assert rates[0] == rates[19] == 2.0 and rates[20] == pytest.approx(0.2) and rates[30] == pytest.approx(0.02)


def test_biases_and_norms_get_no_weight_decay():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LayerNorm(2))
    decay, no_decay = build_optimizer(model, {"lr": 1.0, "weight_decay": 0.1}).param_groups
    assert len(decay["params"]) == 1 and decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0


def test_the_tuned_fast_rcnn_takes_its_own_rate_through_the_schedule():
    model = torch.nn.ModuleDict({"fast_rcnn": torch.nn.Linear(2, 2), "head": torch.nn.Linear(2, 2)})
    optimizer = build_optimizer(model, {"lr": 1.0, "frcnn_lr_factor": 0.1})
    rates = {id(p): group["lr"] for group in optimizer.param_groups for p in group["params"]}
    assert rates[id(model["fast_rcnn"].weight)] == rates[id(model["fast_rcnn"].bias)] == pytest.approx(0.1)
    assert rates[id(model["head"].weight)] == rates[id(model["head"].bias)] == 1.0
    scheduler = build_scheduler(optimizer, {"warmup_steps": 2, "schedule": "linear_decay"}, 10, 5)
    assert sorted(scheduler.get_last_lr()) == pytest.approx([0.05, 0.05, 0.5, 0.5])  # warm-up keeps the ratio


def test_the_task_head_takes_its_own_rate_and_nothing_else_does():
    # A fresh VQA head under the body's rate learnt the answer prior and then sat there while the
    # body forgot what pre-training had given it; head_lr_factor gives the head its own rate.
    model = torch.nn.ModuleDict(
        {
            "vlbert": torch.nn.ModuleDict({"classifier": torch.nn.Linear(2, 2)}),  # not the task's head
            "classifier": torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LayerNorm(2)),
        }
    )
    rates = {
        id(p): group["lr"]
        for group in build_optimizer(model, {"lr": 1.0, "head_lr_factor": 10.0}).param_groups
        for p in group["params"]
    }
    assert {rates[id(p)] for p in model["classifier"].parameters()} == {10.0}
    assert {rates[id(p)] for p in model["vlbert"].parameters()} == {1.0}
    # Without the option the groups are what they were: a preset that does not name it trains as before.
    assert len(build_optimizer(model, {"lr": 1.0}).param_groups) == 2


# ---- the stages ------------------------------------------------------------------------------


def test_the_head_input_statistics_are_the_training_rows_with_padding_left_out():
    from vlbert.engine.head_input import fit_head_standardisers
    from vlbert.modeling.heads import HeadInputStandardiser

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Linear(3, 3)
            self.classifier = torch.nn.Sequential(HeadInputStandardiser(3), torch.nn.Linear(3, 1))

        def forward(self, features, candidate):
            # A row that is no candidate reaches the head as zeros (as roi_hidden pads a RefCOCO+ item).
            return self.classifier(self.body(features) * candidate.unsqueeze(-1))

    torch.manual_seed(0)
    model = Head().train()
    batches = [{"features": torch.randn(4, 5, 3) * 3 + 1, "candidate": torch.ones(4, 5)} for _ in range(3)]
    batches[0]["candidate"][0, 0] = 0
    rows = torch.cat([model.body(b["features"])[b["candidate"] > 0] for b in batches]).detach()
    assert fit_head_standardisers(model, batches) == len(rows) == 59
    standardiser = model.classifier[0]
    assert torch.allclose(standardiser.mean, rows.mean(0), atol=1e-5)
    assert torch.allclose(standardiser.std, rows.std(0), atol=1e-5)
    assert model.training  # the model is handed back in the mode it came in
    assert fit_head_standardisers(torch.nn.Linear(3, 1), [{"input": torch.zeros(1, 3)}]) == 0


def test_finetune_standardises_the_head_input_and_turns_off_only_the_bodys_dropout(smoke_study, tmp_path):
    from safetensors.torch import load_file

    preset = yaml.safe_load(smoke_study["preset"].read_text())
    preset["finetune"]["refcoco"] |= {"standardise_head_input": True, "dropout": 0.0}
    (tmp_path / "preset.yaml").write_text(yaml.safe_dump(preset))
    out = tmp_path / "run"
    args = ["finetune", "--setting", "no_pretrain", "--task", "refcoco_det", "--lr", "0.001", "--seed", "0"]
    assert main([*args, "--out", str(out), *study_args(smoke_study), "--config", str(tmp_path / "preset.yaml")]) == 0
    config = json.loads((out / "best" / "config.json").read_text())
    assert config["standardise_head_input"] is True
    assert config["hidden_dropout_prob"] == config["attention_probs_dropout_prob"] == 0.0
    bert = json.loads((smoke_study["bert"] / "config.json").read_text())
    assert config["classifier_dropout"] == bert["hidden_dropout_prob"] > 0
    weights = load_file(str(out / "best" / "model.safetensors"))
    mean, std = weights["classifier.0.mean"], weights["classifier.0.std"]
    assert mean.abs().sum() > 0 and not torch.equal(std, torch.ones_like(std)) and torch.isfinite(std).all()
    assert json.loads((out / "metrics.json").read_text())["test"]


def test_word_embedding_std_draws_the_embeddings_and_the_tied_decoder():
    # The mini world's bert-init starts its words wide apart: at BERT's 0.02 the colours ended
    # near one embedding, and pre-training could not tell them apart from the image.
    from transformers import BertConfig, BertForMaskedLM

    from vlbert.engine.bert_init import init_word_embeddings

    torch.manual_seed(0)
    model = BertForMaskedLM(
        BertConfig(vocab_size=400, hidden_size=64, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    )
    assert float(model.get_input_embeddings().weight[1:].std()) == pytest.approx(0.02, rel=0.1)
    init_word_embeddings(model, 0.1)
    weight = model.get_input_embeddings().weight
    assert float(weight[1:].std()) == pytest.approx(0.1, rel=0.1)
    assert not weight[model.config.pad_token_id].any()
    assert model.get_output_embeddings().weight is weight


def test_bert_init_checkpoint_loads_into_vlbert(smoke_study):
    from vlbert.engine.build import build_model
    from vlbert.modeling import VLBertForPreTraining

    _, report = build_model(VLBertForPreTraining, {}, smoke_study["bert"], smoke_study["detector"])
    assert report["new"] and all(
        n.startswith(("vlbert.visual_embeddings.", "mlm.", "roi_head.", "relation_head."))
        for n in report["new"]
        if "segment C" not in n
    )


def test_a_trained_vocabulary_puts_img_and_end_where_the_model_looks_for_them(smoke_study):
    # The smoke preset trains its own WordPiece vocabulary: [IMG] is not BERT's id 1 there, and a
    # model that took id 1 for [IMG] would give the regions a word's tiny share of the image.
    from vlbert.engine.build import build_model, load_processor
    from vlbert.modeling import VLBertForPreTraining

    processor = load_processor(smoke_study["bert"], 40)
    assert len(processor.tokenizer) < 1000 and processor.img_token_id != 1
    model, _ = build_model(VLBertForPreTraining, {}, smoke_study["bert"], smoke_study["detector"])
    assert (model.config.img_token_id, model.config.end_token_id) == (processor.img_token_id, processor.end_token_id)


EXPECTED_LOSSES = {
    "a": {"mlm"},
    "b": {"mlm", "masked_roi"},
    "c": {"mlm", "masked_roi", "relation"},
    "d": {"mlm", "masked_roi", "text_mlm"},
    "full": {"mlm", "masked_roi", "text_mlm"},
}


@pytest.mark.parametrize("name", list(EXPECTED_LOSSES))
def test_each_setting_pretrains_with_its_tasks(smoke_study, smoke_config, name):
    from vlbert.engine.build import load_processor
    from vlbert.engine.context import RunInputs, TrainingContext
    from vlbert.engine.pretrain import pretrain
    from vlbert.tracking import NullTracker

    class Recorder(NullTracker):
        seen = set()

        def log_metrics(self, metrics, step=None):
            self.seen |= {k[len("loss_") :] for k in metrics if k.startswith("loss_")}

    tracker = Recorder()
    out = smoke_study["root"] / "pretrain" / name
    inputs = RunInputs(smoke_study["data"], smoke_study["features"], smoke_study["bert"], smoke_study["detector"])
    context = TrainingContext(smoke_config, inputs, load_processor(smoke_study["bert"], 40), tracker, progress=False)
    summary = pretrain(context, SETTINGS[name], out)
    assert tracker.seen == EXPECTED_LOSSES[name]
    assert (out / "best" / "model.safetensors").is_file() and 0 <= summary["val"]["mlm_accuracy"] <= 100
    val = summary["val"]
    assert val["visual_clue_gain"] == pytest.approx(val["mlm_accuracy"] - val["mlm_accuracy_other_image"])
    config = json.loads((out / "best" / "config.json").read_text())
    assert config["tune_frcnn"] is SETTINGS[name].tune_frcnn
    # The features are centred on the caption images' mean, and the checkpoint keeps it.
    from safetensors.torch import load_file

    from vlbert.data.feature_store import FeatureStore
    from vlbert.tasks.pretraining import CaptionDataset
    from vlbert.tasks.regions import feature_mean

    captions = CaptionDataset(
        smoke_study["data"] / "conceptual_captions",
        "train",
        FeatureStore(smoke_study["features"] / "conceptual_captions.train.det.h5"),
        smoke_config.get("model", {}).get("max_rois"),
    )
    saved = load_file(str(out / "best" / "model.safetensors"))["vlbert.visual_embeddings.appearance_mean"]
    assert saved.abs().sum() > 0 and torch.equal(saved, feature_mean(c["regions"] for c in captions))
    # The checkpoint the study wrote is a transformers one: its class and AutoModel load it.
    from transformers import AutoModel

    import vlbert  # noqa: F401  (registers the Auto classes)
    from vlbert.modeling import VLBertForPreTraining, VLBertModel

    model = VLBertForPreTraining.from_pretrained(out / "best")
    encoder = AutoModel.from_pretrained(out / "best")
    assert type(encoder) is VLBertModel and encoder.config.tune_frcnn is SETTINGS[name].tune_frcnn
    assert torch.equal(encoder.visual_embeddings.appearance_mean, saved)
    assert all(torch.equal(value, model.vlbert.state_dict()[key]) for key, value in encoder.state_dict().items())


def test_other_image_order_pairs_each_image_with_one_of_as_many_regions():
    from vlbert.engine.mlm_validation import other_image_order

    counts = [3, 2, 3, 5, 2, 3]
    order = other_image_order(counts)
    assert sorted(order) == list(range(len(counts)))  # every image is used once
    assert all(counts[j] == counts[i] for i, j in enumerate(order))
    assert [i for i, j in enumerate(order) if i == j] == [3]  # only the lone 5-region image keeps its own


def test_validation_scores_the_same_masks_with_another_image(smoke_study, smoke_config, smoke_validation):
    from vlbert.engine.mlm_validation import validation_batches, visual_clue_accuracy
    from vlbert.modeling import VLBertForPreTraining

    val, _, collate = smoke_validation
    own, other = validation_batches(val, collate, 0, 4)
    for mine, theirs in zip(own, other):
        for key in ("input_ids", "mlm_labels", "visual_index"):
            assert torch.equal(mine[key], theirs[key]), key
    assert any(not torch.equal(a["visual"].features, b["visual"].features) for a, b in zip(own, other))
    # A model whose visual projection ignores the appearance and boxes cannot gain from the image.
    from vlbert.engine.build import build_model

    model, _ = build_model(VLBertForPreTraining, smoke_config, smoke_study["bert"], smoke_study["detector"])
    with torch.no_grad():
        model.vlbert.visual_embeddings.projection.weight.zero_()
    blind = visual_clue_accuracy(model, own, other)
    assert blind["visual_clue_gain"] == 0 and blind["mlm_accuracy"] == blind["mlm_accuracy_other_image"]


def test_tune_frcnn_changes_the_fast_rcnn_only_in_full(smoke_study):
    from safetensors.torch import load_file

    from vlbert.detection.model import WEIGHTS_FILE

    detector = load_file(str(smoke_study["detector"] / WEIGHTS_FILE))
    key = "backbone.layer3.0.conv1.weight"
    for name, tuned in (("b", False), ("full", True)):
        path = smoke_study["root"] / "pretrain" / name / "best" / "model.safetensors"
        if not path.exists():
            pytest.skip("runs after the pre-training tests")
        weights = load_file(str(path))
        assert torch.equal(weights[f"vlbert.fast_rcnn.{key}"], detector[key]) is not tuned


@pytest.mark.parametrize("task", ["vqa", "vcr_q2a", "vcr_qa2r", "refcoco_det", "refcoco_gt"])
def test_finetune_follows_the_protocol_and_evaluate_agrees(smoke_study, task, tmp_path, capsys):
    out = tmp_path / task
    lr = "0.02" if task.startswith("vcr") else "0.001"
    assert (
        main(
            [
                "finetune",
                "--setting",
                "no_pretrain",
                "--task",
                task,
                "--lr",
                lr,
                "--seed",
                "0",
                "--out",
                str(out),
                *study_args(smoke_study),
            ]
        )
        == 0
    )
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["setting"] == "no_pretrain" and metrics["task"] == task and metrics["seed"] == 0
    # Without pre-training, the features are centred on the task's own training images.
    from safetensors.torch import load_file

    from vlbert import tasks
    from vlbert.engine.build import load_processor
    from vlbert.tasks.regions import feature_mean

    train = tasks.build(
        task, load_processor(smoke_study["bert"], 40), smoke_study["data"], smoke_study["features"]
    ).examples("train")
    saved = load_file(str(out / "best" / "model.safetensors"))["vlbert.visual_embeddings.appearance_mean"]
    assert torch.equal(saved, feature_mean(e["regions"] for e in train))
    assert metrics["lr"] == float(lr) and metrics["epochs"] == 1 and metrics["best_epoch"] == 1
    assert len(metrics["val_history"]) == 1 and metrics["val"]["accuracy"] == metrics["val_history"][0]["accuracy"]
    data = smoke_study["data"]
    capsys.readouterr()
    if task == "vqa":
        assert (
            main(
                [
                    "evaluate",
                    "vqa",
                    "--questions",
                    str(data / "vqa/v2_OpenEnded_mscoco_test-dev2015_questions.json"),
                    "--annotations",
                    str(data / "vqa/v2_mscoco_test-dev2015_annotations.json"),
                    "--predictions",
                    str(out / "predictions_test.json"),
                ]
            )
            == 0
        )
        assert f"VQA accuracy: {metrics['test']['accuracy']:.2f}" in capsys.readouterr().out
    elif task.startswith("vcr"):
        assert (
            main(
                [
                    "evaluate",
                    "vcr",
                    "--annotations",
                    str(data / "vcr/test.jsonl"),
                    "--predictions",
                    str(out / "predictions_test.json"),
                ]
            )
            == 0
        )
        key = "q2a" if task == "vcr_q2a" else "qa2r"
        assert f"{key}: {metrics['test']['accuracy']:.2f}" in capsys.readouterr().out
    else:
        assert (
            main(
                [
                    "evaluate",
                    "refcoco",
                    "--root",
                    str(data / "refcoco+"),
                    "--predictions",
                    str(out / "predictions_test.json"),
                ]
            )
            == 0
        )
        printed = capsys.readouterr().out
        assert f"testA: {metrics['test']['accuracy_testA']:.2f}" in printed
        assert f"testB: {metrics['test']['accuracy_testB']:.2f}" in printed


def test_refcoco_never_predicts_the_whole_image(smoke_study):
    """Row 0 of every image's regions is the whole image: scored by the model, never a candidate."""
    from types import SimpleNamespace

    from vlbert import tasks
    from vlbert.engine.build import load_processor

    task = tasks.build("refcoco_gt", load_processor(None, 32), smoke_study["data"], smoke_study["features"])
    examples = task.examples("val")[:4]
    logits = torch.zeros(len(examples), 1 + max(e["regions"].num_rois for e in examples))
    logits[:, 0], logits[:, 1] = 10.0, 5.0  # the whole image scores highest, then the first region
    predicted = task.predictions(SimpleNamespace(logits=logits), examples)
    for e, p in zip(examples, predicted):
        x1, y1, x2, y2 = (float(v) for v in e["regions"].boxes[1])
        assert p["bbox"] == [x1, y1, x2 - x1, y2 - y1]


def test_full_fine_tunes_on_the_features_of_its_tuned_fast_rcnn(smoke_study, tmp_path):
    """`full` tuned Fast R-CNN in pre-training: tune-features recomputes a store with the tuned
    module once (the features it computes from the images), and fine-tuning `full` reads them."""
    import numpy as np

    from vlbert.data.errors import DataFormatError
    from vlbert.data.feature_store import FeatureStore
    from vlbert.data.images import load_image
    from vlbert.detection.sources import image_items
    from vlbert.engine.tuned_features import check_store_features
    from vlbert.modeling import VLBertForPreTraining

    pretrained = smoke_study["root"] / "pretrain" / "full" / "best"
    if not pretrained.exists():
        pytest.skip("runs after the pre-training tests")
    store = smoke_study["features"] / "refcoco+.all.det.h5"
    assert (
        main(
            [
                "tune-features",
                "--config",
                str(smoke_study["preset"]),
                "--pretrained",
                str(pretrained),
                "--store",
                str(store),
                "--out",
                str(tmp_path / "tuned"),
                "--data",
                str(smoke_study["data"]),
                "--quiet",
            ]
        )
        == 0
    )
    tuned_path = tmp_path / "tuned" / store.name
    with pytest.raises(DataFormatError, match="vlbert tune-features"):
        check_store_features(SETTINGS["full"], [store], pretrained)
    check_store_features(SETTINGS["full"], [tuned_path], pretrained)
    check_store_features(SETTINGS["d"], [store], None)
    fast_rcnn = VLBertForPreTraining.from_pretrained(pretrained).vlbert.fast_rcnn.eval()
    paths = {item.key: item.path for item in image_items(smoke_study["data"] / "refcoco+", "refcoco+", "all")}
    with FeatureStore(store) as original, FeatureStore(tuned_path) as tuned:
        assert tuned.keys == original.keys
        key = tuned.keys[-1]
        assert np.array_equal(tuned[key]["boxes"], original[key]["boxes"])
        assert np.array_equal(tuned[key]["labels"], original[key]["labels"])
        with torch.no_grad():
            expected = fast_rcnn([load_image(paths[key])], [torch.from_numpy(original[key]["boxes"])])[0]
        # Stored in the source store's float16: within 2^-11 of the magnitude.
        assert torch.allclose(torch.from_numpy(tuned[key]["features"]), expected, rtol=2**-10, atol=1e-4)
        assert not np.allclose(tuned[key]["features"], original[key]["features"], atol=1e-4)  # tuning moved them
    assert (
        main(
            [
                "finetune",
                "--setting",
                "full",
                "--task",
                "refcoco_det",
                "--lr",
                "0.001",
                "--seed",
                "1",
                "--out",
                str(tmp_path / "full"),
                "--pretrained",
                str(pretrained),
                *study_args({**smoke_study, "features": tmp_path / "tuned"}),
            ]
        )
        == 0
    )
    assert json.loads((tmp_path / "full" / "metrics.json").read_text())["setting"] == "full"


class FakeFastRCNN:
    """Stands in for a tuned Fast R-CNN: a feature of ones for every box."""

    def eval(self):
        return self

    def __call__(self, images, boxes):
        return [torch.ones(len(b), 8) for b in boxes]


def test_fine_tuning_refuses_the_features_of_another_fast_rcnn(tmp_path):
    """Fine-tuning reads the stores' features as they are: `full` only those its own tuned Fast
    R-CNN made (`vlbert tune-features`), every other setting only the detector's."""
    from conftest import tiny_store
    from PIL import Image

    from vlbert.data.errors import DataFormatError
    from vlbert.engine.tuned_features import check_store_features, tune_store

    image = tmp_path / "1.png"
    Image.new("RGB", (10, 10)).save(image)
    extracted = tiny_store(tmp_path / "features" / "refcoco+.all.det.h5", dataset="refcoco+", split="all")
    full, other = tmp_path / "pretrain" / "full" / "best", tmp_path / "elsewhere" / "full" / "best"
    stores = {}
    for name, pretrained in (("full", full), ("other", other)):
        pretrained.mkdir(parents=True)
        (pretrained / "model.safetensors").write_bytes(f"the weights of {name}".encode())
        stores[name] = tmp_path / f"tuned_{name}" / extracted.name
        tune_store(FakeFastRCNN(), pretrained, extracted, {"1": image}, stores[name], progress=False)

    check_store_features(SETTINGS["full"], [stores["full"]], full)
    check_store_features(SETTINGS["d"], [extracted], tmp_path / "pretrain" / "d" / "best")
    check_store_features(SETTINGS["no_pretrain"], [extracted], None)
    full_id, other_id = re.escape(str(full.resolve())), re.escape(str(other.resolve()))
    with pytest.raises(
        DataFormatError,
        match=rf"tuned_other/refcoco\+\.all\.det\.h5: holds the features of the tuned "
        rf"Fast R-CNN of {other_id}, but setting 'full' fine-tunes on those of the "
        rf"tuned Fast R-CNN of {full_id}: run `vlbert tune-features",
    ):
        check_store_features(SETTINGS["full"], [stores["full"], stores["other"]], full)
    with pytest.raises(
        DataFormatError,
        match=rf"features/refcoco\+\.all\.det\.h5: holds the features of the "
        rf"detector's Fast R-CNN \(not tuned\), but setting 'full' fine-tunes on "
        rf"those of the tuned Fast R-CNN of {full_id}: run `vlbert tune-features",
    ):
        check_store_features(SETTINGS["full"], [extracted], full)
    for name in ("d", "no_pretrain"):
        with pytest.raises(
            DataFormatError,
            match=rf"tuned_full/refcoco\+\.all\.det\.h5: holds the features of the "
            rf"tuned Fast R-CNN of {full_id}, but setting '{name}' fine-tunes on "
            rf"those of the detector's Fast R-CNN \(not tuned\)",
        ):
            check_store_features(SETTINGS[name], [stores["full"]], None)
    # Known by its weights: a copy of the checkpoint elsewhere is the same Fast R-CNN; the folder
    # pre-trained again is another, whose features are not these.
    shutil.copytree(full, tmp_path / "copy")
    check_store_features(SETTINGS["full"], [stores["full"]], tmp_path / "copy")
    (full / "model.safetensors").write_bytes(b"the weights of full, trained again")
    with pytest.raises(
        DataFormatError,
        match=rf"tuned_full/.*: holds the features of the tuned Fast R-CNN of {full_id} "
        rf"before it was pre-trained again",
    ):
        check_store_features(SETTINGS["full"], [stores["full"]], full)


# ---- determinism and crash safety ------------------------------------------------------------


def test_same_seed_same_metrics(smoke_study, tmp_path):
    for run in ("one", "two"):
        assert (
            main(
                [
                    "finetune",
                    "--setting",
                    "no_pretrain",
                    "--task",
                    "vcr_q2a",
                    "--lr",
                    "0.02",
                    "--seed",
                    "3",
                    "--out",
                    str(tmp_path / run),
                    *study_args(smoke_study),
                ]
            )
            == 0
        )
    assert _metrics(tmp_path / "one") == _metrics(tmp_path / "two")


def test_finetune_into_a_folder_of_another_rate_starts_afresh(smoke_study, tmp_path, capsys):
    # Seen: `--lr 5e-2` into a folder finished at 1e-3 wrote "lr": 0.05 beside 1e-3's numbers.
    run = lambda lr, out: main(
        [
            "finetune",
            "--setting",
            "no_pretrain",
            "--task",
            "vcr_q2a",
            "--lr",
            lr,
            "--seed",
            "3",
            "--out",
            str(tmp_path / out),
            *study_args(smoke_study),
        ]
    )
    assert run("0.001", "reused") == 0
    assert run("0.02", "reused") == 0
    assert "not resuming" in capsys.readouterr().out
    assert run("0.02", "fresh") == 0
    assert _metrics(tmp_path / "reused") == _metrics(tmp_path / "fresh")


def test_continue_trial_resumes_only_a_trial_of_the_same_run(smoke_study, tmp_path, capsys):
    # A sweep's trial made with another preset value is copied in, then refused by its identity.
    sweep = tmp_path / "sweep" / "vcr_q2a"
    (sweep / "best.json").parent.mkdir(parents=True)
    (sweep / "best.json").write_text(json.dumps({"lr": 0.001, "seed": 0}))
    preset = yaml.safe_load(smoke_study["preset"].read_text())
    preset["finetune"]["vcr"]["batch_size"] += 1
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(preset))
    trial = [
        "finetune",
        "--setting",
        "no_pretrain",
        "--task",
        "vcr_q2a",
        "--lr",
        "0.001",
        "--seed",
        "0",
        "--out",
        str(sweep / "trials" / "lr_0.001"),
        *study_args({**smoke_study, "preset": other}),
    ]
    assert main(trial) == 0
    capsys.readouterr()
    seeds = [
        "finetune",
        "--setting",
        "no_pretrain",
        "--task",
        "vcr_q2a",
        "--lr-from",
        str(sweep.parent),
        "--continue-trial",
        "--seed",
        "0",
        "--out",
        str(tmp_path / "seed0"),
        *study_args(smoke_study),
    ]
    assert main(seeds) == 0
    out = capsys.readouterr().out
    assert "continuing the sweep's trial" in out and "not resuming" in out and "finetune.batch_size" in out


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_metrics(smoke_study, tmp_path):
    preset = yaml.safe_load(smoke_study["preset"].read_text())
    preset["finetune"]["vqa"]["epochs"] = 8  # 4 epochs of 12 batches: time to be killed mid-epoch
    preset["training"]["checkpoint_every"] = 5
    preset_path = tmp_path / "smoke_long.yaml"
    preset_path.write_text(yaml.safe_dump(preset))
    study = {**smoke_study, "preset": preset_path}
    command = [
        sys.executable,
        "-m",
        "vlbert.cli",
        "finetune",
        "--setting",
        "no_pretrain",
        "--task",
        "vqa",
        "--lr",
        "0.001",
        "--seed",
        "0",
        *study_args(study),
        "--threads",
        "1",
    ]
    killed = tmp_path / "killed"
    process = subprocess.Popen(command + ["--out", str(killed)])
    deadline = time.time() + 180
    while not (killed / "checkpoint" / "state.json").exists():
        assert process.poll() is None and time.time() < deadline, "the run ended before it could be killed"
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    state = read_state(killed / "checkpoint")["position"]
    assert state["batch"] > 0 and not (killed / "metrics.json").exists()  # killed mid-epoch
    subprocess.run(command + ["--out", str(killed)], check=True)
    subprocess.run(command + ["--out", str(tmp_path / "straight")], check=True)
    assert _metrics(killed) == _metrics(tmp_path / "straight")


def _tiny_loop(folder, identity, lr=0.1, select_metric=None, evaluate=None, tracker=None):
    from vlbert.engine.callbacks import BestEpoch, Tracking
    from vlbert.engine.loop import LoopConfig, LoopSteps, TrainingLoop

    torch.manual_seed(0)
    model = Tiny(2)
    optimizer = build_optimizer(model, {"lr": lr, "weight_decay": 0.0})
    scheduler = build_scheduler(optimizer, {}, 20, 10)
    batch = lambda epoch, b: {"x": torch.full((1, 2), float(epoch * 10 + b))}
    loss_fn = lambda model, batch: (((model.linear(batch["x"]) - 1.0) ** 2).sum().div(100), {})
    return TrainingLoop(
        model,
        optimizer,
        scheduler,
        LoopConfig(2, 10, checkpoint_every=5, progress=False),
        folder,
        LoopSteps(batch, loss_fn, evaluate),
        [Tracking(tracker or NullTracker()), BestEpoch(select_metric)],
        identity=identity,
    )


def _weights(folder):
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_a_checkpoint_is_resumed_only_by_the_run_that_made_it(tmp_path, capsys):
    # Seen: `vlbert finetune --lr 5e-2` into a folder finished at 1e-3 wrote 1e-3's numbers under 5e-2.
    _tiny_loop(tmp_path / "out", {"lr": 0.1, "inputs": {"bert": "sha256 aa"}}).fit()
    again = _tiny_loop(tmp_path / "out", {"lr": 0.1, "inputs": {"bert": "sha256 aa"}})
    again.fit()
    assert again.steps_timed == 0  # the same run: resumed, nothing to do
    other = _tiny_loop(tmp_path / "out", {"lr": 0.3, "inputs": {"bert": "sha256 bb"}}, lr=0.3)
    other.fit()
    assert "not resuming" in capsys.readouterr().out and other.steps_timed == 20
    fresh = _tiny_loop(tmp_path / "fresh", {"lr": 0.3, "inputs": {"bert": "sha256 bb"}}, lr=0.3)
    fresh.fit()
    assert all(
        torch.equal(a, b)
        for a, b in zip(_weights(tmp_path / "out" / "best").values(), _weights(tmp_path / "fresh" / "best").values())
    )


def test_checkpoints_need_no_unpickler(tmp_path):
    # Every file a checkpoint holds is JSON or safetensors; the state comes back as it was saved.
    loop = _tiny_loop(tmp_path, {"lr": 0.1})
    loop.fit()
    files = {f.name for f in (tmp_path / "checkpoint").iterdir()}
    assert files == {"model.safetensors", "identity.json", "state.json", "state.safetensors"}
    state = read_state(tmp_path / "checkpoint")
    assert sorted(p for group in state["optimizer"]["param_groups"] for p in group["params"]) == [0, 1]
    assert torch.equal(state["optimizer"]["state"][0]["exp_avg"], loop.optimizer.state_dict()["state"][0]["exp_avg"])
    assert state["extra"]["best_epoch"] == 1 and state["position"] == {"epoch": 2, "batch": 0, "step": 20}


def test_identity_differences_name_the_keys():
    from vlbert.engine.checkpoint import identity_differences

    assert identity_differences(
        {"lr": 0.1, "preset": {"model": {"a": 1}, "seed": 0}}, {"lr": 0.2, "preset": {"model": {"a": 2}, "seed": 0}}
    ) == ["lr", "preset.model.a"]


def test_a_checkpoint_without_an_identity_is_not_resumed(tmp_path, capsys):
    _tiny_loop(tmp_path, None).fit()
    loop = _tiny_loop(tmp_path, {"lr": 0.1})
    loop.fit()
    assert "records no identity" in capsys.readouterr().out and loop.steps_timed == 20


def test_a_finished_run_writes_its_best_weights_again(tmp_path):
    # Seen: Snakemake deleted best/ of a killed job; the re-run found its finished checkpoint and
    # never wrote best/ again (MissingOutputException on every later run).
    import shutil

    _tiny_loop(tmp_path, {"lr": 0.1}).fit()
    before = _weights(tmp_path / "best")
    shutil.rmtree(tmp_path / "best")
    loop = _tiny_loop(tmp_path, {"lr": 0.1})
    loop.fit()
    assert loop.steps_timed == 0 and all(torch.equal(before[k], v) for k, v in _weights(tmp_path / "best").items())


def test_a_finished_run_whose_best_epoch_is_gone_trains_again(tmp_path, capsys):
    import shutil

    scores = iter([2.0, 1.0, 2.0, 1.0])  # the first epoch is the best one, in both runs
    evaluate = lambda model: {"accuracy": next(scores)}
    _tiny_loop(tmp_path, {"lr": 0.1}, select_metric="accuracy", evaluate=evaluate).fit()
    before = _weights(tmp_path / "best")
    shutil.rmtree(tmp_path / "best")
    loop = _tiny_loop(tmp_path, {"lr": 0.1}, select_metric="accuracy", evaluate=evaluate)
    loop.fit()
    assert "are gone" in capsys.readouterr().out and loop.steps_timed == 20 and loop.state.best_epoch == 0
    assert all(torch.equal(before[k], v) for k, v in _weights(tmp_path / "best").items())


def test_a_second_run_into_a_folder_in_use_stops_naming_the_holder(smoke_study, tmp_path, capsys):
    # Seen: two `vlbert pretrain` into one --out crashed each other on checkpoint.partial/.old.
    from vlbert.io import exclusive_folder

    out = tmp_path / "out"
    hold = (
        "import sys, time\nfrom vlbert.io import exclusive_folder\nwith exclusive_folder(sys.argv[1]):\n"
        "    print('held', flush=True)\n    time.sleep(120)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", hold, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        code = main(["pretrain", "--setting", "a", "--out", str(out), *study_args(smoke_study)])
        assert code == 2 and f"{out} is in use by another run (PID {holder.pid})" in capsys.readouterr().err
        assert not (out / "checkpoint").exists()
    finally:
        holder.kill()
        holder.wait()
    with exclusive_folder(out):  # a killed holder leaves no stale lock
        pass


@pytest.mark.parametrize("verb", ["pretrain", "finetune"])
def test_a_second_run_stops_before_its_set_up(verb, tmp_path, monkeypatch, capsys):
    # Seen: the folder was taken after set-up (the preset, tokenizer, MLflow run: over a minute on
    # a loaded machine), so two runs started together both did their set-up before one stopped.
    from types import SimpleNamespace

    from vlbert.study import runs
    from vlbert.tracking import NullTracker

    set_up = []

    def training_context(*args, **kwargs):
        set_up.append(args[1])
        return SimpleNamespace(tracker=NullTracker())

    monkeypatch.setattr(runs, "_training_context", training_context)
    out = tmp_path / "out"
    hold = (
        "import sys, time\nfrom vlbert.io import exclusive_folder\nwith exclusive_folder(sys.argv[1]):\n"
        "    print('held', flush=True)\n    time.sleep(120)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", hold, str(out)], stdout=subprocess.PIPE, text=True)
    args = {
        "pretrain": ["--setting", "a"],
        "finetune": ["--setting", "no_pretrain", "--task", "vqa", "--lr", "0.001", "--seed", "0"],
    }[verb]
    try:
        assert holder.stdout.readline().strip() == "held"
        code = main([verb, "--config", "unused.yaml", *args, "--out", str(out)])
        assert code == 2 and f"{out} is in use by another run (PID {holder.pid})" in capsys.readouterr().err
        assert set_up == []
    finally:
        holder.kill()
        holder.wait()


def test_non_finite_loss_stops_naming_the_step_and_keeps_the_last_checkpoint(tmp_path):
    from vlbert.engine.loop import LoopConfig, LoopSteps, TrainingLoop

    model = Tiny(2)
    optimizer = build_optimizer(model, {"lr": 0.1})
    scheduler = build_scheduler(optimizer, {}, 20, 10)
    make_batch = lambda epoch, b: {"x": torch.ones(1, 2), "poison": epoch * 10 + b == 6}

    def loss_fn(model, batch):
        mrc = model.linear(batch["x"]).sum() * (math.nan if batch["poison"] else 1.0)
        mlm = torch.tensor(0.5)
        return mlm + mrc, {"mlm": mlm, "mrc": mrc}

    loop = TrainingLoop(
        model,
        optimizer,
        scheduler,
        LoopConfig(2, 10, checkpoint_every=5, progress=False),
        tmp_path,
        LoopSteps(make_batch, loss_fn),
        [],
    )
    # The message names the step and each of the setting's losses, so that the culprit shows.
    with pytest.raises(
        FloatingPointError,
        match=r"non-finite loss at step 7 \(epoch 1, batch 7\): "
        r"loss nan \(mlm 0\.5, mrc nan\).*checkpoint",
    ):
        loop.fit()
    state = read_state(tmp_path / "checkpoint")
    assert state["position"] == {"epoch": 0, "batch": 5, "step": 5}


# ---- loader workers ----------------------------------------------------------------------------


def _loader_loop(folder, device="cpu", **loop):
    """A tiny loop whose batches draw from (seed, epoch, batch) generators, hold one tensor twice,
    and whose loss draws dropout from the global RNG (which a loader must leave as it was)."""
    from vlbert.engine.callbacks import BestEpoch, Callback
    from vlbert.engine.loop import LoopConfig, LoopSteps, TrainingLoop
    from vlbert.engine.seeding import batch_generator, epoch_order
    from vlbert.tracking import LOSS_METRIC

    class Losses(Callback):
        def __init__(self):
            self.seen = []

        def on_log(self, loop, logs):
            self.seen.append((loop.state.step, logs[LOSS_METRIC]))

    torch.manual_seed(0)
    model = Tiny(4).to(device)
    data = torch.randn(40, 4, generator=torch.Generator().manual_seed(1))
    targets = data.sum(1, keepdim=True)
    optimizer = build_optimizer(model, {"lr": 0.05, "weight_decay": 0.0})
    scheduler = build_scheduler(optimizer, {}, 20, 10)

    def make_batch(epoch, b):
        rows = epoch_order(len(data), 0, epoch)[b * 4 : (b + 1) * 4]
        x = data[rows] + 0.1 * torch.randn(4, 4, generator=batch_generator(0, epoch, b))
        return {"x": x, "y": targets[rows], "pair": [x, x]}

    def loss_fn(model, batch):
        assert batch["pair"][0] is batch["pair"][1]  # a tensor held twice comes as one tensor
        x = torch.nn.functional.dropout(batch["x"], 0.2, training=True)
        return ((model.linear(x) - batch["y"]) ** 2).mean(), {}

    losses = Losses()
    built = TrainingLoop(
        model,
        optimizer,
        scheduler,
        LoopConfig(2, 10, checkpoint_every=5, log_every=1, progress=False, **loop),
        folder,
        LoopSteps(make_batch, loss_fn),
        [losses, BestEpoch()],
        identity={"test": "loader"},
    )
    return built, losses


def test_loader_workers_train_on_the_same_batches_as_the_thread(tmp_path):
    import multiprocessing

    threaded, thread_losses = _loader_loop(tmp_path / "thread")
    threaded.fit()
    workers, worker_losses = _loader_loop(tmp_path / "workers", loader_workers=2, prefetch_batches=3)
    assert workers.pin_memory is False  # on CPU: nothing to pin for
    workers.fit()
    assert worker_losses.seen == thread_losses.seen and len(worker_losses.seen) == 20
    assert _weights(tmp_path / "workers" / "best").keys() == _weights(tmp_path / "thread" / "best").keys()
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            _weights(tmp_path / "workers" / "best").values(), _weights(tmp_path / "thread" / "best").values()
        )
    )
    assert workers.steps_timed == 20 and workers.step_time >= workers.data_wait > 0
    # Stopped early, the loader's workers stop with the training.
    early, early_losses = _loader_loop(tmp_path / "early", loader_workers=2, max_steps=3)
    early.fit()
    assert early_losses.seen == thread_losses.seen[:3] and not multiprocessing.active_children()


def test_a_run_killed_with_loader_workers_resumes_to_the_same_weights(tmp_path, monkeypatch):
    import multiprocessing

    from vlbert.engine.loop import TrainingLoop

    straight, straight_losses = _loader_loop(tmp_path / "straight")
    straight.fit()
    trains = TrainingLoop._step

    def step_or_die(loop, batch):
        if loop.state.step + 1 == 8:
            raise Killed
        return trains(loop, batch)

    monkeypatch.setattr(TrainingLoop, "_step", step_or_die)
    killed, _ = _loader_loop(tmp_path / "killed", loader_workers=2)
    with pytest.raises(Killed):
        killed.fit()
    assert not multiprocessing.active_children()
    assert read_state(tmp_path / "killed" / "checkpoint")["position"] == {"epoch": 0, "batch": 5, "step": 5}
    monkeypatch.setattr(TrainingLoop, "_step", trains)
    resumed, resumed_losses = _loader_loop(tmp_path / "killed", loader_workers=2)
    resumed.fit()
    assert resumed.steps_timed == 15 and resumed_losses.seen == straight_losses.seen[5:]
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            _weights(tmp_path / "killed" / "best").values(), _weights(tmp_path / "straight" / "best").values()
        )
    )


def test_loader_settings_are_checked(tmp_path):
    from vlbert.engine.loop import LoopConfig, LoopSteps, TrainingLoop

    for settings in ({"loader_workers": -1}, {"loader_workers": 2, "prefetch_batches": 0}):
        with pytest.raises(ValueError, match=r"loading\.workers must be >= 0 and loading\.prefetch_batches >= 1"):
            TrainingLoop(Tiny(2), None, None, LoopConfig(1, 1, **settings), tmp_path, LoopSteps(None, None), [])


def test_pinning_keeps_a_batch_as_move_to_takes_it(monkeypatch):
    # The DataLoader's own pinning skips dataclasses (VisualInputs) and copies a tensor once per
    # place it is held (Pixel-BERT's VCR image, once per candidate); a worker's batch is pinned as
    # move_to moves it. Pinning is faked here: it needs CUDA.
    from vlbert.engine.loop import _Built
    from vlbert.modeling.inputs import VisualInputs

    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda tensor: tensor.clone())  # a copy, as pinning
    image = torch.rand(3, 8, 8)
    visual = VisualInputs(
        torch.zeros(2, 1, 4), torch.ones(2, 2), torch.ones(2, 1, dtype=torch.bool), images=[image, image]
    )
    pinned = _Built({"visual": visual, "again": (image,), "n": 3}).pin_memory().batch
    assert isinstance(pinned["visual"], VisualInputs) and pinned["n"] == 3
    assert pinned["visual"].boxes is not visual.boxes and torch.equal(pinned["visual"].boxes, visual.boxes)
    assert pinned["visual"].images[0] is pinned["visual"].images[1] is pinned["again"][0]  # still one image
    assert pinned["again"][0] is not image and torch.equal(pinned["again"][0], image)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory needs CUDA")
def test_loader_workers_pin_batches_on_cuda(tmp_path):
    from vlbert.engine.loop import _Built

    assert _Built({"x": torch.ones(2)}).pin_memory().batch["x"].is_pinned()
    threaded, thread_losses = _loader_loop(tmp_path / "thread", "cuda")
    threaded.fit()
    workers, worker_losses = _loader_loop(tmp_path / "workers", "cuda", loader_workers=2)
    assert workers.pin_memory
    workers.fit()
    assert worker_losses.seen == thread_losses.seen


# ---- MLflow ----------------------------------------------------------------------------------


def test_finetune_run_is_recorded_in_mlflow(smoke_study, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.2")  # the run is seconds long
    args = [a for a in study_args(smoke_study) if a != "--no-tracking"]
    assert (
        main(
            [
                "finetune",
                "--setting",
                "no_pretrain",
                "--task",
                "refcoco_gt",
                "--lr",
                "0.001",
                "--seed",
                "2",
                "--out",
                str(tmp_path / "run"),
                *args,
            ]
        )
        == 0
    )
    client = MlflowClient(uri)
    [run] = client.search_runs([client.get_experiment_by_name("vlbert-ablation-smoke").experiment_id])
    tags = run.data.tags
    assert {tags[k] for k in ("setting", "task", "stage", "seed", "preset")} == {
        "no_pretrain",
        "refcoco_gt",
        "finetune",
        "2",
        "smoke",
    }
    assert len(tags["git_commit"]) >= 7
    assert run.data.params["preset.finetune.refcoco.batch_size"] == "8"
    assert {"loss", "val_accuracy", "lr"} <= set(run.data.metrics)
    assert any(name.startswith("system/") for name in run.data.metrics)
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"metrics.json", "checkpoint"} <= artifacts
    assert {"checkpoint/model.safetensors", "checkpoint/config.json"} <= {
        a.path for a in client.list_artifacts(run.info.run_id, "checkpoint")
    }


def test_unreachable_tracking_store_fails_at_start(smoke_study, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9/")  # discard port: nothing listens
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    args = [a for a in study_args(smoke_study) if a != "--no-tracking"]
    started = time.time()
    assert (
        main(
            [
                "finetune",
                "--setting",
                "no_pretrain",
                "--task",
                "vqa",
                "--lr",
                "0.001",
                "--seed",
                "0",
                "--out",
                str(tmp_path / "run"),
                *args,
            ]
        )
        == 2
    )
    assert "MLflow tracking store 'http://127.0.0.1:9/' cannot be reached" in capsys.readouterr().err
    assert time.time() - started < 30 and not (tmp_path / "run").exists()


class Killed(BaseException):
    """What SIGKILL does to a run, in-process: training stops mid-epoch and the run is never closed."""


def _killed_at_step(monkeypatch, step):
    """Training stops as if killed before step `step` (the checkpoint of step 5 exists from step 6 on),
    and the MLflow run is never marked ended."""
    from mlflow.tracking import MlflowClient

    from vlbert.engine.loop import TrainingLoop

    trains = TrainingLoop._step

    def step_or_die(loop, batch):
        if loop.state.step + 1 == step:
            raise Killed
        return trains(loop, batch)

    monkeypatch.setattr(TrainingLoop, "_step", step_or_die)
    monkeypatch.setattr(MlflowClient, "set_terminated", lambda *args, **kwargs: None)


def _tracked_finetune(smoke_study, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    args = [a for a in study_args(smoke_study) if a != "--no-tracking"]
    client = MlflowClient(uri)

    def finetune(lr, *more):
        return main(
            [
                "finetune",
                "--setting",
                "no_pretrain",
                "--task",
                "vqa",
                "--lr",
                lr,
                "--seed",
                "0",
                "--out",
                str(tmp_path / "run"),
                *args,
                *more,
            ]
        )

    def runs():
        return client.search_runs(
            [client.get_experiment_by_name("vlbert-ablation-smoke").experiment_id],
            order_by=["attributes.start_time ASC"],
        )

    return finetune, runs, client


def test_a_killed_run_re_run_continues_its_mlflow_run(smoke_study, tmp_path, monkeypatch):
    # Seen: a run killed mid-way stayed RUNNING, and its re-run logged into a new run from the
    # checkpoint's step on: the history split in two, one half RUNNING for ever.
    finetune, runs, client = _tracked_finetune(smoke_study, tmp_path, monkeypatch)
    with monkeypatch.context() as killing:
        _killed_at_step(killing, 6)  # 12 steps, logged every 2, a checkpoint at 5
        with pytest.raises(Killed):
            finetune("0.001")
    [killed] = runs()
    assert killed.info.status == "RUNNING"
    # The same data by another path: the run's param preset.data.root keeps its first value.
    (tmp_path / "data").symlink_to(smoke_study["data"])
    assert finetune("0.001", "--data", str(tmp_path / "data")) == 0
    [run] = runs()
    assert run.info.run_id == killed.info.run_id and run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [2, 4, 6, 8, 10, 12]
    assert {"val_accuracy", "final_test_accuracy"} <= set(run.data.metrics)
    assert run.data.tags["vlbert.resumed_at_step"] == "5"
    assert run.data.params["preset.data.root"] == str(smoke_study["data"])
    from vlbert.study.report import collect_runs, latest_results

    chosen, notes = latest_results(collect_runs(client.tracking_uri, "vlbert-ablation-smoke"), "finetune")
    assert list(chosen["run_id"]) == [run.info.run_id] and notes == []


@pytest.mark.parametrize(
    "killed_at, lr, why",
    [
        (6, "0.002", "its checkpoint was not resumed: it was made by another run (differs in lr"),
        (3, "0.001", "it stopped before its first checkpoint"),
    ],
    ids=["another rate", "no checkpoint"],
)
def test_a_killed_run_that_cannot_be_continued_ends_killed_with_a_note(
    smoke_study, tmp_path, monkeypatch, killed_at, lr, why
):
    # Its folder trained again from the start (another rate; nothing to resume): the killed run
    # will never go on, so it ends KILLED, saying why and which run took the folder over.
    finetune, runs, client = _tracked_finetune(smoke_study, tmp_path, monkeypatch)
    with monkeypatch.context() as killing:
        _killed_at_step(killing, killed_at)
        with pytest.raises(Killed):
            finetune("0.001")
    assert finetune(lr) == 0
    old, new = runs()
    assert old.info.status == "KILLED" and why in old.data.tags["vlbert.ended"]
    assert new.info.run_id in old.data.tags["vlbert.ended"]  # where the folder's training went
    assert new.info.status == "FINISHED" and "vlbert.resumed_at_step" not in new.data.tags
    assert [m.step for m in client.get_metric_history(new.info.run_id, "loss")] == [2, 4, 6, 8, 10, 12]


class RecordingTracker(NullTracker):
    """A Tracker that keeps which runs it was asked to start and to end."""

    def __init__(self, new_run: str):
        self.new_run, self.calls = new_run, []

    def start(self, continue_run=None):
        self.calls.append(("start", continue_run))
        return continue_run or self.new_run

    def abandon(self, run_id, why):
        self.calls.append(("abandon", run_id))


def test_a_checkpoint_copied_from_a_sweep_trial_starts_a_run_of_its_own(tmp_path):
    # --continue-trial copies the trial's checkpoint into the seed's folder: the seed's run is a
    # fine-tuning run of its own, never the trial's run nor the folder's last run (here: of another
    # rate, killed before its first checkpoint) continued; that one is ended.
    _tiny_loop(tmp_path / "seed", {"lr": 0.3}, lr=0.3, tracker=RecordingTracker("other-rate")).fit()
    for name in ("checkpoint", "best"):
        shutil.rmtree(tmp_path / "seed" / name)
    _tiny_loop(tmp_path / "trial", {"lr": 0.1}, tracker=RecordingTracker("trial-run")).fit()
    shutil.copytree(tmp_path / "trial" / "checkpoint", tmp_path / "seed" / "checkpoint")
    tracker = RecordingTracker("seed-run")
    loop = _tiny_loop(tmp_path / "seed", {"lr": 0.1}, tracker=tracker)
    loop.fit()
    assert loop.steps_timed == 0 and tracker.calls == [("start", None), ("abandon", "other-rate")]
    again = RecordingTracker("another-run")
    _tiny_loop(tmp_path / "seed", {"lr": 0.1}, tracker=again).fit()  # re-run: the seed's own run goes on
    assert again.calls == [("start", "seed-run")]


def test_a_continued_run_keeps_its_params_and_takes_its_new_sweep_run(tmp_path):
    # A re-run sweep's trial continues its run: under the new sweep run, its first params kept
    # (MLflow refuses to change them), the params it lacked added.
    from mlflow.tracking import MlflowClient

    from vlbert.tracking import MLflowTracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = MLflowTracker(uri, "e", "trial", {"stage": "sweep_trial"}, parent_run_id="sweep-1", system_metrics=False)
    first.log_params({"data": {"root": "/a"}})
    run_id = first.start()
    first.log_metrics({"loss": 1.0}, step=2)
    again = MLflowTracker(uri, "e", "trial", {"stage": "sweep_trial"}, parent_run_id="sweep-2", system_metrics=False)
    again.log_params({"data": {"root": "/b"}, "lr": 0.1})
    assert again.start(continue_run=run_id) == run_id
    again.log_metrics({"loss": 0.5}, step=4)
    again.close()
    run = MlflowClient(uri).get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["mlflow.parentRunId"] == "sweep-2"
    assert run.data.params == {"data.root": "/a", "lr": "0.1"}
    assert [m.step for m in MlflowClient(uri).get_metric_history(run_id, "loss")] == [2, 4]
    gone = MLflowTracker(uri, "e", "trial", {}, system_metrics=False)
    assert gone.start(continue_run="0" * 32) not in (run_id, "0" * 32)  # not in the store: a new run


# ---- DDP -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_two_processes_on_cpu_stay_in_step(smoke_study, tmp_path):
    """torchrun with 2 CPU processes (gloo): the loop checks every epoch that the ranks hold the
    same weights, and fails if they drift."""
    out = tmp_path / "ddp"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            "29517",
            "-m",
            "vlbert.cli",
            "finetune",
            "--setting",
            "no_pretrain",
            "--task",
            "vcr_q2a",
            "--lr",
            "0.02",
            "--seed",
            "0",
            "--out",
            str(out),
            *study_args(smoke_study),
            "--threads",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["best_epoch"] == 1 and 0 <= metrics["val"]["accuracy"] <= 100
    assert "data-parallel fine-tuning: 2 processes" in result.stdout


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_autocast_precision_trains(tmp_path, precision):
    """bf16 autocast (GPU in real use; CPU here) runs the same loop and still learns."""
    from vlbert.engine.loop import LoopConfig, LoopSteps, TrainingLoop

    torch.manual_seed(0)
    model = Tiny(4)
    x, y = torch.randn(64, 4), torch.randn(64, 1)
    optimizer = build_optimizer(model, {"lr": 0.05, "weight_decay": 0.0})
    scheduler = build_scheduler(optimizer, {}, 40, 20)
    loss_fn = lambda model, batch: (((model.linear(batch["x"]).float() - batch["y"]) ** 2).mean(), {})
    loop = TrainingLoop(
        model,
        optimizer,
        scheduler,
        LoopConfig(2, 20, precision=precision, progress=False),
        tmp_path,
        LoopSteps(lambda e, b: {"x": x, "y": y}, loss_fn),
        [],
    )
    before = loss_fn(model, {"x": x, "y": y})[0].item()
    loop.fit()
    assert loss_fn(model, {"x": x, "y": y})[0].item() < 0.8 * before
    with pytest.raises(ValueError, match="precision"):
        TrainingLoop(
            model,
            optimizer,
            scheduler,
            LoopConfig(1, 1, precision="fp8"),
            tmp_path,
            LoopSteps(None, None),
            [],
        )


# ---- Ray Tune sweeps -------------------------------------------------------------------------


@pytest.mark.slow
def test_sweep_retries_a_crashed_trial_and_the_seeds_rerun_its_choice(
    smoke_study, smoke_config, tmp_path, monkeypatch, capsys
):
    from vlbert.engine.context import RunInputs
    from vlbert.study.sweep import run_sweeps

    monkeypatch.setenv("VLBERT_FAULT_ONCE", str(tmp_path / "crashed"))  # the first trial to start crashes once
    # One Tuner for both tasks, each with its own rates (VCR's SGD needs other rates than AdamW).
    lrs = {"vcr": [2e-2], "vqa": [1e-3], "refcoco": [1e-3, 3e-3]}
    preset = {**smoke_config, "sweep": {**smoke_config["sweep"], "lrs": lrs, "max_failures": 1}}
    summaries = run_sweeps(
        preset,
        "no_pretrain",
        ["refcoco_gt", "vqa"],
        tmp_path / "sweep",
        RunInputs(smoke_study["data"], smoke_study["features"], smoke_study["bert"], smoke_study["detector"]),
        cores=2,
    )
    assert (tmp_path / "crashed").exists()  # a trial did crash
    best = {task: json.loads((tmp_path / "sweep" / task / "best.json").read_text()) for task in ("refcoco_gt", "vqa")}
    assert best == summaries and best["refcoco_gt"]["lr"] in (1e-3, 3e-3) and best["vqa"]["lr"] == 1e-3
    assert [t["lr"] for t in best["refcoco_gt"]["trials"]] == [1e-3, 3e-3]
    assert [t["lr"] for t in best["vqa"]["trials"]] == [1e-3]
    assert all(t["best_val_accuracy"] is not None for b in best.values() for t in b["trials"])  # the crash was retried
    # Trials never look at test.
    assert not list((tmp_path / "sweep").rglob("predictions_test.json"))
    # The seeds re-run each task's chosen rate, every (task, seed) in OUT/<task>/seed<N>/; the
    # sweep's seed (0) continues the sweep's own trial of that rate, as the workflow does.
    assert (
        main(
            [
                "finetune",
                "--setting",
                "no_pretrain",
                "--task",
                "refcoco_gt",
                "vqa",
                "--lr-from",
                str(tmp_path / "sweep"),
                "--continue-trial",
                "--seed",
                "0",
                "1",
                "--out",
                str(tmp_path / "seeds"),
                *study_args(smoke_study),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    for task in ("refcoco_gt", "vqa"):
        assert f"no_pretrain/{task} seed 0: continuing the sweep's trial" in out
        assert f"no_pretrain/{task} seed 1: continuing" not in out
        for seed in (0, 1):
            metrics = json.loads((tmp_path / "seeds" / task / f"seed{seed}" / "metrics.json").read_text())
            assert (metrics["task"], metrics["seed"], metrics["lr"]) == (task, seed, best[task]["lr"])
            assert metrics["test"]  # the chosen runs are scored on test
    # Continuing the trial gives the metrics of a run from scratch.
    for task in ("refcoco_gt", "vqa"):
        assert (
            main(
                [
                    "finetune",
                    "--setting",
                    "no_pretrain",
                    "--task",
                    task,
                    "--lr",
                    str(best[task]["lr"]),
                    "--seed",
                    "0",
                    "--out",
                    str(tmp_path / "scratch" / task),
                    *study_args(smoke_study),
                ]
            )
            == 0
        )
        assert _metrics(tmp_path / "seeds" / task / "seed0") == _metrics(tmp_path / "scratch" / task)


def test_several_tasks_take_their_rates_from_a_sweep_folder(smoke_study, tmp_path, capsys):
    best = tmp_path / "best.json"
    best.write_text(json.dumps({"lr": 1e-3}))
    assert (
        main(
            [
                "finetune",
                "--setting",
                "no_pretrain",
                "--task",
                "vqa",
                "refcoco_gt",
                "--lr-from",
                str(best),
                "--seed",
                "0",
                "--out",
                str(tmp_path / "out"),
                *study_args(smoke_study),
            ]
        )
        == 2
    )
    assert "several tasks need a sweep folder" in capsys.readouterr().err


def test_continue_trial_needs_a_sweep_folder(smoke_study, tmp_path, capsys):
    assert (
        main(
            [
                "finetune",
                "--setting",
                "no_pretrain",
                "--task",
                "vqa",
                "--lr",
                "0.001",
                "--continue-trial",
                "--seed",
                "0",
                "--out",
                str(tmp_path / "out"),
                *study_args(smoke_study),
            ]
        )
        == 2
    )
    assert "--continue-trial needs --lr-from with a sweep folder" in capsys.readouterr().err


def test_without_a_rate_each_task_takes_its_presets(smoke_study, tmp_path, capsys):
    args = ["finetune", "--setting", "no_pretrain", "--task", "vcr_q2a", "refcoco_gt", "--seed", "0"]
    assert main([*args, "--out", str(tmp_path / "out"), *study_args(smoke_study)]) == 0
    preset = yaml.safe_load(smoke_study["preset"].read_text())["finetune"]
    for task, section in (("vcr_q2a", "vcr"), ("refcoco_gt", "refcoco")):
        assert _metrics(tmp_path / "out" / task / "seed0")["lr"] == preset[section]["lr"]
    both = ["--lr", "0.001", "--lr-from", str(tmp_path / "best.json")]
    assert main([*args, *both, "--out", str(tmp_path / "both"), *study_args(smoke_study)]) == 2
    assert "give at most one of --lr and --lr-from" in capsys.readouterr().err


def test_a_task_without_a_rate_anywhere_is_refused_naming_the_key(smoke_study, tmp_path, capsys):
    preset = yaml.safe_load(smoke_study["preset"].read_text())
    del preset["finetune"]["vqa"]["lr"]
    (tmp_path / "preset.yaml").write_text(yaml.safe_dump(preset))
    args = ["finetune", "--setting", "no_pretrain", "--task", "vqa", "--seed", "0", "--out", str(tmp_path / "out")]
    assert main([*args, *study_args(smoke_study), "--config", str(tmp_path / "preset.yaml")]) == 2
    assert "finetune.vqa.lr is not set; give --lr or --lr-from for vqa" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
