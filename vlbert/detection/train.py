"""Train the Faster R-CNN on a COCO-format detector split and score it with pycocotools.

On the embedded default this stands in for the Visual Genome detector of bottom-up-attention:
the shapes are the classes, and the detector is trained from scratch.
"""

from __future__ import annotations

import contextlib
import io as _io
import math
import time
from pathlib import Path

import numpy as np
import torch
from pycocotools.cocoeval import COCOeval
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from ..data.coco import read_coco
from ..data.images import load_image
from .backends import score_regions
from .model import DetectorConfig, build_faster_rcnn, save_detector


class CocoDetection(Dataset):
    def __init__(self, coco, flip: bool = False):
        self.coco, self.flip = coco, flip
        self.ids = sorted(coco.imgs)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, index):
        image_id = self.ids[index]
        image = load_image(self.coco.image_root / self.coco.imgs[image_id]["file_name"])
        anns = self.coco.imgToAnns[image_id]
        boxes = torch.tensor(
            [[a["bbox"][0], a["bbox"][1], a["bbox"][0] + a["bbox"][2], a["bbox"][1] + a["bbox"][3]] for a in anns],
            dtype=torch.float32,
        ).reshape(-1, 4)
        labels = torch.tensor([a["category_id"] for a in anns], dtype=torch.int64)
        # Flip decided per (epoch-seeded) worker RNG: deterministic for a fixed seed.
        if self.flip and torch.rand(()) < 0.5:
            image = image.flip(-1)
            width = image.shape[-1]
            boxes = torch.stack([width - boxes[:, 2], boxes[:, 1], width - boxes[:, 0], boxes[:, 3]], 1)
        return image, {"boxes": boxes, "labels": labels, "image_id": image_id}


def _collate(batch):
    return tuple(zip(*batch))


@torch.no_grad()
def evaluate_coco(model, coco, batch_size: int = 16, device: str = "cpu") -> dict:
    """COCO box mAP (IoU .50:.95) and mAP@0.5 of the model on a COCO split."""
    model.eval()
    loader = DataLoader(CocoDetection(coco), batch_size=batch_size, collate_fn=_collate)
    results = []
    for images, targets in loader:
        outputs = model([i.to(device) for i in images])
        for target, out in zip(targets, outputs):
            for box, label, score in zip(out["boxes"].tolist(), out["labels"].tolist(), out["scores"].tolist()):
                results.append(
                    {
                        "image_id": target["image_id"],
                        "category_id": label,
                        "score": score,
                        "bbox": [box[0], box[1], box[2] - box[0], box[3] - box[1]],
                    }
                )
    if not results:
        return {"mAP": 0.0, "mAP50": 0.0}
    with contextlib.redirect_stdout(_io.StringIO()):
        evaluator = COCOeval(coco, coco.loadRes(results), "bbox")
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return {"mAP": float(evaluator.stats[0]), "mAP50": float(evaluator.stats[1])}


# COCO's area ranges (pixels squared), the size groups when annotations carry no `size` of their own.
COCO_AREA_RANGES = (("small", 32**2), ("medium", 96**2), ("large", math.inf))
SIZE_ORDER = ("small", "medium", "large")


def size_group(ann: dict) -> str:
    """The annotation's own size (the synthetic world records it), else its COCO area range."""
    if "size" in ann:
        return str(ann["size"])
    area = ann.get("area", ann["bbox"][2] * ann["bbox"][3])
    return next(name for name, upper in COCO_AREA_RANGES if area < upper)


def predict_ground_truth_labels(model, coco, device: str = "cpu", batch_size: int = 16) -> dict[int, int]:
    """{annotation id: the category the model gives that ground-truth box}."""
    model.eval()
    ids = sorted(coco.imgs)
    predicted = {}
    for start in range(0, len(ids), batch_size):
        batch = [i for i in ids[start : start + batch_size] if coco.imgToAnns[i]]
        if not batch:
            continue
        images = [load_image(coco.image_root / coco.imgs[i]["file_name"]) for i in batch]
        anns = [coco.imgToAnns[i] for i in batch]
        boxes = [
            np.array([[x, y, x + w, y + h] for x, y, w, h in (a["bbox"] for a in image_anns)], dtype=np.float32)
            for image_anns in anns
        ]
        # Row 0 is the whole image; the best foreground class names a box, as the feature stores label it.
        for image_anns, (_, probs, _) in zip(anns, score_regions(model, images, boxes, device)):
            predicted.update({a["id"]: int(k) + 1 for a, k in zip(image_anns, probs[1:, 1:].argmax(1))})
    return predicted


