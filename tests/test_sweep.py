"""Ray Tune sweeps through the CLI: a crashed trial retried, rates taken from a sweep folder, the
preset's rates when none is given."""

import json
from pathlib import Path

import pytest
import yaml
from conftest import finetune_args, study_args
from training_helpers import run_metrics

from vlbert.cli import main

# ---- Ray Tune sweeps -------------------------------------------------------------------------


@pytest.mark.slow
def test_sweep_retries_a_crashed_trial_and_the_seeds_rerun_its_choice(
    smoke_study, smoke_config, tmp_path, monkeypatch, capsys
):
    from vlbert.config import finetune_epochs
    from vlbert.engine.context import RunInputs
    from vlbert.study.sweep import asha_rungs, choose_rate, run_sweeps

    monkeypatch.setenv("VLBERT_FAULT_ONCE", str(tmp_path / "crashed"))  # the first trial to start crashes once
    # One Tuner for both tasks, each with its own rates (VCR's SGD needs other rates than AdamW).
    lrs = {"vcr": [2e-2], "vqa": [1e-3], "refcoco": [1e-3, 3e-3]}
    preset = {**smoke_config, "sweep": {**smoke_config["sweep"], "lrs": lrs, "max_failures": 1}}
    inputs = RunInputs(smoke_study["data"], smoke_study["features"], smoke_study["bert"], smoke_study["detector"])
    sweep = lambda: run_sweeps(preset, "no_pretrain", ["refcoco_gt", "vqa"], tmp_path / "sweep", inputs, cores=2)
    summaries = sweep()
    assert (tmp_path / "crashed").exists()  # a trial did crash
    best = {task: json.loads((tmp_path / "sweep" / task / "best.json").read_text()) for task in ("refcoco_gt", "vqa")}
    assert best == summaries and best["vqa"]["lr"] == 1e-3
    assert [t["lr"] for t in best["refcoco_gt"]["trials"]] == [1e-3, 3e-3]
    assert [t["lr"] for t in best["vqa"]["trials"]] == [1e-3]
    assert all(t["best_val_accuracy"] is not None for b in best.values() for t in b["trials"])  # the crash was retried
    # Each trial keeps the val items its scores rest on, and the choice its rule's trace.
    assert all(t["val_items"] > 0 for b in best.values() for t in b["trials"])
    refcoco = best["refcoco_gt"]
    rungs = asha_rungs(finetune_epochs(preset, "refcoco_gt"))
    assert refcoco["tie_ses"] == 2.0 and refcoco["lr"] == choose_rate(refcoco["trials"], 2.0, None, rungs)["lr"]
    scores = {t["lr"]: t["best_val_accuracy"] for t in refcoco["trials"]}
    assert refcoco["tied"] == (scores[refcoco["lr"]] < scores[refcoco["best_scoring_lr"]])
    assert all(t["val_epochs"] == list(range(1, len(t["val_epochs"]) + 1)) for t in refcoco["trials"])
    # Trials never look at test.
    assert not list((tmp_path / "sweep").rglob("predictions_test.json"))
    # Run again (as after a kill between the trials' last checkpoints and best.json): the resumed
    # trials run no epoch, and their curves come back from their checkpoints. Seen: best.json
    # chose from the epochs a resumed trial ran again (val_epochs [[4]] against [[1, 2, 3, 4]]).
    for task in ("refcoco_gt", "vqa"):
        (tmp_path / "sweep" / task / "best.json").unlink()
    assert sweep() == best
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
                    *finetune_args("no_pretrain", task, str(best[task]["lr"]), "0"),
                    "--out",
                    str(tmp_path / "scratch" / task),
                    *study_args(smoke_study),
                ]
            )
            == 0
        )
        assert run_metrics(tmp_path / "seeds" / task / "seed0") == run_metrics(tmp_path / "scratch" / task)


