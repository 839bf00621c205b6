"""The sharded feature store: what it keeps of a region, its index, a reader whose memory is
bounded, and chunks that cover a split."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from types import SimpleNamespace

import h5py
import numpy as np
import pytest

from vlbert.data.errors import DataFormatError
from vlbert.data.feature_store import FeatureStore, dense_probs, shards_folder, top_classes, write_index, write_shard
from vlbert.detection.extract import Chunk

CLASSES = 12  # with background


def _results(count: int, seed: int = 0, dim: int = 16):
    rng = np.random.default_rng(seed)
    results = []
    for _ in range(count):
        rows = int(rng.integers(2, 7))
        logits = rng.normal(size=(rows, CLASSES)) * 3
        probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
        results.append(
            SimpleNamespace(
                boxes=rng.uniform(0, 90, (rows, 4)).astype(np.float32),
                labels=rng.integers(0, CLASSES, rows),
                probs=probs.astype(np.float32),
                scores=rng.uniform(size=rows).astype(np.float32),
                features=(rng.normal(size=(rows, dim)) * 4).astype(np.float32),
                box_ids=np.full(rows, -1, np.int64),
                width=96,
                height=80,
            )
        )
    return results


def _write_legacy(path, keys, results):
    """A store as extraction wrote it before shards: one file, float32 features, dense probs."""
    counts = [len(r.boxes) for r in results]
    with h5py.File(path, "w") as f:
        f.create_dataset("keys", data=np.array(keys, dtype=object), dtype=h5py.string_dtype())
        f.create_dataset("offsets", data=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))
        f.create_dataset("width", data=np.array([r.width for r in results], np.int32))
        f.create_dataset("height", data=np.array([r.height for r in results], np.int32))
        for name in ("boxes", "labels", "probs", "scores", "features", "box_ids"):
            f.create_dataset(name, data=np.concatenate([getattr(r, name) for r in results]))
        f.attrs["mode"], f.attrs["dataset"] = "detected", "vqa"


def _write_sharded(out, keys, results, per_shard, **fmt):
    paths = []
    for number, start in enumerate(range(0, len(keys), per_shard)):
        path = shards_folder(out) / f"shard_{number:06d}.h5"
        write_shard(
            path,
            keys[start : start + per_shard],
            results[start : start + per_shard],
            [],
            {"mode": "detected", "dataset": "vqa"},
            **fmt,
        )
        paths.append(path)
    return write_index(out, paths)


def test_sharded_float16_store_reads_as_the_single_file_float32_store(tmp_path):
    """Float16 keeps 11 significant bits: a feature within 2^-11 of its magnitude (plus float16's
    smallest step); the class distribution, every class kept, within 1e-3; the rest exact."""
    keys = [f"img{k}" for k in range(23)]
    results = _results(len(keys))
    _write_legacy(tmp_path / "legacy.h5", keys, results)
    summary = _write_sharded(tmp_path / "sharded.h5", keys, results, per_shard=5)
    assert summary["images"] == 23 and summary["shards"] == 5
    with FeatureStore(tmp_path / "legacy.h5") as legacy, FeatureStore(tmp_path / "sharded.h5") as sharded:
        assert sharded.keys == legacy.keys == keys
        for key in keys[::-1]:
            a, b = legacy[key], sharded[key]
            for name in ("boxes", "labels", "scores", "box_ids", "width", "height"):
                assert np.array_equal(a[name], b[name]), name
            assert b["features"].dtype == np.float32
            assert np.all(np.abs(a["features"] - b["features"]) <= np.abs(a["features"]) * 2.0**-11 + 2.0**-24)
            assert np.allclose(a["probs"], b["probs"], atol=1e-3)


def test_top_k_classes_are_the_most_probable_renormalised(tmp_path):
    keys = [f"img{k}" for k in range(4)]
    results = _results(len(keys), seed=1)
    _write_sharded(tmp_path / "top3.h5", keys, results, per_shard=4, class_topk=3)
    with FeatureStore(tmp_path / "top3.h5") as store:
        for key, result in zip(keys, results):
            probs = store[key]["probs"]
            assert probs.shape == result.probs.shape and np.allclose(probs.sum(1), 1, atol=1e-3)
            top = np.argsort(-result.probs, axis=1)[:, :3]
            assert np.array_equal(np.sort(np.nonzero(probs)[1].reshape(-1, 3), 1), np.sort(top, 1))
            kept = np.take_along_axis(result.probs, top, 1)
            assert np.allclose(np.take_along_axis(probs, top, 1), kept / kept.sum(1, keepdims=True), atol=1e-3)
    ids, values = top_classes(np.zeros((0, CLASSES), np.float32), 3)
    assert ids.shape == values.shape == (0, 3)
    assert not dense_probs(np.zeros((2, 3), np.int32), np.zeros((2, 3), np.float16), CLASSES).any()


def test_index_that_lost_a_shard_names_it(tmp_path):
    keys = [f"img{k}" for k in range(6)]
    _write_sharded(tmp_path / "s.h5", keys, _results(6), per_shard=2)
    (shards_folder(tmp_path / "s.h5") / "shard_000001.h5").unlink()
    with FeatureStore(tmp_path / "s.h5") as store:
        assert store["img0"]["width"] == 96
        with pytest.raises(DataFormatError, match=r"s\.h5: its shard .*shard_000001\.h5 is missing"):
            store["img3"]
    with pytest.raises(DataFormatError, match=r"s\.h5: its shard .*shard_000001\.h5 is missing"):
        FeatureStore(tmp_path / "s.h5", preload=True)


def test_index_keeps_to_its_folder_and_its_shards_agree(tmp_path):
    keys = [f"img{k}" for k in range(4)]
    results = _results(4)
    out = tmp_path / "s.h5"
    first = shards_folder(out) / "shard_000000.h5"
    write_shard(first, keys[:2], results[:2], [], {"mode": "detected", "detector": "one"})
    with pytest.raises(ValueError, match="is not in its shards folder"):
        write_index(out, [first, tmp_path / "elsewhere.h5"])
    other = shards_folder(out) / "shard_000001.h5"
    write_shard(other, keys[2:], results[2:], [], {"mode": "detected", "detector": "two"})
    with pytest.raises(DataFormatError, match=r"shard_000001\.h5: its attributes \['detector'\] differ"):
        write_index(out, [first, other])
    write_shard(other, keys[:2], results[2:], [], {"mode": "detected", "detector": "one"})
    with pytest.raises(ValueError, match="duplicate image keys"):
        write_index(out, [first, other])
    stale = shards_folder(out) / "shard_000007.h5"
    stale.write_bytes(b"")
    write_shard(other, keys[2:], results[2:], [], {"mode": "detected", "detector": "one"})
    assert write_index(out, [first, other])["images"] == 4
    assert not stale.exists()  # a shard no index lists is an earlier layout's
    with h5py.File(out, "a") as f:
        del f["shards"]
        f.create_dataset(
            "shards", data=np.array(["../x.h5", "shard_000001.h5"], dtype=object), dtype=h5py.string_dtype()
        )
    with pytest.raises(DataFormatError, match=r"'\.\./x\.h5' is not a plain file name"):
        FeatureStore(out)


@pytest.mark.parametrize("shards", [0, 1, 5, 8, 64, 1001])
@pytest.mark.parametrize("count", [1, 3, 8])
def test_chunks_deal_out_every_shard_once_in_order(shards, count):
    runs = [Chunk(number, count).shards(shards) for number in range(1, count + 1)]
    assert [s for run in runs for s in run] == list(range(shards))
    assert max(map(len, runs)) - min(map(len, runs)) <= 1
    assert Chunk.parse(f"2-of-{max(count, 2)}").number == 2
    with pytest.raises(ValueError, match="3-of-8"):
        Chunk.parse("3/8")
    with pytest.raises(ValueError, match="need 1 <= chunk <= chunks"):
        Chunk(4, 3)


def test_reader_memory_stays_bounded_on_a_store_larger_than_its_limit(tmp_path):
    """A ~250 MB store (600 images x 101 rows x 2,048 float16) read in random order by a process
    whose address space may grow by 200 MB only: a reader that held the store would fail."""
    out = tmp_path / "big.h5"
    block = np.random.default_rng(0).normal(size=(101, 2048)).astype(np.float16)
    template = SimpleNamespace(
        boxes=np.zeros((101, 4), np.float32),
        labels=np.zeros(101, np.int64),
        probs=np.full((101, 40), 1 / 40, np.float32),
        scores=np.ones(101, np.float32),
        box_ids=np.full(101, -1, np.int64),
        width=600,
        height=400,
    )
    paths = []
    for number in range(6):
        results = [
            SimpleNamespace(**vars(template), features=block + np.float16(number * 100 + k)) for k in range(100)
        ]
        path = shards_folder(out) / f"shard_{number:06d}.h5"
        write_shard(path, [str(number * 100 + k) for k in range(100)], results, [], {"mode": "detected"}, class_topk=8)
        paths.append(path)
    write_index(out, paths)
    size = sum(p.stat().st_size for p in paths)
    assert size > 240e6
    script = textwrap.dedent(
        f"""
        import resource
        import numpy as np
        from vlbert.data.feature_store import FeatureStore

        def vm_bytes():
            with open("/proc/self/status") as f:
                return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))

        store = FeatureStore({str(out)!r}, max_open_shards=2)
        limit = vm_bytes() + 200 * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        total = 0.0
        for key in np.random.default_rng(1).permutation(store.keys):
            item = store[key]
            assert item["features"].shape == (101, 2048)
            total += float(item["features"][0, 0])
        print("read", len(store), "images")
        try:
            FeatureStore({str(out)!r}, preload=True)
            print("preloaded")
        except MemoryError:
            print("preload refused")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "read 600 images" in done.stdout
    assert "preload refused" in done.stdout  # the limit binds: holding the store does not fit in it


