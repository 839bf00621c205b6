"""One error type for bad input, always naming where the problem is."""

from __future__ import annotations

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
