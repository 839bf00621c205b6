"""Pixel-BERT (Huang et al. 2020): a single-stream BERT over words and the cells of a CNN's map.

Input: `[CLS] sentence A [SEP] (sentence B [SEP]) v_1 ... v_k`. The batch is VL-BERT's
(processing_study's layout, the heads' arguments): the [IMG] / [END] elements are dropped, the
words moved to the front of each row in their order, and the pixel tokens of the image appended
after them. Words embed as in BERT (token + segment + position). A pixel token is a cell of the
CNN's C5 map through a 3x3 conv to the hidden width, a 2x2 max-pool where the map is large
enough, and a ReLU, plus one learned visual embedding shared by every pixel and the image
segment (C); every pixel token takes position 0, whatever the caption: no position information,
as in the paper (a constant that the shared visual embedding could absorb). The CNN is the
detector's trunk (its ResNet to C4, then its C5 stage over the whole map), initialised from the
trained detector and trained end to end with the transformer (its last `cnn_trainable_layers`
stages; the others frozen, their output kept per image). The encoder is transformers'
BertModel (attention through SDPA).

Pre-training: masked language modelling and image-text matching on [CLS], with random pixel
sampling (a fresh random subset of each image's pixel tokens each step, `pixel_samples`); the
task heads always see every pixel token, as the paper fine-tunes and infers.

Reading order: the CNN, the pixel embeddings, `PixelBertPreTrainedModel` (the builder's hooks and
the readouts the task heads take), `PixelBertModel`, the pre-training model, then the task models:
heads.py's heads on Pixel-BERT's readouts. Weight init, BERT loading and checkpoints are every
family's (`StudyPreTrainedModel`, pretrained.py), as are `VisualInputs` (inputs.py) and the heads
and losses (heads.py): nothing is imported from VL-BERT's modeling module. The classes are
transformers `PreTrainedModel`s, on AutoConfig / AutoModel / AutoModelForPreTraining as VL-BERT's.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn
from torchvision.models.detection.transform import GeneralizedRCNNTransform
from torchvision.ops import roi_align
from transformers import BertModel

from ..detection.detectron2 import is_described
from ..detection.model import WEIGHTS_FILE, C4Backbone, C5Head, DetectorConfig
from .configuration_pixelbert import PixelBertConfig
from .configuration_study import SEGMENT_IMAGE
from .fast_rcnn import IMAGE_MEAN, IMAGE_STD
from .heads import IGNORE_INDEX, PreTrainingHeadMixin, RefCOCOHeadMixin, VCRHeadMixin, VQAHeadMixin
from .inputs import VisualInputs
from .pretrained import StudyPreTrainedModel

# The 2x2 max-pool applies (pixel_pool=None) when the map has at least this many cells on its
# shorter side, so that the pooled one keeps at least half as many.
POOL_MIN_SIDE = 16
# pixel_standardise: the training images the C5 channels' statistics are taken over (in batches),
# and the smallest deviation divided by, as a share of the median channel's: a channel the CNN
# (almost) never fires on them is not scaled up into noise.
PIXEL_STATISTICS_IMAGES = 512
PIXEL_STATISTICS_BATCH = 32
STANDARDISE_MIN_STD_SHARE = 1e-2
# pixel_whiten: this share of the covariance's largest eigenvalue is added to every eigenvalue
# before the inverse square root (ZCA's epsilon), so that directions the CNN (almost) never varies
# along are not scaled up into noise.
WHITEN_EPSILON_SHARE = 1e-2
# A frozen trunk keeps each image's map up to this many bytes in all (the mini world's: 37 KB an
# image at C4); past it, maps are computed every time they are read.
PIXEL_MAP_CACHE_BYTES = 2 * 2**30
# RefCOCO+: RoIAlign's output per box (then averaged), each bin of 2 x 2 bilinear samples.
ROI_SIZE = 2
# torchvision's ResNet module names -> PixelBertCNN's (load_resnet_state).
RESNET_NAMES = {
    "conv1": "backbone.stem.0",
    "bn1": "backbone.stem.1",
    "layer1": "backbone.layer1",
    "layer2": "backbone.layer2",
    "layer3": "backbone.layer3",
    "layer4": "layer4",
}


class ResNetC4(nn.Module):
    """torchvision's ResNet to C4 (stride 16), laid out and called as C4Backbone is."""

    def __init__(self, resnet: nn.Module):
        super().__init__()
        self.stem = nn.Sequential(resnet.conv1, resnet.bn1, resnet.relu, resnet.maxpool)
        self.layer1, self.layer2, self.layer3 = resnet.layer1, resnet.layer2, resnet.layer3

    def forward(self, images: torch.Tensor) -> OrderedDict:
        return OrderedDict([("0", self.layer3(self.layer2(self.layer1(self.stem(images)))))])