def test_shard_whose_images_were_all_unreadable_joins_the_index(tmp_path):
    out = tmp_path / "s.h5"
    results = _results(4)
    attrs = {"mode": "detected", "detector": "one"}
    paths = [shards_folder(out) / f"shard_{k:06d}.h5" for k in range(3)]
    write_shard(paths[0], ["a", "b"], results[:2], [], attrs)
    write_shard(paths[1], [], [], [("c", "truncated"), ("d", "missing")], attrs)
    write_shard(paths[2], ["e", "f"], results[2:], [], attrs)
    assert write_index(out, paths) == {
        "images": 4,
        "regions": sum(len(r.boxes) for r in results),
        "skipped": 2,
        "shards": 3,
    }
    with FeatureStore(out) as store:
        assert store.keys == ["a", "b", "e", "f"] and store.skipped == [["c", "truncated"], ["d", "missing"]]
        assert store["e"]["probs"].shape == results[2].probs.shape


def test_tasks_preload_small_stores_and_stream_large_ones(tmp_path, monkeypatch):
    from vlbert.registry import FEATURE_STORES
    from vlbert.tasks import regions

    store = FEATURE_STORES[0]
    out = tmp_path / f"{store.name}.h5"
    attrs = {"mode": regions.BOX_MODES[store.boxes], "dataset": store.dataset, "split": store.split}
    path = shards_folder(out) / "shard_000000.h5"
    write_shard(path, ["a", "b"], _results(2), [], attrs)
    write_index(out, [path])
    assert regions.open_store(tmp_path, store).preload
    monkeypatch.setattr(regions, "PRELOAD_MAX_BYTES", out.stat().st_size + path.stat().st_size - 1)
    streamed = regions.open_store(tmp_path, store)
    assert not streamed.preload and streamed["b"]["features"].shape[1] == 16