def test_the_preset_s_rate_or_the_lowest_is_chosen_unless_another_leads_it_beyond_the_noise():
    from vlbert.study.sweep import choose_rate, preset_lr

    def trial(lr, accuracy, items=250):
        return {"lr": lr, "best_val_accuracy": accuracy, "val_items": items}

    # 4 points on 250 items is within two SEs of the difference (about 8.7): the lower rate.
    assert choose_rate([trial(3e-4, 60.5), trial(1e-4, 56.5)], 2.0)["lr"] == 1e-4
    assert choose_rate([trial(3e-4, 60.5), trial(1e-4, 56.5)], 0.0)["lr"] == 3e-4
    # 20 points is not: the better rate, and so on 2,500 items for 4.
    assert choose_rate([trial(3e-4, 60.5), trial(1e-4, 40.5)], 2.0)["lr"] == 3e-4
    assert choose_rate([trial(3e-4, 60.5, 2500), trial(1e-4, 56.5, 2500)], 2.0)["lr"] == 3e-4
    # A rate that failed does not take part; items unknown (an older sweep): the best score.
    assert choose_rate([trial(1e-4, None), trial(3e-4, 50.0)], 2.0)["lr"] == 3e-4
    assert choose_rate([trial(3e-4, 60.5, None), trial(1e-4, 60.4, None)], 2.0)["lr"] == 3e-4
    # Three rates: the lowest of those within the noise of the best, not merely the best's neighbour.
    assert choose_rate([trial(1e-4, 30.0), trial(3e-4, 58.0), trial(1e-3, 60.0)], 2.0)["lr"] == 3e-4
    # The preset's own rate is kept within the noise, and left only on evidence.
    assert choose_rate([trial(3e-4, 60.5), trial(1e-4, 56.5)], 2.0, preferred=3e-4)["lr"] == 3e-4
    assert choose_rate([trial(3e-4, 56.5), trial(1e-4, 60.5)], 2.0, preferred=3e-4)["lr"] == 3e-4
    assert choose_rate([trial(3e-4, 40.5), trial(1e-4, 60.5)], 2.0, preferred=3e-4)["lr"] == 1e-4
    assert choose_rate([trial(3e-4, 60.5), trial(1e-4, 56.5)], 2.0, preferred=1e-3)["lr"] == 1e-4
    # A trial that failed for good does not take part, whatever its partial curve scored.
    assert choose_rate([trial(3e-4, 50.0), {**trial(1e-4, 70.0), "error": "RayTaskError"}], 2.0)["lr"] == 3e-4
    # The preferred rate is the task's fine-tuning section's; a task's sweep reads its own section.
    preset = {"finetune": {"vqa": {"lr": 3e-4}, "vcr": {"lr": 1e-3}, "refcoco": {}}}
    assert (preset_lr(preset, "vqa"), preset_lr(preset, "vcr_qa2r"), preset_lr(preset, "refcoco_det")) == (
        3e-4,
        1e-3,
        None,
    )


def test_a_family_tries_its_own_rates_around_its_own_rate_and_the_others_the_section_s():
    """sweep.family_lrs and finetune.<section>.families: ViLBERT's settings sweep their own VCR
    rates and keep their own rate in a tie; its other sections and every other family read the
    section's."""
    from vlbert.config import finetune_options
    from vlbert.study.sweep import preset_lr, sweep_lrs

    preset = {
        "finetune": {
            "vcr": {"lr": 1e-3, "epochs": 30, "families": {"vilbert": {"lr": 3e-4}}},
            "vqa": {"lr": 3e-4, "epochs": 20},
        },
        "sweep": {"lrs": {"vcr": [5e-4, 1e-3], "vqa": [1e-4, 3e-4]}, "family_lrs": {"vilbert": {"vcr": [1e-4, 3e-4]}}},
    }
    assert sweep_lrs(preset, "vcr_qa2r", "vilbert") == [1e-4, 3e-4]
    assert sweep_lrs(preset, "vcr_qa2r", "vlbert") == sweep_lrs(preset, "vcr_q2a") == [5e-4, 1e-3]
    assert sweep_lrs(preset, "vqa", "vilbert") == [1e-4, 3e-4]
    assert (preset_lr(preset, "vcr_q2a", "vilbert"), preset_lr(preset, "vcr_q2a", "pixelbert")) == (3e-4, 1e-3)
    # A run's options (what it logs and what its identity holds) carry the rate it trains at, and no
    # `families` entry: a VL-BERT run's options are the section's as they were before the entry.
    assert finetune_options(preset, "vcr_q2a", "vilbert") == {"lr": 3e-4, "epochs": 30}
    section = {"lr": 1e-3, "epochs": 30}
    assert finetune_options(preset, "vcr_q2a", "vlbert") == finetune_options(preset, "vcr_q2a") == section


