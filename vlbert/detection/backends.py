"""Detector backends behind one interface: boxes, labels, class probabilities and RoI features.

`TorchvisionBackend` runs the Faster R-CNN trained by `vlbert train-detector`;
`Detectron2Backend` runs a detectron2 model (e.g. the Visual Genome R101-C4 of
bottom-up-attention) from its description (`vlbert.detection.detectron2`). Both apply the same box
rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from .detectron2 import BACKEND, describe, read_description
from .rules import BoxRule, select_boxes


@dataclass
class RoIResult:
    """One image's regions. Row 0 is always the whole image; rows 1.. are the regions."""

    boxes: np.ndarray  # [n+1, 4] float32, x1 y1 x2 y2 in original pixels
    labels: np.ndarray  # [n+1] int64, detector class id (0 for the whole-image row)
    probs: np.ndarray  # [n+1, C+1] float32, class probabilities, column 0 background
    scores: np.ndarray  # [n+1] float32, confidence (1.0 for the whole-image row)
    features: np.ndarray  # [n+1, D] float32, pooled RoI features
    width: int
    height: int
    box_ids: np.ndarray | None = None  # [n+1] int64: what each given box is (-1: whole image, detected)


class RoIBackend(Protocol):
    class_names: list[str]
    feature_dim: int

    def extract(self, images: list[torch.Tensor], boxes: list[np.ndarray | None]) -> list[RoIResult]:
        """images: float RGB [3, H, W] in [0, 1]; boxes: given x1y1x2y2 boxes (ground-truth mode)
        or None (detect by the rule). The same as select(images, boxes, forward_regions(...))."""

    def forward_regions(self, images: list[torch.Tensor], boxes: list[np.ndarray | None]) -> list[tuple]:
        """Per image: (region boxes [R, 4] in original pixels, probs [R, C+1], features [R, D]),
        the whole image first, then the given boxes or every proposal."""

    def select(self, images: list[torch.Tensor], boxes: list[np.ndarray | None], regions) -> list[RoIResult]:
        """The box rule over forward_regions' output."""


def _result(boxes, probs, features, width, height, scores=None) -> RoIResult:
    labels = probs[:, 1:].argmax(1) + 1
    if scores is None:
        scores = probs[:, 1:].max(1).values
    labels[0], scores[0] = 0, 1.0
    return RoIResult(
        boxes.numpy().astype(np.float32),
        labels.numpy().astype(np.int64),
        probs.numpy().astype(np.float32),
        scores.numpy().astype(np.float32),
        features.numpy().astype(np.float32),
        int(width),
        int(height),
    )


class _RegionBackend:
    """Shared by the backends: `forward_regions` scores regions, `select` applies the box rule,
    `extract` does both."""

    rule: BoxRule

    def forward_regions(self, images, boxes):
        raise NotImplementedError

    def extract(self, images, boxes):
        return self.select(images, boxes, self.forward_regions(images, boxes))

    def select(self, images, boxes, regions) -> list[RoIResult]:
        """The rule over `forward_regions`' output: the given boxes, or the detections it keeps."""
        results = []
        for image, given, (region, probs, feats) in zip(images, boxes, regions):
            height, width = image.shape[1:]
            if given is not None:
                results.append(_result(region, probs, feats, width, height))
                continue
            kept, confidence = select_boxes(region[1:], probs[1:], self.rule)
            rows = torch.cat([torch.zeros(1, dtype=torch.long), kept + 1])
            scores = torch.cat([torch.ones(1), confidence])
            results.append(_result(region[rows], probs[rows], feats[rows], width, height, scores))
        return results


@torch.inference_mode()
def score_regions(model, images: list[torch.Tensor], boxes: list[np.ndarray | None], device: str = "cpu"):
    """Per image: (region boxes in original pixels [R, 4], probs [R, C+1], features [R, D]),
    where the regions are the whole image, then the given boxes or all RPN proposals."""
    image_list, _ = model.transform([i.to(device) for i in images])
    features = model.backbone(image_list.tensors)
    scales = [
        torch.tensor([r[1] / i.shape[2], r[0] / i.shape[1]] * 2, device=device)
        for r, i in zip(image_list.image_sizes, images)
    ]
    if any(b is None for b in boxes):
        proposals, _ = model.rpn(image_list, features)
    regions = []
    for k, (given, scale, (h, w)) in enumerate(zip(boxes, scales, image_list.image_sizes)):
        whole = torch.tensor([[0.0, 0.0, float(w), float(h)]], device=device)
        rest = (
            proposals[k]
            if given is None
            else torch.as_tensor(given, dtype=torch.float32, device=device).reshape(-1, 4) * scale
        )
        regions.append(torch.cat([whole, rest]))
    pooled = model.roi_heads.box_roi_pool(features, regions, image_list.image_sizes)
    region_features = model.roi_heads.box_head(pooled)
    logits, _ = model.roi_heads.box_predictor(region_features)
    probs = logits.softmax(-1)
    out, start = [], 0
    for region, scale in zip(regions, scales):
        end = start + len(region)
        out.append(((region / scale).cpu(), probs[start:end].cpu(), region_features[start:end].cpu()))
        start = end
    return out


