"""A Faster R-CNN in the layout of the bottom-up-attention detector: ResNet to C4, C5 box head.

torchvision's FasterRCNN with a ResNet trunk cut at C4 (stride 16) feeding the RPN and RoIAlign,
and ResNet's C5 stage plus average pooling as the box head, so a region's feature is the pooled
C5 output, as in the detector the paper used. The widths are set by the preset: a narrow trunk at
low resolution for the synthetic world, ResNet-101 widths for real use.

Weights are saved as safetensors with a JSON config beside them (no pickle).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn import functional as F
from torchvision.models.detection import FasterRCNN
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.faster_rcnn import FastRCNNPredictor
from torchvision.models.resnet import BasicBlock
from torchvision.ops import MultiScaleRoIAlign

from .. import io

WEIGHTS_FILE = "detector.safetensors"
CONFIG_FILE = "detector_config.json"


@dataclass
class DetectorConfig:
    class_names: list[str]  # without the background class
    image_size: int = 96  # images are resized to this (shorter side)
    widths: tuple[int, ...] = (16, 32, 64, 128)  # stem/C2, C3, C4, C5 channels
    blocks: tuple[int, ...] = (1, 1, 2, 1)  # residual blocks per stage
    c4_stride: int = 16  # 16: ResNet's stem max-pool; 8: without it
    anchor_sizes: tuple[int, ...] = (8, 16, 32, 64)
    aspect_ratios: tuple[float, ...] = (0.5, 1.0, 2.0)
    roi_size: int = 8  # RoIAlign output; C5 halves it
    rpn_pre_nms_top_n: int = 600
    rpn_post_nms_top_n_train: int = 200
    rpn_post_nms_top_n_test: int = 100
    rpn_batch_size_per_image: int = 64
    box_batch_size_per_image: int = 32
    extra: dict = field(default_factory=dict)

    @property
    def num_classes(self) -> int:
        return len(self.class_names) + 1

    @property
    def feature_dim(self) -> int:
        return self.widths[3]

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> DetectorConfig:
        data = dict(data)
        for key in ("widths", "blocks", "anchor_sizes", "aspect_ratios"):
            data[key] = tuple(data[key])
        return cls(**data)


class StridedPointwiseConv(nn.Conv2d):
    """A 1x1 convolution with a stride, computed as the stride's subsampling then the 1x1
    convolution at stride 1: the same output, gradients and parameters as nn.Conv2d's. oneDNN 3.12's
    weight gradient of a strided 1x1 convolution on channels-last input with fewer than 16 input
    channels writes past its buffer and corrupts the heap (4, 8 and 12 did in a sweep of widths,
    batches and sizes; 16 to 64 did not). tests/test_detection.py trains the smoke preset's widths
    (8 -> 16) in a subprocess, which the overrun aborts."""

    def __init__(self, in_channels: int, out_channels: int, stride: int):
        super().__init__(in_channels, out_channels, 1, stride, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows, cols = self.stride
        return F.conv2d(x[:, :, ::rows, ::cols], self.weight, self.bias)


def _downsample_conv(in_channels: int, out_channels: int, stride: int) -> nn.Conv2d:
    """The residual branch's 1x1 projection; below 16 input channels, one that avoids oneDNN's
    overrun (StridedPointwiseConv). Wider ones keep nn.Conv2d, faster on channels-last tensors."""
    if stride != 1 and in_channels < 16:
        return StridedPointwiseConv(in_channels, out_channels, stride)
    return nn.Conv2d(in_channels, out_channels, 1, stride, bias=False)


def _stage(in_channels: int, channels: int, blocks: int, stride: int) -> nn.Sequential:
    downsample = None
    if stride != 1 or in_channels != channels:
        downsample = nn.Sequential(_downsample_conv(in_channels, channels, stride), nn.BatchNorm2d(channels))
    layers = [BasicBlock(in_channels, channels, stride, downsample)]
    layers += [BasicBlock(channels, channels) for _ in range(blocks - 1)]
    return nn.Sequential(*layers)


class C4Backbone(nn.Module):
    """ResNet stem and stages C2-C4: stride 16, or 8 without the stem's max-pool (small images:
    at stride 16 a 96-px image is a 6 x 6 map and a small shape falls in one cell).
    Returns {"0": C4} as torchvision expects."""

    def __init__(self, config: DetectorConfig):
        super().__init__()
        w, b = config.widths, config.blocks
        if config.c4_stride not in (8, 16):
            raise ValueError(f"detector c4_stride must be 8 or 16, got {config.c4_stride}")
        pool = [nn.MaxPool2d(3, 2, 1)] if config.c4_stride == 16 else []
        self.stem = nn.Sequential(
            nn.Conv2d(3, w[0], 7, 2, 3, bias=False), nn.BatchNorm2d(w[0]), nn.ReLU(inplace=True), *pool
        )
        self.layer1 = _stage(w[0], w[0], b[0], 1)
        self.layer2 = _stage(w[0], w[1], b[1], 2)
        self.layer3 = _stage(w[1], w[2], b[2], 2)
        self.out_channels = w[2]

    def forward(self, images: torch.Tensor) -> OrderedDict:
        # oneDNN's CPU convolutions, forward and backward, are faster on channels-last tensors
        # (bench/channels_last.py); the stages keep the layout they are given.
        images = images.contiguous(memory_format=torch.channels_last)
        return OrderedDict([("0", self.layer3(self.layer2(self.layer1(self.stem(images)))))])


class C5Head(nn.Module):
    """ResNet stage C5 (stride 2) and global average pooling: pooled RoI -> feature vector."""

    def __init__(self, config: DetectorConfig):
        super().__init__()
        self.layer4 = _stage(config.widths[2], config.widths[3], config.blocks[3], 2)
        self.out_channels = config.widths[3]

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        pooled = pooled.contiguous(memory_format=torch.channels_last)  # as C4Backbone's
        return self.layer4(pooled).mean(dim=(2, 3))


def build_faster_rcnn(config: DetectorConfig) -> FasterRCNN:
    anchors = AnchorGenerator(sizes=(config.anchor_sizes,), aspect_ratios=(config.aspect_ratios,))
    return FasterRCNN(
        C4Backbone(config),
        num_classes=None,
        min_size=config.image_size,
        max_size=config.image_size,
        rpn_anchor_generator=anchors,
        rpn_pre_nms_top_n_train=config.rpn_pre_nms_top_n,
        rpn_pre_nms_top_n_test=config.rpn_pre_nms_top_n,
        rpn_post_nms_top_n_train=config.rpn_post_nms_top_n_train,
        rpn_post_nms_top_n_test=config.rpn_post_nms_top_n_test,
        rpn_batch_size_per_image=config.rpn_batch_size_per_image,
        box_roi_pool=MultiScaleRoIAlign(["0"], output_size=config.roi_size, sampling_ratio=2),
        box_head=C5Head(config),
        box_predictor=FastRCNNPredictor(config.feature_dim, config.num_classes),
        box_batch_size_per_image=config.box_batch_size_per_image,
        box_score_thresh=0.05,
        box_detections_per_img=100,
    )


def save_detector(model: FasterRCNN, config: DetectorConfig, folder) -> None:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    with io.atomic_path(folder / WEIGHTS_FILE) as tmp:
        save_file(state, str(tmp))
    io.write_json(folder / CONFIG_FILE, config.to_json(), indent=2)


def read_detector_config(folder) -> dict:
    """A study's detector folder's config: a trained detector's (`DetectorConfig.to_json()`) or a
    given detectron2 model's description (`vlbert.detection.detectron2.describe`)."""
    path = Path(folder) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"detector folder {folder} has no {CONFIG_FILE} (run `vlbert train-detector`, or "
            "`vlbert describe-detector` for a detectron2 model)"
        )
    from ..data.errors import load_json

    return load_json(path, "the detector's config")


def visual_sizes(detector: dict) -> tuple[int, int]:
    """(region feature width, classes with background) of a detector folder's config."""
    return detector.get("feature_dim") or detector["widths"][3], len(detector["class_names"]) + 1


def load_detector(folder, device: str = "cpu") -> tuple[FasterRCNN, DetectorConfig]:
    folder = Path(folder)
    for name in (WEIGHTS_FILE, CONFIG_FILE):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"detector folder {folder} has no {name} (run `vlbert train-detector`)")
    config = DetectorConfig.from_json(json.loads((folder / CONFIG_FILE).read_text()))
    model = build_faster_rcnn(config)
    model.load_state_dict(load_file(str(folder / WEIGHTS_FILE), device="cpu"))
    return model.to(device).eval(), config
