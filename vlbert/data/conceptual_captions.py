"""Conceptual Captions reader: `caption TAB image` per line (image: a path or URL column)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .errors import DataFormatError, require_file, require_nonempty, resolve_inside, text_lines


@dataclass(frozen=True)
class Caption:
    caption: str
    image_path: Path


def read_captions(tsv_path, image_root=None, check_images: bool = False) -> list[Caption]:
    """Read one split. Relative image paths resolve against `image_root` (default: the TSV's folder)."""
    tsv_path = require_file(tsv_path, "Conceptual Captions TSV")
    root = Path(image_root) if image_root else tsv_path.parent
    records = []
    for line_no, line in text_lines(tsv_path):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 2:
            raise DataFormatError(
                tsv_path, f"expected 2 tab-separated columns (caption, image), got {len(fields)}", line_no
            )
        caption, image = fields[0].strip(), fields[1].strip()
        if not caption:
            raise DataFormatError(tsv_path, "empty caption", line_no)
        path = resolve_inside(root, image, tsv_path, line_no)
        if check_images and not path.is_file():
            raise FileNotFoundError(f"{tsv_path}:{line_no}: image not found: {path}")
        records.append(Caption(caption, path))
    return require_nonempty(records, tsv_path, "captions")
