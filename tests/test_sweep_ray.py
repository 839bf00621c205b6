"""The sweeps' local Ray: it listens on 127.0.0.1 only, and a sweep, however it ends (returns,
fails, SIGTERM, SIGKILL, its Ray driver's process quitting after or before its trials), leaves no
Ray process and no temp folder of its Ray behind."""

import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import REPO


def _loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%")[0])
    return (getattr(address, "ipv4_mapped", None) or address).is_loopback


def _ray_processes(me=None) -> dict:
    """This process's descendants, by name: the local Ray it started (nothing else here spawns any)."""
    found = {}
    for process in (me or psutil.Process()).children(recursive=True):
        try:
            found[process] = process.name()
        except psutil.NoSuchProcess:
            pass
    return found


def _gone(processes, timeout=15.0) -> bool:
    _, alive = psutil.wait_procs(list(processes), timeout=timeout)
    return all(_dead(p) for p in alive)


def _dead(process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _end(processes) -> None:
    """Kill what a test's own Ray left (a failed assertion, a SIGKILL's orphaned agents)."""
    for process in processes:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass


def _temp_folders(pid: int) -> list[Path]:
    return sorted(Path("/tmp").glob(f"ray-vlbert-{pid}-*"))


def _sweep(tmp_path, monkeypatch, tune):
    """run_sweeps as `vlbert sweep` calls it, its Ray Tune run replaced by `tune` (module-level:
    it runs in the sweep's Ray driver process, and says what it saw in OUT/seen.json)."""
    from vlbert.engine.context import RunInputs
    from vlbert.study import sweep

    monkeypatch.setattr(sweep, "_tune", tune)
    preset = {"name": "t", "seed": 0, "finetune": {"vqa": {"epochs": 1}}, "sweep": {"lrs": [1e-3]}}
    return sweep.run_sweeps(
        preset,
        "no_pretrain",
        ["vqa"],
        tmp_path / "sweep",
        RunInputs(data_root=None, features_dir=None),
        cores=1,
    )


TRIALS = {"vqa": [{"lr": 1e-3, "best_val_accuracy": 50.0, "val_accuracy_by_epoch": [50.0], "error": None}]}


def _seen(tmp_path) -> dict:
    """What the driver's `tune` noted; `left`: those of its Ray's processes still here."""
    seen = json.loads((tmp_path / "sweep" / "seen.json").read_text())
    seen["left"] = []
    for pid, _, started in seen["processes"]:
        try:
            process = psutil.Process(pid)
            if process.create_time() == started:
                seen["left"].append(process)
        except psutil.NoSuchProcess:
            pass
    return seen


def _note(out, **seen) -> None:
    """What a driver's `tune` saw: its Ray's processes (pid, name), its temp folder, more."""
    import ray

    assert ray.get(ray.remote(lambda: os.getpid()).remote()) != os.getpid()  # a worker is up too
    processes = [(p.pid, name, p.create_time()) for p, name in _ray_processes().items()]
    folders = [str(f) for f in _temp_folders(os.getpid())]
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "seen.json").write_text(json.dumps({"processes": processes, "folders": folders, **seen}))


def tune_listing_what_listens(preset, setting_name, tasks, out, *args):
    time.sleep(2)  # the agents open theirs
    processes = [psutil.Process(), *_ray_processes()]  # the driver's core worker listens too
    bound = [
        (p.name(), c.laddr.ip, c.laddr.port)
        for p in processes  # TCP listening, UDP bound
        for c in p.net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN or not c.raddr
    ]
    _note(out, bound=bound)
    return TRIALS


def tune_returning(preset, setting_name, tasks, out, *args):
    _note(out)
    return TRIALS


def tune_failing(preset, setting_name, tasks, out, *args):
    _note(out)
    raise RuntimeError("a trial went wrong")


def tune_dying(preset, setting_name, tasks, out, *args):
    _note(out)
    os._exit(3)  # as Ray quits a driver, before its trials are in


# A driver killed mid-sweep waits out Ray's own teardown (seconds each): the slow tier's.
KILLED = pytest.mark.slow


