"""The CLI's expected failures: one line on stderr and exit status 2, never a traceback;
`vlbert --debug <verb>` shows the traceback instead."""

import math
import pickle
import subprocess
import sys

import h5py
import pytest
import torch
import yaml
from conftest import REPO, study_args

from vlbert.cli import main
from vlbert.study import runs


def _raise(exc):
    def verb(args):
        raise exc

    return verb


def _is_a_directory(tmp_path):
    try:
        open(tmp_path)  # noqa: SIM115 (it must fail)
    except IsADirectoryError as exc:
        return exc


def _corrupt_hdf5(tmp_path):
    path = tmp_path / "store.h5"
    path.write_bytes(b"not an HDF5 file" * 64)
    try:
        h5py.File(path, "r")
    except OSError as exc:
        return exc


def _unpickling(data):
    try:
        pickle.loads(data)
    except (pickle.UnpicklingError, EOFError) as exc:
        return exc


def _non_finite_loss(tmp_path):
    """The training loop's own error on a NaN loss."""
    from vlbert.engine.loop import LoopConfig, LoopSteps, TrainingLoop
    from vlbert.engine.optim import build_optimizer, build_scheduler

    model = torch.nn.Linear(2, 1)
    optimizer = build_optimizer(model, {"lr": 0.1})
    loss_fn = lambda model, batch: (model(batch["x"]).sum() * math.nan, {"mlm": torch.tensor(math.nan)})
    loop = TrainingLoop(
        model,
        optimizer,
        build_scheduler(optimizer, {}, 2, 1),
        LoopConfig(1, 2, progress=False),
        tmp_path,
        LoopSteps(lambda epoch, b: {"x": torch.ones(1, 2)}, loss_fn),
        [],
    )
    try:
        loop.fit()
    except FloatingPointError as exc:
        return exc


# Each: the error as it arises, and what its one line must say.
FAILURES = {
    "permission denied": (
        lambda tmp: PermissionError(13, "Permission denied", str(tmp / "refs(unc).p")),
        "Permission denied: ",
    ),
    "a directory for a file": (_is_a_directory, "Is a directory: "),
    "corrupt HDF5 store": (_corrupt_hdf5, "file signature not found"),
    "corrupt pickle": (lambda tmp: _unpickling(b"\x99junk"), "invalid load key"),
    "truncated pickle": (lambda tmp: _unpickling(b""), "Ran out of input"),
    "non-finite loss": (_non_finite_loss, "non-finite loss"),
}


