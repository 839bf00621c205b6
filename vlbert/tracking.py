"""The one place that talks to MLflow. Training code reports to a `Tracker`; it never imports mlflow.

`make_tracker` checks that the tracking store answers before any work starts, so a wrong URI
fails in the first second, not after an hour of training. The report reads the runs back
through `read_runs`, `metric_history` and `read_artifact_text`; the tags and metric names below
are the format both sides share.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .layout import Layout

# ---- the run format: what the writers record and the report looks up ------------------------

# Tags: where a run sits in the study (its stage, then setting, task, seed and learning rate,
# as far as they apply), and what the run is made from.
STAGE_TAG, SETTING_TAG, TASK_TAG, SEED_TAG, LR_TAG = "stage", "setting", "task", "seed", "lr"
FAMILY_TAG = "family"  # the setting's model family (vlbert.registry.FAMILIES)
PRESET_TAG = "preset"
TRAIN_FRACTION_TAG = "train_fraction"  # a fine-tuning run on a share of its training set (absent: all of it)
GIT_COMMIT_TAG = "git_commit"
# MLflow 3's UI opens an experiment on what this tag says it is (without it: its GenAI overview of
# traces); the study's runs are model training.
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"
PARENT_RUN_TAG = "mlflow.parentRunId"  # MLflow's own: a sweep trial's sweep run, nested under it in the UI
ENDED_TAG = "vlbert.ended"  # why a run was ended from outside (KILLED by `abandon`, `end_dead_runs`)
RESUMED_TAG = "vlbert.resumed_at_step"  # the step a resumed training went on from
# The process that records a run (the last one, for a continued run): its host, its PID and when
# it started (a PID the system gave to another process since is not the run's).
HOST_TAG, PID_TAG, PROCESS_STARTED_TAG = "vlbert.host", "vlbert.pid", "vlbert.process_started"
PROCESS_GONE = "its process (PID {pid} on {host}) is gone: killed before it could end its run"

# Metrics: the training loop logs the loss per step and, at the end of each epoch, every validation
# figure as val_<name> with `epoch` at the same step; fine-tuning logs the best epoch's figures as
# final_<split>_<name>, and which epoch that was.
LOSS_METRIC = "loss"
EPOCH_METRIC = "epoch"
BEST_EPOCH_METRIC = "best_epoch"
# A fine-tuned model's size: all its parameters, and those fine-tuning trains.
PARAMETERS_METRIC = "parameters"
TRAINABLE_PARAMETERS_METRIC = "trainable_parameters"
VAL_PREFIX = "val_"


def val_metric(name: str) -> str:
    return f"{VAL_PREFIX}{name}"


# The test split scored a second time with its images shuffled among the items (final metrics).
SHUFFLED_IMAGES_SPLIT = "test_shuffled_images"


def final_metric(split: str, name: str = "accuracy") -> str:
    return f"final_{split}_{name}"


def predictions_artifact(split: str) -> str:
    """A fine-tuning run's predictions on `split`, as `vlbert evaluate` reads them."""
    return f"predictions_{split}.json"


class TrackingStoreError(RuntimeError):
    """The MLflow tracking store cannot be reached or refuses the run."""


class Tracker(Protocol):
    def start(self, continue_run: str | None = None) -> str | None:
        """Begin recording: into the earlier run `continue_run` where it can go on, so that a
        resumed training's history stays in one run, else into a new run; the run's id."""

    def abandon(self, run_id: str, why: str) -> None:
        """An earlier run that will never go on (its training was killed and is not resumed):
        ended as KILLED, saying why, unless it already ended."""

    def end_children(self, why: str) -> None:
        """Mark this run's child runs that are still RUNNING as KILLED, saying why."""

    def log_params(self, params: dict) -> None: ...
    def log_metrics(self, metrics: dict, step: int | None = None) -> None: ...
    def log_metric_rows(self, rows: list[tuple[dict, int, float]]) -> None:
        """Several steps' metrics at once (`(metrics, step, unix time)` each): one write to the store."""

    def log_datasets(self, datasets: list[dict]) -> None:
        """The data the run reads, each {name, digest, source, context, profile}: MLflow's inputs."""

    def inherit_history(self, run_id: str) -> None:
        """The run starts with run `run_id`'s metric history (the sweep trial it continues)."""

    def log_artifact(self, path, artifact_path: str | None = None) -> None: ...
    def set_tags(self, tags: dict) -> None: ...
    def close(self, status: str = "FINISHED") -> None: ...


