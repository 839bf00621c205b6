"""Deterministic randomness for training: the order of an epoch and the random choices of a batch
depend only on (seed, epoch, batch), never on what ran before, so resumed runs repeat them."""

from __future__ import annotations

import zlib

import torch


def _generator(*parts) -> torch.Generator:
    key = "/".join(str(p) for p in parts)
    return torch.Generator().manual_seed(zlib.crc32(key.encode()))


def epoch_order(n: int, seed: int, epoch: int, stream: str = "main") -> list[int]:
    return torch.randperm(n, generator=_generator(seed, stream, epoch)).tolist()


def batch_generator(seed: int, epoch: int, batch: int, stream: str = "main") -> torch.Generator:
    return _generator(seed, stream, epoch, batch)


def training_subset(n: int, fraction: float) -> list[int]:
    """The indices of a `fraction` of n training examples (at least one), in their order: the same
    subset for every setting and seed, so that a fraction's runs differ only in what they start from."""
    if not 0 < fraction <= 1:
        raise ValueError(f"a training fraction is in (0, 1], got {fraction}")
    keep = max(1, round(n * fraction))
    return sorted(torch.randperm(n, generator=_generator("training_subset", n)).tolist()[:keep])
