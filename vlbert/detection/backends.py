"""Detector backends behind one interface: boxes, labels, class probabilities and RoI features.

`TorchvisionBackend` runs the Faster R-CNN trained by `vlbert train-detector`;
`Detectron2Backend` runs a detectron2 model (e.g. the Visual Genome R101-C4 of
bottom-up-attention) from a config and weights file. Both apply the same box rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

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


DETECTRON2_MISSING = (
    "the detectron2 backend needs the `detectron2` package, which is not importable here. It is "
    "not on PyPI: build it from source as its installation guide says (`pip install "
    "--no-build-isolation <detectron2 source checkout>`, with a torch that matches), or use "
    "`detector: {backend: torchvision}` in the preset."
)


class Detectron2Backend(_RegionBackend):
    """A detectron2 C4 model (Res5ROIHeads), e.g. bottom-up-attention's Visual Genome R101-C4.

    RoI features are the res5 outputs averaged over space, as that detector's `pool5`.
    """

    def __init__(self, config_file: str, weights_file: str, rule: BoxRule, device: str = "cpu"):
        try:
            from detectron2.checkpoint import DetectionCheckpointer
            from detectron2.config import get_cfg
            from detectron2.modeling import build_model
        except ImportError as exc:
            raise ImportError(DETECTRON2_MISSING) from exc
        cfg = get_cfg()
        cfg.merge_from_file(config_file)
        cfg.MODEL.DEVICE = device
        self.model = build_model(cfg).eval()
        DetectionCheckpointer(self.model).load(weights_file)
        self.rule, self.device = rule, device
        self.class_names = [str(i) for i in range(cfg.MODEL.ROI_HEADS.NUM_CLASSES)]
        self.feature_dim = self.model.roi_heads.res5[-1].conv3.out_channels

    @torch.inference_mode()
    def forward_regions(self, images, boxes):
        from detectron2.structures import Boxes

        model = self.model
        # detectron2 takes 0-255 BGR images in `image`.
        inputs = [
            {"image": (i.flip(0) * 255).to(self.device), "height": i.shape[1], "width": i.shape[2]} for i in images
        ]
        batch = model.preprocess_image(inputs)
        features = model.backbone(batch.tensor)
        scales = [batch.image_sizes[k][1] / images[k].shape[2] for k in range(len(images))]
        if any(b is None for b in boxes):
            proposals, _ = model.proposal_generator(batch, features, None)
        regions = []
        for k, given in enumerate(boxes):
            h, w = batch.image_sizes[k]
            whole = torch.tensor([[0.0, 0.0, float(w), float(h)]], device=self.device)
            rest = (
                proposals[k].proposal_boxes.tensor
                if given is None
                else torch.as_tensor(given, dtype=torch.float32, device=self.device).reshape(-1, 4) * scales[k]
            )
            regions.append(torch.cat([whole, rest]))
        heads = model.roi_heads
        pooled = heads._shared_roi_transform([features[f] for f in heads.in_features], [Boxes(r) for r in regions])
        region_features = pooled.mean(dim=(2, 3))
        logits, _ = heads.box_predictor(region_features)
        # detectron2 puts background last; move it to column 0 as the torchvision backend has it.
        probs = logits.softmax(-1)
        probs = torch.cat([probs[:, -1:], probs[:, :-1]], 1)
        out, start = [], 0
        for k, region in enumerate(regions):
            end = start + len(region)
            out.append(((region / scales[k]).cpu(), probs[start:end].cpu(), region_features[start:end].cpu()))
            start = end
        return out


def build_backend(config: dict, detector_dir=None, device: str = "cpu") -> RoIBackend:
    """The backend the preset names, with the preset's box rule."""
    options = config.get("detector", {})
    rule = BoxRule(
        **{k: v for k, v in config.get("features", {}).items() if k in ("score_threshold", "min_boxes", "max_boxes")}
    )
    if options.get("backend", "torchvision") == "detectron2":
        d2 = options["detectron2"]
        return Detectron2Backend(d2["config"], d2["weights"], rule, device)
    if detector_dir is None:
        raise ValueError("the torchvision backend needs --detector (the folder `vlbert train-detector` wrote)")
    from .model import load_detector

    model, det_config = load_detector(detector_dir, device)
    return TorchvisionBackend(model, det_config, rule, device)
