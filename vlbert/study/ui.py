"""`vlbert ui` (`make ui`): MLflow's UI over a preset's tracking store, opened on the study's runs.

MLflow 3 opens on its GenAI view, where a newcomer sees an empty traces dashboard; the address
printed here goes straight to the table of the study's training runs.
"""

from __future__ import annotations

import os
import sys

from ..tracking import TrackingStoreError, default_tracking_uri, end_dead_runs, experiment_name, find_experiment_id

SERVED_STORES = ("sqlite:", "file:", "postgresql", "mysql", "mssql")


def runs_table_url(base: str, experiment_id: str) -> str:
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs"


def find_experiment(uri: str, name: str) -> str:
    """The id of experiment `name` in the store at `uri`; an error that says what to run when absent."""
    database = uri.removeprefix("sqlite:///")
    if uri.startswith("sqlite:///") and not os.path.isfile(database):  # MLflow would create an empty one
        raise TrackingStoreError(
            f"no tracking store at {database}: run the study first (make reproduce PRESET=<preset>)"
        )
    found = find_experiment_id(uri, name)
    if found is None:
        raise TrackingStoreError(
            f"no experiment {name!r} in {uri}: run the study first (make reproduce PRESET=<preset>)"
        )
    return found


def mlflow_ui_command(uri: str, host: str, port: int) -> list[str]:
    return [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", host, "--port", str(port)]


def serve(config: dict, host: str = "127.0.0.1", port: int = 5000, tracking_uri: str | None = None) -> int:
    """Print the runs table's address, then become `mlflow ui` (a server store: only print it)."""
    uri = tracking_uri or default_tracking_uri(config)
    experiment_id = find_experiment(uri, experiment_name(config))
    end_dead_runs(uri, experiment_name(config))  # the UI shows a killed job's run KILLED, not RUNNING
    if uri.startswith(("http://", "https://")):
        print(f"the study's runs: {runs_table_url(uri, experiment_id)}", flush=True)
        return 0
    if not uri.startswith(SERVED_STORES):
        raise TrackingStoreError(f"cannot serve the tracking store {uri}: give a database or file store")
    print(f"the study's runs: {runs_table_url(f'http://{host}:{port}', experiment_id)}", flush=True)
    command = mlflow_ui_command(uri, host, port)
    os.execv(command[0], command)
    return 0  # not reached: the process is now mlflow's