class NullTracker:
    """Tracks nothing: for tests and for commands run with --no-tracking."""

    run_id = None

    def start(self, continue_run=None):
        return continue_run  # a resumed training still belongs to the run it was recorded in

    def abandon(self, run_id, why):
        pass

    def end_children(self, why):
        pass

    def log_params(self, params):
        pass

    def log_metrics(self, metrics, step=None):
        pass

    def log_metric_rows(self, rows):
        for metrics, step, _ in rows:
            self.log_metrics(metrics, step)

    def log_datasets(self, datasets):
        pass

    def inherit_history(self, run_id):
        pass

    def log_artifact(self, path, artifact_path=None):
        pass

    def set_tags(self, tags):
        pass

    def close(self, status="FINISHED"):
        pass


def experiment_name(config: dict) -> str:
    """The MLflow experiment of a preset's runs: tracking.experiment, else vlbert-ablation-<preset>."""
    return (config.get("tracking") or {}).get("experiment") or f"vlbert-ablation-{config['name']}"


def default_tracking_uri(config: dict) -> str:
    """The preset's tracking.uri, else $MLFLOW_TRACKING_URI, else SQLite under results/<preset>/."""
    uri = (config.get("tracking") or {}).get("uri") or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    db = Layout(config["name"]).mlflow_db
    db.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{db.resolve()}"


def store_lock(uri: str):
    """Jobs that open a new SQLite store at once (bert_init and train_detector at the start of a
    study, a sweep's trials) race to create its tables and its experiment; they take turns."""
    if not uri.startswith("sqlite:///"):
        return contextlib.nullcontext()
    from filelock import FileLock

    return FileLock(f"{uri.removeprefix('sqlite:///')}.lock")


def artifact_root(uri: str) -> str | None:
    """Where a new experiment keeps its artifacts: beside a SQLite store's database, so that a
    study's checkpoints and predictions live in its results folder (MLflow's default, ./mlruns, is
    relative to whichever folder the first job ran in); the store's own default for any other."""
    if not uri.startswith("sqlite:///"):
        return None
    return (Path(uri.removeprefix("sqlite:///")).resolve().parent / "mlartifacts").as_uri()


def git_commit() -> str:
    try:
        return (
            subprocess.run(
                ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent, timeout=5
            ).stdout.strip()
            or "unknown"
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


_MLFLOW_UNSAFE = re.compile(r"[^\w\-. :/]")


def _flatten(params: dict, prefix: str = "") -> dict:
    """Nested dicts to dotted keys; characters MLflow refuses in names (the '+' of 'refcoco+')
    become '_'."""
    flat = {}
    for key, value in params.items():
        key = _MLFLOW_UNSAFE.sub("_", str(key))
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def process_tags() -> dict:
    """The tags that name this process as the one recording a run (see `process_gone`)."""
    import psutil

    started = psutil.Process().create_time()
    return {HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid()), PROCESS_STARTED_TAG: f"{started:.2f}"}


def process_gone(tags: dict) -> str | None:
    """Why the process that recorded a run is known to be gone, else None: only on its own host
    (another host's processes cannot be seen from here), when its PID is dead, a zombie, or
    another process's (one that started at another time)."""
    import psutil

    host, pid = tags.get(HOST_TAG), tags.get(PID_TAG)
    if host != socket.gethostname() or not (pid or "").isdigit():
        return None
    try:
        process = psutil.Process(int(pid))
        started = float(tags.get(PROCESS_STARTED_TAG) or process.create_time())
        alive = process.status() != psutil.STATUS_ZOMBIE and abs(process.create_time() - started) < 1
    except psutil.NoSuchProcess:
        alive = False
    except (psutil.AccessDenied, ValueError):  # there, but not ours to look at: leave its run alone
        alive = True
    return None if alive else PROCESS_GONE.format(pid=pid, host=host)


