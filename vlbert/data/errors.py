"""One error type for bad input, always naming where the problem is."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path


class DataFormatError(ValueError):
    """A data file is malformed. The message names the file and the line or key."""

    def __init__(self, path, problem: str, line: int | None = None, key: str | None = None):
        where = str(path) + (f":{line}" if line is not None else "") + (f" [{key}]" if key else "")
        super().__init__(f"{where}: {problem}")
        self.path, self.line, self.key = Path(path), line, key


def require_file(path, what: str = "file") -> Path:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    return path


def require_keys(record: dict, keys, path, line: int | None = None, prefix: str = "") -> None:
    if not isinstance(record, dict):
        raise DataFormatError(path, f"expected an object, got {type(record).__name__}", line, prefix or None)
    for key in keys:
        if key not in record:
            raise DataFormatError(path, f"missing key {key!r}", line, prefix + key)


def require_nonempty(items: list, path, what: str) -> list:
    if not items:
        raise DataFormatError(path, f"no {what}: the split is empty")
    return items


def require_same_ids(expected, found, id_name: str, path=None, shown: int = 5) -> None:
    """Refuse predictions whose ids are not exactly the expected ones (the official VQA `loadRes`
    asserts as much): scoring a part as if it were the whole, or answers to questions that are not
    there, gives a figure nobody else would get. The message counts the missing and the extra ids
    and shows the first few of each (in the annotations' and the predictions' order); it names
    `path` when the predictions came from a file."""
    expected, found = list(expected), list(dict.fromkeys(found))
    expected_set, found_set = set(expected), set(found)
    missing = [i for i in expected if i not in found_set]
    extra = [i for i in found if i not in expected_set]
    if not missing and not extra:
        return
    few = lambda ids: ", ".join(repr(i) for i in ids[:shown]) + (", ..." if len(ids) > shown else "")
    parts = (
        [f"no prediction for {len(missing)} of the {len(expected_set)} {id_name}s ({few(missing)})"] if missing else []
    ) + ([f"predictions for {len(extra)} {id_name}s that are not annotated ({few(extra)})"] if extra else [])
    problem = "; ".join(parts) + f": predictions must cover exactly the annotated {id_name}s"
    raise DataFormatError(path, problem) if path is not None else ValueError(problem)


def _decode(data: bytes, path, line: int | None = None) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        start = data.rfind(b"\n", 0, exc.start) + 1
        line = line if line is not None else data.count(b"\n", 0, exc.start) + 1
        raise DataFormatError(
            path,
            f"not UTF-8 text (byte 0x{data[exc.start]:02x} at column {exc.start - start + 1}): save the file as UTF-8",
            line,
        ) from None


def text_lines(path) -> Iterator[tuple[int, str]]:
    """The lines of a UTF-8 text file, numbered from 1, without their line ends. Decoded one line at
    a time (large corpora stream) so that bad bytes are reported with their line; Python's own
    decoding error names neither the file nor the line."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            yield number, _decode(raw, path, number).rstrip("\r\n")


def read_text(path) -> str:
    """A whole UTF-8 text file (a JSON document); bad bytes are reported with their line."""
    return _decode(Path(path).read_bytes(), path)


def load_json(path, what: str):
    """A whole JSON document; a missing file or bad JSON is one DataFormatError naming it (and the line)."""
    import json

    path = require_file(path, what)
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise DataFormatError(path, f"invalid JSON: {exc.msg}", exc.lineno) from None


def resolve_inside(root, relative, path, line: int | None = None, key: str | None = None) -> Path:
    """`root / relative` for a path read from the data file `path`, refused when it leaves `root`
    (absolute, or climbing out with `..`): a data file must not make us open files elsewhere.
    Checked on the text, not on the disk, so symlinks the user placed inside the root still work."""
    if not isinstance(relative, str) or not relative.strip():
        raise DataFormatError(path, f"expected a file path relative to the data root, got {relative!r}", line, key)
    parts = os.path.normpath(relative).split(os.sep)
    if os.path.isabs(relative) or parts[0] == "..":
        raise DataFormatError(
            path, f"{relative} is outside the data root {root}: paths in a data file must stay inside it", line, key
        )
    return Path(root) / relative