def _colour_shape_names(coco) -> dict[int, tuple[str, str]] | None:
    """{category id: (colour, shape)} when the names are every "colour shape" pair of a set of
    colours and shapes (the synthetic detector's), else None (e.g. Visual Genome's "tennis racket")."""
    parts = {c: tuple(coco.cats[c]["name"].rsplit(" ", 1)) for c in coco.cats}
    if not all(len(p) == 2 for p in parts.values()):
        return None
    colours, shapes = {p[0] for p in parts.values()}, {p[1] for p in parts.values()}
    return parts if len(set(parts.values())) == len(colours) * len(shapes) > 1 else None


def score_ground_truth_labels(coco, predicted: dict[int, int]) -> dict:
    """Shares of ground-truth boxes given the right class (and, for "colour shape" classes, the
    right shape and the right colour), per size group and over all boxes."""
    names = _colour_shape_names(coco)
    checks = {"class": lambda truth, guess: truth == guess}
    if names:
        checks["shape"] = lambda truth, guess: names[truth][1] == names[guess][1]
        checks["colour"] = lambda truth, guess: names[truth][0] == names[guess][0]
    hits: dict[str, dict[str, int]] = {}
    for ann_id, guess in predicted.items():
        ann = coco.anns[ann_id]
        for group in (size_group(ann), "all"):
            counts = hits.setdefault(group, dict.fromkeys(["boxes", *checks], 0))
            counts["boxes"] += 1
            for check, right in checks.items():
                counts[check] += right(ann["category_id"], guess)

    def shares(counts):
        return {"boxes": counts["boxes"], **{k: counts[k] / counts["boxes"] for k in checks}}

    groups = sorted(
        set(hits) - {"all"}, key=lambda g: (SIZE_ORDER.index(g) if g in SIZE_ORDER else len(SIZE_ORDER), g)
    )
    return {
        "by_size": {g: shares(hits[g]) for g in groups},
        "all": shares(hits["all"]) if "all" in hits else {"boxes": 0},
    }


def ground_truth_accuracy(model, coco, device: str = "cpu", batch_size: int = 16) -> dict:
    """How well the box head names the split's ground-truth boxes, per size: what the RoI
    features of a given box can tell (the study's ground-truth mode reads exactly these).
    {"by_size": {"small": {"boxes": n, "class": share, "shape": .., "colour": ..}, ...}, "all": {...}}"""
    return score_ground_truth_labels(coco, predict_ground_truth_labels(model, coco, device, batch_size))


def format_ground_truth_accuracy(accuracy: dict) -> str:
    """One line: each size group's box count and shares in percent."""
    rows = [*accuracy["by_size"].items(), ("all", accuracy["all"])]
    return "  ".join(
        f"{group} ({counts['boxes']}): " + " ".join(f"{k} {100 * v:.1f}%" for k, v in counts.items() if k != "boxes")
        for group, counts in rows
    )


def ground_truth_accuracy_metrics(accuracy: dict) -> dict:
    """Flat figures for the tracker: val_gt_<check>_accuracy[_<size>]."""
    flat = {}
    for group, counts in [("", accuracy["all"]), *((f"_{g}", c) for g, c in accuracy["by_size"].items())]:
        flat.update({f"val_gt_{k}_accuracy{group}": v for k, v in counts.items() if k != "boxes"})
    return flat


def detector_config(coco, options: dict, data_root) -> DetectorConfig:
    """The preset's `detector` architecture (image_size, widths, blocks, c4_stride) for the classes
    of a COCO split, whose category ids must be 1..n (0 is the background)."""
    names = [coco.cats[c]["name"] for c in sorted(coco.cats)]
    if sorted(coco.cats) != list(range(1, len(names) + 1)):
        raise ValueError(f"{data_root}: category ids must be 1..{len(names)} (0 is the background)")
    architecture = {k: options[k] for k in ("image_size", "widths", "blocks", "c4_stride") if k in options}
    return DetectorConfig(
        class_names=names, **{k: tuple(v) if isinstance(v, list) else v for k, v in architecture.items()}
    )


