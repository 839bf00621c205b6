"""The RoI detector and extraction: the paper's box rule, ground-truth mode, resume, bad images."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
import torch
from conftest import REPO, tiny_store
from torchvision.ops import nms

from vlbert.cli import main
from vlbert.data.errors import DataFormatError
from vlbert.data.feature_store import FeatureStore, shards_folder
from vlbert.detection import rules
from vlbert.detection.backends import TorchvisionBackend
from vlbert.detection.extract import Chunk, StoreFormat, chunk_manifest, extract_chunk, extract_to_store, index_store
from vlbert.detection.model import load_detector
from vlbert.detection.rules import BoxRule, select_boxes
from vlbert.detection.sources import image_items


@pytest.fixture
def backend(smoke_detector):
    model, config = load_detector(smoke_detector)
    return TorchvisionBackend(model, config, BoxRule())


# ---- the rule --------------------------------------------------------------------------------


def _proposals(confidences, classes=3):
    """Far-apart boxes (no NMS suppression) whose best foreground class has the given probability."""
    n = len(confidences)
    boxes = torch.tensor([[20.0 * i, 0.0, 20.0 * i + 10, 10.0] for i in range(n)])
    probs = torch.zeros(n, classes + 1)
    probs[:, 1] = torch.tensor(confidences)
    probs[:, 0] = 1 - probs[:, 1]
    return boxes, probs


@pytest.mark.parametrize(
    "confidences, expected",
    [
        ([0.9] * 3 + [0.1] * 20, 10),  # 3 above 0.2: topped up to min_boxes
        ([0.9] * 40 + [0.1] * 5, 40),  # between the bounds: exactly those above
        ([0.9] * 3 + [0.3] * 12 + [0.1] * 5, 15),  # the paper's conf_thresh is 0.2: a 0.3 box is kept
        ([0.9] * 150, 100),  # more than max_boxes: capped
        ([0.9] * 4, 4),  # fewer proposals than min_boxes: all of them
    ],
)
def test_rule_keeps_between_min_and_max(confidences, expected):
    kept, confidence = select_boxes(*_proposals(confidences), BoxRule())
    assert len(kept) == expected
    assert torch.all(confidence[:-1] >= confidence[1:])  # best first


def test_rule_confidence_counts_only_classes_a_box_survives_nms():
    boxes = torch.tensor([[0.0, 0, 10, 10], [0.5, 0, 10.5, 10]])  # IoU ~0.9: one suppresses the other
    probs = torch.tensor([[0.1, 0.8, 0.1], [0.1, 0.7, 0.2]])
    kept, confidence = select_boxes(boxes, probs, BoxRule(min_boxes=2))
    # Box 1 loses class 1 to box 0 but survives as class 2 (0.2), the only class it is kept for.
    assert kept.tolist() == [0, 1] and confidence.tolist() == pytest.approx([0.8, 0.2])


def test_rule_numbers_are_configurable():
    kept, _ = select_boxes(
        *_proposals([0.9] * 3 + [0.6] * 5 + [0.1] * 20), BoxRule(score_threshold=0.7, min_boxes=2, max_boxes=4)
    )
    assert len(kept) == 3
    with pytest.raises(ValueError, match="min_boxes <= max_boxes"):
        BoxRule(min_boxes=5, max_boxes=4)


def _rule_over_all_pairs(boxes, probs, rule):
    """bottom-up-attention's rule written plainly: NMS of every class over every proposal."""
    foreground = probs[:, 1:]
    confidence = torch.zeros(len(boxes))
    for c in range(foreground.shape[1]):
        keep = nms(boxes, foreground[:, c], rule.nms_iou)
        confidence[keep] = torch.maximum(confidence[keep], foreground[keep, c])
    order = torch.argsort(confidence, descending=True, stable=True)
    count = min(max(int((confidence > rule.score_threshold).sum()), rule.min_boxes), rule.max_boxes, len(boxes))
    return order[:count], confidence[order[:count]]


