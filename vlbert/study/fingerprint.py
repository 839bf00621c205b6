"""Where two runs of a study part: a digest of every stage's outputs, in the order the DAG makes them.

Two runs of one commit and preset on one machine repeat each other to the byte. Another machine
(another CPU's vector kernels, another thread count) may not: a float sum taken in another order
differs in its last bits, and training grows that into other weights, other learning rates chosen
by the sweeps, another Table 4. `vlbert fingerprint` says at which stage two runs first part, and
by how much (the largest difference of the first parting weights or features), so a user can tell
a parting in the last bits of a training from different data or code.

A fingerprint is a JSON file (stage -> file -> digest) or a results folder itself; comparing two
folders also measures the differences. Digests are of content, not bytes: a weights file's tensors,
a feature store's arrays, a metrics file without its timings.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import h5py
import numpy as np
from safetensors.numpy import load_file

from .. import io
from ..data.feature_store import SHARD_FINGERPRINTS
from ..layout import Layout

# A layout with a placeholder preset: its paths, relative to its results folder, name the stages.
_LAYOUT = Layout("<preset>")
_SETTING = "*"


def _rel(path: Path) -> str:
    return str(path.relative_to(_LAYOUT.results))


# A fine-tuning run's results (its tracking.json names an MLflow run, whose id is new every run).
_FINETUNE_FILES = ("metrics.json", "predictions_*.json")

# (stage, glob patterns relative to the results folder), in the DAG's order.
STAGES: list[tuple[str, list[str]]] = [
    ("data", [f"{_rel(_LAYOUT.data)}/*/**/*"]),
    ("bert_init", [f"{_rel(_LAYOUT.bert)}/*"]),
    ("detector", [f"{_rel(_LAYOUT.detector)}/*"]),
    ("features", [f"{_rel(_LAYOUT.features)}/*.h5", f"{_rel(_LAYOUT.features)}/*.shards/*.h5"]),
    ("pretrain", [f"{_rel(_LAYOUT.pretrained(_SETTING))}/*", f"{_rel(_LAYOUT.pretrain(_SETTING))}/metrics.json"]),
    (
        "tuned_features",
        [f"{_rel(_LAYOUT.tuned_features(_SETTING))}/*.h5", f"{_rel(_LAYOUT.tuned_features(_SETTING))}/*.shards/*.h5"],
    ),
    ("sweep", [_rel(_LAYOUT.sweep_best(_SETTING, "*"))]),
    ("finetune", [f"{_rel(_LAYOUT.finetune_run(_SETTING, '*', '*'))}/{name}" for name in _FINETUNE_FILES]),
    # The runs on shares of each training set (finetune.data_fractions): <fraction>/<task>/seed<n>.
    (
        "fractions",
        [f"{_rel(_LAYOUT.finetune_fraction(_SETTING, '*'))}/*/seed*/{name}" for name in _FINETUNE_FILES],
    ),
]

# The files a stage writes its results in, and their keys that measure the machine, not the model.
_METRICS_FILES = ("metrics.json", "best.json")
_TIMING_KEYS = ("second", "time", "wait")


def _timeless(value):
    if isinstance(value, dict):
        return {k: _timeless(v) for k, v in value.items() if not any(t in k for t in _TIMING_KEYS)}
    if isinstance(value, list):
        return [_timeless(v) for v in value]
    return value


def _h5_arrays(path: Path) -> Iterator[tuple[str, np.ndarray]]:
    """A store's datasets but an index's shard fingerprints, which name the folders the store was
    made in: two clones' identical stores would differ there."""
    with h5py.File(path, "r") as f:
        names: list[str] = []
        f.visititems(
            lambda name, obj: (
                names.append(name) if isinstance(obj, h5py.Dataset) and name != SHARD_FINGERPRINTS else None
            )
        )
        for name in sorted(names):
            yield name, f[name][()]


def _arrays(path: Path) -> Iterator[tuple[str, np.ndarray]] | None:
    """The arrays a weights file or feature store holds, by name; None for other files."""
    if path.suffix == ".safetensors":
        return iter(sorted(load_file(path).items()))
    if path.suffix == ".h5":
        return _h5_arrays(path)
    return None


def digest(path: Path) -> str:
    """SHA-256 of a file's content: arrays (name, dtype, shape, values), a metrics file's values
    without timings, else its bytes."""
    h = hashlib.sha256()
    arrays = _arrays(path)
    if arrays is not None:
        for name, array in arrays:
            array = np.asarray(array)
            h.update(f"{name}|{array.dtype}|{array.shape}|".encode())
            h.update(np.ascontiguousarray(array).tobytes() if array.dtype != object else repr(array).encode())
    elif path.name in _METRICS_FILES:
        h.update(json.dumps(_timeless(json.loads(path.read_text())), sort_keys=True).encode())
    else:
        h.update(path.read_bytes())
    return h.hexdigest()


