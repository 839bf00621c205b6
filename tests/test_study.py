"""The one-command study on the smoke preset: the DAG end to end, the report, MLflow over REST."""

import json
import re
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml
from conftest import REPO, SNAKEMAKE

from vlbert import registry
from vlbert.config import study_settings

SMOKE = yaml.safe_load((REPO / "experiments/smoke.yaml").read_text())
SEEDS = len(SMOKE["sweep"]["seeds"])
SETTINGS = study_settings(SMOKE)  # every system's rows: VL-BERT's Table 4 and the systems table
# Whole-set fine-tuning runs: every setting on each of its tasks (registry.finetune_tasks), each seed.
FINETUNE_RUNS = sum(len(registry.finetune_tasks(setting)) for setting in SETTINGS) * SEEDS


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, payload: dict | None = None) -> dict:
    data = json.dumps(payload).encode() if payload is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_no_file_the_dag_writes_is_committed():
    """A fresh clone must run the study, not find it done: the committed reference reports live
    outside every preset's results/ and reports/<preset>/ folders."""
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    presets = [yaml.safe_load(path.read_text())["name"] for path in (REPO / "experiments").glob("*.yaml")]
    outputs = ["results/"] + [f"reports/{name}/" for name in presets]
    assert presets and not [path for path in tracked if path.startswith(tuple(outputs))]


def _rule_threads() -> dict[str, str]:
    """Each workflow rule's `threads:` as written (a `use rule ... as ... with:` inherits its source's)."""
    threads, sources = {}, {}
    for path in sorted((REPO / "workflow" / "rules").glob("*.smk")):
        text = path.read_text()
        for match in re.finditer(r"^(?:rule (\w+):|use rule (\w+) as (\w+) with:)\n((?:[ \t]+.*\n|\n)*)", text, re.M):
            name = match.group(1) or match.group(3)
            declared = re.search(r"^\s+threads: (.+)$", match.group(4), re.M)
            if declared:
                threads[name] = declared.group(1).strip()
            if match.group(2):
                sources[name] = match.group(2)
    for name, source in sources.items():
        threads.setdefault(name, threads.get(source, "1"))
    return threads


def test_the_default_profile_runs_every_job_on_one_thread():
    """A job that takes both cores of a 2-core laptop runs alone: the per-seed pre-trainings, before
    the profile named them, ran one at a time with nothing beside them for 45 of a Table 4 run's 128
    minutes. Every rule that may take more than one thread is named in both profiles."""
    threads = _rule_threads()
    assert {"pretrain", "pretrain_seed", "tune_features_seed", "sweep"} <= set(threads)
    profiles = REPO / "workflow" / "profiles"
    default = yaml.safe_load((profiles / "default" / "config.yaml").read_text())["set-threads"]
    slurm = yaml.safe_load((profiles / "slurm" / "config.yaml").read_text())["set-threads"]
    more_than_one = {name for name, value in threads.items() if value != "1"}
    assert more_than_one <= set(default), sorted(more_than_one - set(default))
    assert all(default[name] == 1 for name in more_than_one)
    assert set(slurm) == set(default)


