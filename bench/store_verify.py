"""Benchmark: what checking a feature store's shards costs a training job (issue 40).

Training's reader verifies each shard once per job before reading it: the SHA-256 of each of its
datasets and attributes against those extraction recorded (`content_sha256`), and its attributes
against the study's. This writes a store at the paper's per-image shape (bench/store_scale.py's
synthetic images: 100 regions + the whole image, 2048-d float16 features, class top-k) and reads
every image of it, not preloaded, as a fresh job would: with and without verification, passes
alternating, each in a fresh process, the page cache warm (the hashing's cost, not the disk's).
Prints each way's median seconds and images/s, the verification's cost per image and per GB of
store, and what recording the checksums adds to writing a shard.

    python bench/store_verify.py [--images 2000] [--images-per-shard 500] [--class-topk 32]
                                 [--repeats 3] [--workdir DIR] [--keep] [--quiet]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import h5py
from store_scale import Synthetic, in_fresh_process, store_files, write_store

from vlbert.data.feature_store import FeatureStore, content_digests


def read_all(path: Path, verify: bool) -> float:
    """Seconds to open the store and read every image once, in store order."""
    started = time.perf_counter()
    store = FeatureStore(path, verify=verify)
    for key in store.keys:
        store[key]
    store.close()
    return time.perf_counter() - started


def digest_seconds(path: Path) -> float:
    """Seconds to compute a shard's checksums (what write_shard adds), for the store's first shard."""
    with h5py.File(store_files(path)[1], "r") as f:
        started = time.perf_counter()
        content_digests(f)
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--images-per-shard", type=int, default=500)
    parser.add_argument("--class-topk", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", help="where the store is written (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the store")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="store_verify_", dir=args.workdir))
    try:
        path = workdir / "store.h5"
        write_store(path, Synthetic(args.class_topk), args.images, args.images_per_shard, args.quiet)
        size = sum(f.stat().st_size for f in store_files(path))
        shards = len(store_files(path)) - 1
        read_all(path, False)  # the page cache warm for every pass
        times = {False: [], True: []}
        for _ in range(args.repeats):
            for verify in (False, True):
                times[verify].append(in_fresh_process(read_all, path, verify))
        plain, verified = statistics.median(times[False]), statistics.median(times[True])
        extra = verified - plain
        print(f"{args.images} images in {shards} shards of {args.images_per_shard}, {size / 1e9:.2f} GB")
        print(f"read every image, not verified: {plain:.2f} s ({args.images / plain:,.0f} images/s)")
        print(f"read every image, verified:     {verified:.2f} s ({args.images / verified:,.0f} images/s)")
        print(
            f"verification: +{extra:.2f} s, {100 * extra / plain:+.0f}%, "
            f"{1e3 * extra / args.images:.2f} ms per image, {extra / (size / 1e9):.2f} s per GB "
            f"(median of {args.repeats}, page cache warm)"
        )
        one = digest_seconds(path)
        print(f"checksums of one shard at writing: {one:.2f} s ({args.images_per_shard} images)")
    finally:
        if not args.keep:
            shutil.rmtree(workdir)


if __name__ == "__main__":
    main()
