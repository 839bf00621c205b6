"""The training stages (vlbert/engine/stage.py and its stages): the runner, `run_stage`, on a
stage of its own; on the smoke study, BERT init, each setting's pre-training objectives,
fine-tuning with the evaluation protocol, the head's input statistics, the tuned Fast R-CNN's
features."""

import json
import re
import shutil

import pytest
import torch
import yaml
from conftest import finetune_args, study_args
from training_helpers import Tiny, saved_weights

from vlbert.cli import main
from vlbert.engine.callbacks import Callback
from vlbert.engine.optim import build_optimizer, build_scheduler
from vlbert.engine.seeding import batch_generator
from vlbert.engine.stage import Stage, run_stage
from vlbert.registry import SETTINGS
from vlbert.tracking import EPOCH_METRIC, NullTracker

# ---- the runner ------------------------------------------------------------------------------


class RecordingTracker(NullTracker):
    """What the runner records: the params, each log_metrics call with its step, the runs started."""

    def __init__(self):
        self.params, self.metrics, self.started = [], [], []

    def start(self, continue_run=None):
        self.started.append(continue_run)
        return continue_run or "run-1"

    def log_params(self, params):
        self.params.append(params)

    def log_metrics(self, metrics, step=None):
        self.metrics.append((step, metrics))

    def validated_epochs(self) -> list[int]:
        return [m[EPOCH_METRIC] for _, m in self.metrics if EPOCH_METRIC in m]


SCORES = (1.0, 3.0, 2.0)  # LinearStage's validation scores by epoch: the best is epoch 1, not the last


class LinearStage(Stage):
    """A linear model fitting y = x . (1, -2) on 3 epochs of 3 synthetic batches. Its validation
    scores are scripted (SCORES), so that keeping the last epoch's weights instead of the selected
    one shows; it counts its training steps and keeps each validated epoch's weights."""

    select_metric = "score"

    seed = 0

    def __init__(self, out):
        self.out = out
        self.preset = {"training": {"log_every": 1, "checkpoint_every": 100}}
        self.steps_trained, self.weights_by_epoch = 0, []

    def setup_data(self):
        self.options = {"lr": 0.1, "weight_decay": 0.0}
        self.epochs, self.batches_per_epoch, self.batch_size = 3, 3, 4

    def setup_model(self):
        self.model = Tiny(2)

    def setup_optimizer(self):
        self.optimizer = build_optimizer(self.model, self.options)
        self.scheduler = build_scheduler(self.optimizer, self.options, 9, 3)

    def params(self):
        return {"optimizer": self.options, "epochs": self.epochs}

    def make_batch(self, epoch, b):
        x = torch.randn(self.batch_size, 2, generator=batch_generator(0, epoch, b))
        return {"x": x, "y": x @ torch.tensor([[1.0], [-2.0]])}

    def training_step(self, model, batch):
        self.steps_trained += 1
        loss = ((model.linear(batch["x"]) - batch["y"]) ** 2).mean()
        return loss, {"mse": loss}

    def validate(self, model):
        self.weights_by_epoch.append({k: v.clone() for k, v in model.state_dict().items()})
        epoch = len(self.weights_by_epoch) - 1
        return {"score": SCORES[epoch], "other": -epoch}  # `other` would pick epoch 0

    def identity(self):
        return {"stage": "linear", "options": self.options}

    def result(self, state, speed):
        summary = {"best_epoch": state.best_epoch, "best_score": state.best_metric, "steps": state.step}
        return {**summary, "steps_timed": speed["steps"]}, {"best_score": state.best_metric}


def test_run_stage_trains_a_stage_records_it_keeps_its_best_epoch_and_resumes_it_finished(tmp_path):
    class SeesTheOrder(Callback):
        """A caller's callback (a sweep's Ray report) sees the epoch already in the tracker and its
        weights not yet kept as the best: a trial that Ray ends inside its report leaves the best
        of the epochs before."""

        def __init__(self, tracker):
            self.tracker, self.seen = tracker, []

        def on_validation_end(self, loop, epoch, metrics):
            self.seen.append((epoch, len(self.tracker.validated_epochs()), loop.state.best_epoch))

    out = tmp_path / "run"
    stage, tracker = LinearStage(out), RecordingTracker()
    order = SeesTheOrder(tracker)
    result = run_stage(stage, tracker, progress=False, callbacks=(order,))

    assert result == {"best_epoch": 1, "best_score": 3.0, "steps": 9, "steps_timed": 9}
    assert tracker.params == [stage.params()]
    assert order.seen == [(0, 1, -1), (1, 2, 0), (2, 3, 1)]  # tracker, the caller's, then the best epoch
    assert sum("loss_mse" in m for _, m in tracker.metrics) == 9  # the preset's training.log_every reached the loop
    assert tracker.metrics[-1] == (9, {"best_score": 3.0})  # the stage's final figures, last
    best = saved_weights(out / "best")
    assert all(torch.equal(best[k], v) for k, v in stage.weights_by_epoch[1].items())  # the selected epoch's
    assert not torch.equal(best["linear.weight"], stage.weights_by_epoch[2]["linear.weight"])

    # The same stage again: resumed from its finished checkpoint, in the same tracker run, untrained.
    again, tracker_again = LinearStage(out), RecordingTracker()
    assert run_stage(again, tracker_again, progress=False) == {**result, "steps_timed": 0}
    assert again.steps_trained == 0 and again.weights_by_epoch == []
    assert tracker_again.started == ["run-1"] and tracker_again.metrics == [(9, {"best_score": 3.0})]
    assert all(torch.equal(saved_weights(out / "best")[k], v) for k, v in best.items())