def train_detector(data_root, out, options: dict, tracker, seed: int = 0, device: str = "cpu") -> dict:
    """Train on `<data_root>/annotations/instances_train2017.json`, score on val, save to `out`.

    options: the preset's `detector` section (epochs, lr, batch_size, image_size, widths...).
    """
    data_root = Path(data_root)
    train = read_coco(data_root / "annotations/instances_train2017.json", data_root / "train2017")
    val = read_coco(data_root / "annotations/instances_val2017.json", data_root / "val2017")
    config = detector_config(train, options, data_root)
    torch.manual_seed(seed)
    model = build_faster_rcnn(config).to(device)
    epochs = int(options.get("epochs", 6))
    batch_size = int(options.get("batch_size", 8))
    generator = torch.Generator().manual_seed(seed)
    loader = DataLoader(
        CocoDetection(train, flip=True),
        batch_size=batch_size,
        shuffle=True,
        collate_fn=_collate,
        generator=generator,
        drop_last=True,
    )
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=options.get("lr", 0.02), momentum=0.9, weight_decay=1e-4)
    total = epochs * len(loader)
    warmup = min(100, total // 10)
    # Linear warm-up then cosine decay to zero.
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: (
            (s + 1) / warmup if s < warmup else 0.5 * (1 + math.cos(math.pi * (s - warmup) / max(1, total - warmup)))
        ),
    )
    tracker.log_params(
        {
            "detector": {
                **config.to_json(),
                "epochs": epochs,
                "batch_size": batch_size,
                "lr": optimizer.param_groups[0]["initial_lr"],
            },
            "train_images": len(train.imgs),
            "val_images": len(val.imgs),
        }
    )
    step, start = 0, time.perf_counter()
    for epoch in range(epochs):
        model.train()
        losses = []
        for images, targets in tqdm(loader, desc=f"detector epoch {epoch + 1}/{epochs}", leave=False):
            targets = [{"boxes": t["boxes"].to(device), "labels": t["labels"].to(device)} for t in targets]
            loss_dict = model([i.to(device) for i in images], targets)
            loss = sum(loss_dict.values())
            if not torch.isfinite(loss):
                raise FloatingPointError(f"detector loss is {loss.item()} at step {step}")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 10.0)
            optimizer.step()
            scheduler.step()
            step += 1
            losses.append(loss.item())
            if step % 10 == 0:
                tracker.log_metrics(
                    {
                        "loss": loss.item(),
                        **{k: v.item() for k, v in loss_dict.items()},
                        "lr": scheduler.get_last_lr()[0],
                    },
                    step=step,
                )
        scores = evaluate_coco(model, val, device=device)
        tracker.log_metrics(
            {
                "epoch": epoch + 1,
                "train_loss_epoch": float(np.mean(losses)),
                "val_mAP": scores["mAP"],
                "val_mAP50": scores["mAP50"],
            },
            step=step,
        )
        print(
            f"detector epoch {epoch + 1}/{epochs}: loss {np.mean(losses):.3f}  "
            f"val mAP {scores['mAP']:.3f}  mAP@0.5 {scores['mAP50']:.3f}"
        )
    save_detector(model, config, out)
    metrics = {
        "val_mAP": scores["mAP"],
        "val_mAP50": scores["mAP50"],
        "epochs": epochs,
        "train_seconds": round(time.perf_counter() - start, 1),
    }
    # mAP alone can hide a detector whose features no longer tell small shapes or colours apart.
    metrics["val_gt_accuracy"] = ground_truth_accuracy(model, val, device=device)
    tracker.log_metrics(ground_truth_accuracy_metrics(metrics["val_gt_accuracy"]), step=step)
    print("detector val ground-truth boxes: " + format_ground_truth_accuracy(metrics["val_gt_accuracy"]))
    return metrics