def end_dead_runs(uri: str, experiment: str) -> list[str]:
    """Mark KILLED, saying why, the experiment's runs still RUNNING whose process is gone (a job
    killed with SIGKILL never ends its run): they would stay RUNNING for ever, and the report could
    not tell them from a live run. Returns their ids. A run continued later (a re-run resumes its
    folder's training) is RUNNING again, its note removed."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return []
    ended = []
    for run in client.search_runs(
        [found.experiment_id], filter_string="attributes.status = 'RUNNING'", max_results=50000
    ):
        why = process_gone(run.data.tags)
        if why is not None:
            client.set_tag(run.info.run_id, ENDED_TAG, why)
            client.set_terminated(run.info.run_id, status="KILLED")
            print(f"MLflow run {run.info.run_id} marked KILLED: {why}")
            ended.append(run.info.run_id)
    return ended


class MLflowTracker:
    """A run in an MLflow store, created at the first record that needs it, not before: the
    training loop decides whether a resumed training continues its earlier run (`start`). Params
    and tags given before then wait for the run."""

    def __init__(
        self,
        uri: str,
        experiment: str,
        run_name: str,
        tags: dict,
        parent_run_id: str | None = None,
        system_metrics: bool = True,
    ):
        from mlflow.tracking import MlflowClient

        try:
            with store_lock(uri):
                self.client = MlflowClient(tracking_uri=uri)
                found = self.client.get_experiment_by_name(experiment)
                self.experiment_id = (
                    found.experiment_id
                    if found
                    else self.client.create_experiment(
                        experiment, artifact_location=artifact_root(uri), tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND}
                    )
                )
                if found and found.tags.get(EXPERIMENT_KIND_TAG) is None:  # made before the tag was set
                    self.client.set_experiment_tag(self.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        except Exception as exc:  # the store's own errors vary by backend; all mean "unreachable"
            raise TrackingStoreError(f"MLflow tracking store {uri!r} cannot be reached: {exc}") from exc
        end_dead_runs(uri, experiment)  # a study's next job ends the runs its killed jobs left
        tags = {GIT_COMMIT_TAG: git_commit(), **tags}
        if parent_run_id:
            tags[PARENT_RUN_TAG] = parent_run_id
        self.uri, self.run_name, self.system_metrics = uri, run_name, system_metrics
        self.run_tags = {k: str(v) for k, v in tags.items()}
        self._run_id = None
        self._params, self._tags, self._datasets = {}, {}, []  # given before the run started
        self._inherited = None  # a run whose metric history the new run starts with
        self._kept = set()  # params the continued run holds already
        self._system = None

    @property
    def run_id(self) -> str:
        """The run recorded into; asking for it starts a new one if none is yet."""
        return self._run_id if self._run_id is not None else self.start()

    def start(self, continue_run: str | None = None) -> str:
        if self._run_id is not None:
            return self._run_id
        run = self._continuable(continue_run) if continue_run else None
        if run is not None:
            # MLflow's params cannot change: those the run holds keep their first value (a path
            # given another way, say; what the training depends on is the same, as the
            # checkpoint's identity says), the continuation adds the others. Tags say who
            # continues it: its commit, and the sweep run of a trial a re-run sweep continues.
            self.client.update_run(continue_run, status="RUNNING")
            if ENDED_TAG in run.data.tags:  # ended while its process was gone: it goes on after all
                self.client.delete_tag(continue_run, ENDED_TAG)
            self._run_id, self._kept = continue_run, set(run.data.params)
            self._tags = self.run_tags | process_tags() | self._tags
        else:
            if continue_run:
                print(
                    f"MLflow run {continue_run} cannot be continued (not in experiment {self.experiment_id} "
                    f"of {self.uri}): recording into a new run"
                )
            self._run_id = self.client.create_run(
                self.experiment_id, run_name=self.run_name, tags=self.run_tags | process_tags()
            ).info.run_id
        self._log_params(self._params)
        self.set_tags(self._tags)
        self.log_datasets(self._datasets)
        if self._inherited and run is None:
            self._copy_history(self._inherited)
        self._params, self._tags, self._datasets = {}, {}, []
        if self.system_metrics:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            # CPU, memory, disk, network (and GPU where there is one), every 10 s, as system/*.
            self._system = SystemMetricsMonitor(self._run_id, sampling_interval=10, tracking_uri=self.uri)
            self._system.start()
        return self._run_id

    def _continuable(self, run_id: str):
        """The run `run_id` if this store's experiment holds it, not deleted; else None."""
        from mlflow.exceptions import MlflowException

        try:
            run = self.client.get_run(run_id)
        except MlflowException:
            return None
        ours = run.info.experiment_id == self.experiment_id and run.info.lifecycle_stage == "active"
        return run if ours else None

    def abandon(self, run_id: str, why: str) -> None:
        run = self._continuable(run_id)
        if run is None:
            return
        gone = run.data.tags.get(ENDED_TAG, "")
        if run.info.status == "KILLED" and gone == process_gone(run.data.tags):
            why = f"{gone}; {why}"  # `end_dead_runs` ended it: say too why it will never go on
        elif run.info.status not in ("RUNNING", "SCHEDULED"):
            return
        self.client.set_tag(run_id, ENDED_TAG, why)
        self.client.set_terminated(run_id, status="KILLED")
        print(f"MLflow run {run_id} marked KILLED: {why}")

    def end_children(self, why: str) -> None:
        if self._run_id is None:
            return
        running = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`{PARENT_RUN_TAG}` = '{self._run_id}' and attributes.status = 'RUNNING'",
        )
        for run in running:
            self.abandon(run.info.run_id, why)

    def log_params(self, params: dict) -> None:
        if self._run_id is None:
            self._params.update(_flatten(params))
        else:
            self._log_params(_flatten(params))

    def _log_params(self, flat: dict) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)[:6000]) for k, v in flat.items() if k not in self._kept]
        for start in range(0, len(items), 100):
            self.client.log_batch(self._run_id, params=items[start : start + 100])

    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(
            self.run_id, metrics=[Metric(k, float(v), now, step or 0) for k, v in _flatten(metrics).items()]
        )

    def log_metric_rows(self, rows: list[tuple[dict, int, float]]) -> None:
        from mlflow.entities import Metric

        entries = [
            Metric(k, float(v), int(when * 1000), step or 0)
            for metrics, step, when in rows
            for k, v in _flatten(metrics).items()
        ]
        for start in range(0, len(entries), 1000):  # MLflow's limit of metrics per batch
            self.client.log_batch(self.run_id, metrics=entries[start : start + 1000])

    def log_datasets(self, datasets: list[dict]) -> None:
        """MLflow's run inputs (the runs table's Dataset column), logged when the run starts; a
        continued run has them already."""
        if self._run_id is None:
            self._datasets = list(datasets)
            return
        from mlflow.entities import Dataset, DatasetInput, InputTag

        if not datasets or self._kept:
            return
        inputs = [
            DatasetInput(
                Dataset(
                    d["name"], d["digest"], "local", json.dumps({"uri": d["source"]}), profile=json.dumps(d["profile"])
                ),
                [InputTag("mlflow.data.context", d["context"])],
            )
            for d in datasets
        ]
        self.client.log_inputs(self.run_id, datasets=inputs)

    def inherit_history(self, run_id: str) -> None:
        """Copied into the run when it starts (not a continued one, which has it): run `run_id`'s
        training and validation metrics, each step's value and time, so that a seed that continues
        its sweep's trial shows the trial's curves."""
        self._inherited = run_id

    def _copy_history(self, source: str) -> None:
        from mlflow.entities import Metric
        from mlflow.exceptions import MlflowException

        try:
            keys = [k for k in self.client.get_run(source).data.metrics if not k.startswith("system/")]
        except MlflowException:  # the trial's run is gone (another store, deleted): nothing to copy
            return
        points = [
            Metric(k, m.value, m.timestamp, m.step) for k in keys for m in self.client.get_metric_history(source, k)
        ]
        for start in range(0, len(points), 1000):
            self.client.log_batch(self._run_id, metrics=points[start : start + 1000])

    def log_artifact(self, path, artifact_path: str | None = None) -> None:
        path = Path(path)
        if path.is_dir():
            self.client.log_artifacts(self.run_id, str(path), artifact_path)
        else:
            self.client.log_artifact(self.run_id, str(path), artifact_path)

    def set_tags(self, tags: dict) -> None:
        if self._run_id is None:
            self._tags.update({k: str(v) for k, v in tags.items()})
            return
        for key, value in tags.items():
            self.client.set_tag(self._run_id, key, str(value))

    def close(self, status: str = "FINISHED") -> None:
        run_id = self.run_id  # a command that failed before recording anything still leaves its run
        if self._system is not None:
            self._system.finish()
        self.client.set_terminated(run_id, status=status)


