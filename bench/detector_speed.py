"""Benchmark: extraction with a detector of bottom-up-attention's shape, in images a second.

A Faster R-CNN with a ResNet-101 trunk cut at C4 (stride 16), RoIAlign 14 x 14 over the RPN's 300
proposals an image, C5 and average pooling as the box head (2,048-d features) and 1,601 classes
(Visual Genome's and the background), on images resized to 600 pixels on the shorter side and at
most 1,000 on the longer (bottom-up-attention's test scale). None of its weights can be downloaded
here, and its convolutions cost the same whatever they are, so they are untrained, made sane:
residual branches start at zero (else the activations overflow and the RPN proposes nothing), and
the class layer is scaled so that some 10 to 40 of the 300 proposals are above the box rule's 0.2,
as for a trained detector (torchvision's own detections, in `detect` below, depend on that scale).
Three timings over the same 640 x 480 JPEG images (COCO's usual size):

  - detect:      `model(images)` on images already on the device (bench/extract_rois.py's bare):
                 torchvision's inference, with its own detections (per-class NMS of every box);
  - regions:     what extraction runs on the device (`score_regions`: every proposal's class
                 distribution and feature, copied to the host), on images already on it;
  - end to end:  `extract_to_store` with the paper preset's rule and store (decoding, the images'
                 upload, the regions, the rule, float16 features and top-32 classes in shards,
                 the index).

Target: end to end >= 0.95 of detect. End to end against regions is what extraction adds to the
device's work. The end-to-end images/s gives the hours printed for Conceptual Captions (what
`bench/store_scale.py` takes as `--detector-img-per-s`).

    python bench/detector_speed.py [--device cuda] [--batch-size 16] [--images 128]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import OrderedDict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn
from torchvision.models import resnet101
from torchvision.models.detection import FasterRCNN
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.faster_rcnn import FastRCNNPredictor
from torchvision.ops import MultiScaleRoIAlign

from vlbert.data.images import load_image
from vlbert.detection.backends import TorchvisionBackend, score_regions
from vlbert.detection.extract import StoreFormat, extract_to_store
from vlbert.detection.rules import BoxRule
from vlbert.detection.sources import ImageItem

VISUAL_GENOME_CLASSES = 1600
CC_IMAGES = 3_300_000  # Conceptual Captions
# The class layer's weights times this put some 10 to 40 of an image's 300 proposals above 0.2.
CLASS_LAYER_SCALE = 80.0
PAPER_RULE = BoxRule(score_threshold=0.2, min_boxes=10, max_boxes=100)
PAPER_STORE = StoreFormat(dtype="float16", class_topk=32, images_per_shard=1000)


class C4Trunk(nn.Sequential):
    """ResNet-101's stem and stages C2-C4, returning {"0": C4} as the RPN expects (as the project's
    C4Backbone does: `score_regions` calls the backbone itself)."""

    out_channels = 1024

    def forward(self, images: torch.Tensor) -> OrderedDict:
        return OrderedDict([("0", super().forward(images))])


class C5Head(nn.Module):
    """ResNet-101's C5 stage and average pooling over a pooled RoI (bottom-up-attention's box head)."""

    def __init__(self, layer4: nn.Module):
        super().__init__()
        self.layer4 = layer4

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.layer4(pooled).mean(dim=(2, 3))


def build_r101_c4() -> FasterRCNN:
    resnet = resnet101(weights=None, zero_init_residual=True)
    trunk = C4Trunk(resnet.conv1, resnet.bn1, resnet.relu, resnet.maxpool, resnet.layer1, resnet.layer2, resnet.layer3)
    anchors = AnchorGenerator(sizes=((32, 64, 128, 256, 512),), aspect_ratios=((0.5, 1.0, 2.0),))
    predictor = FastRCNNPredictor(2048, VISUAL_GENOME_CLASSES + 1)
    with torch.no_grad():
        predictor.cls_score.weight.mul_(CLASS_LAYER_SCALE)
    return FasterRCNN(
        trunk,
        num_classes=None,
        min_size=600,
        max_size=1000,
        rpn_anchor_generator=anchors,
        rpn_pre_nms_top_n_test=6000,
        rpn_post_nms_top_n_test=300,
        box_roi_pool=MultiScaleRoIAlign(["0"], output_size=14, sampling_ratio=0),
        box_head=C5Head(resnet.layer4),
        box_predictor=predictor,
        box_detections_per_img=100,
    ).eval()


def write_images(folder: Path, count: int) -> list[ImageItem]:
    """Smooth random 640 x 480 JPEGs (coarse noise upsampled: about 50 kB each, where noise would
    make megabytes; COCO's photographs are some 160 kB)."""
    generator = torch.Generator().manual_seed(0)
    items = []
    for n in range(count):
        coarse = torch.rand(1, 3, 24, 32, generator=generator)
        image = F.interpolate(coarse, size=(480, 640), mode="bilinear", align_corners=False)[0]
        path = folder / f"{n:06d}.jpg"
        Image.fromarray((image.permute(1, 2, 0).numpy() * 255).astype(np.uint8)).save(path, quality=90)
        items.append(ImageItem(f"{n:06d}", path))
    return items


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--images", type=int, default=128, help="images a timing")
    parser.add_argument("--repeats", type=int, default=3, help="best of N timings for each pass")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cuda = args.device.startswith("cuda")
    model = build_r101_c4().to(args.device)
    backend = TorchvisionBackend(
        model,
        SimpleNamespace(class_names=[f"class_{c}" for c in range(VISUAL_GENOME_CLASSES)], feature_dim=2048),
        PAPER_RULE,
        args.device,
    )

    with tempfile.TemporaryDirectory() as folder:
        items = write_images(Path(folder), args.images)
        images = [load_image(item.path).to(args.device) for item in items]
        batches = [images[k : k + args.batch_size] for k in range(0, len(images), args.batch_size)]

        def detect():
            for batch in batches:
                model(batch)

        def regions():
            for batch in batches:
                score_regions(model, batch, [None] * len(batch), args.device)

        def end_to_end():
            with tempfile.TemporaryDirectory() as out:
                extract_to_store(
                    backend, items, Path(out) / "f.h5", batch_size=args.batch_size, fmt=PAPER_STORE, progress=False
                )

        def timed(run) -> float:
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            with torch.inference_mode():
                run()
            if cuda:
                torch.cuda.synchronize()
            return time.perf_counter() - start

        passes = {"detect": detect, "regions": regions, "end to end": end_to_end}
        for run in passes.values():  # warm-up: the allocator, CUDA's lazy loading, the page cache
            timed(run)
        # Interleaved, best of N each: a slow spell of the machine hits every pass alike.
        rounds = [{name: timed(run) for name, run in passes.items()} for _ in range(args.repeats)]
        best = {name: min(r[name] for r in rounds) for name in passes}
        sample = images[: args.batch_size]
        with torch.inference_mode():
            scored = backend.forward_regions(sample, [None] * len(sample))
            proposals = np.mean([len(boxes) - 1 for boxes, _, _ in scored])
            kept = np.mean([len(result.boxes) - 1 for result in backend.select(sample, [None] * len(sample), scored)])

    device = torch.cuda.get_device_name() if cuda else f"cpu, {args.threads} threads"
    if cuda:
        device += (
            f"; TF32 convolutions {torch.backends.cudnn.allow_tf32}, matmuls {torch.backends.cuda.matmul.allow_tf32}"
        )
    print(f"R101-C4 Faster R-CNN, {VISUAL_GENOME_CLASSES + 1} classes, 300 proposals at most, 600/1000 px; untrained")
    print(f"device: {device}; {args.images} JPEGs of 640 x 480, batches of {args.batch_size}")
    print(f"proposals: {proposals:.0f} an image; rule: {PAPER_RULE}, kept {kept:.0f} an image")
    print(f"store: {PAPER_STORE}")
    for name, seconds in best.items():
        print(f"{name:>11}: {args.images / seconds:7.1f} img/s")
    print(f"ratio end to end / detect (target >= 0.95): {best['detect'] / best['end to end']:.2f}")
    print(f"ratio end to end / regions: {best['regions'] / best['end to end']:.2f}")
    hours = CC_IMAGES * best["end to end"] / args.images / 3600
    print(f"Conceptual Captions, {CC_IMAGES:,} images, end to end: {hours:,.1f} h on one, {hours / 64:.2f} h on 64")


if __name__ == "__main__":
    main()
