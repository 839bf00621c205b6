"""The other systems of the seed papers run through the study's own stages: each family's
settings pre-train with their objectives and fine-tune every task with the Table 4 protocol."""

import json

import pytest
from conftest import study_args

from vlbert.cli import main
from vlbert.registry import FAMILIES, SETTINGS, TASKS, family_class, family_settings, model_class_name

# The losses each system's pre-training logs (the loop's loss_<name> metrics).
EXPECTED_LOSSES = {
    "vilbert": {"mlm", "masked_roi", "relation"},
    "pixelbert": {"mlm", "relation"},
    "pixelbert_no_sampling": {"mlm", "relation"},
}


def test_every_family_names_a_class_for_pre_training_and_every_head():
    for family in FAMILIES.values():
        assert family_class(family, family.config_class).model_type == family.name
        for name in (family.model_class, family.pretraining_class, *family.head_classes.values()):
            assert family_class(family, name).config_class.model_type == family.name
    assert model_class_name("vilbert", "refcoco_det") == "ViLBertForRefCOCO"
    assert model_class_name("full") == "VLBertForPreTraining"
    assert family_settings(["vlbert"]) == ("no_pretrain", "a", "b", "c", "d", "full")
    with pytest.raises(ValueError, match="unknown model families"):
        family_settings(["lxmert"])


def test_every_family_s_systems_rows_are_its_own_settings():
    for family in FAMILIES.values():
        assert family.system_rows and set(family.system_rows) <= set(family_settings([family.name])), family.name
        assert family.finetune_cost > 0 and family.pretrain_cost > 0


def test_only_the_no_pretrain_rows_skip_pre_training():
    assert {name for name, s in SETTINGS.items() if not s.pretrains} == {
        "no_pretrain",
        "vilbert_no_pretrain",
        "pixelbert_no_pretrain",
    }


@pytest.mark.parametrize("name", list(EXPECTED_LOSSES))
def test_a_system_pretrains_with_its_objectives_and_fine_tunes_every_task(
    smoke_study, smoke_config, name, tmp_path, monkeypatch
):
    from vlbert.engine.build import load_processor
    from vlbert.engine.context import RunInputs, TrainingContext
    from vlbert.engine.pretrain import pretrain
    from vlbert.modeling.pretrained import StudyPreTrainedModel
    from vlbert.tracking import NullTracker

    class Recorder(NullTracker):
        seen = set()

        def log_metrics(self, metrics, step=None):
            self.seen |= {k[len("loss_") :] for k in metrics if k.startswith("loss_")}

    tracker = Recorder()
    out = tmp_path / "pretrain"
    inputs = RunInputs(smoke_study["data"], smoke_study["features"], smoke_study["bert"], smoke_study["detector"])
    context = TrainingContext(smoke_config, inputs, load_processor(smoke_study["bert"], 40), tracker, progress=False)
    summary = pretrain(context, SETTINGS[name], out)
    assert tracker.seen == EXPECTED_LOSSES[name]
    assert 0 <= summary["val"]["mlm_accuracy"] <= 100 and "ground_colour_own" in summary["val"]
    family = SETTINGS[name].family
    # Where words and visual elements share one attention (VL-BERT, Pixel-BERT), the probe
    # measures the masked words' share of it on the visual elements; ViLBERT has no such share.
    assert ("attention_img_share" in summary["val"]) == (family != "vilbert")
    if family != "vilbert":
        assert 0 <= summary["val"]["attention_img_share"] <= 1 and 0 < summary["val"]["attention_img_uniform"] < 1
    config = json.loads((out / "best" / "config.json").read_text())
    assert config["model_type"] == family and config["architectures"] == [FAMILIES[family].pretraining_class]
    reinitialised = []
    reinitialise = StudyPreTrainedModel.reinitialise

    def recorded(self, names):
        reinitialised.append(names)
        reinitialise(self, names)

    monkeypatch.setattr(StudyPreTrainedModel, "reinitialise", recorded)
    for task in TASKS:
        lr = "0.02" if task.startswith("vcr") else "0.001"
        run = tmp_path / task
        args = ["finetune", "--setting", name, "--task", task, "--lr", lr, "--seed", "0", "--out", str(run)]
        assert main([*args, "--pretrained", str(out / "best"), *study_args(smoke_study)]) == 0
        metrics = json.loads((run / "metrics.json").read_text())
        assert metrics["setting"] == name and 0 <= metrics["val"]["accuracy"] <= 100
        head = json.loads((run / "best" / "config.json").read_text())["architectures"]
        assert head == [model_class_name(name, task)]
    # The modules each task's section draws new for this family, before its first step.
    sections = [smoke_config["finetune"][TASKS[task].options_key] for task in TASKS]
    assert reinitialised == [section.get("reinitialise", {}).get(family, []) for section in sections]
    if family == "pixelbert":  # pixel sampling: the preset's count, or every pixel token kept
        expected = smoke_config["model"]["pixelbert"]["pixel_samples"] if SETTINGS[name].pixel_sampling else 0
        assert config["pixel_samples"] == expected
    no_pretrain = f"{family}_no_pretrain"
    run = tmp_path / "no_pretrain"
    args = ["finetune", "--setting", no_pretrain, "--task", "refcoco_det", "--lr", "0.001", "--seed", "0"]
    assert main([*args, "--out", str(run), *study_args(smoke_study)]) == 0
    head = json.loads((run / "best" / "config.json").read_text())
    assert head["architectures"] == [model_class_name(no_pretrain, "refcoco_det")]
    if family == "pixelbert":  # the fine-tuning section's trainable CNN stages reach the model
        assert head["cnn_trainable_layers"] == smoke_config["finetune"]["refcoco"]["cnn_trainable_layers"]
    else:
        assert "cnn_trainable_layers" not in head