def test_a_trial_stops_at_a_rung_only_where_another_of_its_task_beats_it_beyond_the_noise():
    from ray.tune.schedulers import TrialScheduler

    from vlbert.study.sweep import EPOCH_METRIC, ITEMS, METRIC, asha_rungs, significant_halving

    assert asha_rungs(15) == [3, 6, 12] and asha_rungs(10) == [2, 4, 8] and asha_rungs(8) == [2, 4]
    assert asha_rungs(1) == []
    scheduler = significant_halving({"vqa": 10, "vcr_q2a": 10}, 2.0)

    class Trial:
        def __init__(self, trial_id, task):
            self.trial_id, self.config = trial_id, {"trial": {"task": task, "lr": 1e-4}}

    def report(trial, epoch, accuracy):
        return scheduler.on_trial_result(None, trial, {METRIC: accuracy, ITEMS: 250, EPOCH_METRIC: epoch})

    go, stop = TrialScheduler.CONTINUE, TrialScheduler.STOP
    low, high = Trial("low", "vqa"), Trial("high", "vqa")
    # A tenth of a point at the first rung: both go on (ASHA stopped one of them).
    assert report(low, 1, 30.0) == go and report(high, 1, 31.0) == go
    assert report(high, 2, 38.2) == go and report(low, 2, 38.1) == go
    # 15 points at the second rung is beyond two SEs of the difference (about 8.6).
    assert report(high, 4, 45.0) == go and report(low, 4, 30.0) == stop
    # Whichever reaches the rung first: the trailing one stops at its next result.
    early, late = Trial("early", "vcr_q2a"), Trial("late", "vcr_q2a")
    assert report(early, 2, 20.0) == go and report(late, 2, 50.0) == go
    assert report(early, 3, 21.0) == stop and report(late, 3, 51.0) == go
    # A trial's last epoch does not stop it: it returns by itself, its last checkpoint saved.
    assert report(high, 10, 60.0) == go
    # Tasks are never compared with each other.
    other = Trial("other", "vcr_q2a")
    assert report(Trial("vqa_leader", "vqa"), 2, 90.0) == go and report(other, 2, 49.0) == go


def test_a_trial_refuses_to_run_other_code_than_its_sweep_s(tmp_path, monkeypatch):
    """A Ray worker imports `vlbert` from the job's working directory first: a trial whose package
    differs from its sweep's stops, naming where it imported it from, before it trains."""
    from vlbert.study import sweep

    sweep.check_trial_code({"code": sweep.code_digest()})  # the sweep's own package: runs
    with pytest.raises(RuntimeError, match=r"this trial imported vlbert from .*differ from the package its sweep"):
        sweep._trial({"code": "0" * 64})
    # The digest follows the package's sources, not only its file names.
    package = tmp_path / "vlbert"
    (package / "study").mkdir(parents=True)
    (package / "config.py").write_text("A = 1\n")
    monkeypatch.setattr(sweep, "__file__", str(package / "study" / "sweep.py"))
    before = sweep.code_digest()
    (package / "config.py").write_text("A = 2\n")
    assert sweep.code_digest() != before


