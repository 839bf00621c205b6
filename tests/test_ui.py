"""`vlbert ui`: MLflow's UI over a preset's store, opened on the study's runs table, on loopback."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from vlbert.cli import main

ROOT = Path(__file__).resolve().parents[1]
SMOKE = str(ROOT / "experiments" / "smoke.yaml")


def _store_with_the_study(tmp_path) -> tuple[str, str]:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    client.create_experiment("another-study")  # so that the study's id is not simply the first
    return uri, client.create_experiment("vlbert-ablation-smoke")


def test_ui_prints_the_runs_table_and_serves_the_store_on_loopback(tmp_path, monkeypatch, capsys):
    uri, experiment_id = _store_with_the_study(tmp_path)
    became = []
    monkeypatch.setattr(os, "execv", lambda path, argv: became.append(argv))

    assert main(["ui", "--config", SMOKE, "--tracking-uri", uri, "--port", "5123"]) == 0

    assert (
        capsys.readouterr().out.strip()
        == f"the study's runs: http://127.0.0.1:5123/#/experiments/{experiment_id}/runs"
    )
    (argv,) = became
    assert argv[1:] == ["-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", "127.0.0.1", "--port", "5123"]


@pytest.mark.parametrize("store", ["missing", "of another study"])
def test_ui_over_a_store_without_the_study_says_what_to_run(store, tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    if store == "of another study":
        from mlflow.tracking import MlflowClient

        MlflowClient(tracking_uri=uri).create_experiment("another-study")
        capsys.readouterr()

    assert main(["ui", "--config", SMOKE, "--tracking-uri", uri]) == 2

    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    says = "no tracking store at" if store == "missing" else "no experiment 'vlbert-ablation-smoke'"
    assert says in err and "make reproduce" in err
    assert (tmp_path / "mlflow.db").exists() == (store != "missing")  # nothing created where nothing was


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_the_printed_address_is_served_and_only_on_loopback(tmp_path):
    uri, experiment_id = _store_with_the_study(tmp_path)
    port = _free_port()
    ui = subprocess.Popen(
        [sys.executable, "-m", "vlbert.cli", "ui", "--config", SMOKE, "--tracking-uri", uri, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=tmp_path,
    )
    try:
        printed = ui.stdout.readline().strip()
        assert printed == f"the study's runs: http://127.0.0.1:{port}/#/experiments/{experiment_id}/runs"
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{base}/", timeout=5) as page:
                    assert page.status == 200
                break
            except OSError:
                assert time.monotonic() < deadline, "mlflow ui did not answer in 120 s"
                time.sleep(0.5)
        query = f"{base}/ajax-api/2.0/mlflow/experiments/get-by-name?experiment_name=vlbert-ablation-smoke"
        with urllib.request.urlopen(query, timeout=10) as answer:
            assert json.load(answer)["experiment"]["experiment_id"] == experiment_id
        server = psutil.Process(ui.pid)
        listening = {
            conn.laddr.ip
            for proc in [server, *server.children(recursive=True)]
            for conn in proc.net_connections(kind="inet")
            if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port
        }
        assert listening == {"127.0.0.1"}
    finally:
        for proc in psutil.Process(ui.pid).children(recursive=True):
            proc.kill()
        ui.kill()
        ui.wait()
