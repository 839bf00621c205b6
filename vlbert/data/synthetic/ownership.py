"""Which files of a data set folder make-data wrote. It replaces a folder (a changed spec,
--force) only when every file there is its own, so that nothing of the user's is deleted: a
data root may point at a folder that holds other things."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ... import io

MANIFEST = ".files.json"  # the files make-data wrote into a data set folder, relative to it


class ForeignFileError(ValueError):
    """A folder make-data would replace holds a file it did not write."""


def _entries(folder: Path) -> list[str]:
    """Every file under `folder`, relative to it; a symlink counts as a file (never followed)."""
    found = []
    for top, dirs, files in os.walk(folder):
        links = [d for d in dirs if os.path.islink(os.path.join(top, d))]
        for name in files + links:
            found.append(Path(top, name).relative_to(folder).as_posix())
    return sorted(found)


def write_manifest(folder) -> None:
    folder = Path(folder)
    io.write_json(folder / MANIFEST, [e for e in _entries(folder) if e != MANIFEST], indent=0)


def foreign_file(folder, stamp: str) -> str | None:
    """The first file under `folder` that make-data did not write (relative to it), else None.
    A folder with a manifest holds what it lists; one with the spec stamp `stamp` but no manifest
    was made by make-data before manifests existed, or is its interrupted `.partial` folder (the
    stamp is written first)."""
    folder = Path(folder)
    if not folder.exists() and not folder.is_symlink():
        return None
    if folder.is_symlink() or not folder.is_dir():
        return "."
    entries = _entries(folder)
    if (folder / MANIFEST).is_file():
        owned = {*json.loads((folder / MANIFEST).read_text()), MANIFEST}
        return next((e for e in entries if e not in owned), None)
    if (folder / stamp).is_file():
        return None
    return entries[0] if entries else None


def check_replaceable(folder, stamp: str) -> None:
    found = foreign_file(folder, stamp)
    if found == ".":
        raise ForeignFileError(
            f"{folder}: is not a folder make-data made, and it would replace it: move it elsewhere, "
            "or give make-data another --out (data.root)"
        )
    if found is not None:
        raise ForeignFileError(
            f"{folder}: holds {found}, which make-data did not write, and it would replace this folder: "
            "move the file elsewhere, or give make-data another --out (data.root)"
        )
