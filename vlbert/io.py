"""Atomic file writes: a crash leaves either the old file or the new one, never half of one."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path


class WriteFailedError(OSError):
    """A file could not be written (the disk full, a file-size limit, no permission): the message
    names the file, so the command's one line says what to free or fix."""


# The system's errors of a write that cannot be done, however a library reports them: OSError's
# errno, h5py's "errno = 27", safetensors' "(os error 27)".
_WRITE_ERRNOS = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.EIO}
_ERRNO_IN_MESSAGE = re.compile(r"(?:errno = |os error )(\d+)")


def write_failure(exc: BaseException) -> str | None:
    """Why `exc` says a write could not be done (the system's words for its errno), or None."""
    number = exc.errno if isinstance(exc, OSError) and not isinstance(exc, WriteFailedError) else None
    if number is None and (found := _ERRNO_IN_MESSAGE.search(str(exc))):
        number = int(found.group(1))
    return os.strerror(number) if number in _WRITE_ERRNOS else None


@contextmanager
def writing(path: str | os.PathLike):
    """A block that writes `path`: a write that cannot be done (see `write_failure`) is raised as
    WriteFailedError naming it, whatever library wrote."""
    try:
        yield
    except Exception as exc:
        reason = write_failure(exc)
        if reason is None:
            raise
        raise WriteFailedError(f"{path}: cannot be written: {reason}") from exc


@contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path beside `path`; on success rename it into place. Nothing is left at
    `path` by a write that fails, which is raised naming it (`writing`)."""
    path = Path(path)
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        try:
            yield Path(tmp)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def write_text(path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_bytes(path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def _finite(obj):
    """`obj` with null for every NaN or infinity: a missing figure (a cell without runs, a spread of
    one seed)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {key: _finite(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(value) for value in obj]
    return obj


def write_json(path, obj, indent: int | None = None) -> None:
    """JSON as the standard has it: Python's default writes bare NaN and Infinity tokens, which
    strict parsers (browsers, jq, other languages) refuse; those become null."""
    # sort_keys keeps the bytes stable for the same content.
    try:
        text = json.dumps(obj, sort_keys=True, indent=indent, allow_nan=False)
    except ValueError:
        text = json.dumps(_finite(obj), sort_keys=True, indent=indent, allow_nan=False)
    write_text(path, text + "\n")


class FolderInUseError(RuntimeError):
    """Another process is writing the output folder."""


@contextmanager
def exclusive_folder(path: str | os.PathLike):
    """Hold an output folder for this process while it writes there: a second run into the same
    folder stops at once, naming the process that holds it. The lock is the kernel's (flock), so a
    killed holder leaves nothing stale behind."""
    from filelock import FileLock, Timeout

    path = Path(path)
    made = not path.exists()
    path.mkdir(parents=True, exist_ok=True)
    lock, holder = FileLock(path / ".lock", timeout=0), path / ".lock.pid"
    try:
        lock.acquire()
    except Timeout:
        pid = holder.read_text().strip() if holder.is_file() else "unknown"
        raise FolderInUseError(
            f"{path} is in use by another run (PID {pid}): wait for it to end, or give this one another output folder"
        ) from None
    try:
        holder.write_text(f"{os.getpid()}\n")
        yield path
    finally:
        # A run that stopped before writing anything (a bad preset, an unreachable store) leaves
        # no folder it made: held from the start, it is made before any of that is known.
        if made and {p.name for p in path.iterdir()} <= {".lock", ".lock.pid"}:
            holder.unlink(missing_ok=True)
            (path / ".lock").unlink(missing_ok=True)
            with contextlib.suppress(OSError):  # another run made its lock there meanwhile
                path.rmdir()
        lock.release()


def partial_dir(path) -> Path:
    """Where `atomic_dir` builds the folder `path`."""
    path = Path(path)
    return path.with_name(path.name + ".partial")


@contextmanager
def atomic_dir(path: str | os.PathLike):
    """Build a directory under a temporary name and rename it into place when complete.

    A folder that exists is complete; a crash leaves only `<name>.partial`, cleared on retry.
    """
    path = Path(path)
    partial = partial_dir(path)
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    try:
        yield partial
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if path.exists():
        shutil.rmtree(path)
    os.replace(partial, path)


# A run's inputs are known by their content: checkpoints resume only runs made from the same files,
# and feature stores name the detector weights they came from.
HASHED_UP_TO = 64 * 2**20  # larger files are known by size and modification time


def file_identity(path) -> dict | str | None:
    """What a file (or folder of files) is: a SHA-256 of its bytes, or, past HASHED_UP_TO, its
    size and modification time. None for a path that does not exist."""
    path = Path(path)
    if path.is_dir():
        return {str(f.relative_to(path)): file_identity(f) for f in sorted(path.rglob("*")) if f.is_file()}
    if not path.is_file():
        return None
    stat = path.stat()
    if stat.st_size > HASHED_UP_TO:
        return f"size {stat.st_size}, mtime_ns {stat.st_mtime_ns}"
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(2**20), b""):
            digest.update(block)
    return f"sha256 {digest.hexdigest()}"


# ---- a folder's files, checked before use -----------------------------------------------------

DIGESTS_FILE = "digests.json"  # a checkpoint folder's files and their SHA-256, written last


class CorruptCheckpointError(ValueError):
    """A checkpoint's files are not the ones it was written with (changed, cut short, missing)."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_digests(folder) -> None:
    """Record the SHA-256 of every file in `folder` (digests.json, written whole and last), for
    `digest_problem` to check before the folder is used."""
    folder = Path(folder)
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name not in (DIGESTS_FILE, ".lock", ".lock.pid"))
    write_json(folder / DIGESTS_FILE, {str(p.relative_to(folder)): _sha256(p) for p in files}, indent=1)


def digest_problem(folder) -> str | None:
    """Why `folder`'s files differ from the digests it recorded (a file missing, changed or cut
    short), or None: they match, or it records none (written before digests were kept)."""
    folder = Path(folder)
    recorded = folder / DIGESTS_FILE
    if not recorded.is_file():
        return None
    try:
        digests = json.loads(recorded.read_text())
    except (ValueError, UnicodeDecodeError):
        return f"{recorded} is not the JSON it was written as"
    for name, expected in digests.items():
        path = folder / name
        if not path.is_file():
            return f"{path} is missing"
        if _sha256(path) != expected:
            return f"{path} does not match the digest recorded when it was written (changed or cut short)"
    return None


def check_checkpoint(folder) -> None:
    """Refuse a checkpoint folder whose files fail their recorded digests, naming the file."""
    problem = digest_problem(folder)
    if problem is not None:
        raise CorruptCheckpointError(f"{problem}: the checkpoint {folder} cannot be used; make it again")