def test_features_beyond_float16_are_refused_not_stored_as_infinity(tmp_path):
    results = _results(2)
    results[1].features[0, 3] = 7e4
    with pytest.raises(ValueError, match=r"shard\.h5: a region feature of 70000 does not fit float16"):
        write_shard(tmp_path / "shard.h5", ["a", "b"], results, [], {"mode": "detected"})
    write_shard(tmp_path / "shard.h5", ["a", "b"], results, [], {"mode": "detected"}, dtype="float32")
    assert FeatureStore(tmp_path / "shard.h5")["b"]["features"][0, 3] == 7e4


def test_shard_written_again_after_the_index_is_refused(tmp_path):
    out = tmp_path / "s.h5"
    results = _results(4)
    paths = [shards_folder(out) / f"shard_{k:06d}.h5" for k in range(2)]
    for k, path in enumerate(paths):
        write_shard(
            path, [f"img{2 * k}", f"img{2 * k + 1}"], results[2 * k : 2 * k + 2], [], {"shard_fingerprint": "one"}
        )
    write_index(out, paths)
    write_shard(paths[1], ["img2", "img3"], results[2:], [], {"shard_fingerprint": "two"})
    with FeatureStore(out) as store:
        assert store["img0"]["width"] == 96
        with pytest.raises(DataFormatError, match=r"shard_000001\.h5 was written again after the index"):
            store["img3"]
    write_index(out, paths)
    assert FeatureStore(out)["img3"]["width"] == 96