@pytest.mark.parametrize(
    "ending",
    [
        "returns",
        "fails",
        pytest.param("driver_quits_after", marks=KILLED),
        pytest.param("driver_dies_before", marks=KILLED),
    ],
)
def test_a_sweep_leaves_no_ray_process_and_no_temp_folder_and_its_ray_listens_on_loopback_only(
    ending, tmp_path, monkeypatch, capsys
):
    # Seen in CI: Ray's driver ended its process with status 1 in ray.shutdown(), after the trials
    # (its log's last line: "The core worker process is not initialized yet or already shutdown").
    # The sweep that returns also lists what its Ray listens on (one Ray start fewer in the fast tier).
    tune = {"returns": tune_listing_what_listens, "driver_quits_after": tune_returning}.get(ending)
    if ending == "driver_quits_after":
        monkeypatch.setenv("VLBERT_FAULT_DRIVER_EXIT", "1")
    if ending == "fails":
        with pytest.raises(RuntimeError, match="a trial went wrong"):
            _sweep(tmp_path, monkeypatch, tune_failing)
    elif ending == "driver_dies_before":
        with pytest.raises(RuntimeError, match="ended with exit status 3 before its trials were done") as error:
            _sweep(tmp_path, monkeypatch, tune_dying)
        logs = tmp_path / "sweep" / "ray_driver_logs"
        assert str(logs) in str(error.value) and list(logs.glob("raylet.*"))  # kept, for a look
    else:
        assert _sweep(tmp_path, monkeypatch, tune)["vqa"]["lr"] == 1e-3
        quit_note = "the Ray driver ended with exit status 1 after handing over its trials"
        assert (quit_note in capsys.readouterr().err) == (ending == "driver_quits_after")
    seen = _seen(tmp_path)
    if ending == "returns":
        # Seen: during a sweep, gcs_server, raylet and the workers listened on every interface.
        assert {"gcs_server", "raylet"} <= {name for name, _, _ in seen["bound"]}, seen["bound"]
        assert [entry for entry in seen["bound"] if not _loopback(entry[1])] == []
    assert {"gcs_server", "raylet"} <= {name for _, name, _ in seen["processes"]}
    assert len(seen["folders"]) == 1
    assert _gone(seen["left"]) and not Path(seen["folders"][0]).exists()


HOLD_RAY = """
import os, sys, time
from vlbert.study.sweep import local_ray
import ray
with local_ray(cpus=1) as folder:
    worker_niceness = ray.get(ray.remote(lambda: os.nice(0)).remote())
    print(folder, worker_niceness == os.nice(0), flush=True)
    time.sleep(300)
"""


def _held_ray():
    """A process holding a local Ray as a sweep does; its Ray's processes and temp folder."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    holder = subprocess.Popen([sys.executable, "-c", HOLD_RAY], stdout=subprocess.PIPE, text=True, env=env)
    folder, same_priority = holder.stdout.readline().split()
    folder = Path(folder)
    assert folder.is_dir(), "the holder did not start its Ray"
    # Ray's default starts workers at niceness 15: beside another study job a trial would starve.
    assert same_priority == "True", "Ray's worker runs at another priority than the sweep"
    return holder, _ray_processes(psutil.Process(holder.pid)), folder


def test_a_terminated_sweep_leaves_nothing_behind():
    holder, processes, folder = _held_ray()
    try:
        holder.send_signal(signal.SIGTERM)
        holder.wait(timeout=60)
        assert _gone(processes) and not folder.exists()
    finally:
        holder.kill()
        _end(processes)


@pytest.mark.slow
def test_the_folder_of_a_killed_sweep_goes_with_the_next_one():
    # SIGKILL runs no code of the sweep's: Ray's GCS and raylet die with it (the kernel sees to
    # that), its folder stays until the next local Ray starts.
    from vlbert.study.sweep import local_ray

    holder, processes, folder = _held_ray()
    holder.kill()
    holder.wait()
    try:
        assert _gone([p for p, name in processes.items() if name in ("gcs_server", "raylet")])
        assert folder.exists()
        with local_ray(cpus=1):
            assert not folder.exists()
    finally:
        _end(processes)
