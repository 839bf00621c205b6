"""Moving a batch (dicts, lists, VisualInputs, tensors) to the model's device."""

from __future__ import annotations

import dataclasses

import torch


def move_to(obj, device: torch.device):
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=True)
    if isinstance(obj, dict):
        return {k: move_to(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(move_to(v, device) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(
            obj, **{f.name: move_to(getattr(obj, f.name), device) for f in dataclasses.fields(obj)}
        )
    return obj