def test_rule_tops_up_with_boxes_suppressed_in_every_class():
    """Duplicates lose every class to their twin, and a proposal may have no foreground at all:
    their confidence is 0, and they still top the count up to min_boxes."""
    box = [[10.0, 10, 50, 50]]
    kept, confidence = select_boxes(torch.tensor(box * 2), torch.tensor([[0.5, 0.5]] * 2), BoxRule(min_boxes=2))
    assert kept.tolist() == [0, 1] and confidence.tolist() == [0.5, 0.0]
    kept, confidence = select_boxes(torch.tensor(box), torch.tensor([[1.0, 0.0, 0.0]]), BoxRule(min_boxes=1))
    assert kept.tolist() == [0] and confidence.tolist() == [0.0]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("classes, extent", [(20, 200), (1600, 1000)])
@pytest.mark.parametrize(
    "rule",
    [
        BoxRule(),
        BoxRule(min_boxes=2),
        BoxRule(score_threshold=0.6, min_boxes=40),
        BoxRule(min_boxes=150, max_boxes=150),
    ],
)
def test_rule_equals_nms_over_every_class_and_proposal(rule, classes, extent, seed):
    """The rule runs NMS only over (box, class) pairs above a floor it lowers as the top-up needs:
    the same boxes, order and confidences as over all pairs, on clustered proposals (Visual
    Genome's 1,600 classes on large images too)."""
    generator = torch.Generator().manual_seed(seed)
    centres = torch.rand(12, 2, generator=generator) * extent
    corner = centres[torch.randint(0, 12, (300,), generator=generator)] + torch.randn(300, 2, generator=generator) * 6
    boxes = torch.cat([corner, corner + 10 + torch.rand(300, 2, generator=generator) * 40], 1)
    probs = (torch.randn(300, classes + 1, generator=generator) * (2.5 if classes < 100 else 4)).softmax(-1)
    expected, expected_confidence = _rule_over_all_pairs(boxes, probs, rule)
    kept, confidence = select_boxes(boxes, probs, rule)
    assert torch.equal(kept, expected) and torch.equal(confidence, expected_confidence)


@pytest.mark.parametrize("seed", range(20))
def test_per_class_nms_on_the_iou_matrix_keeps_what_torchvision_keeps_class_by_class(seed):
    """Small boxes on a grid, tied scores and overlaps at the threshold itself (IoU 0.3 in float32
    is above 0.3, and torchvision's kernel suppresses it; 0.5 is exact, and is not above 0.5): the
    matrix form keeps the same pairs."""
    generator = torch.Generator().manual_seed(seed)
    corner = torch.randint(0, 12, (80, 2), generator=generator).float()
    boxes = torch.cat([corner, corner + torch.randint(1, 11, (80, 2), generator=generator)], 1)
    scores = torch.randint(1, 6, (80,), generator=generator).float() / 5
    classes = torch.randint(0, 4, (80,), generator=generator)
    matrix = rules._per_class_nms_matrix(boxes, scores, classes, 0.3)
    by_class = rules._per_class_nms_by_class(boxes, scores, classes, 0.3)
    assert sorted(matrix.tolist()) == sorted(by_class.tolist())
    at_threshold = torch.tensor([[0.0, 0, 10, 10], [0, 0, 3, 10]])  # IoU 30 / 100
    one = torch.tensor([0.9, 0.8]), torch.zeros(2, dtype=torch.long)
    assert rules._per_class_nms_matrix(at_threshold, *one, 0.3).tolist() == [0]
    assert rules._per_class_nms_by_class(at_threshold, *one, 0.3).tolist() == [0]
    exactly_at = torch.tensor([[0.0, 0, 10, 10], [0, 0, 5, 10]])  # IoU 50 / 100, not above 0.5: both kept
    assert sorted(rules._per_class_nms_matrix(exactly_at, *one, 0.5).tolist()) == [0, 1]
    assert sorted(rules._per_class_nms_by_class(exactly_at, *one, 0.5).tolist()) == [0, 1]