def test_preloaded_store_pickles(tmp_path):
    import pickle

    out = tmp_path / "s.h5"
    path = shards_folder(out) / "shard_000000.h5"
    write_shard(path, ["a", "b"], _results(2), [], {"mode": "detected"})
    write_index(out, [path])
    store = pickle.loads(pickle.dumps(FeatureStore(out, preload=True)))
    assert store["b"]["features"].shape[1] == 16
    streamed = pickle.loads(pickle.dumps(FeatureStore(out)))  # handles stay behind; the copy opens its own
    assert streamed["a"]["width"] == 96


def _altered(tmp_path, alter):
    """A two-shard store whose second shard `alter(h5py file)` changed after extraction."""
    out = tmp_path / "s.h5"
    _write_sharded(out, [f"img{k}" for k in range(6)], _results(6), 3)
    shard = shards_folder(out) / "shard_000001.h5"
    with h5py.File(shard, "r+") as f:
        alter(f)
    return out, shard


def _times_1000(f):
    f["features"][...] = f["features"][()] * 1000


def _ff_bytes(f):
    data = f["features"][()]
    data.reshape(-1).view(np.uint8)[:4] = 0xFF  # a block of 0xFF bytes: two NaN in float16
    f["features"][...] = data


ALTERATIONS = {
    "features x 1000": (
        _times_1000,
        r"its features \(now in \[-?\d[\d.e+]*, \d[\d.e+]*\]; written in \[-?[\d.]+, [\d.]+\]\)",
    ),
    "0xFF bytes": (_ff_bytes, r"its features \(now in \[.*\] with 2 values that are not finite; written in"),
    "detector attribute": (
        lambda f: f.attrs.modify("detector_weights", '"sha256 another"'),
        r"its attribute 'detector_weights'",
    ),
    "boxes": (lambda f: f["boxes"].__setitem__((0, 0), 7.0), r"its boxes"),
}


@pytest.mark.parametrize("alteration", list(ALTERATIONS))
@pytest.mark.parametrize("preload", [False, True])
def test_a_verifying_reader_refuses_an_altered_shard_naming_it_and_what_differs(alteration, preload, tmp_path):
    # Seen: features multiplied by 1000, or a shard's detector_weights changed, were trained on;
    # 0xFF bytes stopped the run at "non-finite loss at step 1", which did not name the store.
    import re

    alter, says = ALTERATIONS[alteration]
    out, shard = _altered(tmp_path, alter)
    FeatureStore(out, preload=preload)["img4"]  # a reader that does not verify reads it as it is
    with pytest.raises(DataFormatError) as refused:
        store = FeatureStore(out, preload=preload, verify=True)
        store["img0"]  # the first shard is as extraction wrote it
        store["img4"]
    message = str(refused.value)
    assert message.startswith(f"{shard}: ") and "differ from what extraction wrote (checksums)" in message
    assert re.search(says, message), message


def test_a_shard_is_verified_once_per_process_and_one_without_checksums_is_refused(tmp_path, monkeypatch):
    from vlbert.data import feature_store

    out = tmp_path / "s.h5"
    _write_sharded(out, [f"img{k}" for k in range(6)], _results(6), 3)
    checked = []
    check = feature_store.check_content
    monkeypatch.setattr(feature_store, "check_content", lambda f, path, *a: (checked.append(path), check(f, path, *a)))
    for _ in range(2):  # a task opens its stores again for each split it scores
        store = FeatureStore(out, verify=True, max_open_shards=1)
        for key in ("img0", "img4", "img0"):  # shards closed and opened again
            store[key]
    assert [p.name for p in checked] == ["shard_000000.h5", "shard_000001.h5"]
    legacy = tmp_path / "legacy.h5"
    _write_legacy(legacy, ["a", "b"], _results(2))
    assert FeatureStore(legacy)["a"] is not None
    with pytest.raises(DataFormatError, match=r"legacy\.h5: records no content checksum .*extract-rois` again"):
        FeatureStore(legacy, verify=True)["a"]
