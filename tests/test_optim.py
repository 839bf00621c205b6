"""Optimisers and schedules: warm-up and decay, step decay, no weight decay on biases and norms, the
Fast R-CNN's and the task head's own rates (vlbert/engine/optim.py)."""

import pytest
import torch

from vlbert.engine.optim import build_optimizer, build_scheduler

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


class PretrainedBackbone(torch.nn.Linear):
    """A module that names the option scaling its rate, as the Fast R-CNN and Pixel-BERT's CNN do."""

    lr_factor_option = "frcnn_lr_factor"


def test_a_backbone_that_names_its_rate_factor_takes_its_own_rate_through_the_schedule():
    model = torch.nn.ModuleDict({"fast_rcnn": PretrainedBackbone(2, 2), "head": torch.nn.Linear(2, 2)})
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


def test_the_fused_step_on_the_cpu_is_the_per_parameter_loop_s(monkeypatch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 3))
    start = {k: v.clone() for k, v in model.state_dict().items()}
    inputs, targets = torch.randn(16, 6), torch.randint(0, 3, (16,))
    trained = {}
    for kind, options in (("adamw", {"lr": 1e-2, "weight_decay": 0.1}), ("sgd", {"lr": 0.1, "momentum": 0.9})):
        for fused in (True, False):
            monkeypatch.setattr("vlbert.engine.optim.FUSED", fused)
            model.load_state_dict(start)
            optimizer = build_optimizer(model, {"optimizer": kind, **options})
            assert optimizer.defaults["fused"] is (True if fused else None)
            for _ in range(5):
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(model(inputs), targets).backward()
                optimizer.step()
            trained[kind, fused] = {k: v.clone() for k, v in model.state_dict().items()}
        for name, value in trained[kind, True].items():
            assert not torch.equal(value, start[name])
            torch.testing.assert_close(value, trained[kind, False][name], rtol=1e-5, atol=1e-6)
