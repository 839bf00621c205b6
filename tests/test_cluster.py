"""The cluster path, run for real (`make test-cluster`): the smoke study submitted job by job to a
one-node SLURM cluster by Snakemake's SLURM executor, its sweeps on a Ray head by address, its
runs tracked on an MLflow server over PostgreSQL (tests/local_cluster.py starts them all)."""

import io
import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import REPO, snakemake_command, snakemake_failure
from local_cluster import PARTITION, LocalCluster, why_unavailable

from vlbert import registry
from vlbert.config import study_settings
from vlbert.engine.checkpoint import STATE_FILE

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SMOKE = yaml.safe_load((REPO / "experiments/smoke.yaml").read_text())
# The one-machine run's threads per rule: the thread count changes the numbers (the smoke detector's
# weights part by up to 0.1 between one thread and two), so the cluster's jobs take the same.
LOCAL_THREADS = yaml.safe_load((REPO / "workflow/profiles/default/config.yaml").read_text())["set-threads"]
SACCT_COLUMNS = "JobID,JobName,Comment,State,ExitCode,Elapsed,AllocCPUS,ReqMem"


# First: the module's cluster is not up yet.
def test_a_cluster_that_cannot_start_leaves_nothing_behind(monkeypatch):
    import psutil

    why = why_unavailable()
    if why:
        pytest.skip(f"no local cluster: {why}")

    def fail(self):
        raise RuntimeError("the Ray head cannot start")

    monkeypatch.setattr(LocalCluster, "_start_ray", fail)
    before = {p.pid for p in psutil.process_iter()}
    with pytest.raises(RuntimeError, match="Ray head"), LocalCluster():
        pass
    new = [p for p in psutil.process_iter(["name"]) if p.pid not in before and p.info["name"] != "pytest"]
    names = {p.info["name"] for p in new if p.is_running()}
    assert not names & {"munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd", "postgres"}, names
    assert not list(Path("/tmp").glob("vlbert-cluster-*")) and not Path("/etc/slurm/slurm.conf").exists()


@pytest.fixture(scope="module")
def cluster():
    why = why_unavailable()
    if why:
        pytest.skip(f"no local cluster: {why}")
    with LocalCluster() as running:
        yield running
    leftovers = [p for p in Path("/tmp").glob("vlbert-cluster-*")]
    assert not leftovers and not Path("/etc/slurm/slurm.conf").exists(), leftovers


def edited_profile(cluster, folder: Path) -> Path:
    """workflow/profiles/slurm as docs/cluster.md tells a user to edit it: the partition, memory and
    cores per rule for this cluster's one node (the one-machine run's threads, so that the numbers
    can be compared); and, for jobs that last seconds, the first status check after one second
    instead of forty."""
    profile = yaml.safe_load((REPO / "workflow/profiles/slurm/config.yaml").read_text())
    profile["default-resources"].update(slurm_partition=PARTITION, mem_mb=2000, runtime=60)
    for resources in profile["set-resources"].values():
        resources.update(slurm_partition=PARTITION, mem_mb=2000)
        resources.pop("runtime", None)
    assert set(profile["set-threads"]) == set(LOCAL_THREADS)
    profile["set-threads"] = LOCAL_THREADS
    profile.update({"jobs": 4, "latency-wait": 5, "slurm-init-seconds-before-status-checks": 1})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    return folder


def cluster_preset(cluster, path: Path, **changes) -> Path:
    """The smoke preset with its sweeps on the Ray head and its runs on the tracking server, and
    each store extracted in two chunks (two SLURM jobs a split; the stores come out the same)."""
    preset = {
        **SMOKE,
        "features": {**SMOKE["features"], "chunks": 2},
        "sweep": {**SMOKE["sweep"], "address": cluster.ray_address},
        "tracking": {**SMOKE["tracking"], "uri": cluster.tracking_uri},
        **changes,
    }
    path.write_text(yaml.safe_dump(preset, sort_keys=False))
    return path


