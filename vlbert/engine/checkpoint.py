"""Training checkpoints: everything a killed run needs to continue exactly where it was.

A checkpoint is a folder, with no pickle anywhere: the model in safetensors (model.safetensors +
config.json), and the optimiser, scheduler and RNG states and the position in the data as
`state.json` (the structure) and `state.safetensors` (its tensors). It is written under a
temporary name and renamed, so a crash mid-write leaves the previous checkpoint intact.

`identity.json` records what the run was made from: the preset values and arguments it depends
on and the identities of its input files. A run resumes only a checkpoint of its own identity.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..io import digest_problem, file_identity, write_digests, writing

STATE_FILE = "state.json"
STATE_TENSORS = "state.safetensors"
IDENTITY_FILE = "identity.json"


def input_identity(source) -> dict | str | None:
    """An input given as a path (its content's identity) or as a name (a hub model: the name)."""
    return (
        file_identity(source)
        if source is not None and Path(source).exists()
        else (None if source is None else str(source))
    )


def dataset_digest(source) -> str:
    """A short digest of an input's identity (`input_identity`), as MLflow's dataset records keep one."""
    return hashlib.sha256(json.dumps(input_identity(source), sort_keys=True).encode()).hexdigest()[:16]


def normalise_identity(identity: dict) -> dict:
    """The identity as JSON gives it back (tuples as lists, paths as strings): what is compared."""
    return json.loads(json.dumps(identity, sort_keys=True, default=str))


def identity_differences(stored, current, prefix: str = "") -> list[str]:
    """Dotted keys at which two identities differ."""
    if isinstance(stored, dict) and isinstance(current, dict):
        return [
            d
            for key in sorted(set(stored) | set(current), key=str)
            for d in identity_differences(stored.get(key), current.get(key), f"{prefix}{key}.")
        ]
    return [] if stored == current else [prefix.rstrip(".") or "(all)"]


def checkpoint_identity(folder) -> dict | None:
    path = Path(folder) / IDENTITY_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def save_checkpoint(
    folder, model, optimizer, scheduler, position: dict, extra: dict | None = None, identity: dict | None = None
) -> None:
    folder = Path(folder)
    with writing(folder):
        _save_checkpoint(folder, model, optimizer, scheduler, position, extra, identity)


def _save_checkpoint(folder: Path, model, optimizer, scheduler, position, extra, identity) -> None:
    partial = folder.with_name(folder.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    model.save_pretrained(partial)
    if identity is not None:
        (partial / IDENTITY_FILE).write_text(json.dumps(normalise_identity(identity), indent=1, sort_keys=True))
    write_state(
        partial,
        {
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "position": position,
            "extra": extra or {},
        },
    )
    write_digests(partial)  # the state's files too: a resume checks them all
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


def latest_sound_checkpoint(folder) -> tuple[Path | None, list[str]]:
    """`latest_checkpoint`, but one whose files fail their recorded digests (changed or cut short)
    is set aside as `<name>.corrupt` (a later one replaces it), and the one before it, if any, is
    taken. Returns the checkpoint (or None) and what was set aside, each with why."""
    set_aside = []
    while (found := latest_checkpoint(folder)) is not None:
        problem = digest_problem(found)
        if problem is None:
            return found, set_aside
        corrupt = found.with_name(Path(folder).name + ".corrupt")
        shutil.rmtree(corrupt, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):  # another process of the run (DDP) did it
            os.replace(found, corrupt)
        set_aside.append(f"{problem}; set aside as {corrupt}")
    return None, set_aside


def write_state(folder, state: dict) -> None:
    """A nest of dicts, lists, numbers, strings and tensors as JSON plus safetensors. Dict keys
    keep their type (the optimiser's are ints); tuples come back as lists."""
    tensors = {}

    def pack(value):
        if isinstance(value, torch.Tensor):
            key = str(len(tensors))
            tensors[key] = value.detach().cpu().contiguous()
            return {"tensor": key}
        if isinstance(value, dict):
            return {"dict": [[key, pack(item)] for key, item in value.items()]}
        if isinstance(value, (list, tuple)):
            return [pack(item) for item in value]
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        raise TypeError(f"training state holds a {type(value).__name__}, which a checkpoint cannot keep")

    structure = pack(state)
    save_file(tensors, str(Path(folder) / STATE_TENSORS))
    (Path(folder) / STATE_FILE).write_text(json.dumps(structure))


def read_state(folder) -> dict:
    tensors = load_file(str(Path(folder) / STATE_TENSORS))

    def unpack(value):
        if isinstance(value, dict):
            return (
                tensors[value["tensor"]] if "tensor" in value else {key: unpack(item) for key, item in value["dict"]}
            )
        if isinstance(value, list):
            return [unpack(item) for item in value]
        return value

    return unpack(json.loads((Path(folder) / STATE_FILE).read_text()))


def discard_checkpoint(folder) -> None:
    """Remove a checkpoint and whatever a crash mid-save left beside it."""
    folder = Path(folder)
    for candidate in (folder, folder.with_name(folder.name + ".old"), folder.with_name(folder.name + ".partial")):
        shutil.rmtree(candidate, ignore_errors=True)


def load_training_state(state: dict, optimizer, scheduler) -> dict:
    """Put a `read_state` result back into the optimiser, scheduler and RNG."""
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"])
    return {"position": state["position"], "extra": state["extra"]}
