"""Benchmark: RoI extraction end to end against the bare detector forward pass, same images.

End to end = reading and decoding the images, the forward pass, the paper's box rule, and writing
the sharded store and its index (`extract_to_store`), with the preset's rule and store format.
Bare = `model(images)` in eval mode on images already in memory (on `--device`), in the same
batches. Target: extraction throughput >= 0.95 of the bare forward's.

    python bench/extract_rois.py --detector DIR --data DIR [--config experiments/mini.yaml]
                                 [--dataset vqa --split val2014] [--device cuda]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from vlbert.config import load_config
from vlbert.data.images import load_image
from vlbert.detection.backends import build_backend
from vlbert.detection.extract import StoreFormat, extract_to_store
from vlbert.detection.sources import image_items


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--detector", required=True, help="folder from `vlbert train-detector`")
    parser.add_argument("--data", required=True, help="data root (make-data output)")
    parser.add_argument("--config", default="experiments/mini.yaml", help="preset: its box rule and store format")
    parser.add_argument("--dataset", default="vqa")
    parser.add_argument("--split", default="val2014")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7, help="best of N timings for each side")
    parser.add_argument("--device", default="cpu", help="where the detector runs (cpu, cuda)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    items = image_items(Path(args.data) / args.dataset, args.dataset, args.split)
    config = load_config(args.config)
    backend = build_backend(config, args.detector, device=args.device)
    model, fmt = backend.model, StoreFormat.from_config(config)
    images = [load_image(item.path).to(args.device) for item in items]
    batches = [images[k : k + args.batch_size] for k in range(0, len(images), args.batch_size)]
    synchronize = torch.cuda.synchronize if args.device.startswith("cuda") else lambda: None

    def bare() -> float:
        start = time.perf_counter()
        with torch.no_grad():
            for batch in batches:
                model(batch)
        synchronize()
        return time.perf_counter() - start

    def end_to_end() -> float:
        with tempfile.TemporaryDirectory() as out:
            start = time.perf_counter()
            extract_to_store(
                backend, items, Path(out) / "features.h5", batch_size=args.batch_size, fmt=fmt, progress=False
            )
            return time.perf_counter() - start

    bare()
    end_to_end()  # warm-up: allocator, thread pools, page cache
    # Interleaved, best of N each: a slow spell of the machine hits both sides alike.
    timings = [(bare(), end_to_end()) for _ in range(args.repeats)]
    bare_s, e2e_s = (min(side) for side in zip(*timings))
    n = len(items)
    print(f"images: {n} ({args.dataset}/{args.split}), batch {args.batch_size}, {args.threads} threads")
    print(f"device: {torch.cuda.get_device_name() if args.device.startswith('cuda') else args.device}")
    print(f"rule: {backend.rule}; store: {fmt}")
    print(f"bare detector forward : {n / bare_s:7.1f} img/s")
    print(f"extraction end to end : {n / e2e_s:7.1f} img/s")
    print(f"ratio (target >= 0.95): {bare_s / e2e_s:7.2f}")


if __name__ == "__main__":
    main()