def test_extraction_applies_the_rule_plus_the_whole_image(backend, smoke_world):
    items = image_items(smoke_world / "vqa", "vqa", "val2014")[:6]
    from vlbert.data.images import load_image

    results = backend.extract([load_image(i.path) for i in items], [None] * len(items))
    for r in results:
        assert 10 <= len(r.boxes) - 1 <= 100
        assert r.boxes[0].tolist() == [0, 0, r.width, r.height] and r.labels[0] == 0
        assert r.features.shape == (len(r.boxes), backend.feature_dim)
        assert np.allclose(r.probs.sum(1), 1, atol=1e-5)
        assert np.all(r.scores[1:-1] >= r.scores[2:])


# ---- ground-truth boxes ----------------------------------------------------------------------


def test_ground_truth_mode_describes_the_given_boxes(backend, smoke_world, tmp_path):
    items = image_items(smoke_world / "refcoco+", "refcoco+", "all", gt_boxes=True)[:8]
    extract_to_store(backend, items, tmp_path / "gt.h5", batch_size=3, progress=False)
    with FeatureStore(tmp_path / "gt.h5") as store:
        assert store.attrs["mode"] == "gt"
        for item in items:
            regions = store[item.key]
            assert np.allclose(regions["boxes"][1:], item.boxes, atol=1e-3)
            assert regions["box_ids"].tolist() == [-1, *item.box_ids]
    vcr = image_items(smoke_world / "vcr", "vcr", "val", gt_boxes=True)
    assert all(len(i.boxes) == len(i.box_ids) >= 1 for i in vcr)  # every object of the image, one at least


# ---- resume after a kill ---------------------------------------------------------------------


def _read_all(path):
    with h5py.File(path, "r") as f:
        return {name: f[name][()] for name in f}, dict(f.attrs)


def _assert_same_files(a, b):
    found, expected = _read_all(a), _read_all(b)
    assert found[0].keys() == expected[0].keys()
    for name in expected[0]:
        assert np.array_equal(found[0][name], expected[0][name]), (a, name)
    assert found[1] == expected[1]


@pytest.mark.slow  # a killed extraction subprocess, restarted: tens of seconds
def test_killed_chunk_resumes_to_the_same_store(smoke_detector, smoke_world, tmp_path):
    """The smoke preset's caption store is 8 shards of 16 images in 2 chunks: chunk 1 killed after
    its first shard, run again, then chunk 2 and the index, equals one uninterrupted extraction."""
    command = [
        sys.executable,
        "-m",
        "vlbert.cli",
        "extract-rois",
        "--config",
        str(REPO / "experiments/smoke.yaml"),
        "--data",
        str(smoke_world),
        "--detector",
        str(smoke_detector),
        "--dataset",
        "conceptual_captions",
        "--split",
        "train",
        "--batch-size",
        "2",
        "--quiet",
        "--threads",
        "1",
    ]
    killed, shards = tmp_path / "killed.h5", tmp_path / "killed.shards"
    process = subprocess.Popen(command + ["--out", str(killed), "--chunk", "1-of-2"])
    deadline = time.time() + 120
    while not list(shards.glob("shard_*.h5")):
        assert process.poll() is None and time.time() < deadline, "the chunk ended before it could be killed"
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    done_before = {p.name: p.stat().st_mtime_ns for p in shards.glob("shard_*.h5")}
    assert 1 <= len(done_before) < 4 and not (shards / "chunk_1-of-2.json").exists()
    for chunk in ("1-of-2", "2-of-2"):
        subprocess.run(command + ["--out", str(killed), "--chunk", chunk], check=True)
    assert {p.name: p.stat().st_mtime_ns for p in shards.glob("shard_*.h5") if p.name in done_before} == done_before
    manifests = [str(shards / f"chunk_{c}.json") for c in ("2-of-2", "1-of-2")]
    subprocess.run([sys.executable, "-m", "vlbert.cli", "index-store", "--out", str(killed), *manifests], check=True)
    subprocess.run(command + ["--out", str(tmp_path / "straight.h5")], check=True)
    _assert_same_files(killed, tmp_path / "straight.h5")
    straight_shards = sorted((tmp_path / "straight.shards").glob("shard_*.h5"))
    assert [p.name for p in straight_shards] == [f"shard_{k:06d}.h5" for k in range(8)]
    for path in straight_shards:
        _assert_same_files(shards / path.name, path)
    with FeatureStore(killed) as store:
        assert len(store) == 120 and len(store.keys) == len(set(store.keys))