@pytest.mark.slow
def test_the_smoke_study_s_mlflow_store_opens_on_its_training_runs(smoke_run):
    """What a user sees in the MLflow UI of a whole study: the experiment tagged as model training,
    no sweep trial that finished marked KILLED, every fine-tuning run with its data sets as inputs
    and its reported-split accuracy as a metric."""
    from mlflow.tracking import MlflowClient

    from vlbert.tracking import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG

    client = MlflowClient(f"sqlite:///{smoke_run['dir'] / 'results' / 'smoke' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(SMOKE["tracking"]["experiment"])
    assert experiment.tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
    runs = client.search_runs([experiment.experiment_id], max_results=5000)
    by_stage = {}
    for run in runs:
        by_stage.setdefault(run.data.tags.get("stage"), []).append(run)
    trials = by_stage["sweep_trial"]
    assert trials and all(run.info.status == "FINISHED" for run in trials), {r.info.status for r in trials}
    finetunes = [run for run in by_stage["finetune"] if run.info.status == "FINISHED"]
    assert len(finetunes) >= FINETUNE_RUNS
    for run in finetunes:
        contexts = {{t.key: t.value for t in d.tags}.get("mlflow.data.context") for d in run.inputs.dataset_inputs}
        assert {"training", "validation", "test"} <= contexts, run.info.run_name
        assert "final_test_accuracy" in run.data.metrics, run.info.run_name
        assert {"setting", "task", "seed", "family"} <= set(run.data.tags), run.info.run_name


@pytest.mark.slow
def test_smoke_study_writes_the_report(smoke_run):
    report = smoke_run["dir"] / "reports" / "smoke"
    table = (report / "table4.md").read_text()
    for setting in ("no_pretrain", "a", "b", "c", "d", "full"):
        assert f"| {setting} |" in table
    assert "recalled" in table  # the paper's numbers carry their provenance
    findings = json.loads((report / "findings.json").read_text())
    assert [f["id"] for f in findings] == [
        "pretrain_helps",
        "mlm_helps",
        "mrc_helps_ref",
        "sirp_hurts",
        "text_helps",
        "tune_frcnn_helps",
    ]
    for name in ("table4_bars", "delta_heatmap", "lr_sweeps", "pretraining_loss", "pretraining_grounding"):
        assert (report / "figures" / f"{name}.png").stat().st_size > 10_000
    # Each pre-trained setting's masked words, with its own images and another's, read from MLflow.
    pretraining = (report / "pretraining.md").read_text()
    rows = {
        line.split("|")[1].strip(): line.split("|")[2:5] for line in pretraining.splitlines() if line.startswith("| ")
    }
    for setting in ("a", "b", "c", "d", "full"):
        own, other, gain = (float(cell) for cell in rows[setting])
        assert gain == pytest.approx(own - other, abs=0.11)
        # and per word kind, from the grounding probe's last epoch, with the attention share on [IMG]
        section = pretraining.split(f"### {setting}\n")[1].split("###")[0]
        kinds = {
            line.split("|")[1].strip(): line.split("|")[2:7]
            for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| kind")
        }
        assert set(kinds) == {"colour", "shape", "size"}
        for own, other, gain, chance, n in ((float(c) for c in cells) for cells in kinds.values()):
            assert 0 <= own <= 100 and 0 <= other <= 100 and 0 < chance < 100 and n > 0
            assert gain == pytest.approx(own - other, abs=0.11)
        assert "Attention on [IMG]" in section
    import pandas as pd

    runs = pd.read_csv(report / "runs.csv")
    finetunes = runs[(runs["stage"] == "finetune") & (runs["status"] == "FINISHED")]
    assert len(finetunes[finetunes["train_fraction"] == 1]) == FINETUNE_RUNS
    # finetune.data_fractions: its settings on each share of every Table 4 task's training set
    shares = SMOKE["finetune"]["data_fractions"]
    fraction_runs = finetunes[finetunes["train_fraction"] < 1]
    assert (
        len(fraction_runs) == len(shares["fractions"]) * len(shares["settings"]) * len(registry.TABLE4_TASKS) * SEEDS
    )
    assert "| VQA | 50% |" in (report / "data_fractions.md").read_text()
    assert (report / "figures" / "data_fractions.png").stat().st_size > 10_000
    # Table 4's controls: every cell beside its shuffled-image score and blind floor
    controls = pd.read_csv(report / "table4_controls.csv")
    assert len(controls) == 6 * len(registry.TABLE4_TASKS) and controls["shuffled"].notna().all()
    assert controls["floor"].notna().all() and controls["se"].notna().all()
    # RefCOCO+'s two tracks, per test split: the detected one for every setting, the ground-truth
    # one for the settings that fine-tune it
    refcoco = pd.read_csv(report / "refcoco.csv").set_index("setting")
    assert sorted(refcoco.index) == sorted(SETTINGS)
    assert refcoco[["refcoco_det_testA", "refcoco_det_testB"]].notna().all().all()
    on_gt = [s for s in SETTINGS if "refcoco_gt" in registry.finetune_tasks(s)]
    assert on_gt and refcoco.loc[on_gt, ["refcoco_gt_testA", "refcoco_gt_testB"]].notna().all().all()
    assert refcoco.drop(on_gt)["refcoco_gt_n"].eq(0).all()
    systems = (report / "systems.md").read_text()
    for setting in ("no_pretrain", "c", "full", "vilbert_no_pretrain", "vilbert", "pixelbert_no_sampling"):
        assert f"| {setting} |" in systems, setting
    assert (report / "figures" / "systems.png").stat().st_size > 10_000
    csv = pd.read_csv(report / "table4.csv").set_index("setting")
    assert (csv["vqa_n"] == SEEDS).all()


@pytest.mark.slow
def test_up_to_date_study_does_nothing_quickly(smoke_run):
    started = time.time()
    result = subprocess.run(
        SNAKEMAKE + ["--configfile", str(REPO / "experiments/smoke.yaml"), "--directory", str(smoke_run["dir"])],
        capture_output=True,
        text=True,
        env=smoke_run["env"],
    )
    assert result.returncode == 0 and "Nothing to be done" in result.stderr + result.stdout
    assert time.time() - started < 10


def _dry_run_over_smoke(smoke_run, preset: dict, tmp_path) -> subprocess.CompletedProcess:
    """`snakemake -n` of the finished smoke study under a changed preset: what it would re-run."""
    changed = tmp_path / "smoke.yaml"
    changed.write_text(yaml.safe_dump(preset))
    result = subprocess.run(
        SNAKEMAKE + ["-n", "--configfile", str(changed), "--directory", str(smoke_run["dir"])],
        capture_output=True,
        text=True,
        env=smoke_run["env"],
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.slow
def test_changing_one_setting_reruns_only_what_depends_on_it(smoke_run, tmp_path):
    preset = yaml.safe_load((REPO / "experiments/smoke.yaml").read_text())
    preset["finetune"]["vqa"]["batch_size"] = 4
    result = _dry_run_over_smoke(smoke_run, preset, tmp_path)
    table = result.stdout.split("Job stats:")[1].split("\n\n")[0]
    jobs = {
        line.split()[0]: int(line.split()[1])
        for line in table.splitlines()
        if len(line.split()) == 2 and line.split()[1].isdigit()
    }
    # The sweep and fine-tuning jobs of every setting (one job per setting and stage), the
    # data-fraction runs (one job per setting and share), then the report.
    # The settings whose family fine-tunes Table 4's tasks alone have rules of their own.
    table4_only = sum(registry.finetune_tasks(s) == registry.TABLE4_TASKS for s in SETTINGS)
    n, k = len(SETTINGS) - table4_only, table4_only
    shares = SMOKE["finetune"]["data_fractions"]
    f = len(shares["fractions"]) * len(shares["settings"])
    assert n and k
    assert jobs == {
        "sweep": n,
        "finetune_seeds": n,
        "sweep_table4_tasks": k,
        "finetune_seeds_table4_tasks": k,
        "finetune_fractions": f,
        "report": 1,
        "all": 1,
        "total": 2 * (n + k) + f + 2,
    }, result.stdout[-2000:]


@pytest.mark.slow
def test_a_model_family_s_own_entries_rerun_its_settings_alone(smoke_run, tmp_path):
    # ViLBERT's own VCR rate and its poolers drawn new in RefCOCO+ too: its two settings' sweep and
    # seeds jobs, and no VL-BERT or Pixel-BERT job.
    preset = yaml.safe_load((REPO / "experiments/smoke.yaml").read_text())
    preset["finetune"]["vcr"]["families"] = {"vilbert": {"lr": 1.0e-2}}
    preset["finetune"]["refcoco"]["reinitialise"] = {"vilbert": ["text_pooler"]}
    result = _dry_run_over_smoke(smoke_run, preset, tmp_path)
    blocks = re.split(r"^(?:local)?rule ", result.stdout, flags=re.M)[1:]
    settings = {re.search(r"wildcards: setting=(\w+)", b)[1] for b in blocks if "wildcards: setting=" in b}
    assert settings == {"vilbert", "vilbert_no_pretrain"}, result.stdout[-3000:]
    rules = {re.match(r"\w+", b)[0] for b in blocks}
    assert rules == {"sweep_table4_tasks", "finetune_seeds_table4_tasks", "report", "all"}


@pytest.mark.slow
def test_mlflow_server_serves_every_run_with_tags_metrics_and_checkpoint(smoke_run, tmp_path):
    store = smoke_run["dir"] / "results" / "smoke" / "mlflow.db"
    port = _free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--backend-store-uri",
            f"sqlite:///{store}",
            "--workers",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=smoke_run["dir"],
    )
    base = f"http://127.0.0.1:{port}/api/2.0/mlflow"
    try:
        deadline = time.time() + 90
        while True:
            try:
                experiment = _get(f"{base}/experiments/get-by-name?experiment_name=vlbert-ablation-smoke")[
                    "experiment"
                ]
                break
            except OSError:
                assert time.time() < deadline and server.poll() is None, "mlflow server did not come up"
                time.sleep(1)
        runs, token = [], None
        while True:
            page = _get(
                f"{base}/runs/search",
                {
                    "experiment_ids": [experiment["experiment_id"]],
                    "max_results": 500,
                    **({"page_token": token} if token else {}),
                },
            )
            runs += page.get("runs", [])
            token = page.get("next_page_token")
            if not token:
                break
        tags = lambda run: {t["key"]: t["value"] for t in run["data"].get("tags", [])}
        finetunes = [
            r
            for r in runs
            if tags(r).get("stage") == "finetune"
            and r["info"]["status"] == "FINISHED"
            and "train_fraction" not in tags(r)  # the data-fraction runs: counted by the report's test
        ]
        assert len(finetunes) == FINETUNE_RUNS
        seen = set()
        for run in finetunes:
            t = tags(run)
            seen.add((t["setting"], t["task"], t["seed"]))
            assert t["preset"] == "smoke" and t["git_commit"]
            metrics = {m["key"] for m in run["data"]["metrics"]}
            assert {"final_val_accuracy", "final_test_accuracy", "loss"} <= metrics
            listed = _get(f"{base}/artifacts/list?run_id={run['info']['run_id']}&path=checkpoint")
            assert "checkpoint/model.safetensors" in {f["path"] for f in listed.get("files", [])}
        assert len(seen) == FINETUNE_RUNS
        stages = {tags(r).get("stage") for r in runs}
        assert {"detector", "bert_init", "pretrain", "sweep", "sweep_trial", "finetune"} <= stages
        sweeps = {r["info"]["run_id"] for r in runs if tags(r).get("stage") == "sweep"}
        assert all(tags(r)["mlflow.parentRunId"] in sweeps for r in runs if tags(r).get("stage") == "sweep_trial")
    finally:
        server.terminate()
        server.wait(timeout=30)


def _training_jobs(snakemake) -> list:
    """The study's running training jobs (`vlbert pretrain|sweep|finetune` under Snakemake)."""
    import psutil

    jobs = []
    for process in psutil.Process(snakemake.pid).children(recursive=True):
        try:
            cmdline = process.cmdline()
        except psutil.Error:
            continue
        if any(part.endswith("vlbert") for part in cmdline) and {"pretrain", "sweep", "finetune"} & set(cmdline):
            jobs.append(process)
    return jobs


# The chains the killed study is asked for: `full` (pre-training, tuned features, sweep, seeds:
# every kind of training job) and `no_pretrain` beside it on the other core.
KILLED_SETTINGS = ("full", "no_pretrain")


def _run_metrics(workdir, setting: str) -> dict:
    """A setting's seed runs' metrics, less the time they waited for data (a timing)."""
    from pathlib import Path

    from vlbert.layout import Layout

    found = {}
    for path in sorted(Path(workdir, Layout(SMOKE["name"]).finetune(setting)).glob("*/seed*/metrics.json")):
        metrics = json.loads(path.read_text())
        metrics.pop("data_wait_share", None)
        found[str(path.relative_to(workdir))] = metrics
    return found


@pytest.mark.slow
def test_a_study_killed_at_a_random_moment_finishes_with_the_same_results(smoke_run, tmp_path):
    """SIGKILL to Snakemake at a random moment, then SIGKILL to one of its jobs (a training step in
    the middle of its work); each time the same command (after --unlock) heals the study, and every
    run it made scores what the uninterrupted run's did, to the digit. The study starts from the
    uninterrupted run's data, detector, feature stores and BERT (with Snakemake's records of them,
    so they are up to date), and is asked for two settings' chains from pre-training on (a killed
    extraction heals in tests/test_detection.py)."""
    import csv
    import os
    import random
    import shutil
    import signal

    import psutil

    from vlbert.layout import Layout

    seed = int(os.environ.get("VLBERT_KILL_SEED", random.randrange(1_000_000)))
    rng = random.Random(seed)
    print(f"kill moments drawn with VLBERT_KILL_SEED={seed}")
    # VL-BERT's rows alone, and no data-fraction runs: healing is the DAG's, whichever families and
    # runs there are.
    preset = tmp_path / "smoke.yaml"
    finetune = {k: v for k, v in SMOKE["finetune"].items() if k != "data_fractions"}
    preset.write_text(yaml.safe_dump({**SMOKE, "systems": ["vlbert"], "finetune": finetune}))
    layout = Layout(SMOKE["name"])
    done, results = smoke_run["dir"], layout.results
    for made in ("data", "detector", "bert_init"):
        shutil.copytree(done / results / made, tmp_path / results / made, symlinks=True)
    untuned = shutil.ignore_patterns("tuned")  # made after pre-training
    shutil.copytree(done / results / "features", tmp_path / results / "features", ignore=untuned)
    shutil.copy2(done / results / "floors.json", tmp_path / results / "floors.json")
    shutil.copytree(done / ".snakemake" / "metadata", tmp_path / ".snakemake" / "metadata")
    targets = [
        str(layout.finetune_run(setting, task, s) / "metrics.json")
        for setting in KILLED_SETTINGS
        for task in registry.TASKS
        for s in SMOKE["sweep"]["seeds"]
    ]
    command = [*SNAKEMAKE, *targets, "--configfile", str(preset), "--directory", str(tmp_path)]
    # How long the `full` chain took in the uninterrupted run (its jobs' benchmark files).
    benchmarks = done / results / "benchmarks"
    chain = [f"{stage}/full.tsv" for stage in ("pretrain", "tune_features", "sweep", "finetune_seeds")]
    chain_seconds = sum(
        float(next(csv.DictReader((benchmarks / name).read_text().splitlines(), delimiter="\t"))["s"])
        for name in chain
    )

    def start():
        log = (tmp_path / "snakemake.log").open("a")
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=smoke_run["env"])

    # 1. Snakemake itself, killed at a random moment; its jobs run on as orphans, as after `kill -9`.
    snakemake = start()
    time.sleep(rng.uniform(0.05, 0.6) * chain_seconds)
    jobs = psutil.Process(snakemake.pid).children(recursive=True)
    snakemake.send_signal(signal.SIGKILL)
    snakemake.wait()
    psutil.wait_procs(jobs, timeout=600)
    subprocess.run(command + ["--unlock"], check=True, capture_output=True, env=smoke_run["env"])

    # 2. One of its jobs, killed in the middle of its work: the first training job seen running.
    snakemake = start()
    victim = None
    while victim is None and snakemake.poll() is None:
        running = _training_jobs(snakemake)
        if running:
            time.sleep(rng.uniform(1, 5))
            try:
                family = [running[0]] + running[0].children(recursive=True)
                running[0].send_signal(signal.SIGKILL)
                victim = running[0]
            except psutil.NoSuchProcess:  # it ended in the meantime: the next one
                continue
            for process in family[1:]:
                try:
                    process.send_signal(signal.SIGKILL)
                except psutil.NoSuchProcess:
                    pass
        time.sleep(0.5)
    snakemake.wait(timeout=1200)
    assert victim is not None, f"the study ended before a training job could be killed (VLBERT_KILL_SEED={seed})"

    # 3. The same command again finishes the study.
    result = subprocess.run(command, capture_output=True, text=True, env=smoke_run["env"], timeout=1200)
    assert result.returncode == 0, result.stderr[-5000:]
    for setting in KILLED_SETTINGS:
        healed, reference = _run_metrics(tmp_path, setting), _run_metrics(done, setting)
        assert len(healed) == len(registry.TASKS) * SEEDS, sorted(healed)
        assert healed == reference, f"{setting}: VLBERT_KILL_SEED={seed}"