def snakemake(cluster, workdir: Path, profile: Path, preset: Path, *targets) -> subprocess.Popen:
    env = {**cluster.env, "PATH": f"{Path(sys.executable).parent}:{cluster.env['PATH']}"}
    command = snakemake_command(profile, "--configfile", str(preset), "--directory", str(workdir), *targets)
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def sacct(*args) -> pd.DataFrame:
    """The cluster's jobs as `sacct -X` lists them (the comment names each job's rule)."""
    command = ["sacct", "-X", "--parsable2", f"--format={SACCT_COLUMNS}", *args]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return pd.read_csv(io.StringIO(out), sep="|", dtype=str, keep_default_na=False)


@pytest.fixture(scope="module")
def cluster_run(cluster, tmp_path_factory):
    folder = tmp_path_factory.mktemp("cluster_run")
    profile = edited_profile(cluster, folder / "profile")
    preset = cluster_preset(cluster, folder / "smoke.yaml")
    workdir = folder / "study"
    started = time.time()
    process = snakemake(cluster, workdir, profile, preset)
    log, _ = process.communicate(timeout=2400)
    seconds = time.time() - started
    (folder / "snakemake.log").write_text(log)
    assert process.returncode == 0, snakemake_failure(log, workdir)
    print(f"the smoke study through SLURM: {seconds:.0f} s\n{sacct().to_string(index=False)}")
    return {"dir": workdir, "log": log, "seconds": seconds, "profile": profile, "preset": preset}


def test_the_study_through_slurm_gives_the_one_machine_tables(cluster_run, smoke_run):
    for table in ("table4.csv", "systems.csv"):
        here = pd.read_csv(smoke_run["dir"] / "reports/smoke" / table)
        there = pd.read_csv(cluster_run["dir"] / "reports/smoke" / table)
        pd.testing.assert_frame_equal(there, here, check_exact=True, obj=table)


def test_every_job_was_an_sbatch_job_that_sacct_knows(cluster_run):
    submitted = cluster_run["log"].count("has been submitted with SLURM jobid")
    stats = cluster_run["log"].split("Job stats:")[1].split("\n\n")[0]
    total = int(next(line.split()[1] for line in stats.splitlines() if line.startswith("total")))
    assert submitted == total - 1  # all but the local `all`
    jobs = sacct()
    assert len(jobs) >= submitted
    assert (jobs.tail(submitted)["State"] == "COMPLETED").all(), jobs.tail(submitted)
    rules = {comment.split("_wildcards")[0].removeprefix("rule_") for comment in jobs["Comment"]}
    assert {"make_data", "train_detector", "pretrain", "sweep", "finetune_seeds", "report"} <= rules