# ---- bad images ------------------------------------------------------------------------------


@pytest.fixture
def items_with_a_corrupt_image(smoke_world, tmp_path):
    items = image_items(smoke_world / "vqa", "vqa", "val2014")[:5]
    corrupt = tmp_path / "corrupt.jpg"
    corrupt.write_bytes(b"\xff\xd8\xff not a jpeg")
    from dataclasses import replace

    return items[:2] + [replace(items[2], path=corrupt), replace(items[3], path=tmp_path / "missing.jpg")] + items[4:]


def test_bad_image_is_an_error_naming_it(backend, items_with_a_corrupt_image, tmp_path):
    with pytest.raises(OSError, match=r"cannot read image .*corrupt\.jpg.*--on-bad-image skip"):
        extract_to_store(backend, items_with_a_corrupt_image, tmp_path / "f.h5", progress=False)
    assert not (tmp_path / "f.h5").exists()


def test_bad_images_skipped_are_counted_and_recorded(backend, items_with_a_corrupt_image, tmp_path):
    summary = extract_to_store(
        backend, items_with_a_corrupt_image, tmp_path / "f.h5", batch_size=2, on_bad_image="skip", progress=False
    )
    assert summary == {"images": 3, "regions": summary["regions"], "skipped": 2, "shards": 1}
    with FeatureStore(tmp_path / "f.h5") as store:
        assert store.attrs["num_skipped"] == 2 and len(store) == 3
        skipped = dict(store.skipped)
        bad_keys = [items_with_a_corrupt_image[2].key, items_with_a_corrupt_image[3].key]
        assert sorted(skipped) == sorted(bad_keys)
        assert "missing.jpg" in skipped[items_with_a_corrupt_image[3].key]


class _TakenForAGpuBackend:
    """The CPU backend, which extraction takes for a GPU one: threaded decoding, and the rule and
    the writes beside the forward pass."""

    device = "cuda"

    def __init__(self, backend):
        self.backend = backend

    def __getattr__(self, name):
        return getattr(self.backend, name)


def test_the_gpu_path_writes_what_the_cpu_path_writes(backend, items_with_a_corrupt_image, tmp_path):
    items = items_with_a_corrupt_image
    for name, chosen in (("cpu", backend), ("gpu", _TakenForAGpuBackend(backend))):
        extract_to_store(chosen, items, tmp_path / f"{name}.h5", batch_size=2, on_bad_image="skip", progress=False)
    with FeatureStore(tmp_path / "cpu.h5") as cpu, FeatureStore(tmp_path / "gpu.h5") as gpu:
        assert cpu.keys == gpu.keys and len(cpu) == 3 and dict(cpu.skipped) == dict(gpu.skipped)
        for key in cpu.keys:
            assert all(np.array_equal(cpu[key][name], gpu[key][name]) for name in cpu[key])
    with pytest.raises(OSError, match=r"cannot read image .*corrupt\.jpg.*--on-bad-image skip"):
        extract_to_store(_TakenForAGpuBackend(backend), items_with_a_corrupt_image, tmp_path / "f.h5", progress=False)


# ---- the smoke preset end to end -------------------------------------------------------------


