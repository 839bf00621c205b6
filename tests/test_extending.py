"""A model family defined here, as tests/test_tasks.py defines a task: its classes in this module
(ModelFamily.module), one registry entry and its settings, then pre-training and a task.

Toy-BERT is VL-BERT under names of its own: its config has its own model_type, its encoder and its
readouts are VL-BERT's, and its pre-training and task models are the shared heads (heads.py's
mixins) on it: no head is written here. A real family writes its encoder and its readouts."""

import json

import pytest
from conftest import study_args

from vlbert import registry
from vlbert.cli import main
from vlbert.modeling import VLBertConfig, VLBertForVQA, VLBertModel, register_family
from vlbert.modeling.heads import PreTrainingHeadMixin, RefCOCOHeadMixin, VCRHeadMixin, VQAHeadMixin, masked_roi_loss
from vlbert.modeling.modeling_vlbert import VLBertPreTrainedModel


class ToyBertConfig(VLBertConfig):
    model_type = "toybert"

    def __init__(self, **kwargs):  # its own, as transformers wants of a config subclass
        super().__init__(**kwargs)


class ToyBertPreTrainedModel(VLBertPreTrainedModel):
    config_class = ToyBertConfig

    def build_encoder(self, config):
        return ToyBertModel(config, initialise=False)


class ToyBertModel(VLBertModel):
    config_class = ToyBertConfig


class ToyBertForPreTraining(PreTrainingHeadMixin, ToyBertPreTrainedModel):
    masked_region_loss = staticmethod(masked_roi_loss)  # its masked region objective: VL-BERT's


class ToyBertForVQA(VQAHeadMixin, ToyBertPreTrainedModel):
    pass


class ToyBertForVCR(VCRHeadMixin, ToyBertPreTrainedModel):
    pass


class ToyBertForRefCOCO(RefCOCOHeadMixin, ToyBertPreTrainedModel):
    pass


TOYBERT = registry.ModelFamily(
    "toybert",
    "Toy-BERT",
    pretraining_class="ToyBertForPreTraining",
    head_classes={"vqa": "ToyBertForVQA", "vcr": "ToyBertForVCR", "refcoco": "ToyBertForRefCOCO"},
    config_class="ToyBertConfig",
    model_class="ToyBertModel",
    finetune_cost=1.0,
    pretrain_cost=0.5,
    system_rows=("toybert_no_pretrain", "toybert"),
    module=__name__,  # its classes are this module's
)
# VL-BERT's `b`: masked words and masked regions; and the row without pre-training.
SETTINGS = (
    registry.Setting("toybert_no_pretrain", False, False, False, False, False, family="toybert"),
    registry.Setting("toybert", True, True, False, False, False, family="toybert"),
)


@pytest.fixture
def toybert(monkeypatch):
    monkeypatch.setitem(registry.FAMILIES, TOYBERT.name, TOYBERT)
    for setting in SETTINGS:
        monkeypatch.setitem(registry.SETTINGS, setting.name, setting)
    register_family(TOYBERT)  # what a family's own module does: on transformers' Auto classes
    return TOYBERT


def test_a_family_defined_here_names_its_classes_in_its_own_module(toybert):
    assert registry.family_class("toybert", "ToyBertForVQA") is ToyBertForVQA
    assert registry.model_class_name("toybert", "refcoco_det") == "ToyBertForRefCOCO"
    assert registry.family_settings(["toybert"]) == ("toybert_no_pretrain", "toybert")
    assert registry.family_class("vlbert", "VLBertForVQA") is VLBertForVQA  # the built-in ones as before
    with pytest.raises(ValueError, match="not a class of model family"):
        registry.family_class("toybert", "VLBertForVQA")


def test_a_family_defined_here_pretrains_and_fine_tunes_every_task(toybert, smoke_study, smoke_config, tmp_path):
    from transformers import AutoConfig, AutoModelForPreTraining

    from vlbert.engine.build import load_processor
    from vlbert.engine.context import RunInputs, TrainingContext
    from vlbert.engine.pretrain import pretrain
    from vlbert.tracking import NullTracker

    out = tmp_path / "pretrain"
    inputs = RunInputs(smoke_study["data"], smoke_study["features"], smoke_study["bert"], smoke_study["detector"])
    context = TrainingContext(
        smoke_config, inputs, load_processor(smoke_study["bert"], 40), NullTracker(), progress=False
    )
    summary = pretrain(context, registry.SETTINGS["toybert"], out)
    assert 0 <= summary["val"]["mlm_accuracy"] <= 100
    config = json.loads((out / "best" / "config.json").read_text())
    assert config["model_type"] == "toybert" and config["architectures"] == ["ToyBertForPreTraining"]
    # On transformers' Auto classes by its model_type, as the built-in families are.
    assert type(AutoConfig.from_pretrained(out / "best")) is ToyBertConfig
    assert type(AutoModelForPreTraining.from_pretrained(out / "best")) is ToyBertForPreTraining

    runs, tasks = tmp_path / "finetune", registry.finetune_tasks("toybert")
    args = ["finetune", "--setting", "toybert", "--task", *tasks, "--lr", "0.001", "--seed", "0"]
    assert main([*args, "--out", str(runs), "--pretrained", str(out / "best"), *study_args(smoke_study)]) == 0
    for task in tasks:
        run = runs / task / "seed0"
        metrics = json.loads((run / "metrics.json").read_text())
        assert metrics["setting"] == "toybert" and 0 <= metrics["val"]["accuracy"] <= 100, task
        head = json.loads((run / "best" / "config.json").read_text())
        class_name = registry.model_class_name("toybert", task)
        assert head["model_type"] == "toybert" and head["architectures"] == [class_name], task
        assert (
            type(registry.family_class("toybert", class_name).from_pretrained(run / "best").base_model) is ToyBertModel
        )