def make_tracker(
    config: dict, run_name: str, tags: dict, enabled: bool = True, parent_run_id: str | None = None
) -> Tracker:
    if not enabled or os.environ.get("VLBERT_NO_TRACKING") == "1":
        return NullTracker()
    from .registry import SETTINGS

    family = {FAMILY_TAG: SETTINGS[tags[SETTING_TAG]].family} if tags.get(SETTING_TAG) in SETTINGS else {}
    return MLflowTracker(
        default_tracking_uri(config),
        experiment_name(config),
        run_name,
        {PRESET_TAG: config["name"], **family, **tags},
        parent_run_id,
    )


# ---- reading the runs back (the report) ------------------------------------------------------


@dataclass(frozen=True)
class RecordedRun:
    """A run as the store holds it: `metrics` are each metric's last value."""

    run_id: str
    run_name: str
    status: str
    artifact_uri: str
    tags: dict
    metrics: dict


def read_runs(uri: str, experiment: str) -> list[RecordedRun]:
    """Every run of `experiment` in the store at `uri`, newest first."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise ValueError(f"no MLflow experiment {experiment!r} in {uri}")
    return [
        RecordedRun(
            run.info.run_id, run.info.run_name, run.info.status, run.info.artifact_uri, run.data.tags, run.data.metrics
        )
        for run in client.search_runs([found.experiment_id], max_results=50000)  # by start time, newest first
    ]


def find_experiment_id(uri: str, name: str) -> str | None:
    """The id of experiment `name` in the store at `uri` (None when it has none)."""
    from mlflow.tracking import MlflowClient

    try:
        found = MlflowClient(tracking_uri=uri).get_experiment_by_name(name)
    except Exception as exc:  # any store failure is reported the same way
        raise TrackingStoreError(f"the tracking store {uri} does not answer: {exc}") from None
    return found.experiment_id if found is not None else None


def metric_history(uri: str, run_id: str, metric: str) -> list[tuple[int, float]]:
    """Every (step, value) the run logged of `metric`, in the store's order."""
    from mlflow.tracking import MlflowClient

    return [(m.step, m.value) for m in MlflowClient(uri).get_metric_history(run_id, metric)]


def read_artifact_text(uri: str, run_id: str, path: str) -> str:
    """The text of the run's artifact `path`. MLflow copies it into a folder of our own that is
    removed afterwards: left to itself it leaves one `mkdtemp` folder per read in /tmp."""
    import tempfile

    import mlflow.artifacts

    os.environ.setdefault(
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false"
    )  # a bar per file read fills the report's log
    with tempfile.TemporaryDirectory(prefix="vlbert-artifact-") as folder:
        local = mlflow.artifacts.download_artifacts(
            run_id=run_id, artifact_path=path, tracking_uri=uri, dst_path=folder
        )
        return Path(local).read_text()
