"""Multi-process training under `torchrun`: one process per GPU (or CPU, with gloo), DDP.

Without torchrun's environment everything here is a no-op and the run is a single process.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def init_from_environment(device: str = "cpu") -> str:
    """Join the process group when started by torchrun; return this process's device."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        backend = "nccl" if device.startswith("cuda") else "gloo"
        dist.init_process_group(backend)
        if device.startswith("cuda"):
            local = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(local)
            return f"cuda:{local}"
    return device


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def is_main_process() -> bool:
    return rank() == 0


def wrap(model: torch.nn.Module, device: str) -> torch.nn.Module:
    if world_size() == 1:
        return model
    ids = [torch.device(device).index] if device.startswith("cuda") else None
    # Heads unused by a batch (e.g. masked RoI classification with no RoI masked) are allowed.
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids, find_unused_parameters=True)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
