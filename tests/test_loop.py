"""The training loop (vlbert/engine/loop.py, checkpoint.py): determinism, crash-safe resume of the
same run only, non-finite losses, loader workers."""

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml
from conftest import finetune_args, study_args
from training_helpers import Killed, Tiny, loader_loop, run_metrics, saved_weights, tiny_loop

from vlbert.cli import main
from vlbert.engine.checkpoint import read_state
from vlbert.engine.optim import build_optimizer, build_scheduler
from vlbert.tracking import NullTracker

# ---- determinism and crash safety ------------------------------------------------------------


def test_same_seed_same_metrics(smoke_study, tmp_path):
    for run in ("one", "two"):
        assert (
            main(
                [
                    *finetune_args("no_pretrain", "vcr_q2a", "0.02", "3"),
                    "--out",
                    str(tmp_path / run),
                    *study_args(smoke_study),
                ]
            )
            == 0
        )
    assert run_metrics(tmp_path / "one") == run_metrics(tmp_path / "two")


def test_finetune_into_a_folder_of_another_rate_starts_afresh(smoke_study, tmp_path, capsys):
    # Seen: `--lr 5e-2` into a folder finished at 1e-3 wrote "lr": 0.05 beside 1e-3's numbers.
    run = lambda lr, out: main(
        [
            *finetune_args("no_pretrain", "vcr_q2a", lr, "3"),
            "--out",
            str(tmp_path / out),
            *study_args(smoke_study),
        ]
    )
    assert run("0.001", "reused") == 0
    assert run("0.02", "reused") == 0
    assert "not resuming" in capsys.readouterr().out
    assert run("0.02", "fresh") == 0
    assert run_metrics(tmp_path / "reused") == run_metrics(tmp_path / "fresh")


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
        *finetune_args("no_pretrain", "vcr_q2a", "0.001", "0"),
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
        *finetune_args("no_pretrain", "vqa", "0.001", "0"),
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
    assert run_metrics(killed) == run_metrics(tmp_path / "straight")


def test_a_checkpoint_is_resumed_only_by_the_run_that_made_it(tmp_path, capsys):
    # Seen: `vlbert finetune --lr 5e-2` into a folder finished at 1e-3 wrote 1e-3's numbers under 5e-2.
    tiny_loop(tmp_path / "out", {"lr": 0.1, "inputs": {"bert": "sha256 aa"}}).fit()
    again = tiny_loop(tmp_path / "out", {"lr": 0.1, "inputs": {"bert": "sha256 aa"}})
    again.fit()
    assert again.steps_timed == 0  # the same run: resumed, nothing to do
    other = tiny_loop(tmp_path / "out", {"lr": 0.3, "inputs": {"bert": "sha256 bb"}}, lr=0.3)
    other.fit()
    assert "not resuming" in capsys.readouterr().out and other.steps_timed == 20
    fresh = tiny_loop(tmp_path / "fresh", {"lr": 0.3, "inputs": {"bert": "sha256 bb"}}, lr=0.3)
    fresh.fit()
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            saved_weights(tmp_path / "out" / "best").values(), saved_weights(tmp_path / "fresh" / "best").values()
        )
    )


def test_checkpoints_need_no_unpickler(tmp_path):
    # Every file a checkpoint holds is JSON or safetensors; the state comes back as it was saved.
    loop = tiny_loop(tmp_path, {"lr": 0.1})
    loop.fit()
    files = {f.name for f in (tmp_path / "checkpoint").iterdir()}
    assert files == {"model.safetensors", "identity.json", "state.json", "state.safetensors", "digests.json"}
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
    tiny_loop(tmp_path, None).fit()
    loop = tiny_loop(tmp_path, {"lr": 0.1})
    loop.fit()
    assert "records no identity" in capsys.readouterr().out and loop.steps_timed == 20


def test_validation_every_few_epochs_keeps_the_best_validated_epoch_and_scores_the_last(tmp_path):
    scores = iter([0.5, 0.9, 0.7])
    loop = tiny_loop(
        tmp_path,
        {"lr": 0.1},
        select_metric="accuracy",
        evaluate=lambda model: {"accuracy": next(scores)},
        epochs=5,
        validate_every=2,
    )
    state = loop.fit()
    assert state.history == [{}, {"accuracy": 0.5}, {}, {"accuracy": 0.9}, {"accuracy": 0.7}]
    assert state.best_epoch == 3 and state.best_metric == 0.9