def test_run_stage_with_max_steps_gives_only_the_loop_s_speed(tmp_path):
    stage, tracker = LinearStage(tmp_path / "run"), RecordingTracker()
    speed = run_stage(stage, tracker, progress=False, max_steps=2)
    assert speed.keys() == {"steps", "examples_per_second", "data_wait_share"} and speed["steps"] == 2
    assert stage.steps_trained == 2 and stage.weights_by_epoch == []  # stopped mid-epoch: no validation
    assert not (tmp_path / "run" / "best").exists()
    assert all(step <= 2 for step, _ in tracker.metrics)  # no final figures


class ForgetfulStage(LinearStage):
    def setup_data(self):
        self.options = {"lr": 0.1, "weight_decay": 0.0}
        self.epochs, self.batches_per_epoch = 3, 3  # no batch_size


def test_a_stage_s_set_up_hooks_run_in_order_after_the_seed_and_each_sets_what_it_declares(tmp_path):
    stage = LinearStage(tmp_path / "run")
    stage.setup()
    torch.manual_seed(stage.seed)
    assert torch.equal(stage.model.linear.weight, Tiny(2).linear.weight)  # the model's draws follow the seed
    assert stage.optimizer.param_groups[0]["params"][0] is stage.model.linear.weight
    with pytest.raises(TypeError, match=r"ForgetfulStage.setup_data\(\) did not set batch_size"):
        ForgetfulStage(tmp_path / "forgetful").setup()


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
            # A row that is no candidate reaches the head as zeros (as region_states pads a RefCOCO+ item).
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

    import vlbert.modeling  # noqa: F401  (registers the Auto classes)
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


def test_settings_of_one_seed_mask_the_same_words_and_rois(smoke_validation):
    """Common random numbers: every pre-training setting of a seed masks the same words of a caption
    it shows as it is and the same RoIs (where it masks RoIs), whatever else it draws (c mismatches
    captions first) and however long its batch is padded."""
    from vlbert.modeling.heads import IGNORE_INDEX
    from vlbert.tasks.pretraining import PretrainCollator

    val, processor, _ = smoke_validation
    examples = [val[i] for i in range(min(len(val), 8))]
    batches = {
        name: PretrainCollator(processor, SETTINGS[name], val)(examples, batch_generator(3, 1, 0))
        for name in ("a", "b", "c", "d")
    }
    kept = batches["c"]["relation_labels"].bool()
    assert 0 < int(kept.sum()) < len(examples)  # c mismatched some captions, kept others
    words = {name: batch["mlm_labels"] != IGNORE_INDEX for name, batch in batches.items()}
    length = min(w.shape[1] for w in words.values())
    for name in ("b", "c", "d"):
        rows = kept if name == "c" else torch.ones_like(kept)
        assert torch.equal(words[name][rows, :length], words["a"][rows, :length]), name
    assert words["a"].any()
    rois = {name: batches[name]["roi_labels"].sum(-1) > 0 for name in ("b", "c", "d")}
    assert torch.equal(rois["b"], rois["d"]) and rois["b"].any()
    assert torch.equal(rois["c"][kept], rois["b"][kept])
    # A row's word choices do not depend on its batch's padded length: alone (a shorter batch), the
    # first caption is masked as in the batch.
    alone = PretrainCollator(processor, SETTINGS["a"], val)(examples[:1], batch_generator(3, 1, 0))
    first = alone["mlm_labels"] != IGNORE_INDEX
    assert torch.equal(first[0], words["a"][0, : first.shape[1]])