@pytest.mark.slow
def test_smoke_preset_trains_a_detector_and_extracts_every_data_set(smoke_world, tmp_path):
    cli = [sys.executable, "-m", "vlbert.cli"]
    preset = str(REPO / "experiments/smoke.yaml")
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    subprocess.run(
        cli
        + [
            "train-detector",
            "--config",
            preset,
            "--data",
            str(smoke_world / "detector"),
            "--out",
            str(tmp_path / "detector"),
        ],
        check=True,
        env=env,
    )
    assert (tmp_path / "detector/detector.safetensors").is_file()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    [run] = client.search_runs([client.get_experiment_by_name("vlbert-ablation-smoke").experiment_id])
    assert "val_mAP50" in run.data.metrics and "loss" in run.data.metrics and run.data.tags["stage"] == "detector"
    jobs = [
        ("conceptual_captions", "train", False),
        ("conceptual_captions", "val", False),
        ("vqa", "train2014", False),
        ("vqa", "val2014", False),
        ("vqa", "test-dev2015", False),
        ("vcr", "train", True),
        ("vcr", "val", True),
        ("vcr", "test", True),
        ("refcoco+", "all", False),
        ("refcoco+", "all", True),
    ]
    for dataset, split, gt in jobs:
        out = tmp_path / f"{dataset}_{split}{'_gt' if gt else ''}.h5"
        assert (
            main(
                [
                    "extract-rois",
                    "--config",
                    preset,
                    "--data",
                    str(smoke_world),
                    "--detector",
                    str(tmp_path / "detector"),
                    "--dataset",
                    dataset,
                    "--split",
                    split,
                    "--out",
                    str(out),
                    "--quiet",
                ]
                + (["--gt-boxes"] if gt else [])
            )
            == 0
        )
        with FeatureStore(out) as store:
            expected = {i.key for i in image_items(smoke_world / dataset, dataset, split, gt_boxes=gt)}
            assert set(store.keys) == expected and store.attrs["num_skipped"] == 0


# ---- the detector's quality on ground-truth boxes ---------------------------------------------


@pytest.fixture(scope="module")
def val_coco(smoke_world):
    from vlbert.data.coco import read_coco

    root = smoke_world / "detector"
    return read_coco(root / "annotations/instances_val2017.json", root / "val2017")


def test_ground_truth_accuracy_per_size_on_the_smoke_detector(smoke_detector, val_coco):
    from vlbert.detection.train import ground_truth_accuracy

    model, _ = load_detector(smoke_detector)
    accuracy = ground_truth_accuracy(model, val_coco)
    assert list(accuracy["by_size"]) == ["small", "large"]  # the world's own sizes, not COCO's areas
    assert sum(g["boxes"] for g in accuracy["by_size"].values()) == accuracy["all"]["boxes"] == len(val_coco.anns)
    for group in [*accuracy["by_size"].values(), accuracy["all"]]:
        assert set(group) == {"boxes", "class", "shape", "colour"}
        assert all(0 <= group[k] <= 1 for k in ("class", "shape", "colour"))
        assert group["class"] <= min(group["shape"], group["colour"])


def _same_shape_other_colour(coco, category_id):
    colour, shape = coco.cats[category_id]["name"].rsplit(" ", 1)
    return next(
        c
        for c, cat in coco.cats.items()
        if cat["name"].endswith(f" {shape}") and not cat["name"].startswith(f"{colour} ")
    )


def test_ground_truth_accuracy_of_a_model_always_right_and_one_wrong_in_colour(val_coco):
    from vlbert.detection.train import score_ground_truth_labels

    right = score_ground_truth_labels(val_coco, {a: ann["category_id"] for a, ann in val_coco.anns.items()})
    for group in [*right["by_size"].values(), right["all"]]:
        assert (group["class"], group["shape"], group["colour"]) == (1.0, 1.0, 1.0)
    wrong_colour = score_ground_truth_labels(
        val_coco, {a: _same_shape_other_colour(val_coco, ann["category_id"]) for a, ann in val_coco.anns.items()}
    )
    for group in [*wrong_colour["by_size"].values(), wrong_colour["all"]]:
        assert (group["class"], group["shape"], group["colour"]) == (0.0, 1.0, 0.0)


