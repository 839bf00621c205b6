"""Benchmark: the feature store at the paper's scale, the scaled simulation of issue 22.

Writes a store of synthetic images at the paper's per-image shape (100 regions + the whole-image
row, 2048-d float16 features, class distributions over 1601 classes kept as their top-k) in shards
with an index, then reads it back in training order (store order) and in random order (a
fixed-seed permutation), each pass in a fresh process with a fresh FeatureStore (not preloaded),
after dropping the page cache so that the disk is measured. Prints write and read images/s, bytes
per image on disk, each read pass's peak resident memory against the store's size (reading must
stay bounded whatever the store's size), and the extrapolation to Conceptual Captions (3.3M
images), in this format and in the float32 + full-distribution one of before. Ends by checking
that a few images read back equal what was written: a wrong store fails the bench.

    python bench/store_scale.py [--images 20000] [--images-per-shard 1000] [--class-topk 32]
                                [--workdir DIR] [--keep] [--no-drop-caches] [--quiet]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import shutil
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
from tqdm import tqdm

from vlbert.data.feature_store import FeatureStore, compact, shards_folder, write_index, write_shard

REGIONS = 100
ROWS = REGIONS + 1  # row 0: the whole image
FEATURE_DIM = 2048
NUM_CLASSES = 1601  # Visual Genome's 1600 object classes + background
CC_IMAGES = 3_300_000  # Conceptual Captions
GPUS = (1, 8, 64)
# Image n's features are a window of one random pool at an offset of its own: this many distinct
# offsets (a prime, so that consecutive images' windows do not line up).
POOL_SLACK = 65_521
ATTRS = {"dataset": "scale-sim", "split": "train", "mode": "detected", "feature_dim": FEATURE_DIM}
DETECTOR_ASSUMPTION = "bottom-up-attention's Faster R-CNN R101-C4 on one V100"


@dataclass
class Result:
    """What write_shard takes for an image (a RoIResult's fields)."""

    boxes: np.ndarray
    labels: np.ndarray
    probs: np.ndarray
    scores: np.ndarray
    features: np.ndarray
    box_ids: np.ndarray
    width: int
    height: int


class Synthetic:
    """Image n's arrays, made from a few small random blocks: cheap to make for 20,000 images, and
    to make again for the check at the end.

    Its class distributions are a low background on every class, as a softmax gives, plus k clear
    winners at known classes, so the top-k the store keeps, and so what it reads back, is known.
    """

    def __init__(self, topk: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.topk = topk
        self.pool = (4 * rng.random(ROWS * FEATURE_DIM + POOL_SLACK, dtype=np.float32)).astype(np.float16)
        # Background: 0.05 of the mass on average, each class below 1e-4; each winner above
        # 0.95 / (2k) >= 3e-4 (k <= 1601): the winners are the top-k whatever k.
        self.background = rng.random((ROWS, NUM_CLASSES), dtype=np.float32) * (0.1 / NUM_CLASSES)
        self.top_ids = np.stack([rng.permutation(NUM_CLASSES)[:topk] for _ in range(ROWS)])
        winners = 1 + rng.random((ROWS, topk), dtype=np.float32)
        self.top_probs = 0.95 * winners / winners.sum(1, keepdims=True)
        corner, size = rng.random((2, ROWS, 2), dtype=np.float32) * 200
        self.boxes = np.concatenate([corner, corner + size], axis=1)  # x1 y1 x2 y2

    @staticmethod
    def key(n: int) -> str:
        return f"img{n:08d}"

    def features(self, n: int) -> np.ndarray:
        offset = (n * 7919) % POOL_SLACK
        return self.pool[offset : offset + ROWS * FEATURE_DIM].reshape(ROWS, FEATURE_DIM)

    def winners(self, n: int) -> np.ndarray:
        return (self.top_ids + n) % NUM_CLASSES  # still k distinct classes per row

    def result(self, n: int) -> Result:
        ids = self.winners(n)
        probs = self.background.copy()
        np.put_along_axis(probs, ids, self.top_probs, axis=1)
        best = self.top_probs.argmax(1)
        labels, scores = ids[np.arange(ROWS), best].astype(np.int64), self.top_probs.max(1)
        labels[0], scores[0] = 0, 1.0  # the whole-image row, as extraction writes it
        return Result(
            boxes=self.boxes + np.float32(n % 97),
            labels=labels,
            probs=probs,
            scores=scores,
            features=self.features(n),
            box_ids=np.full(ROWS, -1, np.int64),
            width=400 + n % 240,
            height=300 + n % 180,
        )

    def expected(self, n: int) -> dict:
        """What the store should give back for image n: the features as float32 (float16 is
        exact in it), the winners' probabilities as float16, renormalised to sum to one."""
        result = self.result(n)
        probs = np.zeros((ROWS, NUM_CLASSES), np.float32)
        np.put_along_axis(probs, self.winners(n), self.top_probs.astype(np.float16).astype(np.float32), axis=1)
        probs /= probs.sum(1, keepdims=True)
        return {
            "boxes": result.boxes,
            "labels": result.labels,
            "scores": result.scores,
            "features": result.features.astype(np.float32),
            "box_ids": result.box_ids,
            "probs": probs,
            "width": result.width,
            "height": result.height,
        }


def write_store(path: Path, synthetic: Synthetic, images: int, per_shard: int, quiet: bool) -> tuple[float, float]:
    """Write the store shard by shard. Returns (seconds writing, incl. the index and a final sync
    to disk; seconds making the synthetic results, not counted)."""
    folder = shards_folder(path)
    folder.mkdir(parents=True, exist_ok=True)
    shards, writing, making = [], 0.0, 0.0
    with tqdm(total=images, desc="write", unit="img", disable=quiet) as progress:
        for first in range(0, images, per_shard):
            numbers = range(first, min(first + per_shard, images))
            # As extraction does: each image compacted as it comes (float16, top-k), which counts
            # as writing; making the detector's output does not.
            results = []
            for n in numbers:
                started = time.perf_counter()
                result = synthetic.result(n)
                made = time.perf_counter()
                results.append(compact(result, "float16", synthetic.topk))
                making, writing = making + made - started, writing + time.perf_counter() - made
            made = time.perf_counter()
            shards.append(folder / f"shard_{len(shards):06d}.h5")
            write_shard(
                shards[-1],
                [synthetic.key(n) for n in numbers],
                results,
                attrs=ATTRS,
                dtype="float16",
                class_topk=synthetic.topk,
            )
            writing += time.perf_counter() - made
            progress.update(len(numbers))
            del results
    started = time.perf_counter()
    write_index(path, shards)
    os.sync()  # the disk's write speed, not the page cache's
    return writing + time.perf_counter() - started, making


def store_files(path: Path) -> list[Path]:
    return [path, *sorted(shards_folder(path).glob("shard_*.h5"))]


def disk_bytes(path: Path) -> dict[str, int]:
    """Bytes on disk: in all, and those of the features and of the class top-k datasets."""
    sizes = {"total": sum(f.stat().st_size for f in store_files(path)), "features": 0, "topk": 0}
    for shard in store_files(path)[1:]:
        with h5py.File(shard, "r") as f:
            sizes["features"] += f["features"].id.get_storage_size()
            sizes["topk"] += f["class_ids"].id.get_storage_size() + f["class_probs"].id.get_storage_size()
    return sizes


def drop_page_cache(path: Path) -> str:
    """Empty the page cache, so that a read pass reads the disk: all of it (root), or else the
    store's own pages (posix_fadvise: any process that can read the files). Says what was done."""
    os.sync()  # dirty pages cannot be dropped
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return "page cache dropped"
    except OSError as exc:
        reason = exc.strerror
    try:
        for file in store_files(path):
            fd = os.open(file, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        return f"store's pages dropped with posix_fadvise (drop_caches: {reason})"
    except (OSError, AttributeError):
        return f"page cache not dropped (drop_caches: {reason})"


def memory_mb(field: str) -> float:
    """This process's VmRSS or VmHWM (peak RSS), in MB. VmHWM belongs to the process's own memory
    map; ru_maxrss (the fallback, off Linux) can carry over the spawning parent's peak."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024 / 1e6
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6


def read_pass(path: Path, order: str, seed: int, max_open_shards: int, quiet: bool) -> dict:
    """Read every image once, in store order or a fixed-seed random one, with a fresh store. Runs in
    a process of its own, so that its peak RSS is the reading's alone."""
    before = memory_mb("VmRSS")
    started = time.perf_counter()
    store = FeatureStore(path, preload=False, max_open_shards=max_open_shards)
    keys = store.keys
    if order == "random":
        keys = [keys[i] for i in np.random.default_rng(seed).permutation(len(keys))]
    tenth = max(1, len(keys) // 10)
    rows, peak_at_tenth = 0, None
    for i, key in enumerate(tqdm(keys, desc=f"read {order}", unit="img", disable=quiet, mininterval=1)):
        rows += len(store[key]["features"])
        if i + 1 == tenth:
            peak_at_tenth = memory_mb("VmHWM")
    seconds = time.perf_counter() - started
    store.close()
    if rows != ROWS * len(keys):
        raise SystemExit(f"read {order}: {rows} rows for {len(keys)} images, expected {ROWS} each")
    return {
        "seconds": seconds,
        "images": len(keys),
        "before": before,
        "tenth": peak_at_tenth,
        "peak": memory_mb("VmHWM"),
    }


def in_fresh_process(function, *args):
    # spawn, not fork: a forked child starts with the parent's memory (the writer's, large).
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(function, *args).result()


def check(path: Path, synthetic: Synthetic, images: int, count: int, seed: int) -> list[str]:
    """Read back `count` random images and compare them with what was written; exit with an error
    naming the first difference."""
    rng = np.random.default_rng(seed + 1)
    numbers = sorted(rng.choice(images, min(count, images), replace=False).tolist())
    with FeatureStore(path) as store:
        if store.keys != [synthetic.key(n) for n in range(images)]:
            raise SystemExit("store check failed: the store's keys are not the images written, in order")
        for n in numbers:
            item, expected = store[synthetic.key(n)], synthetic.expected(n)
            for name, want in expected.items():
                got = item[name]
                same = (
                    np.allclose(got, want, rtol=1e-6, atol=0) and np.array_equal(got > 0, want > 0)
                    if name == "probs"
                    else np.array_equal(got, want) and np.asarray(got).dtype == np.asarray(want).dtype
                )
                if not same:
                    raise SystemExit(
                        f"store check failed: image {synthetic.key(n)}: {name!r} differs from what was written"
                    )
    return [synthetic.key(n) for n in numbers]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=20_000)
    parser.add_argument("--images-per-shard", type=int, default=1000)
    parser.add_argument("--class-topk", type=int, default=32, help="classes kept per region (of 1601)")
    parser.add_argument("--max-open-shards", type=int, default=16, help="FeatureStore's, when reading")
    parser.add_argument("--seed", type=int, default=0, help="of the synthetic data and the random read order")
    parser.add_argument("--check", type=int, default=5, help="random images compared with what was written")
    parser.add_argument(
        "--detector-img-per-s",
        type=float,
        default=10.0,
        help=f"bare detector speed per GPU, for the extraction estimate: an assumption, not measured "
        f"(default 10: {DETECTOR_ASSUMPTION})",
    )
    parser.add_argument("--workdir", type=Path, help="where to write the store (default: a temp folder in /tmp)")
    parser.add_argument("--keep", action="store_true", help="keep the store (and temp folder) at the end")
    parser.add_argument("--no-drop-caches", action="store_true", help="read passes may hit the page cache")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args()
    if args.images < 1 or args.images_per_shard < 1 or args.class_topk < 1:
        parser.error("--images, --images-per-shard and --class-topk must be positive")
    topk = min(args.class_topk, NUM_CLASSES)

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="store_scale_"))
    path = workdir / "scale.train.det.h5"
    try:
        synthetic = Synthetic(topk, args.seed)
        write_s, making_s = write_store(path, synthetic, args.images, args.images_per_shard, args.quiet)
        write_peak = memory_mb("VmHWM")
        sizes = disk_bytes(path)
        passes = {}
        for order in ("sequential", "random"):
            cache = "page cache not dropped (--no-drop-caches)" if args.no_drop_caches else drop_page_cache(path)
            passes[order] = {
                **in_fresh_process(read_pass, path, order, args.seed, args.max_open_shards, args.quiet),
                "cache": cache,
            }
        checked = check(path, synthetic, args.images, args.check, args.seed)
        measured = dict(write_s=write_s, making_s=making_s, write_peak=write_peak, sizes=sizes, passes=passes)
        report(args, topk, measured, checked)
        if args.keep:
            print(f"store kept: {path}")
    finally:
        if not args.keep:
            shutil.rmtree(shards_folder(path), ignore_errors=True)
            path.unlink(missing_ok=True)
            if not args.workdir:
                shutil.rmtree(workdir, ignore_errors=True)


def report(args, topk: int, measured: dict, checked: list[str]) -> None:
    n, sizes, passes, write_s = args.images, measured["sizes"], measured["passes"], measured["write_s"]
    shards = -(-n // args.images_per_shard)
    per_image = {name: size / n for name, size in sizes.items()}
    rest = per_image["total"] - per_image["features"] - per_image["topk"]
    print(
        f"store: {n} images in {shards} shard{'s' if shards > 1 else ''} of {args.images_per_shard}; {ROWS} rows each "
        f"(whole image + {REGIONS} regions) x {FEATURE_DIM}-d float16 features, top-{topk} of {NUM_CLASSES} classes"
    )
    print(
        f"write: {n / write_s:.1f} images/s (write_shard + write_index + sync to disk; "
        f"making the synthetic data, {measured['making_s']:.1f} s, not counted)"
    )
    print(
        f"bytes per image on disk: {per_image['total'] / 1e3:.1f} kB = features {per_image['features'] / 1e3:.1f} "
        f"+ class top-k {per_image['topk'] / 1e3:.1f} + the rest {rest / 1e3:.1f} "
        "(boxes, labels, scores, box ids, the index, HDF5's own)"
    )
    print(f"store size: {sizes['total'] / 1e6:.1f} MB; writer's peak RSS {measured['write_peak']:.0f} MB")
    print("read, each pass in a fresh process with a fresh FeatureStore (not preloaded):")
    rate = {}
    for order, stats in passes.items():
        rate[order] = stats["images"] / stats["seconds"]
        label = "sequential (store order)" if order == "sequential" else f"random (seed {args.seed})"
        print(
            f"  {label:24} {rate[order]:8.1f} images/s ({rate[order] * per_image['total'] / 1e6:.0f} MB/s); "
            f"peak RSS {stats['peak']:.0f} MB ({stats['tenth']:.0f} MB at 10% of the pass, "
            f"{stats['before']:.0f} MB before opening the store); {stats['cache']}"
        )
    peak = max(stats["peak"] for stats in passes.values())
    print(
        f"  peak RSS / store size: {peak:.0f} MB / {sizes['total'] / 1e6:.0f} MB = {peak * 1e6 / sizes['total']:.2f}"
    )
    print(f"check: {len(checked)} random images read back equal what was written ({', '.join(checked)})")

    # The format of before: float32 features and the full float32 distribution; the rest as now.
    before = ROWS * (FEATURE_DIM * 4 + NUM_CLASSES * 4) + rest
    formats = {"this format": per_image["total"], "float32 + full probs (before)": before}
    print(f"\nextrapolation to Conceptual Captions, {CC_IMAGES:,} images (TB = 1e12 bytes; one reading process):")
    print(f"  {'':34}" + "".join(f"{name:>32}" for name in formats))
    print(f"  {'bytes per image (kB)':34}" + "".join(f"{b / 1e3:32.1f}" for b in formats.values()))
    print(f"  {'disk (TB)':34}" + "".join(f"{CC_IMAGES * b / 1e12:32.2f}" for b in formats.values()))
    for order in passes:
        # The format of before was not written: its rate is this one's MB/s, as if reading were disk-bound.
        hours = [CC_IMAGES / (rate[order] * per_image["total"] / b) / 3600 for b in formats.values()]
        print(f"  {f'one epoch, {order} read (h)':34}{hours[0]:32.2f}{f'{hours[1]:.2f} (est., same MB/s)':>32}")
    print(f"  disk saving: {before / per_image['total']:.1f}x")
    detector = args.detector_img_per_s
    print(
        f"extraction, either format, at {detector:g} images/s per GPU: an ASSUMED bare detector speed, an input "
        f"(--detector-img-per-s), not measured; the default 10 is {DETECTOR_ASSUMPTION}"
    )
    print("  " + ", ".join(f"{g} GPU{'s' if g > 1 else ''}: {CC_IMAGES / (detector * g) / 3600:.1f} h" for g in GPUS))
    print(
        f"  one writer process ({n / write_s:.0f} images/s, measured) keeps up with the detectors of "
        f"{n / write_s / detector:.1f} GPUs"
    )


if __name__ == "__main__":
    main()
