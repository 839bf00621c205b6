"""Training checkpoints: everything a killed run needs to continue exactly where it was.

A checkpoint is a folder: the model in safetensors (model.safetensors + config.json, no pickle),
and `state.pt` with optimiser, scheduler, RNG states and the position in the data, loaded with
torch's weights-only unpickler (tensors and plain containers only). It is written under a
temporary name and renamed, so a crash mid-write leaves the previous checkpoint intact.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

STATE_FILE = "state.pt"


def save_checkpoint(folder, model, optimizer, scheduler, position: dict, extra: dict | None = None) -> None:
    folder = Path(folder)
    partial = folder.with_name(folder.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    model.save_pretrained(partial)
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "torch_rng": torch.get_rng_state(), "position": position, "extra": extra or {}},
               partial / STATE_FILE)
    old = folder.with_name(folder.name + ".old")
    if folder.exists():
        os.replace(folder, old)
    os.replace(partial, folder)
    if old.exists():
        shutil.rmtree(old)


def latest_checkpoint(folder) -> Path | None:
    """The checkpoint folder if complete; a crash between the two renames left it under `.old`."""
    folder = Path(folder)
    for candidate in (folder, folder.with_name(folder.name + ".old")):
        if (candidate / STATE_FILE).is_file():
            return candidate
    return None


def load_training_state(folder, optimizer, scheduler) -> dict:
    state = torch.load(Path(folder) / STATE_FILE, weights_only=True)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"])
    return {"position": state["position"], "extra": state["extra"]}
