"""Benchmark: a trained RoI detector's quality on the val split, as the report states it.

COCO box mAP (IoU .50:.95) and mAP@0.5, and the share of ground-truth boxes whose best class,
shape and colour the box head gets right, per object size: re-measure after a preset change.

    python bench/detector_quality.py --detector results/<preset>/detector --data results/<preset>/data/detector
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from vlbert.data.coco import read_coco
from vlbert.detection.model import load_detector
from vlbert.detection.train import evaluate_coco, ground_truth_accuracy
from vlbert.study.report import ground_truth_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--detector", required=True, help="folder from `vlbert train-detector`")
    parser.add_argument("--data", required=True, help="detector data folder (COCO layout), or the data root above it")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    data = Path(args.data)
    if not (data / "annotations").is_dir() and (data / "detector" / "annotations").is_dir():
        data = data / "detector"
    val = read_coco(data / "annotations/instances_val2017.json", data / "val2017")
    model, config = load_detector(args.detector, args.device)
    names = [val.cats[c]["name"] for c in sorted(val.cats)]
    if names != config.class_names:
        raise SystemExit(
            f"{data}: the val categories are not the detector's classes ({len(names)} vs "
            f"{len(config.class_names)}; first {names[:2]} vs {config.class_names[:2]})"
        )

    start = time.perf_counter()
    scores = evaluate_coco(model, val, device=args.device)
    accuracy = ground_truth_accuracy(model, val, device=args.device)
    print(f"{args.detector} on {len(val.imgs)} val images ({time.perf_counter() - start:.1f} s)")
    print(f"mAP (IoU .50:.95) {scores['mAP']:.3f}   mAP@0.5 {scores['mAP50']:.3f}")
    if "size" not in next(iter(val.anns.values()), {}):
        print("(the annotations record no size: groups are COCO's area ranges)")
    print("\n".join(ground_truth_table(accuracy)))


if __name__ == "__main__":
    main()
