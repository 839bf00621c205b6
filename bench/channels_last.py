"""Benchmark: the detector's trunk on channels-last tensors, and its frozen first stages, on CPU.

C4Backbone and C5Head hand their convolutions channels-last (NHWC) tensors, which oneDNN runs
faster on CPU than the default NCHW. This prints, for the mini preset's sizes:
  - trunk:      forward and backward of C4Backbone and the C5 stage on a batch of images;
  - pixelbert:  one PixelBertForPreTraining step (words, pixel sampling, its CNN training);
  - vlbert+tune: one VLBertForPreTraining step with the Fast R-CNN tuned (setting `full`);
each in the default layout (the conversion skipped) and channels-last, and their ratio (below 1:
channels-last is faster). Runs of the two layouts alternate, so both see the same machine state.
Then the `vlbert+tune` step with every trunk stage tuned against the stem and C2 frozen (VL-BERT's
released configs; `frozen_frcnn_stages`), both channels-last.

    python bench/channels_last.py [--batch 32] [--threads 1]
"""

from __future__ import annotations

import argparse
import time
from collections import OrderedDict
from contextlib import contextmanager

import torch

from vlbert.detection.model import C4Backbone, C5Head, DetectorConfig
from vlbert.modeling import (
    PixelBertConfig,
    PixelBertForPreTraining,
    StudyProcessor,
    VLBertConfig,
    VLBertForPreTraining,
)
from vlbert.modeling.inputs import VisualInputs
from vlbert.modeling.processing_study import pad_batch

# The mini preset's BERT; BERT's vocabulary, as StudyProcessor.from_pretrained() encodes with it.
SIZE = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=256)


@contextmanager
def default_layout():
    """C4Backbone and C5Head as they would be without the conversion: their inputs stay NCHW."""
    backbone, head = C4Backbone.forward, C5Head.forward

    def backbone_forward(self, images):
        return OrderedDict([("0", self.layer3(self.layer2(self.layer1(self.stem(images)))))])

    def head_forward(self, pooled):
        return self.layer4(pooled).mean(dim=(2, 3))

    C4Backbone.forward, C5Head.forward = backbone_forward, head_forward
    try:
        yield
    finally:
        C4Backbone.forward, C5Head.forward = backbone, head


def median_time(step, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def compare(step, repeats: int, rounds: int = 3) -> tuple[float, float]:
    """(default layout, channels-last) median seconds a step, the best of `rounds` alternations."""
    step()
    with default_layout():
        step()
    default, last = [], []
    for _ in range(rounds):
        with default_layout():
            default.append(median_time(step, repeats))
        last.append(median_time(step, repeats))
    return min(default), min(last)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--text", type=int, default=24, help="text tokens per example")
    parser.add_argument("--rois", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="the study runs each job on one thread")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    # The mini preset's detector (experiments/mini.yaml): stride 8, 96-px images, 42 classes.
    detector = DetectorConfig(class_names=[str(i) for i in range(42)], c4_stride=8)
    images = [torch.rand(3, detector.image_size, detector.image_size) for _ in range(args.batch)]
    pixels = torch.stack(images)
    backbone, head = C4Backbone(detector).train(), C5Head(detector).train()

    def trunk_step():
        c4 = backbone(pixels)["0"]
        head.layer4(c4).square().mean().backward()  # the whole map through C5, as Pixel-BERT runs it

    processor = StudyProcessor.from_pretrained()
    encodings = pad_batch([processor.encode(" ".join(["word"] * (args.text - 2)), num_rois=args.rois)] * args.batch)
    mlm_labels = torch.full_like(encodings["input_ids"], -100)
    mlm_labels[:, 1 : args.text - 1 : 6] = 2773
    boxes = torch.tensor(
        [[0, 0, 96, 96]] + [[8 * k, 8 * k, 8 * k + 30, 8 * k + 30] for k in range(args.rois)], dtype=torch.float32
    ).expand(args.batch, -1, -1)
    sizes = torch.tensor([[96, 96]]).expand(args.batch, -1)
    valid = torch.ones(args.batch, args.rois + 1, dtype=torch.bool)
    visual = VisualInputs(boxes, sizes, valid, None, images)
    common = dict(
        **SIZE,
        visual_feature_dim=detector.feature_dim,
        frcnn=detector.to_json(),
        num_visual_classes=detector.num_classes,
    )

    def training_step(model):
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
        relation = (torch.arange(args.batch) % 2).float()

        def step():
            out = model(**encodings, visual=visual, mlm_labels=mlm_labels, relation_labels=relation)
            optimizer.zero_grad(set_to_none=True)
            out.loss.backward()
            optimizer.step()

        return step

    pixelbert = PixelBertForPreTraining(PixelBertConfig(**common, pixel_samples=14)).train()
    vlbert = VLBertForPreTraining(VLBertConfig(**common, tune_frcnn=True)).train()
    rows = [
        ("trunk", compare(trunk_step, args.repeats)),
        ("pixelbert", compare(training_step(pixelbert), args.repeats)),
        ("vlbert+tune", compare(training_step(vlbert), args.repeats)),
    ]
    print(f"batch {args.batch} images of {detector.image_size} px, {args.threads} thread(s), median of {args.repeats}")
    print(f"{'step':12} {'NCHW (ms)':>10} {'channels-last (ms)':>19} {'ratio':>6}")
    for name, (default, last) in rows:
        print(f"{name:12} {1e3 * default:10.1f} {1e3 * last:19.1f} {last / default:6.2f}")

    tuned_all = training_step(VLBertForPreTraining(VLBertConfig(**common, tune_frcnn=True, frozen_frcnn_stages=0)))
    tuned_from_c3 = training_step(vlbert)
    every, frozen = [], []
    for _ in range(3):
        every.append(median_time(tuned_all, args.repeats))
        frozen.append(median_time(tuned_from_c3, args.repeats))
    print(
        f"vlbert+tune, every stage tuned {1e3 * min(every):.1f} ms, stem and C2 frozen {1e3 * min(frozen):.1f} ms: "
        f"ratio {min(frozen) / min(every):.2f}"
    )


if __name__ == "__main__":
    main()
