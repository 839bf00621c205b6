import pickle
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
sys.path.insert(0, str(FIXTURES))


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
    import torch
    from vlbert.detection.train import train_detector
    from vlbert.tracking import NullTracker
    out = tmp_path_factory.mktemp("detector")
    torch.set_num_threads(2)
    metrics = train_detector(smoke_world / "detector", out, smoke_config["detector"], NullTracker())
    assert 0 <= metrics["val_mAP50"] <= 1
    return out


@pytest.fixture
def refcoco_fixture(tmp_path):
    """The hand-written RefCOCO+ fixture as REFER ships it: instances.json + a protocol-2 pickle."""
    from refcoco.refs import REFS
    shutil.copy(FIXTURES / "refcoco" / "instances.json", tmp_path / "instances.json")
    (tmp_path / "refs(unc).p").write_bytes(pickle.dumps(REFS, protocol=2))
    return tmp_path