def test_masking_draws_stop_where_the_words_do():
    """Rows longer than the draws' width (the paper preset's 64 words and 100 regions) mask as
    the first `width` tokens say; a maskable token past them is an error, not a silent shift."""
    from types import SimpleNamespace

    from vlbert.tasks.pretraining import DRAW_WIDTH, mask_tokens

    processor = SimpleNamespace(max_text_length=64, first_word_id=5, tokenizer=range(100), mask_id=3)
    ids = torch.randint(5, 100, (4, DRAW_WIDTH + 40))
    maskable = torch.zeros_like(ids, dtype=torch.bool)
    maskable[:, 1:60] = True
    long_ids, long_labels = mask_tokens(ids, maskable, processor, torch.Generator().manual_seed(0))
    short_ids, short_labels = mask_tokens(
        ids[:, :DRAW_WIDTH], maskable[:, :DRAW_WIDTH], processor, torch.Generator().manual_seed(0)
    )
    assert torch.equal(long_ids[:, :DRAW_WIDTH], short_ids) and torch.equal(long_labels[:, :DRAW_WIDTH], short_labels)
    assert torch.equal(long_ids[:, DRAW_WIDTH:], ids[:, DRAW_WIDTH:]) and (long_labels != -100).any()
    maskable[:, DRAW_WIDTH + 1] = True
    with pytest.raises(ValueError, match="maskable tokens past the first"):
        mask_tokens(ids, maskable, processor, torch.Generator().manual_seed(0))


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
                *finetune_args("no_pretrain", task, lr, "0"),
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
                *finetune_args("full", "refcoco_det", "0.001", "1"),
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


def test_a_fine_tuning_section_s_head_switches_reach_the_task_model_s_config(tmp_path):
    from vlbert.engine.finetune import head_overrides

    switches = {
        "standardise_head_input": True,
        "centre_candidates": True,
        "tags_at_region_scale": True,
        "tag_coattention_mask": True,
    }
    assert head_overrides({**switches, "lr": 1e-3}, tmp_path) == switches
    off = dict.fromkeys(switches, False)
    assert head_overrides({"centre_candidates": False}, tmp_path) == off
    assert head_overrides({}, tmp_path) == off  # a start's own switch is turned off where the preset is silent


def test_a_fraction_s_run_is_validated_as_often_as_the_whole_set_s(smoke_study, smoke_config, tmp_path):
    from vlbert.config import finetune_epochs

    out = tmp_path / "fraction"
    args = ["finetune", "--setting", "no_pretrain", "--task", "vqa", "--lr", "0.001", "--seed", "0"]
    assert main([*args, "--train-fraction", "0.25", "--out", str(out), *study_args(smoke_study)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    whole_set_epochs = finetune_epochs(smoke_config, "vqa")
    assert metrics["epochs"] >= 3 * whole_set_epochs  # more epochs over fewer examples ...
    validated = [epoch for epoch, scores in enumerate(metrics["val_history"], 1) if scores]
    assert len(validated) == whole_set_epochs and validated[-1] == metrics["epochs"]  # ... scored as often
    assert metrics["best_epoch"] in validated


def test_each_seed_fine_tunes_the_pre_training_given_for_it(smoke_study, tmp_path, capsys):
    """pretrain.per_seed's runs: `vlbert pretrain --seed` makes another seed's pre-training (other
    weights), and `vlbert finetune --pretrained` once for each --seed starts each seed's run from its own."""
    from safetensors.torch import load_file

    from vlbert.engine.checkpoint import input_identity

    pretrained = {}
    for seed in (0, 1):
        out = tmp_path / f"pretrain_seed{seed}"
        assert (
            main(["pretrain", "--setting", "a", "--seed", str(seed), "--out", str(out), *study_args(smoke_study)]) == 0
        )
        pretrained[seed] = out / "best"
    weights = [load_file(pretrained[seed] / "model.safetensors") for seed in (0, 1)]
    assert any(not torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    runs = tmp_path / "finetune"
    args = [
        "finetune",
        "--setting",
        "a",
        "--task",
        "refcoco_det",
        "--lr",
        "0.001",
        "--seed",
        "0",
        "1",
        "--out",
        str(runs),
    ]
    assert main([*args, "--pretrained", str(pretrained[0]), str(pretrained[1]), *study_args(smoke_study)]) == 0
    for seed in (0, 1):
        identity = json.loads((runs / "refcoco_det" / f"seed{seed}" / "checkpoint" / "identity.json").read_text())
        assert identity["inputs"]["start"] == input_identity(pretrained[seed])
    assert main([*args, "--pretrained", *(str(pretrained[0]),) * 3, *study_args(smoke_study)]) == 2
    assert "--pretrained: give one for every seed or one for each of the 2 seeds, not 3" in capsys.readouterr().err
