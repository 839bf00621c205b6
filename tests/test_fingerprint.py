"""`vlbert fingerprint`: where two runs of a study part."""

import json

import h5py
import numpy as np
import torch
from safetensors.torch import save_file

from vlbert.cli import main
from vlbert.study import fingerprint as fp


def _results(root, bert_scale=1.0, data="abc", seconds=1.0, val=50.0):
    """A results folder with one file or two of each stage the study writes."""
    (root / "data" / "vqa").mkdir(parents=True)
    (root / "data" / "vqa" / "questions.json").write_text(data)
    (root / "bert_init" / "bert").mkdir(parents=True)
    save_file({"w": torch.arange(6.0).reshape(2, 3) * bert_scale}, root / "bert_init" / "bert" / "model.safetensors")
    (root / "features").mkdir()
    with h5py.File(root / "features" / "vqa.train2014.det.h5", "w") as f:
        f["features"] = np.ones((4, 8), dtype=np.float32)
        f["boxes"] = np.zeros((4, 4), dtype=np.float32)
    run = root / "finetune" / "a" / "vqa" / "seed0"
    run.mkdir(parents=True)
    (run / "metrics.json").write_text(json.dumps({"val": {"accuracy": val}, "wall_seconds": seconds}))
    fraction_run = root / "finetune" / "a" / "fraction0.1" / "vqa" / "seed0"
    fraction_run.mkdir(parents=True)
    (fraction_run / "metrics.json").write_text(json.dumps({"val": {"accuracy": 40.0}, "wall_seconds": seconds}))
    return root


def test_same_content_same_fingerprint_whatever_the_timings_and_metadata(tmp_path):
    a = _results(tmp_path / "a")
    b = _results(tmp_path / "b", seconds=99.0)
    # The same tensors written with another header (metadata) are the same weights.
    save_file(
        {"w": torch.arange(6.0).reshape(2, 3)}, b / "bert_init" / "bert" / "model.safetensors", metadata={"x": "y"}
    )
    assert fp.fingerprint(a) == fp.fingerprint(b)
    rows = fp.compare(fp.fingerprint(a), fp.fingerprint(b))
    assert fp.first_parting(rows) is None
    assert [row["stage"] for row in rows] == ["data", "bert_init", "features", "finetune", "fractions"]


def test_a_store_index_made_in_another_folder_has_the_same_fingerprint(tmp_path):
    from vlbert.data.feature_store import SHARD_FINGERPRINTS

    a, b = _results(tmp_path / "a"), _results(tmp_path / "b")
    for root in (a, b):  # an index's shard fingerprints hash the store's attributes, its folders among them
        with h5py.File(root / "features" / "vqa.train2014.det.h5", "a") as f:
            f[SHARD_FINGERPRINTS] = np.array([str(root)], dtype=object).astype(h5py.string_dtype())
    assert fp.fingerprint(a) == fp.fingerprint(b)
    with h5py.File(b / "features" / "vqa.train2014.det.h5", "a") as f:
        f["boxes"][0, 0] = 1.0
    assert fp.fingerprint(a)["features"] != fp.fingerprint(b)["features"]


def test_the_first_parting_stage_is_named_with_its_largest_difference(tmp_path):
    a = _results(tmp_path / "a")
    b = _results(tmp_path / "b", bert_scale=1.001, val=51.0)
    rows = fp.compare(fp.fingerprint(a), fp.fingerprint(b))
    assert fp.first_parting(rows) == "bert_init"
    assert {row["stage"]: len(row["differ"]) for row in rows} == {
        "data": 0,
        "bert_init": 1,
        "features": 0,
        "finetune": 1,
        "fractions": 0,
    }
    text = fp.render(rows, a, b)
    assert "First parting: bert_init." in text
    assert "  1.0e-03\n" in text  # bert_init: 5 * 0.001 against the largest value, 5


def test_a_fraction_run_is_its_own_stage_not_a_fine_tuning_run(tmp_path):
    a, b = _results(tmp_path / "a"), _results(tmp_path / "b")
    (b / "finetune" / "a" / "fraction0.1" / "vqa" / "seed0" / "metrics.json").write_text('{"val": {"accuracy": 41.0}}')
    stages = fp.fingerprint(a)
    assert list(stages["fractions"]) == ["finetune/a/fraction0.1/vqa/seed0/metrics.json"]
    assert list(stages["finetune"]) == ["finetune/a/vqa/seed0/metrics.json"]
    assert fp.first_parting(fp.compare(stages, fp.fingerprint(b))) == "fractions"


def test_a_data_set_folder_is_one_digest(tmp_path):
    a = _results(tmp_path / "a")
    b = _results(tmp_path / "b", data="abd")
    assert list(fp.fingerprint(a)["data"]) == ["data/vqa/"]
    assert fp.first_parting(fp.compare(fp.fingerprint(a), fp.fingerprint(b))) == "data"


def test_cli_saves_a_fingerprint_and_compares_it_with_a_folder(tmp_path, capsys):
    a = _results(tmp_path / "a")
    b = _results(tmp_path / "b", val=51.0)
    saved = tmp_path / "a.json"
    assert main(["fingerprint", str(a), "--out", str(saved)]) == 0
    assert main(["fingerprint", str(saved), "--against", str(a)]) == 0
    assert "agree on every file" in capsys.readouterr().out
    assert main(["fingerprint", str(saved), "--against", str(b)]) == 1
    out = capsys.readouterr().out
    assert "First parting: finetune." in out
    assert "finetune/a/vqa/seed0/metrics.json" in out


def test_a_file_that_is_not_a_fingerprint_is_named(tmp_path, capsys):
    bad = tmp_path / "notes.txt"
    bad.write_text("hello")
    assert main(["fingerprint", str(bad), "--against", str(bad)]) == 2
    assert "notes.txt is neither a results folder nor a fingerprint JSON" in capsys.readouterr().err


def test_the_committed_reference_fingerprint_covers_every_stage():
    """A user compares a run with it (`vlbert fingerprint results/mini --against ...`): it must have
    every stage this code fingerprints, or a change of the stages left it behind."""
    from pathlib import Path

    reference = fp.load(Path(__file__).parents[1] / "reports" / "reference" / "mini" / "fingerprint.json")
    assert set(reference) == {stage for stage, _ in fp.STAGES}
    assert all(reference.values())
