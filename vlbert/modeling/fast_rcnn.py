"""The Fast R-CNN module inside VL-BERT: backbone to C4, RoIAlign, C5 head.

`FastRCNN` is built from the same pieces as the trained RoI detector (vlbert.detection.model),
`Detectron2FastRCNN` from a given detectron2 C4 model's (vlbert.detection.detectron2); each is
initialised from its detector's weights, so with the module frozen and nothing masked it
reproduces the cached features of the HDF5 store (for images batched alike). A masked RoI has its
pixels zeroed before the backbone, so nothing inside it can reach any output. BatchNorm stays
frozen (running statistics, no affine updates), as is usual when fine-tuning a detector with small
batches.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn
from torchvision.models.detection.transform import GeneralizedRCNNTransform
from torchvision.ops import MultiScaleRoIAlign

from ..detection.model import WEIGHTS_FILE, C4Backbone, C5Head, DetectorConfig

# torchvision's Faster R-CNN normalisation (ImageNet statistics).
IMAGE_MEAN, IMAGE_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def zero_boxes(image: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """A copy of image [3, H, W] with every pixel that any box touches set to 0."""
    image = image.clone()
    height, width = image.shape[1:]
    for x1, y1, x2, y2 in boxes.tolist():
        left, top = max(0, math.floor(x1)), max(0, math.floor(y1))
        right, bottom = min(width, math.ceil(x2)), min(height, math.ceil(y2))
        image[:, top:bottom, left:right] = 0
    return image


class RegionCNN(nn.Module):
    """What VL-BERT needs of the detector inside it, whichever detector that is: the features of
    given boxes on images, with masked RoIs' pixels zeroed first. trainable: whether it receives
    gradients; then its trunk's first `frozen_stages` stages (the stem, C2, C3, C4 in order) stay
    frozen. A subclass builds its modules, then calls `freeze(trainable, frozen_stages)`."""

    # A pre-trained detector under a transformer's rate: the section's option that scales its rate.
    lr_factor_option = "frcnn_lr_factor"
    feature_dim: int

    def stages(self) -> list[nn.Module]:
        """The trunk's stem, C2, C3 and C4 stages, in order."""
        raise NotImplementedError

    def region_features(self, images: list[torch.Tensor], boxes: list[torch.Tensor]) -> torch.Tensor:
        """[sum R_i, D]: the features of each image's boxes."""
        raise NotImplementedError

    def load_detector_weights(self, detector_dir) -> None:
        """The weights of the study's detector (its folder)."""
        raise NotImplementedError

    def freeze(self, trainable: bool, frozen_stages: int) -> None:
        self.trainable = trainable
        stages = self.stages()
        if not 0 <= frozen_stages <= len(stages):
            raise ValueError(f"frozen_stages must be 0 to {len(stages)} (the stem, C2, C3, C4), got {frozen_stages}")
        self.frozen_stages = stages[:frozen_stages]
        self.set_requires_grad()

    def set_requires_grad(self) -> None:
        """BatchNorm's affine parameters and the frozen stages stay frozen; the rest trains only
        when `trainable`."""
        for module in self.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.weight.requires_grad_(False)
                module.bias.requires_grad_(False)
        for stage in self.frozen_stages:
            stage.requires_grad_(False)
        if not self.trainable:
            self.requires_grad_(False)

    def train(self, mode: bool = True):
        super().train(mode)
        for module in self.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.eval()
        return self

    def forward(
        self, images: list[torch.Tensor], boxes: list[torch.Tensor], masked: list[torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        """images: float RGB [3, H, W] in [0, 1]; boxes: per image [R_i, 4] x1y1x2y2 in its pixels;
        masked: per image [R_i] bool, the RoIs whose pixels are zeroed. Returns per image [R_i, D]."""
        if masked is not None:
            images = [
                zero_boxes(image, b[m]) if bool(m.any()) else image for image, b, m in zip(images, boxes, masked)
            ]
        with torch.set_grad_enabled(self.trainable and torch.is_grad_enabled()):
            out = self.region_features(images, boxes)
        return list(out.split([len(b) for b in boxes]))


class FastRCNN(RegionCNN):
    """The trained detector's (vlbert.detection.model): its backbone to C4, RoIAlign, its C5 head."""

    def __init__(self, config: DetectorConfig, trainable: bool = False, frozen_stages: int = 2):
        super().__init__()
        self.config = config
        self.transform = GeneralizedRCNNTransform(config.image_size, config.image_size, IMAGE_MEAN, IMAGE_STD)
        self.backbone = C4Backbone(config)
        self.roi_align = MultiScaleRoIAlign(["0"], output_size=config.roi_size, sampling_ratio=2)
        self.head = C5Head(config)
        self.feature_dim = config.feature_dim
        self.freeze(trainable, frozen_stages)

    def stages(self) -> list[nn.Module]:
        return [self.backbone.stem, self.backbone.layer1, self.backbone.layer2, self.backbone.layer3]

    def load_detector_weights(self, detector_dir) -> None:
        """Take the backbone and C5 head from a `vlbert train-detector` folder."""
        self.load_detector_state(load_file(str(Path(detector_dir) / WEIGHTS_FILE)), str(detector_dir))

    def load_detector_state(self, state: dict, source: str = "detector") -> None:
        """Take the backbone and C5 head from a Faster R-CNN state dict (vlbert.detection.model)."""
        picked = {f"backbone.{k[len('backbone.') :]}": v for k, v in state.items() if k.startswith("backbone.")}
        picked |= {
            f"head.{k[len('roi_heads.box_head.') :]}": v
            for k, v in state.items()
            if k.startswith("roi_heads.box_head.")
        }
        missing, unexpected = self.load_state_dict(picked, strict=False)
        missing = [k for k in missing if not k.startswith(("transform.", "roi_align."))]
        if missing or unexpected:
            raise ValueError(
                f"{source}: detector weights do not fit the Fast R-CNN module "
                f"(missing {missing[:3]}, unexpected {unexpected[:3]})"
            )

    def region_features(self, images, boxes):
        image_list, _ = self.transform(images)
        features = OrderedDict([("0", self.backbone(image_list.tensors)["0"])])
        scaled = [
            b * torch.tensor([r[1] / i.shape[2], r[0] / i.shape[1]] * 2, device=b.device)
            for b, r, i in zip(boxes, image_list.image_sizes, images)
        ]
        return self.head(self.roi_align(features, scaled, image_list.image_sizes))


class Detectron2FastRCNN(RegionCNN):
    """A given detectron2 C4 model's (vlbert.detection.detectron2): its backbone to res4, its
    heads' RoIAlign and res5 stage, the spatial mean; its RPN and box predictor are not part of it."""

    def __init__(self, description: dict, trainable: bool = False, frozen_stages: int = 2):
        super().__init__()
        from ..detection.detectron2 import C4RegionTrunk

        self.trunk = C4RegionTrunk.build(description)
        self.feature_dim = self.trunk.feature_dim
        self.freeze(trainable, frozen_stages)

    def stages(self) -> list[nn.Module]:
        return self.trunk.stages()

    def load_detector_weights(self, detector_dir) -> None:
        """The given weights, as the study's detector folder names them (`vlbert describe-detector`)."""
        from ..detection.detectron2 import load_described, read_description

        load_described(self.trunk, read_description(detector_dir), detector_dir)

    def region_features(self, images, boxes):
        return self.trunk(images, boxes)


def build_region_cnn(detector: dict, trainable: bool = False, frozen_stages: int = 2) -> RegionCNN:
    """The module for a detector folder's config (`StudyConfig.frcnn`): a trained detector's or a
    detectron2 model's description."""
    from ..detection.detectron2 import is_described

    if is_described(detector):
        return Detectron2FastRCNN(detector, trainable, frozen_stages)
    return FastRCNN(DetectorConfig.from_json(detector), trainable, frozen_stages)