def test_a_sweep_reads_a_trial_s_whole_curve_from_its_checkpoint(tmp_path):
    # Seen: a killed sweep run again chose from the epochs its resumed trial ran the second time
    # (val_epochs [[4]] against [[1, 2, 3, 4]]): the earlier ones were Ray's, lost with the job.
    from vlbert.study.sweep import checkpoint_curve

    assert checkpoint_curve(tmp_path) is None  # no checkpoint: Ray's own record stands
    scores = iter([40.0, 55.0, 52.0])
    loop = tiny_loop(
        tmp_path,
        {"lr": 0.1},
        select_metric="accuracy",
        evaluate=lambda model: {"accuracy": next(scores), "n": 250},
        epochs=5,
        validate_every=2,
    )
    loop.fit()
    assert checkpoint_curve(tmp_path) == ([40.0, 55.0, 52.0], [2, 4, 5], 250)
    again = tiny_loop(tmp_path, {"lr": 0.1}, select_metric="accuracy", evaluate=lambda model: {}, epochs=5)
    again.fit()  # a finished trial resumed: it runs no epoch and its checkpoint keeps the curve
    assert again.steps_timed == 0 and checkpoint_curve(tmp_path)[1] == [2, 4, 5]


def test_a_finished_run_writes_its_best_weights_again(tmp_path):
    # Seen: Snakemake deleted best/ of a killed job; the re-run found its finished checkpoint and
    # never wrote best/ again (MissingOutputException on every later run).

    tiny_loop(tmp_path, {"lr": 0.1}).fit()
    before = saved_weights(tmp_path / "best")
    shutil.rmtree(tmp_path / "best")
    loop = tiny_loop(tmp_path, {"lr": 0.1})
    loop.fit()
    assert loop.steps_timed == 0 and all(
        torch.equal(before[k], v) for k, v in saved_weights(tmp_path / "best").items()
    )


def test_a_finished_run_whose_best_epoch_is_gone_trains_again(tmp_path, capsys):

    scores = iter([2.0, 1.0, 2.0, 1.0])  # the first epoch is the best one, in both runs
    evaluate = lambda model: {"accuracy": next(scores)}
    tiny_loop(tmp_path, {"lr": 0.1}, select_metric="accuracy", evaluate=evaluate).fit()
    before = saved_weights(tmp_path / "best")
    shutil.rmtree(tmp_path / "best")
    loop = tiny_loop(tmp_path, {"lr": 0.1}, select_metric="accuracy", evaluate=evaluate)
    loop.fit()
    assert "are gone" in capsys.readouterr().out and loop.steps_timed == 20 and loop.state.best_epoch == 0
    assert all(torch.equal(before[k], v) for k, v in saved_weights(tmp_path / "best").items())


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


@pytest.mark.parametrize("verb", ["pretrain", "finetune", "sweep"])
def test_a_second_run_stops_before_its_set_up(verb, tmp_path, monkeypatch, capsys):
    # Seen: the folder was taken after set-up (the preset, tokenizer, MLflow run: over a minute on
    # a loaded machine), so two runs started together both did their set-up before one stopped.
    from types import SimpleNamespace

    from vlbert.study import runs

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
        "sweep": ["--setting", "no_pretrain", "--task", "vqa"],  # seen: nothing held a sweep's folder
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


def test_loader_workers_train_on_the_same_batches_as_the_thread(tmp_path):
    import multiprocessing

    threaded, thread_losses = loader_loop(tmp_path / "thread")
    threaded.fit()
    workers, worker_losses = loader_loop(tmp_path / "workers", loader_workers=2, prefetch_batches=3)
    assert workers.pin_memory is False  # on CPU: nothing to pin for
    workers.fit()
    assert worker_losses.seen == thread_losses.seen and len(worker_losses.seen) == 20
    assert saved_weights(tmp_path / "workers" / "best").keys() == saved_weights(tmp_path / "thread" / "best").keys()
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            saved_weights(tmp_path / "workers" / "best").values(), saved_weights(tmp_path / "thread" / "best").values()
        )
    )
    assert workers.steps_timed == 20 and workers.step_time >= workers.data_wait > 0
    # Stopped early, the loader's workers stop with the training.
    early, early_losses = loader_loop(tmp_path / "early", loader_workers=2, max_steps=3)
    early.fit()
    assert early_losses.seen == thread_losses.seen[:3] and not multiprocessing.active_children()


