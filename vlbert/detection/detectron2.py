"""A detectron2 C4 Faster R-CNN (`Res5ROIHeads`), e.g. bottom-up-attention's Visual Genome R101-C4,
as the study reads it.

A study that names this backend trains no detector: `vlbert describe-detector` writes the study's
detector folder as a description of the given model (its config, merged and dumped, the weights'
path and identity, the sizes a model config needs), and everything downstream reads that folder as
it reads a trained detector's. A region's feature is the res5 output of its RoIAlign'd C4 map,
averaged over space (that detector's `pool5`), computed the same way by extraction
(`Detectron2Backend`) and by the C4 trunk that VL-BERT tunes (`C4RegionTrunk`), so that a frozen
trunk reproduces the stores' features.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

BACKEND = "detectron2"
DETECTRON2_MISSING = (
    "the detectron2 backend needs the `detectron2` package, which is not importable here. It is "
    "not on PyPI: build it from source as its installation guide says (`pip install "
    "--no-build-isolation <detectron2 source checkout>`, with a torch that matches), or use "
    "`detector: {backend: torchvision}` in the preset."
)


def _import_detectron2():
    try:
        import detectron2  # noqa: F401
    except ImportError as exc:
        raise ImportError(DETECTRON2_MISSING) from exc


def is_described(description: dict) -> bool:
    """Whether a detector folder's config describes a detectron2 model (else it is a trained one's)."""
    return description.get("backend") == BACKEND


def load_cfg(text: str | None = None, path=None):
    """detectron2's defaults merged with a config's YAML `text` or file `path`. A key detectron2
    does not know is refused, naming it: a fork's key (bottom-up-attention's caffe max-pool, its
    res5 halving) changes the model, and stock detectron2 would build another one without it."""
    _import_detectron2()
    from detectron2.config import CfgNode, get_cfg

    cfg = get_cfg()
    try:
        if path is not None:
            cfg.merge_from_file(str(path))
        else:
            cfg.merge_from_other_cfg(CfgNode.load_cfg(text))
    except KeyError as exc:
        where = path or "the detector's description"
        raise ValueError(
            f"{where}: {exc.args[0]}: a key stock detectron2 does not have (a config of a fork of "
            "detectron2 needs that fork's model)"
        ) from None
    return cfg


def describe(config_file, weights_file) -> dict:
    """The description of a detectron2 C4 model that a study's detector folder holds."""
    from ..io import file_identity

    config_file, weights_file = Path(config_file).resolve(), Path(weights_file).resolve()
    for path in (config_file, weights_file):
        if not path.is_file():
            raise FileNotFoundError(f"detector.detectron2: no such file: {path}")
    cfg = load_cfg(path=config_file)
    heads = cfg.MODEL.ROI_HEADS.NAME
    if cfg.MODEL.META_ARCHITECTURE != "GeneralizedRCNN" or heads != "Res5ROIHeads":
        raise ValueError(
            f"{config_file}: the study reads a C4 Faster R-CNN (GeneralizedRCNN with Res5ROIHeads, "
            f"whose res5 stage makes the regions' features), not {cfg.MODEL.META_ARCHITECTURE} with {heads}"
        )
    num_classes = cfg.MODEL.ROI_HEADS.NUM_CLASSES
    # The model once, with its weights: a file that does not fit fails here, not in every extraction job.
    from detectron2.modeling import build_model

    cfg.MODEL.DEVICE = "cpu"
    load_weights(build_model(cfg), weights_file, str(config_file))
    return {
        "backend": BACKEND,
        "config_file": str(config_file),
        "weights": str(weights_file),
        "weights_identity": file_identity(weights_file),
        # res5's output: res2's width doubled at each of three stages.
        "feature_dim": cfg.MODEL.RESNETS.RES2_OUT_CHANNELS * 8,
        "image_sizes": [cfg.INPUT.MIN_SIZE_TEST, cfg.INPUT.MAX_SIZE_TEST],
        "class_names": [str(k) for k in range(1, num_classes + 1)],
        "cfg": cfg.dump(),
    }


def load_described(model: nn.Module, description: dict, source) -> None:
    """The weights a description names into `model` (`load_weights`), refused if the file is no
    longer the one described."""
    from ..io import file_identity

    weights = Path(description["weights"])
    if file_identity(weights) != description["weights_identity"]:
        raise ValueError(
            f"{source}: the weights {weights} are not those `vlbert describe-detector` recorded "
            f"({description['weights_identity']}): describe the detector again (the study's stores "
            "were extracted with the recorded ones)"
        )
    load_weights(model, weights, str(source))


def load_weights(model: nn.Module, weights_file, source: str) -> None:
    """A detectron2 checkpoint (.pth, or a Detectron/Caffe2 .pkl that its checkpointer converts) into
    `model`, refusing one that leaves a convolution of the model as it was built."""
    from detectron2.checkpoint import DetectionCheckpointer

    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.dim() > 1}
    DetectionCheckpointer(model).load(str(weights_file))
    untouched = [n for n, p in model.named_parameters() if n in before and torch.equal(p, before[n])]
    if untouched:
        raise ValueError(
            f"{source}: the weights {weights_file} do not fit the detectron2 model of its config: "
            f"{len(untouched)} weights were not loaded, e.g. {untouched[0]}"
        )


