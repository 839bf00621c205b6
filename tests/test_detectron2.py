"""The detectron2 backend (`detector.backend: detectron2`): the DAG takes the given model instead of
training one, extraction and VL-BERT's tuned trunk read it alike, and a study runs on it end to end.

detectron2 is not on PyPI: the tests that run it are skipped, saying why, where it is not
importable (the README's paper section says how to build it). Their model is a C4 Faster R-CNN of random
weights built from detectron2's own R50-C4 config, narrowed to the smoke world's size.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import REPO, SNAKEMAKE, snakemake_failure

from vlbert import registry
from vlbert.detection.backends import build_backend
from vlbert.detection.detectron2 import DETECTRON2_MISSING, describe
from vlbert.detection.rules import BoxRule

SMOKE = yaml.safe_load((REPO / "experiments/smoke.yaml").read_text())

try:
    import detectron2  # noqa: F401

    MISSING = None
except ImportError:
    MISSING = "detectron2 is not importable here (not on PyPI: the README's paper section says how to build it)"
needs_detectron2 = pytest.mark.skipif(MISSING is not None, reason=str(MISSING))


def detectron2_preset(config_file, weights_file) -> dict:
    """The smoke preset with only `detector:` set to the detectron2 backend."""
    return {
        **SMOKE,
        "detector": {
            "backend": "detectron2",
            "detectron2": {"config": str(config_file), "weights": str(weights_file)},
        },
    }


def small_c4_model(out: Path) -> tuple[Path, Path]:
    """detectron2's model zoo R50-C4 Faster R-CNN, narrowed for 96-px images (widths /8, RoIs of
    8x8, the smoke world's 12 classes, 50 proposals), of random weights: its config and checkpoint."""
    import detectron2
    from detectron2.checkpoint import DetectionCheckpointer
    from detectron2.config import get_cfg
    from detectron2.modeling import build_model

    cfg = get_cfg()
    cfg.merge_from_file(
        str(Path(detectron2.__file__).parent / "model_zoo/configs/COCO-Detection/faster_rcnn_R_50_C4_1x.yaml")
    )
    cfg.MODEL.DEVICE, cfg.MODEL.WEIGHTS = "cpu", ""
    cfg.MODEL.RESNETS.STEM_OUT_CHANNELS, cfg.MODEL.RESNETS.RES2_OUT_CHANNELS = 16, 32
    cfg.MODEL.RESNETS.WIDTH_PER_GROUP = 8
    cfg.MODEL.ROI_HEADS.NUM_CLASSES, cfg.MODEL.ROI_BOX_HEAD.POOLER_RESOLUTION = 12, 8
    cfg.MODEL.RPN.PRE_NMS_TOPK_TEST, cfg.MODEL.RPN.POST_NMS_TOPK_TEST = 300, 50
    cfg.INPUT.MIN_SIZE_TEST, cfg.INPUT.MAX_SIZE_TEST = 96, 160
    torch.manual_seed(0)
    out.mkdir(parents=True, exist_ok=True)
    DetectionCheckpointer(build_model(cfg), save_dir=str(out)).save("model")
    (out / "config.yaml").write_text(cfg.dump())
    return out / "config.yaml", out / "model.pth"


@pytest.fixture(scope="module")
def c4_model(tmp_path_factory):
    return small_c4_model(tmp_path_factory.mktemp("c4_model"))


# ---- without detectron2 ----------------------------------------------------------------------