def dilate_first_stride(stage: nn.Sequential) -> None:
    """A ResNet stage (BasicBlocks or Bottlenecks) with its stride 2 replaced by dilation 2, in
    place and with the same weights, as torchvision's `replace_stride_with_dilation` builds it: the
    first block at stride 1, the later blocks' 3x3 convolutions dilated."""
    for k, block in enumerate(stage):
        for conv in [m for m in block.modules() if isinstance(m, nn.Conv2d)]:
            if k == 0:
                conv.stride = (1, 1)
            elif conv.kernel_size == (3, 3):
                conv.dilation, conv.padding = (2, 2), (2, 2)


class Detectron2C4(nn.Module):
    """A detectron2 C4 model's backbone to res4 (`C4RegionTrunk`), called as C4Backbone is: its
    stem and stages as `stem`, `layer1` to `layer3`, images normalised in RGB order put in the
    model's channel order first."""

    def __init__(self, backbone: nn.Module, bgr: bool):
        super().__init__()
        self.body, self.bgr = backbone, bgr

    # The stages by C4Backbone's names, not registered twice (a checkpoint holds each weight once).
    @property
    def stem(self) -> nn.Module:
        return self.body.stem

    @property
    def layer1(self) -> nn.Module:
        return self.body.stages[0]

    @property
    def layer2(self) -> nn.Module:
        return self.body.stages[1]

    @property
    def layer3(self) -> nn.Module:
        return self.body.stages[2]

    def forward(self, images: torch.Tensor) -> OrderedDict:
        (c4,) = self.body(images.flip(1) if self.bgr else images).values()
        return OrderedDict([("0", c4)])


