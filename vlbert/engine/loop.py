"""The training loop: epochs of batches, checkpoints, resume, per-epoch validation.

It knows nothing of what a batch holds (the stage gives `make_batch` and `loss_fn`: stage.py's
`run_stage` hands it a Stage's `make_batch`, `training_step` and `validate`) nor of what is done
with what it measures: its callbacks (callbacks.py) keep the best epoch's weights
(`BestEpoch`) and record the training in a tracker (`Tracking`; a sweep adds its Ray reporting).

Batch b of epoch e is always the same examples with the same random choices, so a run killed at
any point and re-run with the same command continues exactly: same batches, same dropout (the
RNG state is in the checkpoint), same metrics. A checkpoint is resumed only by the run that made
it (its `identity`: preset values, arguments, inputs); any other run starts afresh and says why
in one line (a callback may refuse it too: `BestEpoch` does when a finished run's best weights
are gone and were not its last epoch's; a finished run re-run writes them again otherwise).

Under torchrun each process takes every world_size-th batch and DDP averages the gradients.

Batches are built ahead of the step that trains on them: by one background thread, one batch
ahead (the preset's `loading.workers: 0`), or by that many forked processes (a DataLoader per
epoch), each `loading.prefetch_batches` ahead, into pinned memory on CUDA. Either way they are the same batches in the
same order: `make_batch` draws its randomness from generators of (seed, epoch, batch) (seeding.py),
never from a process's global RNG, and it runs in the workers on the CPU only.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file
from tqdm import tqdm

from ..tracking import LOSS_METRIC
from .callbacks import Callback
from .checkpoint import (
    checkpoint_identity,
    discard_checkpoint,
    identity_differences,
    latest_checkpoint,
    latest_sound_checkpoint,
    load_training_state,
    normalise_identity,
    read_state,
    save_checkpoint,
)
from .device import move_to
from .distributed import is_main_process, rank, unwrap, world_size


@dataclass
class LoopConfig:
    epochs: int
    batches_per_epoch: int
    checkpoint_every: int = 50  # steps; also at every epoch end
    validate_every: int = 1  # epochs; the last one is always validated
    grad_clip: float = 1.0
    log_every: int = 10
    max_steps: int | None = None  # stop early (benchmarks, quick looks): no validation
    precision: str = "fp32"  # fp32 | bf16 | fp16 (autocast; fp16 with a gradient scaler)
    progress: bool = True  # a progress bar (on the main process only)
    loader_workers: int = 0  # processes building batches; 0: one background thread, one batch ahead
    prefetch_batches: int = 2  # batches each worker builds ahead (with loader_workers)
    pin_memory: bool | None = None  # batches in pinned memory (with loader_workers; CUDA only); None: on CUDA


def loading_options(preset: dict) -> dict:
    """The preset's `loading` section as LoopConfig fields. It is kept out of `training` (and so
    out of a run's identity): how batches are built does not change them."""
    loading = preset.get("loading", {})
    names = {"workers": "loader_workers", "prefetch_batches": "prefetch_batches", "pin_memory": "pin_memory"}
    return {names[key]: value for key, value in loading.items() if key in names}


@dataclass
class LoopSteps:
    """What a stage gives the loop: batch `b` of epoch `epoch`, the loss of a batch (with its named
    parts), and the validation metrics of the model after an epoch (None: no validation)."""

    make_batch: Callable[[int, int], dict]
    loss_fn: Callable
    evaluate: Callable[[torch.nn.Module], dict] | None = None


@dataclass
class LoopState:
    epoch: int = 0  # epoch in progress
    batch: int = 0  # next batch (this process's count) within it
    step: int = 0  # optimiser steps done
    best_metric: float = -math.inf  # kept by the BestEpoch callback
    best_epoch: int = -1
    history: list = field(default_factory=list)  # per-epoch validation metrics

    def to_dict(self) -> dict:
        return {"epoch": self.epoch, "batch": self.batch, "step": self.step}


def _as_is(item):
    """The DataLoader's collate_fn: a batch comes as make_batch built it (no numpy conversion)."""
    return item


