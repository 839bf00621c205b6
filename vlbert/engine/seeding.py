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