class PixelBertCNN(nn.Module):
    """Images -> their C5 map, batched [B, C, h, w], with the size each image was resized to.

    Resizing and normalisation are FastRCNN's (GeneralizedRCNNTransform, ImageNet statistics, or
    a given detectron2 model's pixel statistics and channel order; the batch is padded at the
    bottom and right to a multiple of 32). BatchNorm stays frozen (running statistics, no affine
    updates), as in FastRCNN; the other weights of the last `cnn_trainable_layers` stages train.
    With the trunk to C4 frozen, an image given with a key (its path) has the frozen part's output
    computed once, without autograd, and kept (up to `PIXEL_MAP_CACHE_BYTES`): its C4 map when C5
    trains, its C5 map when nothing does."""

    # A pre-trained CNN trained end to end under a transformer's rate: the option that scales it.
    lr_factor_option = "cnn_lr_factor"

    def __init__(self, config: PixelBertConfig):
        super().__init__()
        min_size, max_size = config.image_sizes
        mean, std = IMAGE_MEAN, IMAGE_STD
        if config.cnn == "detector" and is_described(config.frcnn):
            from ..detection.detectron2 import C4RegionTrunk

            trunk = C4RegionTrunk.build(config.frcnn)
            mean, std, bgr = trunk.normalisation()
            self.backbone = Detectron2C4(trunk.backbone, bgr)
            # res5, run over the whole res4 map instead of the heads' pooled RoIs.
            self.layer4 = trunk.roi_heads.res5
            self.out_channels, self.stride = trunk.feature_dim, 2 * trunk.backbone.output_shape()["res4"].stride
        elif config.cnn == "detector":
            detector = DetectorConfig.from_json(config.frcnn)
            self.backbone = C4Backbone(detector)
            # The detector's C5 stage, run over the whole C4 map instead of its pooled RoIs.
            self.layer4 = C5Head(detector).layer4
            self.out_channels, self.stride = detector.widths[3], 2 * detector.c4_stride
        else:
            from torchvision.models import resnet50

            resnet = resnet50()  # random weights; the ImageNet ones come through load_resnet_state
            self.backbone = ResNetC4(resnet)
            self.layer4 = resnet.layer4
            self.out_channels, self.stride = resnet.fc.in_features, 32
        self.transform = GeneralizedRCNNTransform(min_size, max_size, mean, std)
        if config.c5_dilation:
            dilate_first_stride(self.layer4)
            self.stride //= 2
        self.trainable_layers = config.cnn_trainable_layers
        self.freeze()
        self.train()  # BatchNorm and the transform in eval mode from the start
        # key -> (the frozen part's output [C, h, w], resized (height, width)); new weights void them.
        self.cached_maps: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.cached_stage, self.cached_bytes = None, 0
        self.register_load_state_dict_pre_hook(lambda module, *args: module.clear_cached_maps())

    def stages(self) -> list[nn.Module]:
        """The CNN's stages, last first (the order `cnn_trainable_layers` counts in)."""
        trunk = self.backbone
        return [self.layer4, trunk.layer3, trunk.layer2, trunk.layer1, trunk.stem]

    def freeze(self) -> None:
        """BatchNorm frozen everywhere, and every stage past `trainable_layers` (from the last)."""
        for k, stage in enumerate(self.stages()):
            if k >= self.trainable_layers:
                stage.requires_grad_(False)
        for module in self.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.weight.requires_grad_(False)
                module.bias.requires_grad_(False)

    def train(self, mode: bool = True):
        super().train(mode)
        for module in self.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.eval()
        # The transform too: in train mode it would draw its one size from torch's RNG.
        self.transform.eval()
        return self

    def clear_cached_maps(self) -> None:
        self.cached_maps.clear()
        self.cached_stage, self.cached_bytes = None, 0

    def frozen_stage(self) -> str | None:
        """What a key's cache holds: "c5" (nothing trains), "c4" (only C5 trains), None (the trunk trains)."""
        if any(p.requires_grad for p in self.backbone.parameters()):
            return None
        return "c4" if any(p.requires_grad for p in self.layer4.parameters()) else "c5"

    # Adapted from FastRCNN.load_detector_state: the same keys, and of the box head its C5 stage.
    def load_detector_state(self, state: dict, source: str = "detector") -> None:
        """Take the trunk from a Faster R-CNN state dict (vlbert.detection.model): its backbone,
        and the C5 stage of its box head."""
        head = "roi_heads.box_head."
        picked = {k: v for k, v in state.items() if k.startswith("backbone.")}
        picked |= {k[len(head) :]: v for k, v in state.items() if k.startswith(f"{head}layer4.")}
        missing, unexpected = self.load_state_dict(picked, strict=False)
        if missing or unexpected:
            raise ValueError(
                f"{source}: detector weights do not fit Pixel-BERT's CNN "
                f"(missing {missing[:3]}, unexpected {unexpected[:3]})"
            )

    def load_resnet_state(self, state: dict) -> None:
        """Take a torchvision ResNet-50's weights (its state dict; `fc` is not used)."""
        if not isinstance(self.backbone, ResNetC4):
            raise ValueError('load_resnet_state needs cnn="resnet50"')
        picked = {}
        for key, value in state.items():
            module, _, rest = key.partition(".")
            if module != "fc":
                picked[f"{RESNET_NAMES[module]}.{rest}"] = value
        self.load_state_dict(picked)

    def forward(
        self, images: list[torch.Tensor], keys: list[str | None] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """images: float RGB [3, H, W] in [0, 1]. Returns the map and [B, 2] resized (height, width).
        keys: what identifies each image across batches (its path), for the frozen part's cache."""
        stage = self.frozen_stage()
        if stage != self.cached_stage:  # the weights kept no longer hold (or kept another stage)
            self.clear_cached_maps()
            self.cached_stage = stage
        if keys is None or stage is None:
            c4, resized = self._trunk(images)
            return self.layer4(c4), resized
        kept = {k: self.cached_maps[k] for k in keys if k is not None and k in self.cached_maps}
        missing = [i for i, k in enumerate(keys) if k is None or k not in kept]
        if missing:
            with torch.no_grad():
                maps, resized = self._trunk([images[i] for i in missing])
                if stage == "c5":
                    maps = self.layer4(maps)
            for row, i in enumerate(missing):
                # Cloned as a plain tensor even under validation's inference mode, so that a
                # training step may read the kept map later.
                with torch.inference_mode(False):
                    computed = (maps[row].clone(), resized[row].clone())
                if keys[i] is not None and self.cached_bytes + computed[0].nbytes <= PIXEL_MAP_CACHE_BYTES:
                    self.cached_maps[keys[i]] = computed
                    self.cached_bytes += computed[0].nbytes
                kept[keys[i] if keys[i] is not None else i] = computed
        rows = [kept[k if k is not None else i] for i, k in enumerate(keys)]
        # Computed in other batches: each padded with zeros to the largest (cells off their image,
        # which the pixel tokens' mask leaves out).
        h, w = max(m.shape[1] for m, _ in rows), max(m.shape[2] for m, _ in rows)
        device = next(self.parameters()).device
        maps = torch.stack([F.pad(m, (0, w - m.shape[2], 0, h - m.shape[1])).to(device) for m, _ in rows])
        resized = torch.stack([r for _, r in rows]).to(device)
        return (self.layer4(maps) if stage == "c4" else maps), resized

    def _trunk(self, images: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The C4 map of the batch, and [B, 2] resized (height, width)."""
        image_list, _ = self.transform(images)
        c4 = self.backbone(image_list.tensors)["0"]
        return c4, torch.tensor(image_list.image_sizes, device=c4.device)


class PixelBertPixelEmbeddings(nn.Module):
    """C5 map -> pixel tokens: 3x3 conv to the hidden width, 2x2 max-pool where the map is large
    enough (`pixel_pool`), ReLU, flattened in raster order; plus the paper's semantic embedding
    s_v, one learned vector shared by every pixel (BERT's embeddings add the image segment).
    With `pixel_standardise`, the map's channels are standardised first (buffers `feature_mean`,
    `feature_std`, saved with the weights); with `pixel_whiten`, its cells are whitened (buffers
    `feature_mean`, `whitening`)."""

    def __init__(self, config: PixelBertConfig, in_channels: int, cnn_stride: int):
        super().__init__()
        self.standardise, self.whiten = config.pixel_standardise, config.pixel_whiten
        # Buffers only with a lever on: checkpoints made without one load as they were.
        if self.standardise or self.whiten:
            self.register_buffer("feature_mean", torch.zeros(in_channels))
        if self.standardise:
            self.register_buffer("feature_std", torch.ones(in_channels))
        if self.whiten:
            self.register_buffer("whitening", torch.eye(in_channels))
        self.conv = nn.Conv2d(in_channels, config.hidden_size, 3, padding=1)
        pool = config.pixel_pool
        if pool is None:
            pool = config.image_sizes[0] // cnn_stride >= POOL_MIN_SIDE
        # ceil_mode: an odd side keeps its last row / column of cells.
        self.pool = nn.MaxPool2d(2, ceil_mode=True) if pool else nn.Identity()
        self.stride = cnn_stride * (2 if pool else 1)  # resized image pixels per pixel token
        self.initializer_range = config.initializer_range
        self.visual_embedding = nn.Parameter(torch.empty(config.hidden_size))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The shared visual embedding drawn as BERT draws an embedding (the conv is torch's layer,
        drawn by its own reset_parameters)."""
        self.visual_embedding.data.normal_(0.0, self.initializer_range)

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """[B, C, h', w'] -> [B, h * w, H] tokens and the map's (h, w)."""
        if self.standardise:
            features = (features - self.feature_mean[:, None, None]) / self.feature_std[:, None, None]
        elif self.whiten:
            centred = features - self.feature_mean[:, None, None]
            features = torch.einsum("bchw,cd->bdhw", centred, self.whitening.to(centred.dtype))
        pixel_map = F.relu(self.pool(self.conv(features)))
        return pixel_map.flatten(2).transpose(1, 2) + self.visual_embedding, tuple(pixel_map.shape[2:])


def cells_on_image(resized: torch.Tensor, stride: int, map_size) -> torch.Tensor:
    """[B, h, w] bool: the map cells on their image; those past its resized size ([B, 2] height,
    width) are the batch's padding."""
    h, w = map_size
    on_image = torch.div(resized + stride - 1, stride, rounding_mode="floor")  # [B, 2] cells (h, w)
    rows = torch.arange(h, device=resized.device)[None, :, None] < on_image[:, 0, None, None]
    cols = torch.arange(w, device=resized.device)[None, None, :] < on_image[:, 1, None, None]
    return rows & cols


@dataclass
class PixelTokens:
    """An image batch's pixel tokens. tokens: [B, K, H]; mask: [B, K] bool, the tokens that lie
    on their image (not on the batch's padding); map_size: (h, w), K = h * w unless sampled;
    box_scale: [B, 2] map cells per image pixel in x and y (the transform's resize over the
    stride); cells: [B, K] the map cell (raster index) of each token kept by random sampling, None
    when every cell is there."""

    tokens: torch.Tensor
    mask: torch.Tensor
    map_size: tuple[int, int]
    box_scale: torch.Tensor
    cells: torch.Tensor | None = None


@dataclass
class PixelBertModelOutput:
    """last_hidden_state: [B, T + K, H], the T text slots ([CLS] first) then the K pixel tokens.
    text_index: [B, T], the input column each text slot holds (labels given per input column are
    read through it); text_mask: [B, T] bool, the real text slots (the rest is padding).
    pixels: the pixel tokens as they entered BERT, with their layout (PixelTokens); None without
    images."""

    last_hidden_state: torch.Tensor
    text_index: torch.Tensor
    text_mask: torch.Tensor
    pixels: PixelTokens | None

    @property
    def text_hidden(self) -> torch.Tensor:
        return self.last_hidden_state[:, : self.text_index.shape[1]]

    @property
    def pixel_hidden(self) -> torch.Tensor:
        return self.last_hidden_state[:, self.text_index.shape[1] :]

    def pixel_map(self) -> torch.Tensor:
        """[B, H, h, w]: the pixel tokens' hidden states back on their map."""
        if self.pixels is None or self.pixels.cells is not None:
            raise ValueError("no pixel map: no images, or pixel tokens sampled")
        return self.pixel_hidden.transpose(1, 2).unflatten(2, self.pixels.map_size)


class PixelBertPreTrainedModel(StudyPreTrainedModel):
    """Every family's weight init, BERT loading and checkpoints (`StudyPreTrainedModel`), for
    Pixel-BERT.

    `init_weights` draws BERT's init for every Linear, Embedding and LayerNorm: the CNN has none,
    and keeps its construction init until `load_detector` (no `_detector_name` to set aside).
    A pre-training checkpoint starts a task head with the encoder (`pixelbert.*`: BERT, CNN, pixel
    embeddings) loaded and the head new, as VL-BERT's do."""

    config_class = PixelBertConfig
    base_model_prefix = "pixelbert"

    # ---- what the study's builder calls on a new model (every model family has them) ---------

    def load_detector(self, detector_dir) -> None:
        """The CNN's weights from the trained detector (a `vlbert train-detector` folder): its
        backbone and C5 stage. A ResNet-50 CNN takes its ImageNet weights from the caller instead
        (`base_model.cnn.load_resnet_state`): nothing to take here."""
        if self.config.cnn != "detector":
            return
        cnn = self.base_model.cnn
        if isinstance(cnn.backbone, Detectron2C4):  # a given detectron2 model's checkpoint
            from ..detection.detectron2 import load_described, read_description

            view = nn.Module()  # its checkpoint's names: backbone.*, roi_heads.res5.*
            view.backbone, view.roi_heads = cnn.backbone.body, nn.Module()
            view.roi_heads.res5 = cnn.layer4
            load_described(view, read_description(detector_dir), detector_dir)
        else:
            cnn.load_detector_state(load_file(str(Path(detector_dir) / WEIGHTS_FILE)), str(detector_dir))

    def center_appearance(self, mean: torch.Tensor) -> None:
        """Nothing to do: Pixel-BERT has no region appearance features to centre (VL-BERT centres
        its regions' on the training images' mean); `fit_pixel_statistics` is its counterpart."""

    # ---- what the heads read (StudyPreTrainedModel's readouts) ---------------------------------

    def build_encoder(self, config: PixelBertConfig) -> PixelBertModel:
        return PixelBertModel(config, initialise=False)

    def word_states(self, out: PixelBertModelOutput, mlm_labels: torch.Tensor | None) -> tuple:
        """The text slots' states, and the labels (given per input column) read through the slots'
        columns: [B, T] each, padding slots IGNORE_INDEX."""
        if mlm_labels is None:
            return out.text_hidden, None
        return out.text_hidden, mlm_labels.gather(1, out.text_index).masked_fill(~out.text_mask, IGNORE_INDEX)

    def relation_state(self, out: PixelBertModelOutput) -> torch.Tensor:
        """[B, H]: [CLS]."""
        return out.last_hidden_state[:, 0]

    def answer_state(self, out: PixelBertModelOutput, answer_positions: torch.Tensor | None) -> torch.Tensor:
        """[B, H]: [CLS] (the paper's VQA reads it, not the answer slot)."""
        return out.last_hidden_state[:, 0]

    def candidate_state(self, out: PixelBertModelOutput) -> torch.Tensor:
        return out.last_hidden_state[:, 0]

    def region_states(
        self, out: PixelBertModelOutput, visual: VisualInputs, roi_positions: torch.Tensor
    ) -> torch.Tensor:
        """[B, R, H]: each box of `visual.boxes` (image pixels) as RoIAlign over the final layer's
        pixel-token map, averaged to one vector."""
        pixel_map = out.pixel_map()
        # Image pixels -> map cells: the transform's resize, then the stride.
        boxes = visual.boxes.to(pixel_map.dtype) * out.pixels.box_scale.to(pixel_map.dtype).repeat(1, 2).unsqueeze(1)
        # aligned: cell i covers [i, i + 1) on the map, its centre at i + 0.5, as box corners need.
        pooled = roi_align(pixel_map, list(boxes), ROI_SIZE, spatial_scale=1.0, sampling_ratio=2, aligned=True)
        return pooled.mean((2, 3)).view(*boxes.shape[:2], -1)

    @torch.no_grad()
    def fit_pixel_statistics(self, images: Iterable[torch.Tensor]) -> None:
        """With `pixel_standardise` or `pixel_whiten`: the C5 map's statistics over the on-image
        cells of the first `PIXEL_STATISTICS_IMAGES` training images (float RGB [3, H, W] in
        [0, 1]), which the pixel embedding standardises or whitens the map with. Without either,
        `images` is not read. Call it after the CNN has its weights (`load_detector`, or a
        ResNet-50's `load_resnet_state`)."""
        config = self.config
        if not (config.pixel_standardise or config.pixel_whiten):
            return
        embeddings, cnn = self.base_model.pixel_embeddings, self.base_model.cnn
        device = embeddings.feature_mean.device
        total, second_moments, count = 0.0, 0.0, 0
        images = iter(itertools.islice(images, PIXEL_STATISTICS_IMAGES))
        while batch := list(itertools.islice(images, PIXEL_STATISTICS_BATCH)):
            features, resized = cnn([image.to(device) for image in batch])
            on_image = cells_on_image(resized, cnn.stride, features.shape[2:])
            cells = features.permute(0, 2, 3, 1)[on_image].double()  # [cells, C]
            total = total + cells.sum(0)
            # Whitening needs the channels' products; standardising only their squares (a
            # ResNet-50's 2,048 channels make the products dear).
            second_moments = second_moments + (cells.T @ cells if config.pixel_whiten else cells.square().sum(0))
            count += len(cells)
        if not count:
            raise ValueError("no images to take the pixel features' statistics from")
        mean = total / count
        embeddings.feature_mean.copy_(mean.float())
        if config.pixel_whiten:
            embeddings.whitening.copy_(whitening_matrix(second_moments / count - torch.outer(mean, mean)).float())
        else:
            std = (second_moments / count - mean.square()).clamp_min(0).sqrt()
            std = std.clamp_min(float(std.median()) * STANDARDISE_MIN_STD_SHARE)
            embeddings.feature_std.copy_(std.float())


def whitening_matrix(covariance: torch.Tensor) -> torch.Tensor:
    """ZCA whitening for features with this covariance [C, C]: V diag(1 / sqrt(eigenvalue + eps))
    V^T with eps `WHITEN_EPSILON_SHARE` of the largest eigenvalue, times the root of the mean
    eigenvalue, so that the whitened map keeps the map's mean variance per channel (the conv after
    it starts at the scale it would have had). Symmetric: a cell's whitened channel c is still
    mostly its channel c."""
    eigenvalues, vectors = torch.linalg.eigh(covariance)
    eigenvalues = eigenvalues.clamp_min(0)
    epsilon = float(eigenvalues.max()) * WHITEN_EPSILON_SHARE
    return (vectors * (eigenvalues + epsilon).rsqrt()) @ vectors.T * eigenvalues.mean().sqrt()


class PixelBertModel(PixelBertPreTrainedModel):
    """The encoder: BERT over words and pixel tokens, and the CNN that computes the pixels'
    features. `initialise=False`: a head holds it and initialises it with the head, in one pass."""

    def __init__(self, config: PixelBertConfig, initialise: bool = True):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.cnn = PixelBertCNN(config)
        self.pixel_embeddings = PixelBertPixelEmbeddings(config, self.cnn.out_channels, self.cnn.stride)
        self._initialised_by_head = not initialise
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.bert.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.bert.embeddings.word_embeddings = value

    single_stream = True

    def attention_columns(
        self, batch: dict, encoded: PixelBertModelOutput
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Its sequence holds the words moved to the front (`text_index`, the input column of each
        text slot), then the pixel tokens: the visual elements."""
        labels = batch["mlm_labels"].gather(1, encoded.text_index).masked_fill(~encoded.text_mask, IGNORE_INDEX)
        pixels = encoded.pixels.mask.bool()
        text = encoded.text_mask
        return (
            torch.cat([torch.zeros_like(text), pixels], 1),
            torch.cat([labels != IGNORE_INDEX, torch.zeros_like(pixels)], 1),
            torch.cat([text, pixels], 1),
        )

    def pixel_tokens(
        self, images: list[torch.Tensor], sample_pixels: int = 0, keys: list[str | None] | None = None
    ) -> PixelTokens:
        """The images' pixel tokens; `sample_pixels` > 0 keeps that many per image (random pixel
        sampling: a fresh draw from torch's global RNG each call). keys: each image's identity
        across batches (VisualInputs.image_keys), for a frozen CNN's cache."""
        # An image given several times (the same tensor or key: VCR's candidates) runs through the CNN once.
        keys = keys if keys is not None else [None] * len(images)
        identity = [id(image) if key is None else key for image, key in zip(images, keys)]
        first = {}
        for i, ident in enumerate(identity):
            first.setdefault(ident, i)
        rows = list(first)
        picked = list(first.values())
        features, resized = self.cnn([images[i] for i in picked], [keys[i] for i in picked])
        tokens, (h, w) = self.pixel_embeddings(features)
        if len(rows) < len(images):
            position = {ident: row for row, ident in enumerate(rows)}
            index = torch.tensor([position[ident] for ident in identity], device=tokens.device)
            tokens, resized = tokens[index], resized[index]
        stride = self.pixel_embeddings.stride
        mask = cells_on_image(resized, stride, (h, w)).flatten(1)
        original = torch.tensor([[i.shape[2], i.shape[1]] for i in images], device=tokens.device)
        box_scale = resized.flip(1) / original / stride
        cells = None
        if 0 < sample_pixels < h * w:
            # Padding cells draw last: an image keeps min(sample_pixels, its cells) real tokens.
            draw = torch.rand(mask.shape, device=tokens.device).masked_fill(~mask, 2.0)
            cells = draw.argsort(1)[:, :sample_pixels].sort(1).values  # kept in raster order
            tokens = tokens.gather(1, cells.unsqueeze(-1).expand(-1, -1, tokens.shape[-1]))
            mask = mask.gather(1, cells)
        return PixelTokens(tokens, mask, (h, w), box_scale, cells)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        visual_index: torch.Tensor | None = None,
        visual: VisualInputs | None = None,
        text_only: torch.Tensor | None = None,
        sample_pixels: int = 0,
    ) -> PixelBertModelOutput:
        """The inputs are VL-BERT's batch (visual_index and text_only taken, and not used: there
        are no regions). visual.images: the images, float RGB [3, H, W] in [0, 1]; visual None:
        text only, no pixel tokens. sample_pixels: see `pixel_tokens` (pre-training's only)."""
        # The words: the input less its [IMG] / [END] elements and padding, each row's moved to
        # its front in their order.
        config = self.config
        is_text = attention_mask.bool() & (input_ids != config.img_token_id) & (input_ids != config.end_token_id)
        text_index = torch.argsort((~is_text).int(), dim=1, stable=True)[:, : int(is_text.sum(1).max())]
        text_mask = is_text.gather(1, text_index)
        ids, segments, positions = (t.gather(1, text_index) for t in (input_ids, token_type_ids, position_ids))
        embeds, masks = [self.bert.embeddings.word_embeddings(ids)], [text_mask]
        pixels = None
        if visual is not None:
            if visual.images is None:
                raise ValueError("Pixel-BERT reads the images: visual.images is None")
            pixels = self.pixel_tokens(visual.images, sample_pixels, visual.image_keys)
            count = pixels.tokens.shape[1]
            # The paper gives pixels no position: every pixel token takes position 0, a constant
            # the same for every image and caption.
            embeds.append(pixels.tokens.to(embeds[0].dtype))
            masks.append(pixels.mask)
            segments = torch.cat([segments, segments.new_full((len(segments), count), SEGMENT_IMAGE)], 1)
            positions = torch.cat([positions, positions.new_zeros(len(positions), count)], 1)
        output = self.bert(
            inputs_embeds=torch.cat(embeds, 1),
            token_type_ids=segments,
            position_ids=positions,
            attention_mask=torch.cat(masks, 1).to(attention_mask.dtype),
        )
        return PixelBertModelOutput(output.last_hidden_state, text_index, text_mask, pixels)


# The pre-training and task models: the shared heads (heads.py) on Pixel-BERT's readouts.


class PixelBertForPreTraining(PreTrainingHeadMixin, PixelBertPreTrainedModel):
    """Masked language modelling with the image's pixels, and image-text matching on [CLS]. No
    masked visual modelling: the paper samples pixels instead (`config.pixel_samples`)."""

    def encode_inputs(self, pixel_samples: int | None = None, **inputs) -> PixelBertModelOutput:
        """`inputs` as PixelBertModel takes them; pixel_samples: this step's pixel tokens kept per
        image (None: config.pixel_samples; 0: every one). Random pixel sampling in pre-training's
        steps only: evaluation sees every pixel."""
        step_samples = self.config.pixel_samples if pixel_samples is None else pixel_samples
        return self.pixelbert(**inputs, sample_pixels=step_samples if self.training else 0)


class PixelBertForVQA(VQAHeadMixin, PixelBertPreTrainedModel):
    """The answer read on [CLS], an MLP over the answer vocabulary as the paper's."""


class PixelBertForVCR(VCRHeadMixin, PixelBertPreTrainedModel):
    """A candidate read on its [CLS]; no masked RoI loss (Pixel-BERT has no regions)."""


class PixelBertForRefCOCO(RefCOCOHeadMixin, PixelBertPreTrainedModel):
    """A candidate box read by RoIAlign over the final layer's pixel-token map: the project's design
    (the paper has no RefCOCO+ head)."""