def _rest(base: str, path: str, payload: dict | None = None) -> dict:
    data = json.dumps(payload).encode() if payload is not None else None
    request = urllib.request.Request(f"{base}{path}", data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_every_run_is_in_postgresql(cluster, cluster_run, smoke_run):
    import psycopg2
    from mlflow.tracking import MlflowClient

    base = f"{cluster.tracking_uri}/api/2.0/mlflow"
    experiment = _rest(base, f"/experiments/get-by-name?experiment_name={SMOKE['tracking']['experiment']}")
    runs, token = [], None
    while True:
        page = _rest(
            base,
            "/runs/search",
            {"experiment_ids": [experiment["experiment"]["experiment_id"]], "max_results": 1000}
            | ({"page_token": token} if token else {}),
        )
        runs += page.get("runs", [])
        token = page.get("next_page_token")
        if not token:
            break

    def key(tags: dict) -> tuple:
        return tuple(tags.get(name, "") for name in ("stage", "setting", "task", "seed", "lr"))

    served = sorted(key({t["key"]: t["value"] for t in run["data"].get("tags", [])}) for run in runs)
    local = MlflowClient(f"sqlite:///{smoke_run['dir'] / 'results/smoke/mlflow.db'}")
    local_experiment = local.get_experiment_by_name(SMOKE["tracking"]["experiment"])
    local_runs = local.search_runs([local_experiment.experiment_id], max_results=5000)
    expected = sorted(key(run.data.tags) for run in local_runs)
    assert served == expected
    tags = [{t["key"]: t["value"] for t in run["data"]["tags"]} for run in runs]
    # the whole-set runs (the data-fraction runs carry a train_fraction tag)
    finetunes = [t for t in tags if t.get("stage") == "finetune" and "train_fraction" not in t]
    tasks = [task for setting in study_settings(SMOKE) for task in registry.finetune_tasks(setting)]
    assert len(finetunes) == len(tasks) * len(SMOKE["sweep"]["seeds"])
    # The server's store is PostgreSQL: the same runs, counted in its own table.
    with psycopg2.connect(cluster.postgres_uri) as connection, connection.cursor() as cursor:
        experiment_id = experiment["experiment"]["experiment_id"]
        cursor.execute("SELECT count(*) FROM runs WHERE experiment_id = %s", (experiment_id,))
        assert cursor.fetchone()[0] == len(runs)


def test_the_sweeps_ran_their_trials_on_the_ray_head(cluster, cluster_run):
    logs = cluster.folder / "ray" / "session_latest" / "logs"
    drivers = list(logs.glob("python-core-driver-*.log"))
    sweeps = len(re.findall(r"^rule sweep(_table4_tasks)?:", cluster_run["log"], re.M))
    assert len(drivers) >= sweeps > 0
    assert list(logs.glob("worker-*.out")), "no trial ran in a worker of the head"


def test_a_cancelled_pretraining_job_is_resubmitted_and_resumes_from_its_checkpoint(cluster, cluster_run, tmp_path):
    """scancel in the middle of a pre-training: Snakemake submits the job again (the profile's
    `retries`) and the new job resumes the checkpoint that the cancelled one wrote."""
    workdir = cluster_run["dir"]
    # Longer pre-training of one setting than the smoke preset's, so that there is a middle.
    preset = cluster_preset(cluster, tmp_path / "smoke.yaml", pretrain={**SMOKE["pretrain"], "epochs": 40})
    target = "results/smoke/pretrain/a/best/model.safetensors"
    state = workdir / "results/smoke/pretrain/a/checkpoint" / STATE_FILE
    started = time.time()
    process = snakemake(cluster, workdir, cluster_run["profile"], preset, target)
    cancelled = None
    while process.poll() is None and cancelled is None:
        if state.exists() and state.stat().st_mtime > started:
            running = subprocess.run(
                ["squeue", "-h", "-t", "RUNNING", "-o", "%i %k"], capture_output=True, text=True
            ).stdout.split()
            if running and "pretrain" in running[1]:
                cancelled = running[0]
                subprocess.run(["scancel", cancelled], check=True)
        time.sleep(0.2)
    log, _ = process.communicate(timeout=1200)
    assert cancelled, f"the pre-training ended before it could be cancelled:\n{log[-4000:]}"
    assert process.returncode == 0, snakemake_failure(log, workdir)
    assert f"SLURM-job '{cancelled}' failed" in log and "Trying to restart job" in log, log[-4000:]
    pretrain_log = (workdir / "results/smoke/logs/pretrain/a.log").read_text()
    assert "resuming from" in pretrain_log, pretrain_log[-3000:]
    jobs = sacct()
    after = jobs[jobs["JobID"].astype(int) >= int(cancelled)]
    print(f"{after.to_string(index=False)}\n{next(line for line in pretrain_log.splitlines() if 'resuming' in line)}")
    assert list(after["State"].str.split().str[0]) == ["CANCELLED", "COMPLETED"], after
    assert (workdir / target).stat().st_mtime > started