def test_a_trial_runs_with_the_inputs_its_sweep_s_command_resolved(tmp_path, monkeypatch):
    # `vlbert sweep` resolves the inputs (run_inputs: arguments, else preset, else layout); a trial
    # runs in Ray's folder for it and rebuilds them with run_inputs from the absolute paths shipped.
    from vlbert.engine.context import RunInputs, run_inputs
    from vlbert.layout import Layout
    from vlbert.registry import setting
    from vlbert.study.sweep import _absolute_inputs

    study, trial_folder = (tmp_path / "study").resolve(), (tmp_path / "trial").resolve()
    layout, preset = Layout("p"), {"name": "p", "data": {"root": "data"}, "model": {"bert": None}}
    trial_folder.mkdir()
    for folder in ("data", "features", layout.bert, layout.detector, layout.pretrained("full")):
        (study / folder).mkdir(parents=True)
    monkeypatch.chdir(study)
    resolved = run_inputs(preset, setting("full"), features_dir="features")
    assert resolved == RunInputs(
        Path("data"), Path("features"), layout.bert, layout.detector, layout.pretrained("full")
    )
    assert run_inputs(preset, setting("no_pretrain")).pretrained is None
    assert run_inputs(preset, bert=str(layout.bert)).bert == layout.bert  # a folder of that name: a path
    hub = run_inputs(preset, bert="bert-base-uncased")
    assert hub.bert == "bert-base-uncased"  # no folder of that name: a hub id

    shipped, shipped_hub = _absolute_inputs(resolved), _absolute_inputs(hub)
    monkeypatch.chdir(trial_folder)
    trial = run_inputs(preset, **shipped)
    assert (trial.data_root, trial.features_dir) == (study / "data", study / "features")
    assert (trial.bert, trial.detector_dir) == (study / layout.bert, study / layout.detector)  # paths, as the CLI's
    assert trial.pretrained == str(study / layout.pretrained("full"))
    assert run_inputs(preset, **shipped_hub).bert == "bert-base-uncased"
    # The layout's BERT stays a path where there is none, so that loading it says it is missing.
    assert run_inputs(preset).bert == layout.bert


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
        assert run_metrics(tmp_path / "out" / task / "seed0")["lr"] == preset[section]["lr"]
    both = ["--lr", "0.001", "--lr-from", str(tmp_path / "best.json")]
    assert main([*args, *both, "--out", str(tmp_path / "both"), *study_args(smoke_study)]) == 2
    assert "give at most one of --lr and --lr-from" in capsys.readouterr().err


def test_without_a_rate_a_family_takes_its_own_where_the_section_gives_one(smoke_study, tmp_path):
    preset = yaml.safe_load(smoke_study["preset"].read_text())
    preset["finetune"]["vcr"]["families"] = {"vilbert": {"lr": 0.0123}}
    (tmp_path / "preset.yaml").write_text(yaml.safe_dump(preset))
    for setting, lr in (("vilbert_no_pretrain", 0.0123), ("no_pretrain", preset["finetune"]["vcr"]["lr"])):
        out = tmp_path / setting
        args = ["finetune", "--setting", setting, "--task", "vcr_q2a", "--seed", "0", "--out", str(out)]
        assert main([*args, *study_args(smoke_study), "--config", str(tmp_path / "preset.yaml")]) == 0
        assert run_metrics(out)["lr"] == lr


