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
def test_a_system_pretrains_with_its_objectives_and_fine_tunes_every_task(smoke_study, smoke_config, name, tmp_path):
    from vlbert.engine.build import load_processor
    from vlbert.engine.context import RunInputs, TrainingContext
    from vlbert.engine.pretrain import pretrain
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
    for task in TASKS:
        lr = "0.02" if task.startswith("vcr") else "0.001"
        run = tmp_path / task
        args = ["finetune", "--setting", name, "--task", task, "--lr", lr, "--seed", "0", "--out", str(run)]
        assert main([*args, "--pretrained", str(out / "best"), *study_args(smoke_study)]) == 0
        metrics = json.loads((run / "metrics.json").read_text())
        assert metrics["setting"] == name and 0 <= metrics["val"]["accuracy"] <= 100
        head = json.loads((run / "best" / "config.json").read_text())["architectures"]
        assert head == [model_class_name(name, task)]
    if family == "pixelbert":  # pixel sampling: the preset's count, or every pixel token kept
        expected = smoke_config["model"]["pixelbert"]["pixel_samples"] if SETTINGS[name].pixel_sampling else 0
        assert config["pixel_samples"] == expected
    no_pretrain = f"{family}_no_pretrain"
    run = tmp_path / "no_pretrain"
    args = ["finetune", "--setting", no_pretrain, "--task", "refcoco_det", "--lr", "0.001", "--seed", "0"]
    assert main([*args, "--out", str(run), *study_args(smoke_study)]) == 0
    head = json.loads((run / "best" / "config.json").read_text())
    assert head["architectures"] == [model_class_name(no_pretrain, "refcoco_det")]