def resized_size(height: int, width: int, min_size: int, max_size: int) -> tuple[int, int]:
    """detectron2's ResizeShortestEdge at test time: the shorter side to min_size unless the longer
    would pass max_size; 0: the image as it is."""
    if not min_size:
        return height, width
    scale = min_size / min(height, width)
    if max(height, width) * scale > max_size:
        scale = max_size / max(height, width)
    return int(height * scale + 0.5), int(width * scale + 0.5)


class C4RegionTrunk(nn.Module):
    """A C4 model's path from pixels to region features: resize and normalise as the model's
    config says, the backbone to res4, RoIAlign (the heads' pooler), res5, the spatial mean.

    Built from the description alone (`build`), it holds no RPN and no box predictor; the
    extraction backend gives it its whole model's modules instead."""

    def __init__(self, cfg, backbone: nn.Module, roi_heads: nn.Module):
        super().__init__()
        self.backbone, self.roi_heads = backbone, roi_heads
        self.register_buffer("pixel_mean", torch.tensor(cfg.MODEL.PIXEL_MEAN).view(-1, 1, 1), persistent=False)
        self.register_buffer("pixel_std", torch.tensor(cfg.MODEL.PIXEL_STD).view(-1, 1, 1), persistent=False)
        self.bgr = cfg.INPUT.FORMAT == "BGR"
        self.min_size, self.max_size = cfg.INPUT.MIN_SIZE_TEST, cfg.INPUT.MAX_SIZE_TEST
        self.feature_dim = roi_heads.res5[-1].conv3.out_channels

    @classmethod
    def build(cls, description: dict) -> C4RegionTrunk:
        from detectron2.modeling import build_backbone
        from detectron2.modeling.roi_heads import build_roi_heads

        cfg = load_cfg(description["cfg"])
        cfg.MODEL.DEVICE = "cpu"
        # Every stage trainable as built: the study's own setting says which stay frozen
        # (frozen_frcnn_stages, cnn_trainable_layers), not the config's FREEZE_AT.
        cfg.MODEL.BACKBONE.FREEZE_AT = 0
        backbone = build_backbone(cfg)
        roi_heads = build_roi_heads(cfg, backbone.output_shape())
        del roi_heads.box_predictor  # the features are res5's: nothing reads the classes here
        return cls(cfg, backbone, roi_heads)

    def stages(self) -> list[nn.Module]:
        """The trunk's stem and stages to C4, in order."""
        return [self.backbone.stem, *self.backbone.stages]

    def normalisation(self) -> tuple[list[float], list[float], bool]:
        """(mean, std) for float RGB images in [0, 1], in RGB order, and whether the model reads BGR:
        its config's pixel statistics (0-255, in its input's channel order) for a transform that
        normalises before the channels are put in the model's order."""
        mean, std = (self.pixel_mean.flatten() / 255).tolist(), (self.pixel_std.flatten() / 255).tolist()
        if self.bgr:
            mean, std = mean[::-1], std[::-1]
        return mean, std, self.bgr

    def preprocess(self, images: list[torch.Tensor]):
        """images: float RGB [3, H, W] in [0, 1]. Returns detectron2's ImageList and, per image, the
        factors [x, y, x, y] from its pixels to the list's."""
        from detectron2.structures import ImageList

        tensors, scales = [], []
        for image in images:
            height, width = image.shape[1:]
            size = resized_size(height, width, self.min_size, self.max_size)
            pixels = image.to(self.pixel_mean.device)
            if size != (height, width):
                pixels = F.interpolate(pixels[None], size=size, mode="bilinear", align_corners=False)[0]
            pixels = (pixels.flip(0) if self.bgr else pixels) * 255
            tensors.append((pixels - self.pixel_mean) / self.pixel_std)
            scales.append(torch.tensor([size[1] / width, size[0] / height] * 2, device=pixels.device))
        batch = ImageList.from_tensors(
            tensors, self.backbone.size_divisibility, padding_constraints=self.backbone.padding_constraints
        )
        return batch, scales

    def region_features(self, maps: dict, regions: list[torch.Tensor]) -> torch.Tensor:
        """[sum R_i, D]: res5 over each region's RoIAlign'd map, averaged; regions in the list's pixels."""
        from detectron2.structures import Boxes

        heads = self.roi_heads
        pooled = heads.pooler([maps[f] for f in heads.in_features], [Boxes(r) for r in regions])
        return heads.res5(pooled).mean(dim=(2, 3))

    def forward(self, images: list[torch.Tensor], boxes: list[torch.Tensor]) -> torch.Tensor:
        """[sum R_i, D]: the features of each image's boxes (x1 y1 x2 y2 in its pixels)."""
        batch, scales = self.preprocess(images)
        maps = self.backbone(batch.tensor)
        return self.region_features(maps, [b.to(s) * s for b, s in zip(boxes, scales)])


def read_description(detector_dir) -> dict:
    from .model import read_detector_config

    description = read_detector_config(detector_dir)
    if not is_described(description):
        raise ValueError(f"{detector_dir}: not a detectron2 detector's folder (run `vlbert describe-detector`)")
    return description