def test_paper_dry_run_scatters_extraction_into_chunks(tmp_path):
    """At paper scale each split's extraction is `features.chunks` jobs (a GPU each on a cluster),
    gathered by one index job a store."""
    paper = yaml.safe_load((REPO / "experiments/paper.yaml").read_text())
    chunks = paper["features"]["chunks"]
    # The given detectron2 model's files are the describe_detector job's inputs: they must exist.
    for key, name in (("config", "c4.yaml"), ("weights", "model.pkl")):
        (tmp_path / name).write_text("given")
        paper["detector"]["detectron2"][key] = str(tmp_path / name)
    (tmp_path / "paper.yaml").write_text(yaml.safe_dump(paper))
    result = subprocess.run(
        SNAKEMAKE + ["-n", "--configfile", str(tmp_path / "paper.yaml"), "--directory", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    commands = [line for line in result.stdout.splitlines() if line.startswith("Shell command: vlbert extract-rois")]
    by_store: dict[str, set[str]] = {}
    for command in commands:
        out = command.split("--out ")[1].split()[0]
        by_store.setdefault(out.rsplit("/", 1)[1], set()).add(command.split("--chunk ")[1].split()[0])
    assert chunks > 1 and set(by_store) == {f"{store.name}.h5" for store in registry.FEATURE_STORES}
    assert all(found == {f"{k}-of-{chunks}" for k in range(1, chunks + 1)} for found in by_store.values())
    assert all("--device cuda" in command for command in commands)
    indexes = [line for line in result.stdout.splitlines() if line.startswith("Shell command: vlbert index-store")]
    assert len(indexes) == len(by_store) and all(line.count("chunk_") == chunks for line in indexes)


def _dry_run_in_empty_folder(tmp_path, preset: dict) -> subprocess.CompletedProcess:
    """`snakemake -n` of a changed preset in an empty folder: whether the DAG accepts it."""
    path = tmp_path / "preset.yaml"
    path.write_text(yaml.safe_dump(preset))
    return subprocess.run(
        SNAKEMAKE + ["-n", "--configfile", str(path), "--directory", str(tmp_path / "run")],
        capture_output=True,
        text=True,
    )


def test_dry_run_refuses_a_non_finite_rate(tmp_path):
    """The DAG validates as the CLI does: a NaN rate passes the schema's bounds."""
    result = _dry_run_in_empty_folder(tmp_path, {**SMOKE, "pretrain": {**SMOKE["pretrain"], "lr": float("nan")}})
    assert result.returncode != 0 and "pretrain.lr: nan is not a finite number" in result.stdout + result.stderr


def test_dry_run_refuses_a_data_root_at_a_system_path(tmp_path):
    # Seen: `root: /` planned `vlbert make-data --out //`.
    result = _dry_run_in_empty_folder(tmp_path, {**SMOKE, "data": {**SMOKE["data"], "root": "/"}})
    assert result.returncode != 0 and "data.root: / is a system folder" in result.stdout + result.stderr


def test_per_seed_pre_training_plans_each_later_seed_s_own_pre_training_and_features(tmp_path):
    """pretrain.per_seed: a pre-training (and, for full, tuned features) for every seed but the
    first, the seeds job waiting for them and given each seed's features; sweeps keep the setting's own."""
    preset = {
        **SMOKE,
        "pretrain": {**SMOKE["pretrain"], "per_seed": True},
        "sweep": {**SMOKE["sweep"], "seeds": [0, 4]},
    }
    result = _dry_run_in_empty_folder(tmp_path, preset)
    assert result.returncode == 0, result.stderr[-3000:]
    pretrained = [name for name in SETTINGS if registry.SETTINGS[name].pretrains]
    commands = [line for line in result.stdout.splitlines() if line.startswith("Shell command: ")]
    seeded = [c for c in commands if c.startswith("Shell command: vlbert pretrain") and "--seed 4" in c]
    assert sorted(c.split("--setting ")[1].split()[0] for c in seeded) == sorted(pretrained)
    assert all(f"--out results/smoke/pretrain/{c.split('--setting ')[1].split()[0]}/seed4 " in c for c in seeded)
    tuned = [c for c in commands if "tune-features" in c and "pretrain/full/seed4/best" in c]
    assert len(tuned) == 1 and "--out results/smoke/features/tuned/full/seed4 " in tuned[0]
    (seeds_full,) = [
        c for c in commands if "vlbert finetune" in c and "--setting full " in c and "--continue-trial" in c
    ]
    assert "--features results/smoke/features/tuned/full results/smoke/features/tuned/full/seed4 " in seeds_full
    (seeds_a,) = [c for c in commands if "vlbert finetune" in c and "--setting a " in c and "--continue-trial" in c]
    assert "--features results/smoke/features --bert" in seeds_a
