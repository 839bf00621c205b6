"""What the training loop calls out to: the best epoch's weights and the tracker's records.

The loop (loop.py) runs the batches and owns the folder's checkpoint: resume, identity, the
training state. Everything else it does at fixed points goes through a `Callback`, called in the
order given (a sweep's Ray reporting comes before `BestEpoch`, so that a trial Ray ends in its
report leaves its best weights and checkpoint of the epoch before). Every hook runs on every
process; a callback that writes (files, the tracker) does so on the main process only.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time

from .. import io
from ..tracking import EPOCH_METRIC, RESUMED_TAG, val_metric
from .distributed import is_main_process, unwrap

TRACKING_FILE = "tracking.json"  # the tracker's run that last trained in the folder, and what it trained


class Callback:
    """Hooks of the training loop; each does nothing unless overridden."""

    def why_not_resume(self, loop, saved: dict) -> str | None:
        """Why the checkpoint found (its training state: `saved`) must not be resumed, or None."""
        return None

    def on_train_start(self, loop, resumed: bool) -> None:
        """Before the first batch, once the checkpoint is resumed (`resumed`) or not."""

    def on_log(self, loop, logs: dict) -> None:
        """Every `log_every` steps: the step's losses, the learning rate, the data-wait share."""

    def on_validation_end(self, loop, epoch: int, metrics: dict) -> None:
        """After epoch `epoch` (from 0), its validation metrics ({} without validation and on
        processes other than the main one); the epoch's checkpoint is saved after every callback."""

    def on_checkpoint(self, loop) -> None:
        """Before the loop writes its checkpoint (mid-epoch, and after each epoch's validation): a
        run resumed from it starts after what the callback has done by now."""

    def on_train_end(self, loop) -> None:
        """When `fit` returns, whether every epoch ran or `max_steps` stopped it."""


class BestEpoch(Callback):
    """Keeps the best epoch's weights in the loop's `best_dir` (save_pretrained): the epoch with the
    highest validation `select_metric`, or with None the last epoch. The best epoch and its metric
    are in `loop.state`, and so in the checkpoint."""

    def __init__(self, select_metric: str | None = None):
        self.select_metric = select_metric

    def why_not_resume(self, loop, saved):
        finished = saved["position"]["epoch"] >= loop.config.epochs
        if finished and not self._complete(loop) and saved["extra"]["best_epoch"] != loop.config.epochs - 1:
            return f"it finished, but the best epoch's weights ({loop.best_dir}) are gone"
        return None

    def on_validation_end(self, loop, epoch, metrics):
        s, select = loop.state, self.select_metric
        if select is None or (metrics and metrics[select] > s.best_metric):
            s.best_metric = metrics[select] if select else s.best_metric
            s.best_epoch = epoch
            if is_main_process():
                self._save(loop)

    def on_train_end(self, loop):
        if is_main_process() and loop.state.epoch >= loop.config.epochs and not self._complete(loop):
            # A finished run whose outputs were removed (Snakemake deletes a crashed job's): its
            # last epoch is the best one here (why_not_resume restarts the others), and the model holds it.
            self._save(loop)

    @staticmethod
    def _complete(loop) -> bool:
        return (loop.best_dir / "model.safetensors").is_file()

    @staticmethod
    def _save(loop) -> None:
        partial = loop.best_dir.with_name("best.partial")
        shutil.rmtree(partial, ignore_errors=True)
        unwrap(loop.model).save_pretrained(partial)
        shutil.rmtree(loop.best_dir, ignore_errors=True)
        partial.rename(loop.best_dir)


class Tracking(Callback):
    """Records the training in a `Tracker` (vlbert.tracking): the logged steps and each epoch's
    validation metrics (as val_<name>, with the epoch from 1).

    The tracker's run follows the training: `tracking.json` in the loop's folder names the
    folder's last run and what it trained (a digest of the loop's identity). A resumed checkpoint
    of that training continues that run, so that one run holds the whole history; a run whose
    training is not resumed is ended as killed, saying why."""

    def __init__(self, tracker):
        self.tracker = tracker
        self._rows: list[tuple[dict, int, float]] = []  # logged steps (and when) not yet written to the store

    def on_train_start(self, loop, resumed):
        """Continue the folder's last run if the checkpoint resumed is of its training (one copied
        from a sweep trial into a folder that trained another rate is not); else end that run,
        which will never go on, and start a new one."""
        if not is_main_process():
            return
        record = loop.out_dir / TRACKING_FILE
        last = json.loads(record.read_text()) if record.is_file() else {"run_id": None}
        trains = hashlib.sha256(json.dumps(loop.identity, sort_keys=True).encode()).hexdigest()
        continuing = resumed and last["run_id"] is not None and last["identity"] == trains
        run_id = self.tracker.start(continue_run=last["run_id"] if continuing else None)
        if continuing and run_id == last["run_id"]:
            self.tracker.set_tags({RESUMED_TAG: loop.state.step})
            return
        if last["run_id"] is not None:
            why = (
                loop.not_resumed
                if not resumed
                else "it could not be reopened"
                if continuing
                else "the checkpoint resumed is another training's"
            )
            self.tracker.abandon(
                last["run_id"], f"not continued, as {why}; {loop.out_dir} trains again in run {run_id}"
            )
        if run_id is not None:
            io.write_json(record, {"run_id": run_id, "identity": trains})

    def on_log(self, loop, logs):
        """Kept until the loop writes a checkpoint (one write to the store then, not one every
        `log_every` steps): a run resumed from that checkpoint has lost none of its history."""
        if is_main_process():
            self._rows.append((dict(logs), loop.state.step, time.time()))

    def on_validation_end(self, loop, epoch, metrics):
        """The epoch's rows written now: a sweep's scheduler may end the trial in the callback after."""
        if not is_main_process():
            return
        if metrics:
            logged = {val_metric(k): v for k, v in metrics.items() if isinstance(v, (int, float))}
            self._rows.append((logged | {EPOCH_METRIC: epoch + 1}, loop.state.step, time.time()))
        self._flush()

    def on_checkpoint(self, loop):
        if is_main_process():
            self._flush()

    def on_train_end(self, loop):
        if is_main_process():
            self._flush()

    def _flush(self) -> None:
        if self._rows:
            self.tracker.log_metric_rows(self._rows)
            self._rows = []