def _pinned(obj, memo: dict):
    """`obj` with its tensors in pinned memory; a tensor it holds several times stays one tensor
    (as move_to keeps it: a family that reads pixels runs an image given several times through its CNN once)."""
    if isinstance(obj, torch.Tensor):
        if id(obj) not in memo:
            memo[id(obj)] = obj.pin_memory()
        return memo[id(obj)]
    if isinstance(obj, dict):
        return {k: _pinned(v, memo) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_pinned(v, memo) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(
            obj, **{f.name: _pinned(getattr(obj, f.name), memo) for f in dataclasses.fields(obj)}
        )
    return obj


class _Built:
    """A batch from a loader worker. The DataLoader's pinning thread calls its pin_memory, which
    pins what move_to moves (the DataLoader's own pinning skips dataclasses and copies a tensor
    once per place it is held)."""

    def __init__(self, batch):
        self.batch = batch

    def pin_memory(self, device=None):
        return _Built(_pinned(self.batch, {}))


class _EpochBatches(torch.utils.data.Dataset):
    """Item i: batch todo[i] of `epoch`, for the loader workers."""

    def __init__(self, make_batch: Callable[[int, int], dict], epoch: int, todo: list[int]):
        self.make_batch, self.epoch, self.todo = make_batch, epoch, todo

    def __len__(self) -> int:
        return len(self.todo)

    def __getitem__(self, i: int) -> _Built:
        return _Built(self.make_batch(self.epoch, self.todo[i]))


class TrainingLoop:
    """Trains into `out_dir`: its checkpoint/ (resumed by the run of the same `identity`) and the
    best epoch's weights in best/ (written by a `BestEpoch` callback). `callbacks` are called in
    their order (callbacks.py)."""

    def __init__(
        self,
        model,
        optimizer,
        scheduler,
        config: LoopConfig,
        out_dir,
        steps: LoopSteps,
        callbacks: list[Callback],
        identity: dict | None = None,
    ):
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.identity = normalise_identity(identity) if identity is not None else None
        self.config, self.out_dir = config, Path(out_dir)
        self.make_batch, self.loss_fn, self.evaluate = steps.make_batch, steps.loss_fn, steps.evaluate
        self.callbacks = list(callbacks)
        self.progress = config.progress and is_main_process()
        self.checkpoint_dir = self.out_dir / "checkpoint"
        self.best_dir = self.out_dir / "best"
        self.state = LoopState()
        self.not_resumed = None  # why the training starts from the beginning, when it does
        if config.precision not in ("fp32", "bf16", "fp16"):
            raise ValueError(f"precision must be fp32, bf16 or fp16, got {config.precision!r}")
        if config.loader_workers < 0 or config.prefetch_batches < 1:
            raise ValueError(
                f"loading.workers must be >= 0 and loading.prefetch_batches >= 1, got {config.loader_workers} "
                f"and {config.prefetch_batches}"
            )
        if config.loader_workers and not sys.platform.startswith("linux"):
            # Workers are forked so that they share the stage's make_batch (with all its stage holds: not pickled).
            raise ValueError(f"loading.workers needs Linux (forked workers), not {sys.platform}: set it to 0")
        self.device = next(model.parameters()).device
        self.device_type = self.device.type
        self.autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(config.precision)
        self.scaler = torch.amp.GradScaler(self.device_type, enabled=config.precision == "fp16")
        # Pinned memory only speeds up copies to a GPU (and needs one).
        self.pin_memory = config.pin_memory is not False and self.device_type == "cuda"
        self.data_wait = 0.0  # seconds the loop waited for a batch to be ready
        self.step_time = 0.0  # seconds from asking for a batch to the end of its optimiser step
        self.steps_timed = 0

    # ---- checkpoints --------------------------------------------------------------------------

    def _stale(self, found: Path, saved: dict) -> str | None:
        """Why the checkpoint in `found` (its training state: `saved`) must not be resumed by this
        run, or None."""
        if self.identity is not None:
            stored = checkpoint_identity(found)
            if stored is None:
                return "it records no identity (made before identities were kept)"
            differences = identity_differences(stored, self.identity)
            if differences:
                more = f" and {len(differences) - 4} more" if len(differences) > 4 else ""
                return f"it was made by another run (differs in {', '.join(differences[:4])}{more})"
        for callback in self.callbacks:
            reason = callback.why_not_resume(self, saved)
            if reason is not None:
                return reason
        return None

    def resume(self) -> bool:
        found, set_aside = latest_sound_checkpoint(self.checkpoint_dir)
        for why in set_aside:
            if is_main_process():
                print(f"warning: not resuming from a damaged checkpoint: {why}", file=sys.stderr)
        if found is None:
            self.not_resumed = "its checkpoint was damaged" if set_aside else "it stopped before its first checkpoint"
            return False
        saved = read_state(found)
        reason = self._stale(found, saved)
        if reason is not None:
            self.not_resumed = f"its checkpoint was not resumed: {reason}"
            if is_main_process():
                print(f"not resuming {self.checkpoint_dir}: {reason}; starting afresh")
                discard_checkpoint(self.checkpoint_dir)
                shutil.rmtree(self.best_dir, ignore_errors=True)
            return False
        unwrap(self.model).load_state_dict(load_file(str(found / "model.safetensors")), strict=False)
        loaded = load_training_state(saved, self.optimizer, self.scheduler)
        extra = loaded["extra"]
        self.state = LoopState(
            **loaded["position"],
            best_metric=extra["best_metric"],
            best_epoch=extra["best_epoch"],
            history=extra["history"],
        )
        return True

    def save(self) -> None:
        for callback in self.callbacks:
            callback.on_checkpoint(self)
        if is_main_process():
            s = self.state
            save_checkpoint(
                self.checkpoint_dir,
                unwrap(self.model),
                self.optimizer,
                self.scheduler,
                s.to_dict(),
                {"best_metric": s.best_metric, "best_epoch": s.best_epoch, "history": s.history},
                self.identity,
            )

    # ---- training -----------------------------------------------------------------------------

    def _batch_indices(self) -> list[int]:
        """The global batch numbers this process runs in an epoch."""
        usable = self.config.batches_per_epoch - self.config.batches_per_epoch % world_size()
        return list(range(rank(), usable, world_size()))

    def _thread_batches(self, pool: ThreadPoolExecutor, epoch: int, todo: list[int]) -> Iterator[dict]:
        """The batches `todo` of `epoch` in order, each built in `pool` while the one before trains."""
        pending = pool.submit(self.make_batch, epoch, todo[0]) if todo else None
        for position in range(len(todo)):
            batch = pending.result()
            if position + 1 < len(todo):  # build the next batch while this one trains
                pending = pool.submit(self.make_batch, epoch, todo[position + 1])
            yield batch

    def _worker_batches(self, epoch: int, todo: list[int]) -> Iterator[dict]:
        """The batches `todo` of `epoch` in order, built by `loader_workers` forked processes (a
        loader per epoch: its list of batches is its own), pinned on CUDA."""
        if not todo:
            return
        loader = torch.utils.data.DataLoader(
            _EpochBatches(self.make_batch, epoch, todo),
            batch_size=None,
            shuffle=False,
            collate_fn=_as_is,
            num_workers=self.config.loader_workers,
            prefetch_factor=self.config.prefetch_batches,
            pin_memory=self.pin_memory,
            multiprocessing_context=multiprocessing.get_context("fork"),
            # The workers' seeds come from this generator, not from the global RNG (which the
            # checkpoint keeps for dropout): a loader leaves the training's randomness as it was.
            generator=torch.Generator(),
        )
        built = iter(loader)
        try:
            for item in built:
                yield item.batch
        finally:
            del built  # its workers stop now, not when the loop is collected

    def _step(self, batch: dict) -> dict:
        self.model.train()
        batch = move_to(batch, self.device)
        with torch.autocast(self.device_type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None):
            loss, losses = self.loss_fn(self.model, batch)
        if not torch.isfinite(loss):
            # Each of the setting's losses, so that the one that diverged shows.
            where = self.checkpoint_dir if latest_checkpoint(self.checkpoint_dir) else "none yet"
            parts = ", ".join(f"{k} {v.item():.4g}" for k, v in losses.items())
            raise FloatingPointError(
                f"non-finite loss at step {self.state.step + 1} (epoch {self.state.epoch + 1}, "
                f"batch {self.state.batch + 1}): loss {loss.item():.4g}"
                + (f" ({parts})" if parts else "")
                + f"; the last good checkpoint is kept: {where}"
            )
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        if self.config.grad_clip:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        return {LOSS_METRIC: loss.item(), **{f"{LOSS_METRIC}_{k}": v.item() for k, v in losses.items()}}

    def fit(self) -> LoopState:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        resumed = self.resume()
        if resumed and is_main_process():
            print(f"resuming from {self.checkpoint_dir}: epoch {self.state.epoch + 1}, batch {self.state.batch}")
        for callback in self.callbacks:
            callback.on_train_start(self, resumed)
        mine = self._batch_indices()
        with ThreadPoolExecutor(max_workers=1) as pool:  # its thread starts with its first batch
            while self.state.epoch < self.config.epochs:
                epoch = self.state.epoch
                todo = mine[self.state.batch :]
                bar = tqdm(
                    total=len(mine),
                    initial=len(mine) - len(todo),
                    desc=f"epoch {epoch + 1}/{self.config.epochs}",
                    disable=not self.progress,
                    leave=False,
                )
                if self.config.loader_workers:
                    built = self._worker_batches(epoch, todo)
                else:
                    built = self._thread_batches(pool, epoch, todo)
                with closing(built) as batches:  # a loader's workers stop with the epoch
                    for _ in todo:
                        waited = time.perf_counter()
                        batch = next(batches)
                        started = time.perf_counter()
                        self.data_wait += started - waited
                        logs = self._step(batch)
                        self.step_time += time.perf_counter() - waited
                        self.steps_timed += 1
                        self.state.step += 1
                        self.state.batch += 1
                        bar.update(1)
                        if self.state.step % self.config.log_every == 0:
                            logs |= {
                                "lr": self.scheduler.get_last_lr()[0],
                                "data_wait_share": self.data_wait / max(self.step_time, 1e-9),
                            }
                            for callback in self.callbacks:
                                callback.on_log(self, logs)
                        if self.state.step % self.config.checkpoint_every == 0 and self.state.batch < len(mine):
                            self.save()
                        if self.config.max_steps is not None and self.state.step >= self.config.max_steps:
                            bar.close()
                            return self._end_training()
                bar.close()
                self._end_epoch()
        return self._end_training()

    def _end_training(self) -> LoopState:
        for callback in self.callbacks:
            callback.on_train_end(self)
        return self.state

    def _check_in_step(self) -> None:
        """Under DDP every process must hold the same weights; a drift is a bug, not noise."""
        if world_size() == 1:
            return
        import torch.distributed as dist

        checksum = torch.stack([p.detach().double().sum() for p in self.model.parameters()]).sum().reshape(1)
        gathered = [torch.zeros_like(checksum) for _ in range(world_size())]
        dist.all_gather(gathered, checksum)
        values = torch.cat(gathered)
        if not torch.allclose(values, values[0].expand_as(values), rtol=1e-9, atol=1e-6):
            raise RuntimeError(
                f"training processes are out of step after epoch {self.state.epoch + 1}: "
                f"parameter checksums {values.tolist()}"
            )

    def _validates(self, epoch: int) -> bool:
        last = epoch + 1 == self.config.epochs
        return self.evaluate is not None and (last or (epoch + 1) % self.config.validate_every == 0)

    def _end_epoch(self) -> None:
        self._check_in_step()
        s = self.state
        metrics = self.evaluate(unwrap(self.model)) if self._validates(s.epoch) and is_main_process() else {}
        s.history.append(metrics)
        for callback in self.callbacks:
            callback.on_validation_end(self, s.epoch, metrics)
        s.epoch, s.batch = s.epoch + 1, 0
        self.save()


def loop_speed(loop: TrainingLoop, batch_size: int) -> dict:
    """Throughput of the steps a loop ran: examples per second and the share spent waiting for data."""
    return {
        "steps": loop.steps_timed,
        "examples_per_second": loop.steps_timed * batch_size / max(loop.step_time, 1e-9),
        "data_wait_share": loop.data_wait / max(loop.step_time, 1e-9),
    }