def test_ground_truth_accuracy_without_sizes_or_colour_names_uses_coco_areas_and_classes_only():
    import contextlib
    import io

    from pycocotools.coco import COCO

    from vlbert.detection.train import score_ground_truth_labels

    coco = COCO()
    coco.dataset = {
        "images": [{"id": 1, "file_name": "x.jpg", "width": 200, "height": 200}],
        "categories": [{"id": 1, "name": "tennis racket"}, {"id": 2, "name": "dog"}],
        "annotations": [
            {"id": k + 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, side, side], "area": side * side}
            for k, side in enumerate((10, 50, 150))
        ],
    }
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    accuracy = score_ground_truth_labels(coco, {1: 1, 2: 2, 3: 1})
    assert accuracy["by_size"] == {
        "small": {"boxes": 1, "class": 1.0},
        "medium": {"boxes": 1, "class": 0.0},
        "large": {"boxes": 1, "class": 1.0},
    }
    assert accuracy["all"] == {"boxes": 3, "class": pytest.approx(2 / 3)}


def test_report_writes_the_detector_quality_table_or_says_it_is_missing(tmp_path):
    import json

    from vlbert.study.report import write_detector

    accuracy = {
        "by_size": {
            "small": {"boxes": 30, "class": 0.5, "shape": 0.9, "colour": 0.6},
            "large": {"boxes": 20, "class": 0.95, "shape": 1.0, "colour": 0.95},
        },
        "all": {"boxes": 50, "class": 0.68, "shape": 0.94, "colour": 0.74},
    }
    # Sorted keys, as the CLI writes metrics.json: the table still reads small, large, all.
    metrics = {"val_mAP": 0.41, "val_mAP50": 0.723, "val_gt_accuracy": accuracy}
    (tmp_path / "metrics.json").write_text(json.dumps(metrics, sort_keys=True))
    write_detector(tmp_path, tmp_path)
    text = (tmp_path / "detector.md").read_text()
    assert "0.410" in text and "0.723" in text
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert rows == [
        "| size | boxes | class right (%) | shape right (%) | colour right (%) |",
        "| small | 30 | 50.0 | 90.0 | 60.0 |",
        "| large | 20 | 95.0 | 100.0 | 95.0 |",
        "| all | 50 | 68.0 | 94.0 | 74.0 |",
    ]
    (tmp_path / "metrics.json").write_text(json.dumps({"val_mAP": 0.41, "val_mAP50": 0.723}))  # an older detector
    write_detector(tmp_path, tmp_path)
    text = (tmp_path / "detector.md").read_text()
    assert "0.723" in text and "no ground-truth box accuracy" in text and "| size |" not in text
    (tmp_path / "metrics.json").unlink()
    write_detector(tmp_path, tmp_path)
    assert "No detector metrics" in (tmp_path / "detector.md").read_text()


# ---- broken stores, stores of another data set, paths outside the data root -------------------


def _without_offsets(path):
    with h5py.File(path, "a") as f:
        del f["offsets"]


@pytest.mark.parametrize(
    "damage, problem",
    [
        (lambda p: p.write_bytes(b""), "not a readable feature store"),
        (lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]), "not a readable feature store"),
        (lambda p: p.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(range(256)) * 8), "not a readable feature store"),
        (_without_offsets, "no 'offsets' dataset"),
    ],
)
@pytest.mark.parametrize("preload", [False, True])
def test_broken_feature_store_names_the_file(tmp_path, damage, problem, preload):
    path = tiny_store(
        tmp_path / "vqa.val2014.det.h5", keys=[str(k) for k in range(50)], dataset="vqa", split="val2014"
    )
    damage(path)
    with pytest.raises(DataFormatError, match=rf"vqa\.val2014\.det\.h5: {problem}"):
        FeatureStore(path, preload=preload)