def _data_set_digests(results: Path, files: list[Path]) -> dict[str, str]:
    """One digest a data set folder (data/<name>/): a synthetic world is thousands of files."""
    by_folder: dict[str, hashlib._Hash] = {}
    for path in files:
        relative = path.relative_to(results)
        folder = str(Path(*relative.parts[:2])) + "/"
        h = by_folder.setdefault(folder, hashlib.sha256())
        h.update(f"{relative}|{digest(path)}\n".encode())
    return {folder: h.hexdigest() for folder, h in by_folder.items()}


def fingerprint(results: Path) -> dict[str, dict[str, str]]:
    """stage -> {file (data: data set folder) relative to `results`: digest}, for the stages
    `results` has."""
    results = Path(results)
    if not results.is_dir():
        raise FileNotFoundError(f"no results folder at {results}")
    stages: dict[str, dict[str, str]] = {}
    for stage, patterns in STAGES:
        files = sorted({p for pattern in patterns for p in results.glob(pattern) if p.is_file()})
        if not files:
            continue
        if stage == "data":
            stages[stage] = _data_set_digests(results, files)
        else:
            stages[stage] = {str(p.relative_to(results)): digest(p) for p in files}
    return stages


def load(source: Path) -> dict[str, dict[str, str]]:
    """A fingerprint from a JSON file written by `save`, or computed from a results folder."""
    source = Path(source)
    if source.is_dir():
        return fingerprint(source)
    try:
        return json.loads(source.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{source} is neither a results folder nor a fingerprint JSON: {exc}") from exc


def save(stages: dict, path: Path) -> None:
    io.write_json(path, stages, indent=1)


def largest_difference(a: Path, b: Path) -> float | None:
    """The largest |a - b| over the float arrays two weights files or feature stores share, relative
    to the largest |a| (None when they hold no comparable float arrays)."""
    arrays_a, arrays_b = _arrays(a), _arrays(b)
    if arrays_a is None or arrays_b is None:
        return None
    b_by_name = dict(arrays_b)
    worst, scale = 0.0, 0.0
    for name, x in arrays_a:
        y = b_by_name.get(name)
        if y is None or x.shape != y.shape or not np.issubdtype(x.dtype, np.floating):
            continue
        x, y = x.astype(np.float64), y.astype(np.float64)
        worst = max(worst, float(np.max(np.abs(x - y), initial=0.0)))
        scale = max(scale, float(np.max(np.abs(x), initial=0.0)))
    return worst / scale if scale else None


def compare(a: dict, b: dict) -> list[dict]:
    """Per stage (in the DAG's order): files in both, how many differ, which, and which only one has."""
    rows = []
    for stage, _ in STAGES:
        files_a, files_b = a.get(stage, {}), b.get(stage, {})
        shared = sorted(set(files_a) & set(files_b))
        rows.append(
            {
                "stage": stage,
                "shared": len(shared),
                "differ": [f for f in shared if files_a[f] != files_b[f]],
                "only_a": sorted(set(files_a) - set(files_b)),
                "only_b": sorted(set(files_b) - set(files_a)),
            }
        )
    return [row for row in rows if row["shared"] or row["only_a"] or row["only_b"]]


def first_parting(rows: list[dict]) -> str | None:
    return next((row["stage"] for row in rows if row["differ"]), None)


def _first_array_difference(row: dict, a_folder: Path, b_folder: Path) -> float | None:
    """The largest relative difference of the first of a stage's differing files that holds arrays."""
    for name in row["differ"]:
        difference = largest_difference(a_folder / name, b_folder / name)
        if difference is not None:
            return difference
    return None


def render(rows: list[dict], a_folder: Path | None = None, b_folder: Path | None = None, shown: int = 3) -> str:
    """The comparison as text: a line per stage (with the largest relative difference of its first
    differing weights or features, where both runs' folders are at hand), then the first parting
    stage's files."""
    lines = [f"{'stage':<16} {'files':>6} {'differ':>7} {'only in one':>12}  largest difference"]
    for row in rows:
        only = len(row["only_a"]) + len(row["only_b"])
        difference = None
        if row["differ"] and a_folder is not None and b_folder is not None:
            difference = _first_array_difference(row, a_folder, b_folder)
        shown_difference = f"{difference:.1e}" if difference is not None else ""
        lines.append(f"{row['stage']:<16} {row['shared']:>6} {len(row['differ']):>7} {only:>12}  {shown_difference}")
    parting = first_parting(rows)
    if parting is None:
        lines.append("The runs agree on every file both have.")
        return "\n".join(lines)
    lines.append(f"First parting: {parting}.")
    differ = next(row for row in rows if row["stage"] == parting)["differ"]
    lines.extend(f"  {name}" for name in differ[:shown])
    if len(differ) > shown:
        lines.append(f"  and {len(differ) - shown} more")
    lines.append("Largest difference: the largest |a - b| of a weights file or feature store over its largest |a|.")
    return "\n".join(lines)