class TorchvisionBackend(_RegionBackend):
    def __init__(self, model, config, rule: BoxRule, device: str = "cpu"):
        self.model, self.config, self.rule, self.device = model.eval(), config, rule, device
        self.class_names = config.class_names
        self.feature_dim = config.feature_dim

    def forward_regions(self, images: list[torch.Tensor], boxes: list[np.ndarray | None]):
        return score_regions(self.model, images, boxes, self.device)


class Detectron2Backend(_RegionBackend):
    """A detectron2 C4 model (Res5ROIHeads) from its description (`detectron2.describe`): its RPN's
    proposals, its box predictor's classes, and the regions' features of `C4RegionTrunk`."""

    def __init__(self, description: dict, rule: BoxRule, device: str = "cpu"):
        from .detectron2 import C4RegionTrunk, load_cfg, load_described

        cfg = load_cfg(description["cfg"])  # says how to get detectron2 where it is missing
        from detectron2.modeling import build_model

        cfg.MODEL.DEVICE = device
        self.model = build_model(cfg).eval()
        load_described(self.model, description, description.get("config_file", "detector"))
        self.trunk = C4RegionTrunk(cfg, self.model.backbone, self.model.roi_heads).to(device)
        self.rule, self.device = rule, device
        self.class_names = list(description["class_names"])
        self.feature_dim = self.trunk.feature_dim

    @torch.inference_mode()
    def forward_regions(self, images, boxes):
        batch, scales = self.trunk.preprocess(images)
        maps = self.trunk.backbone(batch.tensor)
        if any(b is None for b in boxes):
            proposals, _ = self.model.proposal_generator(batch, maps, None)
        regions = []
        for k, (given, scale) in enumerate(zip(boxes, scales)):
            h, w = batch.image_sizes[k]
            whole = torch.tensor([[0.0, 0.0, float(w), float(h)]], device=scale.device)
            rest = (
                proposals[k].proposal_boxes.tensor
                if given is None
                else torch.as_tensor(given, dtype=torch.float32, device=scale.device).reshape(-1, 4) * scale
            )
            regions.append(torch.cat([whole, rest]))
        region_features = self.trunk.region_features(maps, regions)
        logits, _ = self.model.roi_heads.box_predictor(region_features)
        # detectron2 puts background last; move it to column 0 as the torchvision backend has it.
        probs = logits.softmax(-1)
        probs = torch.cat([probs[:, -1:], probs[:, :-1]], 1)
        out, start = [], 0
        for region, scale in zip(regions, scales):
            end = start + len(region)
            out.append(((region / scale).cpu(), probs[start:end].cpu(), region_features[start:end].cpu()))
            start = end
        return out


def build_backend(config: dict, detector_dir=None, device: str = "cpu") -> RoIBackend:
    """The backend the preset names, with the preset's box rule. A detectron2 model is read from the
    study's detector folder where one is given (`vlbert describe-detector`), else from the preset."""
    options = config.get("detector", {})
    rule = BoxRule(
        **{k: v for k, v in config.get("features", {}).items() if k in ("score_threshold", "min_boxes", "max_boxes")}
    )
    if options.get("backend", "torchvision") == BACKEND:
        if detector_dir is not None:
            description = read_description(detector_dir)
        else:
            description = describe(options["detectron2"]["config"], options["detectron2"]["weights"])
        return Detectron2Backend(description, rule, device)
    if detector_dir is None:
        raise ValueError("the torchvision backend needs --detector (the folder `vlbert train-detector` wrote)")
    from .model import load_detector

    model, det_config = load_detector(detector_dir, device)
    return TorchvisionBackend(model, det_config, rule, device)