def test_a_task_without_a_rate_anywhere_is_refused_naming_the_key(smoke_study, tmp_path, capsys):
    preset = yaml.safe_load(smoke_study["preset"].read_text())
    del preset["finetune"]["vqa"]["lr"]
    (tmp_path / "preset.yaml").write_text(yaml.safe_dump(preset))
    args = ["finetune", "--setting", "no_pretrain", "--task", "vqa", "--seed", "0", "--out", str(tmp_path / "out")]
    assert main([*args, *study_args(smoke_study), "--config", str(tmp_path / "preset.yaml")]) == 2
    assert "finetune.vqa.lr is not set; give --lr or --lr-from for vqa" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_rate_stopped_at_a_rung_is_not_chosen_whether_it_ran_first_or_beside_the_other():
    """One trial at a time (the default profile's sweep job), the first rate reaches its last epoch
    before the second reaches a rung, and cannot be stopped; side by side, it stops there. The
    scheduler and the choice read the same rule, so both orders choose alike."""
    from ray.tune.schedulers import TrialScheduler

    from vlbert.study.sweep import EPOCH_METRIC, ITEMS, METRIC, asha_rungs, choose_rate, significant_halving

    rungs = asha_rungs(10)  # [2, 4, 8]
    # The preset's rate leads at the second epoch by 15 points on 250 items (two SEs: about 8.6),
    # then trails by 20 at the fourth, where it would be stopped if the other were still running.
    first = [20.0, 30.0, 40.0, 60.0, 61.0, 61.0, 62.0, 62.0, 62.0, 62.0]  # 1e-4, swept first
    second = [25.0, 45.0, 42.0, 40.0, 50.0, 55.0, 56.0, 57.0, 58.0, 58.0]  # 3e-4, the preset's
    go, stop = TrialScheduler.CONTINUE, TrialScheduler.STOP

    class Trial:
        def __init__(self, trial_id):
            self.trial_id, self.config = trial_id, {"trial": {"task": "vqa", "lr": 1e-4}}

    def run(order):
        scheduler, trials = significant_halving({"vqa": 10}, 2.0), {"first": Trial("first"), "second": Trial("second")}
        curves, decisions = {"first": first, "second": second}, {"first": [], "second": []}
        for name, epoch in order:
            if decisions[name] and decisions[name][-1] == stop:
                continue
            result = {METRIC: curves[name][epoch - 1], ITEMS: 250, EPOCH_METRIC: epoch}
            decisions[name].append(scheduler.on_trial_result(None, trials[name], result))
        return {name: curves[name][: len(d)] for name, d in decisions.items()}, decisions

    one_at_a_time = [("first", e) for e in range(1, 11)] + [("second", e) for e in range(1, 11)]
    side_by_side = [(name, e) for e in range(1, 11) for name in ("first", "second")]
    ran_first, decided_first = run(one_at_a_time)
    ran_beside, decided_beside = run(side_by_side)
    # Side by side the first rate stops at its result after the other reached rung 2; alone, never.
    assert len(ran_first["first"]) == 10 and len(ran_beside["first"]) == 3
    assert decided_first["second"][:-1] == [go] * 9 and decided_beside["second"][:-1] == [go] * 9  # both: to its end
    without_rungs = []
    for ran in (ran_first, ran_beside):
        trials = [
            {"lr": lr, "best_val_accuracy": max(curve), "val_items": 250, "val_accuracy_by_epoch": curve}
            for lr, curve in ((1e-4, ran["first"]), (3e-4, ran["second"]))
        ]
        # The first rate, stopped at a rung, is out of the choice even where its run went on to
        # score 62 against 58: neither the lowest rate nor a preferred one brings it back.
        assert choose_rate(trials, 2.0, preferred=1e-4, rungs=rungs)["lr"] == 3e-4
        assert choose_rate(trials, 2.0, rungs=rungs)["lr"] == 3e-4
        without_rungs.append(choose_rate(trials, 2.0)["lr"])
    # Read from the best scores alone, the two orders choose apart: 62 and 58 tie, 40 and 58 do not.
    assert without_rungs == [1e-4, 3e-4]


def test_without_rung_stops_every_rate_runs_to_its_end_and_the_best_scores_choose():
    from ray.tune.schedulers import TrialScheduler

    from vlbert.study.sweep import EPOCH_METRIC, ITEMS, METRIC, significant_halving, sweep_rungs

    preset = {"finetune": {"epoch_factor": 0.5, "vqa": {"epochs": 20}}, "sweep": {"stop_at_rungs": False}}
    assert sweep_rungs(preset, "vqa") == [] and sweep_rungs({"finetune": preset["finetune"]}, "vqa") == [2, 4, 8]
    scheduler = significant_halving({"vqa": 10}, 2.0, {"vqa": sweep_rungs(preset, "vqa")})

    class Trial:
        def __init__(self, trial_id):
            self.trial_id, self.config = trial_id, {"trial": {"task": "vqa", "lr": 1e-4}}

    leader, trailer = Trial("leader"), Trial("trailer")
    for epoch in range(1, 10):  # 60 points behind at every epoch, and not stopped
        assert scheduler.on_trial_result(None, leader, {METRIC: 90.0, ITEMS: 250, EPOCH_METRIC: epoch}) == (
            TrialScheduler.CONTINUE
        )
        assert scheduler.on_trial_result(None, trailer, {METRIC: 30.0, ITEMS: 250, EPOCH_METRIC: epoch}) == (
            TrialScheduler.CONTINUE
        )
    # Its last epoch ends it by its own return, not by the scheduler.
    assert (
        scheduler.on_trial_result(None, trailer, {METRIC: 30.0, ITEMS: 250, EPOCH_METRIC: 10})
        == TrialScheduler.CONTINUE
    )
