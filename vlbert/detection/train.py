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
from PIL import Image
from pycocotools.cocoeval import COCOeval
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms.functional import pil_to_tensor
from tqdm import tqdm

from ..data.coco import read_coco
from .model import DetectorConfig, build_faster_rcnn, save_detector


def load_image(path) -> torch.Tensor:
    """RGB image as float [3, H, W] in [0, 1]; a missing or corrupt file names its path."""
    try:
        with Image.open(path) as image:
            return pil_to_tensor(image.convert("RGB")).float().div_(255)
    except (OSError, ValueError) as exc:
        raise OSError(f"cannot read image {path}: {exc}") from None


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
        boxes = torch.tensor([[a["bbox"][0], a["bbox"][1], a["bbox"][0] + a["bbox"][2],
                               a["bbox"][1] + a["bbox"][3]] for a in anns], dtype=torch.float32).reshape(-1, 4)
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
                results.append({"image_id": target["image_id"], "category_id": label, "score": score,
                                "bbox": [box[0], box[1], box[2] - box[0], box[3] - box[1]]})
    if not results:
        return {"mAP": 0.0, "mAP50": 0.0}
    with contextlib.redirect_stdout(_io.StringIO()):
        evaluator = COCOeval(coco, coco.loadRes(results), "bbox")
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return {"mAP": float(evaluator.stats[0]), "mAP50": float(evaluator.stats[1])}


def train_detector(data_root, out, options: dict, tracker, seed: int = 0, device: str = "cpu") -> dict:
    """Train on `<data_root>/annotations/instances_train2017.json`, score on val, save to `out`.

    options: the preset's `detector` section (epochs, lr, batch_size, image_size, widths...).
    """
    data_root = Path(data_root)
    train = read_coco(data_root / "annotations/instances_train2017.json", data_root / "train2017")
    val = read_coco(data_root / "annotations/instances_val2017.json", data_root / "val2017")
    names = [train.cats[c]["name"] for c in sorted(train.cats)]
    if sorted(train.cats) != list(range(1, len(names) + 1)):
        raise ValueError(f"{data_root}: category ids must be 1..{len(names)} (0 is the background)")
    architecture = {k: options[k] for k in ("image_size", "widths", "blocks") if k in options}
    config = DetectorConfig(class_names=names, **{k: tuple(v) if isinstance(v, list) else v
                                                  for k, v in architecture.items()})
    torch.manual_seed(seed)
    model = build_faster_rcnn(config).to(device)
    epochs = int(options.get("epochs", 6))
    batch_size = int(options.get("batch_size", 8))
    generator = torch.Generator().manual_seed(seed)
    loader = DataLoader(CocoDetection(train, flip=True), batch_size=batch_size, shuffle=True,
                        collate_fn=_collate, generator=generator, drop_last=True)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=options.get("lr", 0.02), momentum=0.9, weight_decay=1e-4)
    total = epochs * len(loader)
    warmup = min(100, total // 10)
    # Linear warm-up then cosine decay to zero.
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: (s + 1) / warmup if s < warmup else
                                                  0.5 * (1 + math.cos(math.pi * (s - warmup) / max(1, total - warmup))))
    tracker.log_params({"detector": {**config.to_json(), "epochs": epochs, "batch_size": batch_size,
                                     "lr": optimizer.param_groups[0]["initial_lr"]},
                        "train_images": len(train.imgs), "val_images": len(val.imgs)})
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
                tracker.log_metrics({"loss": loss.item(), **{k: v.item() for k, v in loss_dict.items()},
                                     "lr": scheduler.get_last_lr()[0]}, step=step)
        scores = evaluate_coco(model, val, device=device)
        tracker.log_metrics({"epoch": epoch + 1, "train_loss_epoch": float(np.mean(losses)),
                             "val_mAP": scores["mAP"], "val_mAP50": scores["mAP50"]}, step=step)
        print(f"detector epoch {epoch + 1}/{epochs}: loss {np.mean(losses):.3f}  "
              f"val mAP {scores['mAP']:.3f}  mAP@0.5 {scores['mAP50']:.3f}")
    save_detector(model, config, out)
    metrics = {"val_mAP": scores["mAP"], "val_mAP50": scores["mAP50"], "epochs": epochs,
               "train_seconds": round(time.perf_counter() - start, 1)}
    return metrics