@pytest.mark.parametrize("failure", list(FAILURES))
def test_expected_failures_are_one_line_and_exit_2(failure, tmp_path, monkeypatch, capsys):
    make, says = FAILURES[failure]
    exc = make(tmp_path)
    assert exc is not None
    monkeypatch.setattr(runs, "make_data", _raise(exc))
    assert main(["make-data", "--config", "unused.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vlbert make-data: error: ") and says in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_a_truncated_refs_pickle_is_one_line(refcoco_fixture, tmp_path, capsys):
    refs = refcoco_fixture / "refs(unc).p"
    refs.write_bytes(refs.read_bytes()[:40])
    (tmp_path / "pred.json").write_text("[]")
    assert (
        main(["evaluate", "refcoco", "--root", str(refcoco_fixture), "--predictions", str(tmp_path / "pred.json")])
        == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("vlbert evaluate: error: ") and err.count("\n") == 1


def test_debug_shows_the_traceback(tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "make_data", _raise(_is_a_directory(tmp_path)))
    with pytest.raises(IsADirectoryError):
        main(["--debug", "make-data", "--config", "unused.yaml"])


def test_make_data_refuses_a_root_with_a_foreign_file_in_one_line(tmp_path, capsys):
    preset = yaml.safe_load((REPO / "experiments/smoke.yaml").read_text())
    preset["data"]["root"] = str(tmp_path / "data")
    (tmp_path / "preset.yaml").write_text(yaml.safe_dump(preset))
    (tmp_path / "data/vqa").mkdir(parents=True)
    (tmp_path / "data/vqa/precious.txt").write_text("mine")
    assert main(["make-data", "--config", str(tmp_path / "preset.yaml"), "--only", "vqa", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"vlbert make-data: error: {tmp_path}/data/vqa: holds precious.txt, which make-data did not write, and it "
        "would replace this folder: move the file elsewhere, or give make-data another --out (data.root)\n"
    )
    assert (tmp_path / "data/vqa/precious.txt").read_text() == "mine"


def test_a_verb_without_a_model_imports_neither_torch_nor_transformers(tmp_path):
    """Each Snakemake job is a process of its own: the data and report jobs do not pay the import
    of what they do not use (transformers' alone is seconds)."""
    code = (
        "import sys; from vlbert.cli import main; "
        f"status = main(['make-data', '--config', {str(REPO / 'experiments/smoke.yaml')!r}, "
        f"'--out', {str(tmp_path / 'data')!r}, '--only', 'text_corpus', '--quiet']); "
        "print(status, sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split("\n")[-2] == "0 []", result.stdout + result.stderr
    assert (tmp_path / "data/text_corpus").is_dir()


def test_make_data_refuses_an_out_at_a_system_path(tmp_path, capsys):
    assert main(["make-data", "--config", str(REPO / "experiments/smoke.yaml"), "--out", "/"]) == 2
    assert capsys.readouterr().err == (
        "vlbert make-data: error: --out: / is a system folder: give the study a folder of its own\n"
    )


def _store_without_its_first_image(source, out):
    """The store `source` rewritten as one shard without its first image."""
    from types import SimpleNamespace

    from vlbert.data.feature_store import FeatureStore, plain_attr, write_shard

    with FeatureStore(source) as store:
        keys = store.keys[1:]
        results = [SimpleNamespace(**store[key]) for key in keys]
        own = ("skipped", "num_skipped", "num_images", "num_classes")
        attrs = {k: plain_attr(v) for k, v in store.attrs.items() if k not in own}
    write_shard(out, keys, results, [], attrs)
    return store.keys[0]


def test_finetune_on_a_store_that_lacks_an_image_is_one_line(smoke_study, tmp_path, capsys):
    # Seen: a KeyError traceback, exit 1.
    import shutil

    features = tmp_path / "features"
    shutil.copytree(smoke_study["features"], features)
    store = features / "vqa.val2014.det.h5"
    store.unlink()
    missing = _store_without_its_first_image(smoke_study["features"] / store.name, store)
    study = {**smoke_study, "features": features}
    args = [
        "--setting",
        "no_pretrain",
        "--task",
        "vqa",
        "--lr",
        "0.001",
        "--seed",
        "0",
        "--out",
        str(tmp_path / "run"),
    ]
    assert main(["finetune", *args, *study_args(study)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"vlbert finetune: error: {store}: no image {missing!r}") and err.count("\n") == 1


def _copied_features(smoke_study, tmp_path):
    import shutil

    features = tmp_path / "features"
    shutil.copytree(smoke_study["features"], features)
    return features, {**smoke_study, "features": features}


FINETUNE = ["finetune", "--setting", "no_pretrain", "--task", "vqa", "--lr", "0.001", "--seed", "0"]


def test_finetune_refuses_a_shard_whose_features_were_altered_naming_it(smoke_study, tmp_path, capsys):
    # Seen: a vqa.train2014.det shard's features multiplied by 1000 with h5py were trained on.
    features, study = _copied_features(smoke_study, tmp_path)
    shard = features / "vqa.train2014.det.shards" / "shard_000000.h5"
    with h5py.File(shard, "r+") as f:
        f["features"][...] = f["features"][()] * 1000
    assert main([*FINETUNE, "--out", str(tmp_path / "run"), *study_args(study)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"vlbert finetune: error: {shard}: its features (now in [") and err.count("\n") == 1
    assert "differ from what extraction wrote (checksums)" in err


@pytest.mark.parametrize("verb", ["finetune", "pretrain"])
def test_training_refuses_the_stores_of_another_detector_naming_them(verb, smoke_study, tmp_path, capsys):
    # Seen: a store whose detector_weights named another detector was trained on.
    features, study = _copied_features(smoke_study, tmp_path)
    name = "vqa.train2014.det.h5" if verb == "finetune" else "conceptual_captions.train.det.h5"
    with h5py.File(features / name, "r+") as f:  # the index: what the store says it was made from
        f.attrs["detector_weights"] = '"sha256 of another detector"'
    args = FINETUNE[1:] if verb == "finetune" else ["--setting", "a"]
    assert main([verb, *args, "--out", str(tmp_path / "run"), *study_args(study)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"vlbert {verb}: error: {features / name}: its regions come from the detector whose weights are "
        '"sha256 of another detector", but the study\'s detector\'s are "sha256 '
    )
    assert err.count("\n") == 1 and "extract the stores again" in err


def test_every_setting_checks_its_stores_detector(tmp_path):
    from conftest import tiny_store

    from vlbert.data.errors import DataFormatError
    from vlbert.engine.tuned_features import check_store_features
    from vlbert.registry import SETTINGS

    store = tiny_store(tmp_path / "vqa.train2014.det.h5", detector_weights='"sha256 one"')
    for setting in SETTINGS.values():
        pretrained = tmp_path / "pretrain" if setting.pretrains else None
        with pytest.raises(DataFormatError, match=r"its regions come from the detector whose weights are"):
            check_store_features(setting, [store], pretrained, '"sha256 two"')
