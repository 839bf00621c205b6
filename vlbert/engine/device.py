"""Which device a run takes (`auto`: a GPU where there is one), and moving a batch (dicts, lists,
VisualInputs, tensors) to it."""

from __future__ import annotations

import dataclasses

import torch

AUTO = "auto"


def resolve_device(device: str) -> str:
    """`auto`: the first CUDA device when torch sees one, else the CPU; any other name as given."""
    if device != AUTO:
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def move_to(obj, device: torch.device, _moved: dict | None = None):
    """`obj` on `device`. A tensor the batch holds several times (an image shared by VCR's four
    candidates) is moved once and stays one tensor there, so a model can compute it once."""
    moved = {} if _moved is None else _moved
    if isinstance(obj, torch.Tensor):
        if id(obj) not in moved:
            moved[id(obj)] = obj.to(device, non_blocking=True)
        return moved[id(obj)]
    if isinstance(obj, dict):
        return {k: move_to(v, device, moved) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(move_to(v, device, moved) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(
            obj, **{f.name: move_to(getattr(obj, f.name), device, moved) for f in dataclasses.fields(obj)}
        )
    return obj
