"""The one place that talks to MLflow. Training code reports to a `Tracker`; it never imports mlflow.

`make_tracker` checks that the tracking store answers before any work starts, so a wrong URI
fails in the first second, not after an hour of training.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Protocol


class TrackingStoreError(RuntimeError):
    """The MLflow tracking store cannot be reached or refuses the run."""


class Tracker(Protocol):
    def log_params(self, params: dict) -> None: ...
    def log_metrics(self, metrics: dict, step: int | None = None) -> None: ...
    def log_artifact(self, path, artifact_path: str | None = None) -> None: ...
    def set_tags(self, tags: dict) -> None: ...
    def close(self, status: str = "FINISHED") -> None: ...


class NullTracker:
    """Tracks nothing: for tests and for commands run with --no-tracking."""

    run_id = None

    def log_params(self, params): pass
    def log_metrics(self, metrics, step=None): pass
    def log_artifact(self, path, artifact_path=None): pass
    def set_tags(self, tags): pass
    def close(self, status="FINISHED"): pass


def default_tracking_uri(config: dict) -> str:
    """The preset's tracking.uri, else $MLFLOW_TRACKING_URI, else SQLite under results/<preset>/."""
    uri = (config.get("tracking") or {}).get("uri") or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    db = Path("results") / config["name"] / "mlflow.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{db.resolve()}"


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=5).stdout.strip() or "unknown"
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


class MLflowTracker:
    def __init__(self, uri: str, experiment: str, run_name: str, tags: dict,
                 parent_run_id: str | None = None, system_metrics: bool = True):
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        try:
            found = self.client.get_experiment_by_name(experiment)
            experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
        except Exception as exc:  # the store's own errors vary by backend; all mean "unreachable"
            raise TrackingStoreError(f"MLflow tracking store {uri!r} cannot be reached: {exc}") from exc
        tags = {"git_commit": git_commit(), **tags}
        if parent_run_id:
            tags["mlflow.parentRunId"] = parent_run_id
        self.run = self.client.create_run(experiment_id, run_name=run_name,
                                          tags={k: str(v) for k, v in tags.items()})
        self.run_id = self.run.info.run_id
        self._system = None
        if system_metrics:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
            # CPU, memory, disk, network (and GPU where there is one), every 10 s, as system/*.
            self._system = SystemMetricsMonitor(self.run_id, sampling_interval=10, tracking_uri=uri)
            self._system.start()

    def log_params(self, params: dict) -> None:
        from mlflow.entities import Param
        items = [Param(k, str(v)[:6000]) for k, v in _flatten(params).items()]
        for start in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[start:start + 100])

    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        import time
        from mlflow.entities import Metric
        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[
            Metric(k, float(v), now, step or 0) for k, v in _flatten(metrics).items()])

    def log_artifact(self, path, artifact_path: str | None = None) -> None:
        path = Path(path)
        if path.is_dir():
            self.client.log_artifacts(self.run_id, str(path), artifact_path)
        else:
            self.client.log_artifact(self.run_id, str(path), artifact_path)

    def set_tags(self, tags: dict) -> None:
        for key, value in tags.items():
            self.client.set_tag(self.run_id, key, str(value))

    def close(self, status: str = "FINISHED") -> None:
        if self._system is not None:
            self._system.finish()
        self.client.set_terminated(self.run_id, status=status)


def make_tracker(config: dict, run_name: str, tags: dict, enabled: bool = True,
                 parent_run_id: str | None = None) -> Tracker:
    if not enabled or os.environ.get("VLBERT_NO_TRACKING") == "1":
        return NullTracker()
    experiment = (config.get("tracking") or {}).get("experiment") or f"vlbert-ablation-{config['name']}"
    return MLflowTracker(default_tracking_uri(config), experiment, run_name,
                         {"preset": config["name"], **tags}, parent_run_id)
