"""Conceptual Captions reader: `caption TAB image` per line (image: a path or URL column); and the
word kinds of a captions folder (`word_kinds.json`), what pre-training's grounding probe masks."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .errors import DataFormatError, load_json, require_file, require_nonempty, resolve_inside, text_lines

# Beside the splits' TSVs: {kind: [word, ...]}, the words of each kind that only the image can tell
# (the synthetic world's colours, shapes and sizes). Real Conceptual Captions has none: no probe.
WORD_KINDS_FILE = "word_kinds.json"


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


def read_word_kinds(folder) -> dict[str, tuple[str, ...]] | None:
    """The word kinds of a captions folder (WORD_KINDS_FILE), lower case; None without the file."""
    path = Path(folder) / WORD_KINDS_FILE
    if not path.is_file():
        return None
    kinds = load_json(path, "word kinds")
    if not isinstance(kinds, dict) or not kinds:
        raise DataFormatError(path, "expected an object of word kinds, {kind: [word, ...]}")
    for kind, words in kinds.items():
        if not (isinstance(words, list) and words and all(isinstance(w, str) and w.strip() for w in words)):
            raise DataFormatError(path, "expected a non-empty list of words", key=kind)
    return {kind: tuple(word.strip().lower() for word in words) for kind, words in kinds.items()}