def test_a_run_killed_with_loader_workers_resumes_to_the_same_weights(tmp_path, monkeypatch):
    import multiprocessing

    from vlbert.engine.loop import TrainingLoop

    straight, straight_losses = loader_loop(tmp_path / "straight")
    straight.fit()
    trains = TrainingLoop._step

    def step_or_die(loop, batch):
        if loop.state.step + 1 == 8:
            raise Killed
        return trains(loop, batch)

    monkeypatch.setattr(TrainingLoop, "_step", step_or_die)
    killed, _ = loader_loop(tmp_path / "killed", loader_workers=2)
    with pytest.raises(Killed):
        killed.fit()
    assert not multiprocessing.active_children()
    assert read_state(tmp_path / "killed" / "checkpoint")["position"] == {"epoch": 0, "batch": 5, "step": 5}
    monkeypatch.setattr(TrainingLoop, "_step", trains)
    resumed, resumed_losses = loader_loop(tmp_path / "killed", loader_workers=2)
    resumed.fit()
    assert resumed.steps_timed == 15 and resumed_losses.seen == straight_losses.seen[5:]
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            saved_weights(tmp_path / "killed" / "best").values(),
            saved_weights(tmp_path / "straight" / "best").values(),
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
    threaded, thread_losses = loader_loop(tmp_path / "thread", "cuda")
    threaded.fit()
    workers, worker_losses = loader_loop(tmp_path / "workers", "cuda", loader_workers=2)
    assert workers.pin_memory
    workers.fit()
    assert worker_losses.seen == thread_losses.seen


def test_a_run_whose_own_checkpoint_is_damaged_sets_it_aside_and_starts_over(tmp_path, capsys):
    # Seen: a killed run whose checkpoint/state.safetensors was cut short failed the same way on
    # every re-run and never healed.
    tiny_loop(tmp_path, {"lr": 0.1}).fit()
    finished = saved_weights(tmp_path / "best")
    state = tmp_path / "checkpoint" / "state.safetensors"
    state.write_bytes(state.read_bytes()[:100])
    loop = tiny_loop(tmp_path, {"lr": 0.1})
    loop.fit()
    assert "not resuming from a damaged checkpoint" in capsys.readouterr().err
    assert loop.not_resumed == "its checkpoint was damaged" and loop.steps_timed == 20  # trained again
    assert (tmp_path / "checkpoint.corrupt").is_dir()
    assert all(torch.equal(finished[k], v) for k, v in saved_weights(tmp_path / "best").items())


def test_a_write_that_cannot_be_done_is_one_error_naming_the_file_and_heals(tmp_path):
    # Seen: with the file size limited (ulimit -f), fine-tuning stopped with a 35-line traceback
    # ("File too large (os error 27)") naming no path; extraction the same from h5py.
    import resource

    from vlbert import io
    from vlbert.io import WriteFailedError

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (200, hard))  # Python ignores SIGXFSZ: writes fail with EFBIG
    try:
        with pytest.raises(WriteFailedError, match=rf"{tmp_path / 'checkpoint'}: cannot be written: File too large"):
            tiny_loop(tmp_path, {"lr": 0.1}).fit()
        with pytest.raises(WriteFailedError, match=rf"{tmp_path / 'big.json'}: cannot be written: File too large"):
            io.write_json(tmp_path / "big.json", list(range(1000)))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert not (tmp_path / "checkpoint").exists() and not (tmp_path / "big.json").exists()
    loop = tiny_loop(tmp_path, {"lr": 0.1})  # the same command, room again: it heals
    loop.fit()
    assert (tmp_path / "best" / "model.safetensors").is_file() and loop.state.epoch == 2
