import os
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
sys.path.insert(0, str(FIXTURES))


def snakemake_command(profile: Path, *args: str) -> list[str]:
    """Snakemake on the repository's Snakefile, with a profile."""
    snakefile = str(REPO / "Snakefile")
    return [sys.executable, "-m", "snakemake", "--snakefile", snakefile, "--profile", str(profile), *args]


# As `make reproduce` runs it: the default profile (one thread per job), on two cores.
SNAKEMAKE = snakemake_command(REPO / "workflow/profiles/default", "--cores", "2")


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory):
    """The whole smoke study, run by Snakemake as `make reproduce PRESET=smoke` would."""
    workdir = tmp_path_factory.mktemp("smoke_run")
    env_bin = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{env_bin}:{os.environ['PATH']}"}
    result = subprocess.run(
        SNAKEMAKE + ["--configfile", str(REPO / "experiments/smoke.yaml"), "--directory", str(workdir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
    )
    assert result.returncode == 0, snakemake_failure(result.stderr, workdir)
    return {"dir": workdir, "env": env}


def snakemake_failure(output: str, workdir: Path, lines: int = 40) -> str:
    """What a failed Snakemake run says, then the end of each failed job's log: Snakemake names
    the logs but does not show them, and a CI machine keeps nothing else."""
    named = re.findall(r"^\s*log: (.+?) \(check log file", output, re.M)
    logs = dict.fromkeys(log for line in named for log in line.split(", "))
    parts = [output[-4000:]]
    for log in logs:
        path = Path(workdir) / log
        text = path.read_text(errors="replace").splitlines()[-lines:] if path.is_file() else ["(missing)"]
        parts.append(f"---- {log} (last {lines} lines) ----\n" + "\n".join(text))
    return "\n".join(parts)


@pytest.fixture(scope="session", autouse=True)
def migrated_mlflow_store(tmp_path_factory):
    """A new SQLite MLflow store gets its tables as a copy of one migrated once a session (SQLite's
    backup API, into the file the store just opened), not by running MLflow's ~40 migrations
    again: 1.4 s a store on 2 cores, and most tests that track open one of their own. The copy is
    the schema MLflow made, and MLflow verifies it as it opens any store. Only a database with no
    table at all is filled so; any other (an older schema, a half-made one) migrates as MLflow
    would. Jobs in subprocesses (the Snakemake studies) migrate their stores themselves."""
    import contextlib
    import sqlite3
    import threading

    import mlflow.store.db.utils as db_utils

    migrate = getattr(db_utils, "_initialize_tables", None)
    if migrate is None:  # another MLflow: every store migrates itself
        yield
        return
    template = tmp_path_factory.mktemp("mlflow_template") / "mlflow.db"
    lock = threading.Lock()

    def tables(database) -> int:
        with contextlib.closing(sqlite3.connect(database)) as db:
            return db.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0]

    def initialize_tables(engine):
        url = engine.url
        database = url.database if url.get_backend_name() == "sqlite" and not url.query else None
        if not database or database == ":memory:" or tables(database):
            return migrate(engine)
        with lock:
            if not template.is_file():  # made aside, then moved in whole: never a half-made template
                import sqlalchemy

                making = template.with_suffix(".making")
                made = sqlalchemy.create_engine(f"sqlite:///{making}")
                migrate(made)
                made.dispose()
                os.replace(making, template)
        with (
            contextlib.closing(sqlite3.connect(template)) as source,
            contextlib.closing(sqlite3.connect(database)) as target,
        ):
            source.backup(target)

    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(db_utils, "_initialize_tables", initialize_tables)
    yield
    monkeypatch.undo()


@pytest.fixture(scope="session")
def smoke_config():
    from vlbert.config import load_config

    return load_config(REPO / "experiments" / "smoke.yaml")


@pytest.fixture(scope="session")
def smoke_world(smoke_config, tmp_path_factory):
    """The smoke preset's synthetic world, generated once per test session."""
    from vlbert.config import synthetic_spec
    from vlbert.data.synthetic import make_world

    out = tmp_path_factory.mktemp("smoke_world")
    make_world(synthetic_spec(smoke_config), out, progress=False)
    return out


@pytest.fixture(scope="session")
def smoke_detector(smoke_config, smoke_world, tmp_path_factory):
    """The smoke preset's detector built, not trained: its `detector` architecture for the world's
    classes, with train_detector's seeded initial weights, saved as train_detector saves. No test
    of the fast tier asserts what training gives (the smoke preset's two epochs reach mAP 0 anyway);
    they need its layout, weights file and features, and the box rule keeps `min_boxes` regions an
    image whatever the scores. Training is the slow tier's (test_detection.py, the Snakemake study)."""
    import torch

    from vlbert.data.coco import read_coco
    from vlbert.detection.model import build_faster_rcnn, save_detector
    from vlbert.detection.train import detector_config

    root = smoke_world / "detector"
    config = detector_config(
        read_coco(root / "annotations/instances_train2017.json", root / "train2017"), smoke_config["detector"], root
    )
    torch.manual_seed(0)  # train_detector's seed: the weights it would start from
    out = tmp_path_factory.mktemp("detector")
    save_detector(build_faster_rcnn(config), config, out)
    return out


# Session fixtures that train a detector (the Snakemake study trains its own): only slow tests use
# them, so the fast tier (`make test-fast`) trains none. Collection refuses a fast test that would.
TRAINS_A_DETECTOR = {"smoke_run"}


def pytest_collection_modifyitems(config, items):
    fast = [
        f"{item.nodeid} (uses {', '.join(sorted(TRAINS_A_DETECTOR & set(item.fixturenames)))})"
        for item in items
        if TRAINS_A_DETECTOR & set(getattr(item, "fixturenames", ())) and not item.get_closest_marker("slow")
    ]
    if fast:
        raise pytest.UsageError(
            "tests that train a detector must be marked slow, or use smoke_detector:\n  " + "\n  ".join(fast)
        )


@pytest.fixture
def refcoco_fixture(tmp_path):
    """The hand-written RefCOCO+ fixture as REFER ships it: instances.json + a protocol-2 pickle."""
    from refcoco.refs import REFS

    shutil.copy(FIXTURES / "refcoco" / "instances.json", tmp_path / "instances.json")
    (tmp_path / "refs(unc).p").write_bytes(pickle.dumps(REFS, protocol=2))
    return tmp_path


@pytest.fixture(scope="session")
def smoke_study(smoke_config, smoke_world, smoke_detector, tmp_path_factory):
    """What training needs on the smoke preset: data, detector, every feature store, the BERT init."""
    from vlbert.cli import main
    from vlbert.detection.backends import TorchvisionBackend
    from vlbert.detection.extract import extract_to_store
    from vlbert.detection.identity import DETECTOR_ATTR, weights_identity
    from vlbert.detection.model import WEIGHTS_FILE, load_detector
    from vlbert.detection.rules import BoxRule
    from vlbert.detection.sources import image_items
    from vlbert.registry import FEATURE_STORES

    root = tmp_path_factory.mktemp("smoke_study")
    detector = weights_identity(smoke_detector / WEIGHTS_FILE)  # as `vlbert extract-rois` records it
    model, det_config = load_detector(smoke_detector)
    backend = TorchvisionBackend(model, det_config, BoxRule())
    for store in FEATURE_STORES:
        items = image_items(smoke_world / store.dataset, store.dataset, store.split, gt_boxes=store.boxes == "gt")
        extract_to_store(
            backend,
            items,
            root / "features" / f"{store.name}.h5",
            progress=False,
            attrs={"dataset": store.dataset, "split": store.split, DETECTOR_ATTR: detector},
        )
    assert (
        main(
            [
                "bert-init",
                "--config",
                str(REPO / "experiments/smoke.yaml"),
                "--data",
                str(smoke_world),
                "--out",
                str(root / "bert_init"),
                "--quiet",
                "--no-tracking",
            ]
        )
        == 0
    )
    paths = {
        "root": root,
        "data": smoke_world,
        "detector": smoke_detector,
        "features": root / "features",
        "bert": root / "bert_init" / "bert",
        "preset": REPO / "experiments/smoke.yaml",
    }
    return paths


@pytest.fixture(scope="session")
def smoke_validation(smoke_study, smoke_config):
    """Pre-training's validation on the smoke study: the val captions, the processor and the
    collator (setting `a`'s, as validation masks no RoI and mismatches no caption)."""
    import dataclasses

    from vlbert.data.feature_store import FeatureStore
    from vlbert.engine.build import load_processor
    from vlbert.registry import SETTINGS
    from vlbert.tasks.pretraining import CaptionDataset, PretrainCollator

    val = CaptionDataset(
        smoke_study["data"] / "conceptual_captions",
        "val",
        FeatureStore(smoke_study["features"] / "conceptual_captions.val.det.h5"),
        smoke_config.get("model", {}).get("max_rois"),
    )
    processor = load_processor(smoke_study["bert"], 40)
    setting = dataclasses.replace(SETTINGS["a"], masked_roi=False, sentence_image=False)
    return val, processor, PretrainCollator(processor, setting, val)


def finetune_args(setting, task, lr, seed):
    """`vlbert finetune`'s arguments that name a run: what the CLI tests vary."""
    return ["finetune", "--setting", setting, "--task", task, "--lr", str(lr), "--seed", str(seed)]


def study_args(study, *extra):
    """CLI arguments that point a training verb at the smoke study's files."""
    return [
        "--config",
        str(study["preset"]),
        "--data",
        str(study["data"]),
        "--features",
        str(study["features"]),
        "--detector",
        str(study["detector"]),
        "--bert",
        str(study["bert"]),
        "--quiet",
        "--no-tracking",
        *extra,
    ]


def tiny_store(path, keys=("1",), **attrs):
    """A store as `vlbert extract-rois` writes it, two regions an image, without a detector."""
    from types import SimpleNamespace

    import numpy as np

    from vlbert.data.feature_store import write_shard

    results = [
        SimpleNamespace(
            boxes=np.zeros((2, 4), np.float32),
            labels=np.zeros(2, np.int64),
            probs=np.zeros((2, 3), np.float32),
            scores=np.zeros(2, np.float32),
            features=np.full((2, 8), k, np.float32),
            box_ids=np.full(2, -1, np.int64),
            width=10,
            height=10,
        )
        for k in range(len(keys))
    ]
    write_shard(path, list(keys), results, [], {"mode": "detected", "feature_dim": 8, **attrs})  # one shard: a store
    return path


def load_bench(path, name: str):
    """A bench/ script as a module, with bench/ on the path as `python bench/<name>.py` has it."""
    import importlib.util
    import sys

    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