def test_the_builder_gives_pixel_statistics_to_a_family_that_takes_them(smoke_study, smoke_config):
    """`build_model`'s training images are read only by a family that standardises its pixels."""
    import copy
    from pathlib import Path

    from vlbert.detection.sources import image_items
    from vlbert.engine.build import build_model
    from vlbert.modeling import PixelBertForVQA, VLBertForVQA

    paths = [item.path for item in image_items(smoke_study["data"] / "vqa", "vqa", "train2014")]
    missing = (Path("/nonexistent") / f"{k}.png" for k in range(3))
    bert, detector = smoke_study["bert"], smoke_study["detector"]
    build_model(VLBertForVQA, smoke_config, bert, detector, image_paths=missing, num_answers=5)
    build_model(PixelBertForVQA, smoke_config, bert, detector, image_paths=missing, num_answers=5)
    preset = copy.deepcopy(smoke_config)
    preset.setdefault("model", {}).setdefault("pixelbert", {})["pixel_standardise"] = True
    model, _ = build_model(PixelBertForVQA, preset, bert, detector, image_paths=iter(paths), num_answers=5)
    embeddings = model.pixelbert.pixel_embeddings
    assert model.config.pixel_standardise and embeddings.feature_mean.abs().sum() > 0
    assert (embeddings.feature_std > 0).all()


def test_pixel_bert_s_cnn_can_be_frozen_for_pre_training_with_its_cells_whitened(smoke_study, smoke_config):
    import copy

    import torch

    from vlbert.config import validate
    from vlbert.detection.sources import image_items
    from vlbert.engine.build import build_model
    from vlbert.modeling import PixelBertForPreTraining

    paths = [item.path for item in image_items(smoke_study["data"] / "vqa", "vqa", "train2014")]
    preset = copy.deepcopy(smoke_config)
    preset["model"]["pixelbert"] |= {"cnn_trainable_layers": 0, "pixel_whiten": True}
    validate(preset)
    bert, detector = smoke_study["bert"], smoke_study["detector"]
    model, _ = build_model(PixelBertForPreTraining, preset, bert, detector, image_paths=iter(paths))
    cnn = model.pixelbert.cnn
    assert model.config.cnn_trainable_layers == 0 and cnn.frozen_stage() == "c5"
    assert not any(p.requires_grad for p in cnn.parameters())
    assert not torch.equal(model.pixelbert.pixel_embeddings.whitening, torch.eye(cnn.out_channels))


def test_detected_objects_counts_each_confident_object_once():
    import numpy as np

    from vlbert.tasks.pretraining import detected_objects
    from vlbert.tasks.regions import Regions

    # Row 0 the whole image; a circle found twice (red 0.6, orange 0.3 of the same box), a square, a faint box.
    boxes = np.array([[0, 0, 96, 96], [10, 10, 40, 40], [11, 10, 40, 41], [60, 60, 90, 90], [50, 5, 70, 25]], float)
    probs = np.zeros((5, 4))
    probs[:, 0] = 0.1
    probs[1, 1], probs[2, 2], probs[3, 3], probs[4, 1] = 0.6, 0.55, 0.9, 0.3
    regions = Regions(boxes, np.zeros(5), np.zeros((5, 8)), np.arange(5), 96, 96, probs=probs)
    assert detected_objects(regions, 0.5) == 2
    assert detected_objects(regions, 0.2) == 3
    assert detected_objects(regions, 0.95) == 0
    with pytest.raises(ValueError, match="no class probabilities"):
        detected_objects(Regions(boxes, np.zeros(5), np.zeros((5, 8)), np.arange(5), 96, 96), 0.5)


