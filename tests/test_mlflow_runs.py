"""Training runs in MLflow: what a run records, an unreachable store, a killed run continued or
ended with a note, sweep trials' runs."""

import shutil
import time

import pytest
from conftest import finetune_args, study_args
from training_helpers import Killed, tiny_loop

from vlbert.cli import main
from vlbert.tracking import NullTracker

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
                *finetune_args("no_pretrain", "refcoco_gt", "0.001", "2"),
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
                *finetune_args("no_pretrain", "vqa", "0.001", "0"),
                "--out",
                str(tmp_path / "run"),
                *args,
            ]
        )
        == 2
    )
    assert "MLflow tracking store 'http://127.0.0.1:9/' cannot be reached" in capsys.readouterr().err
    assert time.time() - started < 30 and not (tmp_path / "run").exists()


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
                *finetune_args("no_pretrain", "vqa", lr, "0"),
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
    tiny_loop(tmp_path / "seed", {"lr": 0.3}, lr=0.3, tracker=RecordingTracker("other-rate")).fit()
    for name in ("checkpoint", "best"):
        shutil.rmtree(tmp_path / "seed" / name)
    tiny_loop(tmp_path / "trial", {"lr": 0.1}, tracker=RecordingTracker("trial-run")).fit()
    shutil.copytree(tmp_path / "trial" / "checkpoint", tmp_path / "seed" / "checkpoint")
    tracker = RecordingTracker("seed-run")
    loop = tiny_loop(tmp_path / "seed", {"lr": 0.1}, tracker=tracker)
    loop.fit()
    assert loop.steps_timed == 0 and tracker.calls == [("start", None), ("abandon", "other-rate")]
    again = RecordingTracker("another-run")
    tiny_loop(tmp_path / "seed", {"lr": 0.1}, tracker=again).fit()  # re-run: the seed's own run goes on
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


def test_a_fine_tuning_run_shows_its_data_family_and_figures_in_mlflow(smoke_study, tmp_path, monkeypatch):
    # Seen: the runs table's Dataset column empty (no run logged its inputs), no family tag.
    finetune, runs, client = _tracked_finetune(smoke_study, tmp_path, monkeypatch)
    assert finetune("0.001") == 0
    [run] = runs()
    inputs = {d.dataset.name: d for d in run.inputs.dataset_inputs}
    assert set(inputs) == {"vqa train", "vqa val", "vqa test"}
    contexts = {name: {t.key: t.value for t in d.tags}["mlflow.data.context"] for name, d in inputs.items()}
    assert contexts == {"vqa train": "training", "vqa val": "validation", "vqa test": "test"}
    assert all(len(d.dataset.digest) == 16 and d.dataset.source.endswith('.h5"}') for d in inputs.values())
    assert run.data.tags["family"] == "vlbert" and run.data.tags["setting"] == "no_pretrain"
    assert {"final_test_accuracy", "final_test_shuffled_images_accuracy", "best_epoch"} <= set(run.data.metrics)
    # Step metrics are written a batch at a time and keep the times they were logged at.
    losses = client.get_metric_history(run.info.run_id, "loss")
    assert len(losses) > 1 and len({m.timestamp for m in losses}) > 1
