"""The MLflow store as the study's jobs meet it: several processes opening a new one at once."""

import multiprocessing

from vlbert.tracking import MLflowTracker


def _open_the_store(uri, barrier, answers):
    barrier.wait()  # all at once, as bert_init and train_detector start a study
    try:
        tracker = MLflowTracker(uri, "vlbert-ablation-smoke", "job", {}, system_metrics=False)
        answers.put(tracker.experiment_id)
    except Exception as exc:
        answers.put(f"{type(exc).__name__}: {exc}")


def test_jobs_that_open_a_new_store_at_once_all_get_its_one_experiment(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    jobs = 4
    spawn = multiprocessing.get_context("spawn")
    barrier, answers = spawn.Barrier(jobs), spawn.Queue()
    processes = [spawn.Process(target=_open_the_store, args=(uri, barrier, answers)) for _ in range(jobs)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=300)
    got = [answers.get(timeout=10) for _ in range(jobs)]
    assert len(set(got)) == 1 and got[0].isdigit(), got


def test_artifacts_live_beside_the_store_and_are_read_back_without_leaving_a_copy(tmp_path, monkeypatch):
    import tempfile

    from vlbert.tracking import read_artifact_text

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where mkdtemp puts MLflow's copies
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = MLflowTracker(uri, "vlbert-ablation-smoke", "job", {}, system_metrics=False)
    written = tmp_path / "predictions_val.json"
    written.write_text('[{"annot_id": "val-0"}]')
    tracker.log_artifact(written)
    tracker.close()

    stored = tmp_path / "mlartifacts" / tracker.run_id / "artifacts" / "predictions_val.json"
    assert stored.read_text() == written.read_text()  # in the study's results folder, not ./mlruns
    assert read_artifact_text(uri, tracker.run_id, "predictions_val.json") == written.read_text()
    assert list(scratch.iterdir()) == []


def test_a_parent_run_ends_the_child_runs_left_running(tmp_path):
    # Seen: the last trial of a sweep stayed RUNNING in MLflow (Ray ended its worker first).
    from mlflow.tracking import MlflowClient

    from vlbert.tracking import ENDED_TAG

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent = MLflowTracker(uri, "vlbert-ablation-smoke", "sweep", {}, system_metrics=False)
    children = [
        MLflowTracker(uri, "vlbert-ablation-smoke", f"trial-{i}", {}, parent.run_id, system_metrics=False)
        for i in range(3)
    ]
    other = MLflowTracker(uri, "vlbert-ablation-smoke", "another", {}, system_metrics=False)
    for child in children + [other]:
        child.start()
    children[0].close("KILLED")
    children[1].close()
    parent.end_children("the sweep ended")
    runs = {run_id: MlflowClient(uri).get_run(run_id) for run_id in [c.run_id for c in children] + [other.run_id]}
    status = [runs[c.run_id].info.status for c in children]
    assert status == ["KILLED", "FINISHED", "KILLED"]
    assert runs[children[2].run_id].data.tags[ENDED_TAG] == "the sweep ended"
    assert ENDED_TAG not in runs[children[1].run_id].data.tags
    assert runs[other.run_id].info.status == "RUNNING"  # not a child of this run


def _dead_pid() -> int:
    import subprocess
    import sys

    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_runs_record_their_process_and_the_next_job_ends_those_whose_process_is_gone(tmp_path, capsys):
    # Seen: a SIGKILLed job's run stayed RUNNING for ever, and the report showed its cell as `-`.
    import os
    import socket

    from mlflow.tracking import MlflowClient

    from vlbert.tracking import ENDED_TAG, HOST_TAG, PID_TAG, PROCESS_STARTED_TAG, process_tags

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    live = MLflowTracker(uri, "vlbert-ablation-smoke", "live", {}, system_metrics=False)
    live.start()
    client = MlflowClient(uri)
    tags = client.get_run(live.run_id).data.tags
    assert tags[HOST_TAG] == socket.gethostname() and tags[PID_TAG] == str(os.getpid())
    mine = process_tags()
    runs = {
        "killed": {**mine, PID_TAG: str(_dead_pid())},
        "pid reused": {**mine, PROCESS_STARTED_TAG: str(float(mine[PROCESS_STARTED_TAG]) - 3600)},
        "another host": {**mine, HOST_TAG: "elsewhere", PID_TAG: str(_dead_pid())},
        "untagged": {},  # a run recorded before runs named their process: nothing known of it
    }
    ids = {name: client.create_run(live.experiment_id, tags=tags).info.run_id for name, tags in runs.items()}
    MLflowTracker(uri, "vlbert-ablation-smoke", "next job", {}, system_metrics=False)
    status = {name: client.get_run(run_id).info.status for name, run_id in ids.items()}
    assert status == {"killed": "KILLED", "pid reused": "KILLED", "another host": "RUNNING", "untagged": "RUNNING"}
    killed = client.get_run(ids["killed"]).data.tags
    assert killed[ENDED_TAG] == f"its process (PID {killed[PID_TAG]} on {socket.gethostname()}) is gone: " + (
        "killed before it could end its run"
    )
    assert f"MLflow run {ids['killed']} marked KILLED" in capsys.readouterr().out
    assert client.get_run(live.run_id).info.status == "RUNNING"  # its process is this one


def test_a_run_ended_as_gone_goes_on_when_its_folder_resumes_or_says_why_it_never_will(tmp_path):
    from mlflow.tracking import MlflowClient

    from vlbert.tracking import ENDED_TAG, PID_TAG, end_dead_runs, process_tags

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    tracker = MLflowTracker(uri, "vlbert-ablation-smoke", "job", {}, system_metrics=False)
    dead = {**process_tags(), PID_TAG: str(_dead_pid())}
    resumed, abandoned = (client.create_run(tracker.experiment_id, tags=dead).info.run_id for _ in range(2))
    assert sorted(end_dead_runs(uri, "vlbert-ablation-smoke")) == sorted([abandoned, resumed])
    assert tracker.start(continue_run=resumed) == resumed
    run = client.get_run(resumed)
    assert run.info.status == "RUNNING" and ENDED_TAG not in run.data.tags
    assert run.data.tags[PID_TAG] == process_tags()[PID_TAG]
    tracker.abandon(abandoned, "not continued, as it stopped before its first checkpoint")
    why = client.get_run(abandoned).data.tags[ENDED_TAG]
    assert why.startswith("its process (PID") and why.endswith(
        "; not continued, as it stopped before its first checkpoint"
    )


def test_the_study_s_experiment_opens_on_its_training_runs(tmp_path):
    # Seen: MLflow 3's UI opened the study's experiment on its GenAI overview (traces, an empty
    # dashboard); it reads the experiment's kind from this tag.
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MLflowTracker(uri, "vlbert-ablation-smoke", "job", {}, system_metrics=False)
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("vlbert-ablation-smoke")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    # An experiment made before the tag was set gets it from the study's next job.
    older = client.create_experiment("vlbert-ablation-older")
    MLflowTracker(uri, "vlbert-ablation-older", "job", {}, system_metrics=False)
    assert client.get_experiment(older).tags["mlflow.experimentKind"] == "custom_model_development"