def test_a_curriculum_epoch_passes_over_the_few_object_captions_in_a_fresh_order_each_round():
    from types import SimpleNamespace

    from vlbert.engine.pretrain import PretrainStage

    stage = SimpleNamespace(batch_size=4, few_object=[3, 5, 7, 11, 13], seed=0)
    picks = [PretrainStage._few_object_picks(stage, 0, b) for b in range(5)]  # 20 picks: 4 rounds of 5
    flat = [i for batch in picks for i in batch]
    rounds = [flat[k : k + 5] for k in range(0, 20, 5)]
    assert all(sorted(r) == stage.few_object for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1  # not one order repeated
    assert picks == [PretrainStage._few_object_picks(stage, 0, b) for b in range(5)]  # a resumed run's picks
    assert picks != [PretrainStage._few_object_picks(stage, 1, b) for b in range(5)]


def test_a_curriculum_names_known_settings(smoke_config):
    import copy

    from vlbert.config import pretrain_curriculum

    preset = copy.deepcopy(smoke_config)
    assert pretrain_curriculum(preset, "pixelbert") is None
    preset["pretrain"]["epochs"] = 3
    preset["pretrain"]["curriculum"] = {"settings": ["pixelbert"], "epochs": 1, "max_objects": 1}
    assert pretrain_curriculum(preset, "pixelbert")["max_objects"] == 1
    assert pretrain_curriculum(preset, "a") is None
    preset["pretrain"]["curriculum"]["epochs"] = preset["pretrain"]["epochs"]
    with pytest.raises(ValueError, match=r"curriculum\.epochs"):
        pretrain_curriculum(preset, "pixelbert")
    preset["pretrain"]["curriculum"] |= {"epochs": 1, "settings": ["pixelbrt"]}
    with pytest.raises(Exception, match="pixelbrt"):
        pretrain_curriculum(preset, "a")


def test_pixel_bert_pre_trains_with_standardised_pixels_and_a_curriculum(
    smoke_study, smoke_config, tmp_path, monkeypatch
):
    import copy

    from vlbert.engine.build import load_processor
    from vlbert.engine.context import RunInputs, TrainingContext
    from vlbert.engine.pretrain import PretrainStage, pretrain
    from vlbert.tracking import NullTracker

    preset = copy.deepcopy(smoke_config)
    preset["model"]["pixelbert"]["pixel_standardise"] = True
    preset["pretrain"] = {**preset["pretrain"], "epochs": 2}
    preset["pretrain"]["curriculum"] = {"settings": ["pixelbert_no_sampling"], "epochs": 1, "max_objects": 1}
    picked = []
    original = PretrainStage._few_object_picks

    def record(self, epoch, b):
        picked.append(epoch)
        return original(self, epoch, b)

    inputs = RunInputs(smoke_study["data"], smoke_study["features"], smoke_study["bert"], smoke_study["detector"])
    context = TrainingContext(preset, inputs, load_processor(smoke_study["bert"], 40), NullTracker(), progress=False)
    monkeypatch.setattr(PretrainStage, "_few_object_picks", record)
    summary = pretrain(context, SETTINGS["pixelbert_no_sampling"], tmp_path / "pretrain")
    assert picked and set(picked) == {0}  # the first epoch only
    assert "ground_colour_own" in summary["val"]
    config = json.loads((tmp_path / "pretrain" / "best" / "config.json").read_text())
    assert config["pixel_standardise"] is True


def test_pixel_sampling_starts_after_its_warmup_epochs(smoke_study, smoke_config, tmp_path):
    """model.pixelbert.pixel_sampling_warmup_epochs: pre-training's first epochs keep every pixel
    token, the later ones sample the preset's count; a warm-up as long as pre-training is refused."""
    import copy

    import torch

    from vlbert.engine.build import load_processor
    from vlbert.engine.context import RunInputs, TrainingContext
    from vlbert.engine.pretrain import PretrainStage
    from vlbert.tracking import NullTracker

    preset = copy.deepcopy(smoke_config)
    preset["pretrain"]["epochs"] = 2
    preset["model"]["pixelbert"]["pixel_sampling_warmup_epochs"] = 1
    samples = preset["model"]["pixelbert"]["pixel_samples"]
    inputs = RunInputs(smoke_study["data"], smoke_study["features"], smoke_study["bert"], smoke_study["detector"])
    processor = load_processor(smoke_study["bert"], 40)
    context = TrainingContext(preset, inputs, processor, NullTracker(), progress=False)
    stage = PretrainStage(context, SETTINGS["pixelbert"], tmp_path / "pretrain")
    stage.setup()
    kept = []
    stage.model.pixelbert.register_forward_hook(lambda module, args, out: kept.append(out.pixels.mask.shape[1]))
    stage.model.train()
    with torch.no_grad():
        for epoch in (0, 1):
            stage.model(**stage.make_batch(epoch, 0)["caption"])
    assert kept[1] == samples < kept[0]  # the warm-up epoch kept every pixel token
    preset["model"]["pixelbert"]["pixel_sampling_warmup_epochs"] = 2
    with pytest.raises(ValueError, match="would never sample its pixels"):
        PretrainStage(context, SETTINGS["pixelbert"], tmp_path / "again").setup()