def test_store_of_another_data_set_is_refused(refcoco_fixture, tmp_path):
    """The VQA train store where RefCOCO+'s is expected: its image ids could match and give
    another data set's features without a word."""
    from vlbert import tasks

    data, features = tmp_path / "data", tmp_path / "features"
    (data / "refcoco+").mkdir(parents=True)
    for name in ("instances.json", "refs(unc).p"):
        shutil.copy(refcoco_fixture / name, data / "refcoco+" / name)
    tiny_store(features / "refcoco+.all.det.h5", keys=["581857", "9"], dataset="vqa", split="train2014")
    with pytest.raises(
        DataFormatError,
        match=r"refcoco\+\.all\.det\.h5: a store of dataset 'vqa', split 'train2014', "
        r"mode 'detected', but dataset 'refcoco\+', split 'all', mode 'detected' "
        r"is expected here",
    ):
        tasks.build("refcoco_det", None, data, features)
    tiny_store(features / "refcoco+.all.gt.h5", keys=["581857", "9"], dataset="refcoco+", split="all")
    with pytest.raises(DataFormatError, match=r"refcoco\+\.all\.gt\.h5: .* mode 'detected', but .* mode 'gt'"):
        tasks.build("refcoco_gt", None, data, features)
    tiny_store(features / "refcoco+.all.det.h5", keys=["581857", "9"])
    with pytest.raises(DataFormatError, match=r"refcoco\+\.all\.det\.h5: no 'dataset' attribute"):
        tasks.build("refcoco_det", None, data, features)
    tiny_store(features / "refcoco+.all.det.h5", keys=["581857", "9"], dataset="refcoco+", split="all")
    assert len(tasks.build("refcoco_det", None, data, features).examples("test")) == 4


def test_extraction_refuses_metadata_outside_the_data_root(tmp_path):
    """VCR ground-truth boxes come from the metadata file each line names: one outside the root
    would land its boxes in the store without a word."""
    root = tmp_path / "vcr"
    shutil.copytree(REPO / "tests/fixtures/vcr", root)
    (tmp_path / "elsewhere.json").write_text((root / "vcr1images/movie_a/frame_0001.json").read_text())
    lines = (root / "val.jsonl").read_text().splitlines()
    record = json.loads(lines[1])
    record["metadata_fn"] = "../../elsewhere.json"
    (root / "val.jsonl").write_text(lines[0] + "\n" + json.dumps(record) + "\n")
    with pytest.raises(DataFormatError, match=r"val\.jsonl:2 \[metadata_fn\]: \.\./\.\./elsewhere\.json is outside"):
        image_items(root, "vcr", "val", gt_boxes=True)


def test_shards_are_made_again_for_another_detector_or_changed_images(backend, smoke_world, tmp_path):
    """A finished shard is kept only for the same inputs: a detector trained again into the same
    folder (other weights) or an image file rewritten under its key makes it again."""
    items = image_items(smoke_world / "vqa", "vqa", "val2014")[:6]
    fmt = StoreFormat(images_per_shard=3)
    out = tmp_path / "s.h5"

    def stamps():
        return {p.name: p.stat().st_mtime_ns for p in shards_folder(out).glob("shard_*.h5")}

    extract_to_store(backend, items, out, batch_size=3, attrs={"detector_weights": "one"}, fmt=fmt, progress=False)
    first = stamps()
    extract_to_store(backend, items, out, batch_size=3, attrs={"detector_weights": "one"}, fmt=fmt, progress=False)
    assert stamps() == first
    os.utime(items[4].path, ns=(time.time_ns(), time.time_ns()))
    extract_to_store(backend, items, out, batch_size=3, attrs={"detector_weights": "one"}, fmt=fmt, progress=False)
    second = stamps()
    assert (
        second["shard_000000.h5"] == first["shard_000000.h5"] and second["shard_000001.h5"] != first["shard_000001.h5"]
    )
    extract_to_store(backend, items, out, batch_size=3, attrs={"detector_weights": "two"}, fmt=fmt, progress=False)
    assert all(stamps()[name] != second[name] for name in second)


def test_index_refuses_chunks_of_two_layouts(backend, smoke_world, tmp_path):
    items = image_items(smoke_world / "vqa", "vqa", "val2014")[:6]
    out = tmp_path / "s.h5"
    extract_chunk(backend, items, out, Chunk(1, 2), batch_size=2, fmt=StoreFormat(images_per_shard=2), progress=False)
    extract_chunk(backend, items, out, Chunk(2, 2), batch_size=2, fmt=StoreFormat(images_per_shard=3), progress=False)
    manifests = [chunk_manifest(out, Chunk(k, 2)) for k in (1, 2)]
    with pytest.raises(ValueError, match="manifests are of different extractions"):
        index_store(out, manifests)
    extract_chunk(backend, items, out, Chunk(1, 2), batch_size=2, fmt=StoreFormat(images_per_shard=3), progress=False)
    assert index_store(out, manifests)["images"] == 6