def test_a_detectron2_preset_plans_no_detector_training_and_every_input_resolves(tmp_path):
    """`snakemake -n` of the smoke preset with only `detector:` changed: the detector folder is the
    given model's description; extraction, pre-training, fine-tuning and the report take it."""
    (tmp_path / "c4.yaml").write_text("MODEL: {}\n")
    (tmp_path / "model.pth").write_bytes(b"weights")
    preset = tmp_path / "preset.yaml"
    preset.write_text(yaml.safe_dump(detectron2_preset(tmp_path / "c4.yaml", tmp_path / "model.pth")))
    result = subprocess.run(
        SNAKEMAKE + ["-n", "--configfile", str(preset), "--directory", str(tmp_path / "run")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = [line.split()[1].rstrip(":") for line in result.stdout.splitlines() if line.startswith("rule ")]
    assert "train_detector" not in jobs and jobs.count("describe_detector") == 1 and "report" in jobs
    commands = [line for line in result.stdout.splitlines() if line.startswith("Shell command: ")]
    extractions = [c for c in commands if "vlbert extract-rois" in c]
    assert extractions and all("--detector results/smoke/detector " in c for c in extractions)
    # The detector's own data set is made only to train a detector.
    assert not any("make-data" in c and "--only 'detector'" in c for c in commands)


def test_detectron2_missing_says_how_to_install(monkeypatch, tmp_path):
    from vlbert.detection.backends import Detectron2Backend

    monkeypatch.setitem(sys.modules, "detectron2", None)  # not importable, even where installed
    with pytest.raises(ImportError, match="not on PyPI: build it from source") as info:
        Detectron2Backend({"cfg": "MODEL: {}\n"}, BoxRule())
    assert str(info.value) == DETECTRON2_MISSING
    (tmp_path / "c.yaml").write_text("MODEL: {}\n")
    (tmp_path / "w.pkl").write_bytes(b"weights")
    with pytest.raises(ImportError, match="not on PyPI"):  # the preset's choice reaches it
        build_backend(detectron2_preset(tmp_path / "c.yaml", tmp_path / "w.pkl"))
    with pytest.raises(FileNotFoundError, match=r"detector.detectron2: no such file: .*absent\.pkl"):
        build_backend(detectron2_preset(tmp_path / "c.yaml", tmp_path / "absent.pkl"))


def test_the_report_names_a_given_detector_and_whose_figures_are_its(tmp_path):
    from vlbert.study.report import write_detector

    description = {
        "backend": "detectron2",
        "config_file": "/models/vg/faster_rcnn_R_101_C4_caffe.yaml",
        "weights": "/models/vg/faster_rcnn_from_caffe.pkl",
        "weights_identity": "size 255000000, mtime_ns 1",
        "feature_dim": 2048,
        "class_names": [str(k) for k in range(1, 1601)],
    }
    (tmp_path / "detector_config.json").write_text(json.dumps(description))
    write_detector(tmp_path, tmp_path)
    text = (tmp_path / "detector.md").read_text()
    assert "faster_rcnn_from_caffe.pkl" in text and "2048-d" in text and "1600 classes" in text
    assert "trained none" in text and "the weights' own" in text and "mAP" not in text


# ---- with detectron2 -------------------------------------------------------------------------


@needs_detectron2
def test_description_refuses_what_is_not_a_c4_model_a_fork_s_key_and_weights_that_do_not_fit(c4_model, tmp_path):
    config_file, weights = c4_model
    fpn = yaml.safe_load(config_file.read_text())
    fpn["MODEL"]["ROI_HEADS"]["NAME"] = "StandardROIHeads"
    (tmp_path / "fpn.yaml").write_text(yaml.safe_dump(fpn))
    with pytest.raises(ValueError, match=r"fpn\.yaml: the study reads a C4 Faster R-CNN"):
        describe(tmp_path / "fpn.yaml", weights)
    # bottom-up-attention's fork: a caffe max-pool stock detectron2 would build without
    fork = yaml.safe_load(config_file.read_text())
    fork["MODEL"]["RESNETS"]["CAFFE_MAXPOOL"] = True
    (tmp_path / "fork.yaml").write_text(yaml.safe_dump(fork))
    with pytest.raises(ValueError, match=r"fork\.yaml: .*CAFFE_MAXPOOL.*a fork of detectron2"):
        describe(tmp_path / "fork.yaml", weights)
    torch.save({"model": {"backbone.stem.conv1.weight": torch.zeros(1)}}, tmp_path / "other.pth")
    with pytest.raises(ValueError, match=r"other\.pth do not fit the detectron2 model"):
        describe(config_file, tmp_path / "other.pth")
    # Weights changed after they were described: the stores were extracted with the others.
    copied = tmp_path / "model.pth"
    copied.write_bytes(weights.read_bytes())
    folder = _folder(tmp_path, describe(config_file, copied))
    copied.write_bytes(weights.read_bytes() + b"\0")
    with pytest.raises(ValueError, match=r"model\.pth are not those `vlbert describe-detector` recorded"):
        build_backend({**SMOKE, "detector": {"backend": "detectron2"}}, folder)


def tiny_pixel_bert(description: dict, **overrides):
    """A one-layer Pixel-BERT whose CNN is the described model's trunk."""
    from vlbert.modeling import PixelBertConfig

    sizes = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    return PixelBertConfig(**sizes, frcnn=description, **overrides)


def _folder(tmp_path, description) -> Path:
    folder = tmp_path / "detector"
    folder.mkdir(exist_ok=True)
    (folder / "detector_config.json").write_text(json.dumps(description))
    return folder


@needs_detectron2
def test_vl_bert_s_frozen_trunk_reproduces_extraction_and_trains_past_its_frozen_stages(c4_model, tmp_path):
    """What `full` tunes starts where the stores are: the trunk built from the description, with
    the given weights, gives the features extraction stored for the same boxes."""
    from vlbert.modeling.fast_rcnn import Detectron2FastRCNN, build_region_cnn

    description = describe(*c4_model)
    folder = _folder(tmp_path, description)
    backend = build_backend({**SMOKE, "detector": {"backend": "detectron2"}}, folder)
    torch.manual_seed(0)
    images = [torch.rand(3, 96, 128), torch.rand(3, 80, 96)]
    given = [np.array([[10, 10, 50, 60], [0, 0, 30, 30]], np.float32), np.array([[5, 5, 40, 40]], np.float32)]
    stored = backend.extract(images, given)
    detected = backend.extract(images, [None, None])
    assert all(1 < len(r.boxes) <= 1 + backend.rule.max_boxes for r in detected)
    assert all(r.probs.shape[1] == 13 and r.features.shape[1] == description["feature_dim"] for r in detected)

    trunk = build_region_cnn(description, trainable=True, frozen_stages=2)
    assert isinstance(trunk, Detectron2FastRCNN) and trunk.feature_dim == 256
    trunk.load_detector_weights(folder)
    boxes = [torch.from_numpy(r.boxes) for r in stored]
    with torch.no_grad():
        features = trunk.eval()(images, boxes)
    for computed, result in zip(features, stored):
        torch.testing.assert_close(computed, torch.from_numpy(result.features), rtol=0, atol=1e-5)
    # A masked RoI's pixels are zeroed before the trunk; the stem and res2 stay frozen, res3 on train.
    masked = trunk.train()(images, boxes, [torch.tensor([False, True, False]), torch.tensor([False, False])])
    assert not torch.allclose(masked[0][1], features[0][1]) and torch.allclose(masked[1], features[1], atol=1e-5)
    masked[0].sum().backward()
    trained = {name.split(".")[2] for name, p in trunk.named_parameters() if p.grad is not None}
    assert trained == {"res3", "res4", "res5"}
    # The study's setting decides what stays frozen, not the config's FREEZE_AT (2).
    everything = build_region_cnn(description, trainable=True, frozen_stages=0)
    assert {name.split(".")[2] for name, p in everything.named_parameters() if p.requires_grad} == {
        "stem",
        "res2",
        "res3",
        "res4",
        "res5",
    }


@needs_detectron2
def test_the_trunk_and_pixel_bert_read_pixels_as_detectron2_does(c4_model, tmp_path):
    """Channel order, scale and statistics: on images at the config's test size (no resize), the
    trunk's res4 map is detectron2's own (its model's `preprocess_image`), and so is Pixel-BERT's."""
    from detectron2.modeling import build_model

    from vlbert.detection.detectron2 import C4RegionTrunk, load_cfg
    from vlbert.modeling import PixelBertModel

    description = describe(*c4_model)
    model = build_model(load_cfg(description["cfg"])).eval()
    trunk = C4RegionTrunk.build(description)
    trunk.load_state_dict(model.state_dict(), strict=False)
    torch.manual_seed(0)
    images = [torch.rand(3, 96, 128), torch.rand(3, 96, 128)]
    with torch.no_grad():
        theirs = model.backbone(model.preprocess_image([{"image": i.flip(0) * 255} for i in images]).tensor)["res4"]
        ours = trunk.backbone(trunk.preprocess(images)[0].tensor)["res4"]
        torch.testing.assert_close(ours, theirs)
        cnn = PixelBertModel(tiny_pixel_bert(description)).cnn.eval()
        cnn.backbone.body.load_state_dict(model.backbone.state_dict())
        pixel_bert = cnn.backbone(cnn.transform(images)[0].tensors)["0"]
        # The statistics applied in [0, 1] instead of [0, 255]: float32 rounding, grown through
        # the untrained trunk, moves a few cells by about 1e-3 of the map's range.
        torch.testing.assert_close(pixel_bert, theirs, rtol=0, atol=2e-3 * float(theirs.abs().max()))
        assert float((pixel_bert - theirs).abs().mean()) < 1e-5 * float(theirs.abs().max())


@needs_detectron2
def test_pixel_bert_reads_a_given_detectron2_model_s_trunk_and_saves_it_once(c4_model, tmp_path):
    """Pixel-BERT's `cnn: detector` on a given model: its backbone to res4 and res5 with the
    checkpoint's weights, at the config's sizes and pixel statistics; a checkpoint of it reloads."""
    from vlbert.modeling import PixelBertModel

    description = describe(*c4_model)
    folder = _folder(tmp_path, description)
    config = tiny_pixel_bert(description, cnn_trainable_layers=1)
    assert config.image_sizes == (96, 160)
    torch.manual_seed(0)
    model = PixelBertModel(config)
    model.load_detector(folder)
    weights = torch.load(c4_model[1], weights_only=False)["model"]
    cnn = model.cnn
    for ours, theirs in (
        ("backbone.body.stem.conv1.weight", "backbone.stem.conv1.weight"),
        ("layer4.0.conv1.weight", "roi_heads.res5.0.conv1.weight"),
    ):
        torch.testing.assert_close(cnn.state_dict()[ours], weights[theirs], rtol=0, atol=0)
    assert cnn.out_channels == description["feature_dim"] and cnn.stride == 32
    # res5 trains (cnn_trainable_layers 1), the trunk to res4 is frozen.
    assert all(p.requires_grad for p in cnn.layer4.parameters())
    assert not any(p.requires_grad for p in cnn.backbone.parameters())
    maps, resized = cnn([torch.rand(3, 96, 128), torch.rand(3, 80, 96)])
    assert maps.shape[:2] == (2, 256) and resized.tolist() == [[96, 128], [96, 115]]
    model.save_pretrained(tmp_path / "saved")
    reloaded = PixelBertModel.from_pretrained(tmp_path / "saved")
    torch.testing.assert_close(reloaded.cnn.state_dict(), cnn.state_dict())


@pytest.mark.slow
@needs_detectron2
def test_both_targets_on_a_detectron2_model_fill_table_4_then_the_systems_table(c4_model, tmp_path):
    """`make reproduce` (VL-BERT's Table 4), then `make reproduce-systems`, on the smoke world with a
    given detectron2 model: no detector trained, `full` tunes the model's trunk and fine-tunes on
    its own features, every Table 4 cell is filled, the report says which detector ran, and the
    other systems (Pixel-BERT's CNN the model's trunk) fill the systems table."""
    import pandas as pd

    preset = tmp_path / "preset.yaml"
    preset.write_text(yaml.safe_dump(detectron2_preset(*c4_model)))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    study = SNAKEMAKE + ["--configfile", str(preset), "--directory", str(tmp_path)]
    for target in (["--config", "systems=[vlbert]"], []):
        result = subprocess.run(study + target, capture_output=True, text=True, env=env, timeout=1800)
        assert result.returncode == 0, snakemake_failure(result.stderr, tmp_path)
        results, report = tmp_path / "results/smoke", tmp_path / "reports/smoke"
        assert not (results / "detector/detector.safetensors").exists()
        described = json.loads((results / "detector/detector_config.json").read_text())
        assert described["backend"] == "detectron2" and described["weights"] == str(c4_model[1].resolve())
        table = pd.read_csv(report / "table4.csv").set_index("setting")
        columns = [f"{task}_mean" for task in registry.TABLE4_TASKS]
        assert sorted(table.index) == sorted(s for s, spec in registry.SETTINGS.items() if spec.family == "vlbert")
        assert table[columns].notna().all().all()
        assert (results / "features/tuned/full").is_dir()
        assert "detectron2" in (report / "detector.md").read_text()
    systems = pd.read_csv(report / "systems.csv").set_index("setting")
    others = [s for s, spec in registry.SETTINGS.items() if spec.family != "vlbert"]
    assert set(others) <= set(systems.index) and systems.loc[others, columns].notna().all().all()