def test_a_strided_pointwise_convolution_equals_torchs():
    from vlbert.detection.model import StridedPointwiseConv, _downsample_conv

    torch.manual_seed(0)
    ours = StridedPointwiseConv(8, 16, 2)
    theirs = torch.nn.Conv2d(8, 16, 1, 2, bias=False)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(3, 8, 13, 12, requires_grad=True)
    got, expected = ours(x), theirs(x)
    torch.testing.assert_close(got, expected)
    # The weight's gradient is the one oneDNN overruns on channels-last input.
    got_grads = torch.autograd.grad(got.square().sum(), (x, ours.weight))
    expected_grads = torch.autograd.grad(expected.square().sum(), (x, theirs.weight))
    torch.testing.assert_close(got_grads, expected_grads)
    assert isinstance(_downsample_conv(8, 16, 2), StridedPointwiseConv)  # the smoke preset's C3
    assert type(_downsample_conv(16, 32, 2)) is torch.nn.Conv2d  # the mini preset's


# One training step of the smoke preset's trunk (widths 8-64, where oneDNN's strided 1x1 weight
# gradient on channels-last input overruns its buffer) on an odd batch, in its own process: heap
# corruption aborts the process rather than failing an assertion.
_CHANNELS_LAST_STEPS = """
import torch
from vlbert.detection.model import C4Backbone, C5Head, DetectorConfig

config = DetectorConfig(class_names=["a"], widths=(8, 16, 32, 64), c4_stride=8)
backbone, head = C4Backbone(config), C5Head(config)
for batch in (3, 7, 9) * 5:
    c4 = backbone(torch.randn(batch, 3, 96, 96))["0"]
    (c4.mean() + head(c4[:, :, :8, :8]).mean()).backward()
"""


def test_the_trunk_trains_on_channels_last_tensors_without_corrupting_memory():
    env = {**os.environ, "MALLOC_CHECK_": "3", "OMP_NUM_THREADS": "2"}
    # glibc >= 2.34 checks the heap on MALLOC_CHECK_ only with its debugging malloc preloaded.
    debug_malloc = "/lib/x86_64-linux-gnu/libc_malloc_debug.so.0"
    if os.path.exists(debug_malloc):
        env["LD_PRELOAD"] = debug_malloc
    run = [sys.executable, "-c", _CHANNELS_LAST_STEPS]
    done = subprocess.run(run, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"exit status {done.returncode}: {done.stderr[-2000:]}"


def test_decoded_images_are_load_image_kept_within_their_bytes(tmp_path):
    from PIL import Image

    from vlbert.data.images import DecodedImages, load_image

    paths = []
    for k in range(3):
        path = tmp_path / f"{k}.png"
        Image.new("RGB", (4, 2), (10 * k, 20, 30)).save(path)
        paths.append(path)
    images = DecodedImages(max_bytes=2 * 3 * 4 * 2)  # room for two 4 x 2 images
    first = images(paths[0])
    assert torch.equal(first, load_image(paths[0]))
    first.zero_()  # a caller's tensor is its own: the kept pixels are untouched
    assert torch.equal(images(paths[0]), load_image(paths[0]))
    images(paths[1]), images(paths[0]), images(paths[2])  # 1 is the least recently used: dropped
    assert list(images._pixels) == [str(paths[0]), str(paths[2])] and images.bytes == 48
    with pytest.raises(OSError, match=r"cannot read image .*missing"):
        images(tmp_path / "missing.png")
    images.resize(0)  # the preset's default: nothing kept, every call decodes
    assert images.bytes == 0 and not images._pixels
    assert torch.equal(images(paths[1]), load_image(paths[1])) and not images._pixels
