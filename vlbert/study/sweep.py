"""Learning-rate sweeps with Ray Tune: the one module that talks to Ray.

For one setting: a grid over its tasks and the preset's learning rates in one Tuner, ASHA's rungs
stopping a trial on the validation metric (per task) only where another rate beats it beyond the
noise of the val split, at most as many concurrent trials as the job's cores (or GPUs) allow, a
crashed trial retried. The chosen rate is the preset's own (finetune.<section>.lr, or the setting's
family's: finetune.<section>.families) unless another
beats it beyond that noise (`choose_rate`), so that two runs whose trials differ in their last
bits choose alike. Trials never look at the test split.
MLflow: each task's sweep is a parent run, every trial a child run (mlflow.parentRunId) in the
same experiment. The result is OUT/<task>/best.json; each trial's folder is
OUT/<task>/trials/lr_<lr>/, where the chosen run's seed can continue it (`continue_trial`).
The Tuner and its Ray run in a driver process of their own, which hands the trials over before
Ray's teardown (`run_in_driver_process`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

from .. import io
from ..config import finetune_epochs, finetune_options, study_seeds
from ..engine.callbacks import Callback
from ..engine.context import RunInputs, run_inputs, training_context
from ..evaluation.floors import accuracy_se
from ..registry import TASKS
from ..registry import setting as setting_entry
from ..tracking import (
    EPOCH_METRIC,
    LR_TAG,
    SEED_TAG,
    SETTING_TAG,
    STAGE_TAG,
    TASK_TAG,
    VAL_PREFIX,
    NullTracker,
    make_tracker,
    val_metric,
)

# Ray can end a trial's worker before the trial closes its MLflow run (the sweep's last trial, say).
UNCLOSED_TRIAL = "the sweep ended; Ray stopped this trial before it closed its run"
METRIC = val_metric("accuracy")  # the sweeps' score, as the training loop logs it each epoch
ITEMS = val_metric("n")  # the val items it rests on, for its standard error
TIE_SES = 2.0  # sweep.tie_ses's default: two rates within two SEs of the difference tie
FAULT_ONCE = "VLBERT_FAULT_ONCE"  # test hook: a trial crashes once if this file does not exist yet
# A local Ray's temp folder: /tmp/ray-vlbert-<PID of the process that started it>-XXXXXXXX. Short,
# as Ray's socket paths under it must stay within 107 bytes; the PID tells a dead sweep's folder.
RAY_TEMP_PREFIX = "ray-vlbert-"
# Ray takes 127.0.0.1 as the node's address, and so binds to it alone, only with multi-node
# clusters off; every Ray process reads this as it starts.
RAY_CLUSTERS = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@contextmanager
def local_ray(cpus: int, gpus: float | None = 0):
    """A Ray for this process alone, for the length of the block; yields its temp folder. Its
    workers run at this process's priority, as any other job of the study does.

    Its GCS, raylet, agents and workers listen on 127.0.0.1 only (Ray binds to every interface
    unless the node's address is the loopback one), and whichever way the block ends (it returns,
    raises, or SIGTERM, which Ray turns into SystemExit), no process of it is left and its temp
    folder is removed. SIGKILL runs none of this: the kernel ends the GCS and raylet with this
    process (their agents follow within a minute or so) and the next local Ray removes the folder.
    """
    import psutil
    import ray
    from ray._private import ray_constants

    _remove_dead_ray_folders()
    folder = tempfile.mkdtemp(prefix=f"{RAY_TEMP_PREFIX}{os.getpid()}-", dir="/tmp")
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    started = {}  # Ray's processes by PID, seen as children (an orphan, such as an agent, leaves that tree)
    saved = os.environ.get(RAY_CLUSTERS), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[RAY_CLUSTERS] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False  # this process's copy, read when Ray was imported
    try:
        ray.init(
            num_cpus=cpus,
            num_gpus=gpus,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            _temp_dir=folder,
            log_to_driver=False,
            configure_logging=False,
            # Ray starts its workers at niceness 15, so a trial beside another study job (a
            # pre-training at 0) would get only the time that job leaves.
            _system_config={"worker_niceness": 0},
        )
        started |= {p.pid: p for p in me.children(recursive=True) if p.pid not in before}
        if ray.util.get_node_ip_address() != "127.0.0.1":
            raise RuntimeError(
                f"the local Ray took {ray.util.get_node_ip_address()} as its address, so it would "
                "listen on every interface; stopped (has Ray changed how it picks its address?)"
            )
        yield folder
    finally:
        started |= {p.pid: p for p in me.children(recursive=True) if p.pid not in before}
        ray.shutdown()
        _end_processes(started.values())
        shutil.rmtree(folder, ignore_errors=True)
        ray_constants.ENABLE_RAY_CLUSTER = saved[1]
        if saved[0] is None:
            os.environ.pop(RAY_CLUSTERS, None)
        else:
            os.environ[RAY_CLUSTERS] = saved[0]


def _end_processes(processes) -> None:
    """Give Ray's processes 10 s to end on their own (agents leave when their raylet has gone),
    then kill those left."""
    import psutil

    _, alive = psutil.wait_procs(list(processes), timeout=10)
    for process in alive:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)


def _remove_dead_ray_folders() -> None:
    """The temp folders of local Rays whose process is gone (killed by SIGKILL, so it could not)."""
    import psutil

    for folder in Path("/tmp").glob(f"{RAY_TEMP_PREFIX}*"):
        pid = folder.name[len(RAY_TEMP_PREFIX) :].split("-")[0]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def _cluster_ray(address: str):
    """A Ray cluster of the user's (sweep.address): joined for the block, left as it was."""
    import ray

    ray.init(address=address, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


class TuneReport(Callback):
    """A training loop callback that hands each epoch's validation accuracy, and the val items it
    rests on, to Ray Tune (for the sweep's scheduler). Ray may end the trial inside the report, so
    it comes before the best epoch is saved."""

    def __init__(self):
        self.reported = False

    def on_train_start(self, loop, resumed):
        # A trial whose checkpoint holds its finished training (its sweep run again) runs no epoch:
        # it reports its last validation, the result Ray checks every trial for.
        if resumed and loop.state.epoch >= loop.config.epochs:
            last = next((metrics for metrics in reversed(loop.state.history) if metrics), {})
            self.on_validation_end(loop, loop.state.epoch - 1, last)

    def on_validation_end(self, loop, epoch, metrics):
        from ray import tune

        from ..engine.distributed import is_main_process

        accuracy = metrics.get(METRIC.removeprefix(VAL_PREFIX))
        if is_main_process() and isinstance(accuracy, (int, float)):
            self.reported = True
            tune.report(
                {METRIC: accuracy, ITEMS: metrics.get(ITEMS.removeprefix(VAL_PREFIX)), EPOCH_METRIC: epoch + 1}
            )


def code_digest() -> str:
    """A digest of the `vlbert` package this process imported (its Python and YAML sources)."""
    package, digest = Path(__file__).resolve().parents[1], hashlib.sha256()
    for path in sorted(package.rglob("*")):
        if path.suffix in (".py", ".yaml") and path.is_file():
            digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def check_trial_code(config: dict) -> None:
    """A trial runs the sweep's own code. A local Ray worker puts the job's working directory first
    on its import path, so a `vlbert/` folder there (a checkout of another commit) would shadow the
    sweep's package: the trials would train with other code than the sweep that chose among them."""
    if config["code"] != code_digest():
        raise RuntimeError(
            f"this trial imported vlbert from {Path(__file__).resolve().parents[1]}, whose sources differ "
            "from the package its sweep ran; a Ray worker takes the job's working directory first on its "
            "path: run the sweep where that folder's vlbert is the one it runs (or one without a vlbert/)"
        )


def _trial(config: dict) -> None:
    """One learning rate: a fine-tuning run without a look at test. Runs in a Ray worker."""
    check_trial_code(config)
    import torch

    from ..engine.finetune import finetune
    from ..registry import setting

    torch.set_num_threads(config["threads"])
    marker = os.environ.get(FAULT_ONCE)
    if marker and not Path(marker).exists():
        Path(marker).write_text("crashed once")
        raise RuntimeError("injected fault (VLBERT_FAULT_ONCE): this trial is retried")
    if config["tracking_uri"]:
        os.environ["MLFLOW_TRACKING_URI"] = config["tracking_uri"]
    preset, task, lr = config["preset"], config["trial"]["task"], config["trial"]["lr"]
    tags = {SETTING_TAG: config["setting"], TASK_TAG: task, SEED_TAG: config["seed"], LR_TAG: lr}
    parent_run_id = config["parent_run_ids"].get(task)
    tracker = (
        make_tracker(
            preset,
            f"trial-{config['setting']}-{task}-lr{lr:g}",
            {STAGE_TAG: "sweep_trial", **tags},
            parent_run_id=parent_run_id,
        )
        if parent_run_id
        else NullTracker()
    )
    status, reporter = "FAILED", TuneReport()
    try:
        tracker.log_params({"lr": lr, "seed": config["seed"]})
        context = training_context(
            preset,
            run_inputs(preset, **config["inputs"]),
            lambda: tracker,
            config["device"],
            progress=False,
            callbacks=(reporter,),
        )
        out = trial_dir(Path(config["out"]) / task, lr)
        finetune(context, setting(config["setting"]), task, lr, config["seed"], out, score_test=False)
        status = "FINISHED"
    except BaseException:
        # Ray ends a trial from inside tune.report when the scheduler stops it (or it reached its last epoch).
        status = "KILLED" if reporter.reported else "FAILED"
        raise
    finally:
        tracker.close(status)


def difference_se(accuracy: float, other: float, items: int | None) -> float:
    """The standard error of the difference of two accuracies (percent) on `items` val items, as of
    two independent proportions: an upper bound for two runs scored on the same items. 0 where the
    items are unknown (a sweep of an older version)."""
    if not items:
        return 0.0
    return math.hypot(accuracy_se(accuracy, items), accuracy_se(other, items))


def beaten(accuracy: float, best: float, items: int | None, ses: float) -> bool:
    """Whether `best` is above `accuracy` beyond `ses` standard errors of their difference."""
    return best - accuracy > ses * difference_se(accuracy, best, items)


def asha_rungs(max_t: int) -> list[int]:
    """ASHA's milestones (Ray's ASHAScheduler with grace_period max_t // 4, reduction_factor 2): the
    epochs at which a task's trials are compared."""
    rungs, rung = [], max(1, max_t // 4)
    while rung < max_t:
        rungs.append(rung)
        rung *= 2
    return rungs


def rung_scores(trial: dict, rungs: list[int]) -> dict[int, float]:
    """A trial's val accuracy at each rung it reached: its first score at or past the rung, as the
    scheduler places it (`val_epochs` gives each score's epoch; a sweep of an older version, one
    score an epoch)."""
    curve = trial.get("val_accuracy_by_epoch") or []
    epochs = trial.get("val_epochs") or range(1, len(curve) + 1)
    scores = {}
    for rung in rungs:
        at = next((score for epoch, score in zip(epochs, curve) if epoch >= rung), None)
        if at is None:
            break
        scores[rung] = at
    return scores


def stopped_at_rungs(scores: dict[int, dict], rungs: list[int], ses: float) -> dict:
    """Which trials the rungs stop, and at which rung: walking the rungs in order, a trial stops at
    the first where another trial still running there scored above it beyond `ses` standard errors
    of the difference (`beaten`). `scores`: {rung: {trial: (val accuracy, val items)}}, the trials
    that reached each rung. A trial stopped at a rung no longer stops others at later ones, however
    long it ran: one trial at a time, the first rate reaches its last epoch before the second
    reaches a rung; side by side, it stops there. The scheduler (`significant_halving`) and the
    choice (`rate_contenders`) both apply this rule, so neither depends on that order."""
    stopped = {}
    for rung in rungs:
        running = {trial: score for trial, score in scores.get(rung, {}).items() if trial not in stopped}
        for trial, (accuracy, items) in running.items():
            if any(beaten(accuracy, other, items, ses) for key, (other, _) in running.items() if key != trial):
                stopped[trial] = rung
    return stopped


def rate_contenders(trials: list[dict], ses: float, rungs: list[int] = ()) -> list[dict]:
    """The trials a rate may be chosen from: those that ran without an error (all that have a score,
    where every one erred) and that the rungs stop (`stopped_at_rungs`) nowhere, read from their
    curves: whether or not the scheduler stopped them in time."""
    scored = [t for t in trials if t["best_val_accuracy"] is not None and not t.get("error")]
    scored = scored or [t for t in trials if t["best_val_accuracy"] is not None]
    scores = {}
    for index, trial in enumerate(scored):
        for rung, accuracy in rung_scores(trial, list(rungs)).items():
            scores.setdefault(rung, {})[index] = (accuracy, trial.get("val_items"))
    stopped = stopped_at_rungs(scores, list(rungs), ses)
    return [t for index, t in enumerate(scored) if index not in stopped] or scored


def choose_rate(trials: list[dict], ses: float, preferred: float | None = None, rungs: list[int] = ()) -> dict:
    """The trial whose rate the study takes. Among the contenders (`rate_contenders`: no error, not
    stopped at one of `rungs`) whose best val accuracy is within `ses` standard errors of the
    difference of the best one's, the `preferred` rate (the preset's own) if it is one of them,
    else the lowest. Between two rates the val split cannot tell apart, a choice by the larger
    score follows the runs' last bits (docs/study.md, "Choosing a rate"); a fixed rule chooses
    alike, and the sweep moves off the preset's rate only on evidence. `ses` 0 and no rungs: the
    best score, the lower rate on an exact tie."""
    contenders = rate_contenders(trials, ses, rungs)
    leader = max(contenders, key=lambda t: (t["best_val_accuracy"], -t["lr"]))
    tied = [
        t
        for t in contenders
        if not beaten(t["best_val_accuracy"], leader["best_val_accuracy"], t.get("val_items"), ses)
    ]
    if preferred is not None:
        for trial in tied:
            if math.isclose(trial["lr"], preferred, rel_tol=1e-9):
                return trial
    return min(tied, key=lambda t: t["lr"])


def significant_halving(max_t_by_task: dict[str, int], ses: float, rungs_by_task: dict[str, list[int]] | None = None):
    """ASHA's rungs kept apart per task, a trial stopped at a rung only where another trial of its
    task scored above it there beyond `ses` standard errors of the difference (`beaten`). ASHA
    stops the lower half of a rung however small the gap: at a quarter of the epochs two rates
    are often within a few tenths of a point, and the one that went on took the choice. One Tuner
    runs every (task, lr) trial of a setting; accuracies of different tasks are not on one scale,
    and each task has its own epochs. A trial is judged at every result against every rung it has
    passed (`stopped_at_rungs`), so the order in which trials reach a rung does not matter to one
    still running; one that reached its last epoch before another reached the rung cannot be
    stopped, and `choose_rate` leaves it out all the same. Built here so that importing this module
    does not import Ray."""
    from ray.tune.schedulers import FIFOScheduler, TrialScheduler

    class SignificantHalving(FIFOScheduler):
        def __init__(self):
            super().__init__()
            self._rungs = rungs_by_task or {task: asha_rungs(max_t) for task, max_t in max_t_by_task.items()}
            self._scores = {task: {} for task in max_t_by_task}  # task -> rung -> {trial_id: (accuracy, items)}

        def on_trial_result(self, controller, trial, result):
            task = trial.config["trial"]["task"]
            accuracy, epoch = result.get(METRIC), int(result.get(EPOCH_METRIC, result.get("training_iteration", 0)))
            if accuracy is None:
                return TrialScheduler.CONTINUE
            for rung in self._rungs[task]:
                if rung > epoch:
                    break
                # A trial validated less often than every epoch is placed at its first score past the rung.
                self._scores[task].setdefault(rung, {}).setdefault(trial.trial_id, (accuracy, result.get(ITEMS)))
            if trial.trial_id in stopped_at_rungs(self._scores[task], self._rungs[task], ses):
                return TrialScheduler.STOP
            # A trial at its last epoch is not stopped (as ASHA would at max_t) but returns: its last
            # checkpoint is saved and its run ends FINISHED, so the chosen rate's seed run only scores it.
            return TrialScheduler.CONTINUE

        def debug_string(self) -> str:
            return f"significant halving at {ses:g} SEs, rungs {self._rungs}"

    return SignificantHalving()


def run_sweeps(
    preset: dict,
    setting_name: str,
    tasks: list[str],
    out,
    inputs: RunInputs,
    device: str = "cpu",
    cores: int | None = None,
    make_parent=None,
) -> dict:
    """Sweep the preset's learning rates for one setting on each task, in one Ray Tune run.

    Every (task, lr) trial runs under one Tuner, so trials share worker processes (one import of
    torch per worker, not per trial) and keep the job's cores busy across tasks; the scheduler
    compares trials of the same task only (`significant_halving`). Writes OUT/<task>/best.json per
    task and returns {task: summary}.
    `make_parent(task)` gives each task's MLflow parent run (a Tracker); trials log child runs.
    The Tuner (`_tune`) runs in a Ray driver process of its own (`run_in_driver_process`).
    """
    out = Path(out).resolve()
    parents = {task: make_parent(task) if make_parent else NullTracker() for task in tasks}
    try:
        parent_run_ids = {task: getattr(parent, "run_id", None) for task, parent in parents.items()}
        trials = run_in_driver_process(
            _tune, (preset, setting_name, tasks, out, parent_run_ids, inputs, device, cores)
        )
        summaries = {
            task: _summarise(setting_name, task, trials[task], preset, out / task, parents[task]) for task in tasks
        }
    except BaseException:
        for parent in parents.values():
            parent.end_children(UNCLOSED_TRIAL)
            parent.close("FAILED")
        raise
    for task, parent in parents.items():
        parent.end_children(UNCLOSED_TRIAL)
        parent.log_artifact(out / task / "best.json")
        parent.close()
    return summaries


# ---- the Ray driver's process ----------------------------------------------------------------
# Ray's driver can end its process with status 1 once ray.shutdown() has run: a thread of its
# core worker calls into the core worker just destroyed, and Ray quits the process on the spot
# (its log's last line: "The core worker process is not initialized yet or already shutdown").
# No Python code runs after that, so a sweep's results would be lost with it. The driver
# therefore runs in a process of its own that hands its trials over before Ray's teardown.

DRIVER_FAULT = "VLBERT_FAULT_DRIVER_EXIT"  # test hook: the driver quits (status 1) once its trials are handed over
DRIVER_LOGS = "ray_driver_logs"  # OUT/<this>: the Ray logs of a driver that ended before its trials did


def run_in_driver_process(tune, args: tuple):
    """Run `tune(*args)` (a module-level function with `_tune`'s arguments) in a spawned process
    under the sweep's Ray (local, sized to the job, or sweep.address), and return what it returns.

    The driver ends with this process: SIGTERM here reaches it, and it gets SIGTERM if this
    process dies. If it ends before handing its trials over, its Ray's logs are kept in
    OUT/ray_driver_logs and the error says so; if it ends badly after, its trials stand. Either
    way no process of its Ray and no temp folder is left.
    """
    import multiprocessing

    context = multiprocessing.get_context("spawn")  # no fork of this process's threads
    receiver, sender = context.Pipe(duplex=False)
    setting_name, out = args[1], args[3]
    driver = context.Process(target=_driver_main, args=(sender, os.getpid(), tune, args), name="ray-driver")
    seen = {}  # the driver's descendants (its Ray), as seen from here while it runs
    outcome = None
    with _sigterm_as_exit():
        driver.start()
        sender.close()
        try:
            while outcome is None and (driver.is_alive() or receiver.poll()):
                seen |= _descendants(driver.pid)
                if receiver.poll(1.0):
                    try:
                        outcome = receiver.recv()
                    except EOFError:
                        break
            driver.join(120)  # its Ray's teardown
        finally:
            if driver.is_alive():
                driver.terminate()  # its Ray's SIGTERM handler runs local_ray's clean-up
                driver.join(60)
                if driver.is_alive():
                    driver.kill()
                    driver.join()
            receiver.close()
            _end_processes(seen.values())
            logs = _keep_driver_logs(driver.pid, out / DRIVER_LOGS) if outcome is None else None
            for folder in Path("/tmp").glob(f"{RAY_TEMP_PREFIX}{driver.pid}-*"):
                shutil.rmtree(folder, ignore_errors=True)
    if outcome is None:
        raise RuntimeError(
            f"the sweep's Ray driver (pid {driver.pid}) ended with {_ending(driver.exitcode)} before its "
            f"trials were done" + (f"; its Ray's logs: {logs}" if logs else "")
        )
    kind, value, trace = outcome
    if kind == "error":
        if isinstance(value, BaseException):
            value.add_note(f"in the sweep's Ray driver:\n{trace}")
            raise value
        raise RuntimeError(f"the sweep's Ray driver failed:\n{trace}")
    if driver.exitcode:
        print(
            f"sweep {setting_name}: the Ray driver ended with {_ending(driver.exitcode)} after handing over "
            "its trials (in Ray's teardown); the trials stand",
            file=sys.stderr,
        )
    return value


def _ending(exitcode: int) -> str:
    return f"signal {-exitcode}" if exitcode < 0 else f"exit status {exitcode}"


def _driver_main(sender, parent_pid: int, tune, args) -> None:
    """The driver process: the sweep's Ray for the length of `tune`, whose result is sent before
    Ray's teardown, which may end this process."""
    _end_with_parent(parent_pid)
    preset, device, cores = args[0], args[6], args[7]
    address = preset.get("sweep", {}).get("address")
    try:
        with (
            _cluster_ray(address)
            if address
            else local_ray(cores or os.cpu_count() or 1, 0 if device == "cpu" else None)
        ):
            sender.send(("trials", tune(*args), None))
            if os.environ.get(DRIVER_FAULT):
                os._exit(1)  # as Ray's teardown does, its processes still up
    except BaseException as exc:
        import pickle
        import traceback

        trace = traceback.format_exc()
        try:
            pickle.dumps(exc)
        except Exception:
            exc = None
        try:
            sender.send(("error", exc, trace))
        except (OSError, ValueError):
            raise  # no one to tell: the traceback goes to stderr
        sys.exit(1)  # the sweep's process raises it


def _end_with_parent(parent_pid: int) -> None:
    """SIGTERM to this process when the sweep's process dies (Linux), so its Ray is cleaned up."""
    import ctypes
    import signal

    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent_pid:  # it died before prctl took effect
        sys.exit(1)


@contextmanager
def _sigterm_as_exit():
    """SIGTERM raises SystemExit in this (main) thread for the block, so clean-ups run."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def exit_on_sigterm(signum, frame):
        sys.exit(128 + signum)

    previous = signal.signal(signal.SIGTERM, exit_on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _descendants(pid: int) -> dict:
    import psutil

    try:
        return {p.pid: p for p in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return {}


def _keep_driver_logs(pid: int, destination: Path) -> Path | None:
    """Copy the Ray logs of a driver that ended early (its temp folder goes) to `destination`."""
    sessions = sorted(Path("/tmp").glob(f"{RAY_TEMP_PREFIX}{pid}-*/session_2*/logs"))
    if not sessions:
        return None
    shutil.rmtree(destination, ignore_errors=True)
    shutil.copytree(sessions[-1], destination, ignore=shutil.ignore_patterns("*.sock"), dirs_exist_ok=True)
    return destination


def _tune(preset, setting_name, tasks, out, parent_run_ids, inputs: RunInputs, device, cores) -> dict[str, list[dict]]:
    """One Tuner over the grid tasks x learning rates; returns each task's trials. Runs in the
    driver process, under its Ray."""
    from ray import tune

    from ..tracking import default_tracking_uri

    options = preset.get("sweep", {})
    seed = sweep_seed(preset)
    threads = int(options.get("cpus_per_trial", 1))
    gpus = float(options.get("gpus_per_trial", 0 if device == "cpu" else 1))
    family = setting_entry(setting_name).family
    grid = [{"task": task, "lr": lr} for task in tasks for lr in sweep_lrs(preset, task, family)]
    space = {
        "trial": tune.grid_search(grid),
        "code": code_digest(),
        "seed": seed,
        "threads": threads,
        "preset": preset,
        "setting": setting_name,
        "out": str(out),
        "inputs": _absolute_inputs(inputs),
        "device": device,
        "parent_run_ids": parent_run_ids,
        "tracking_uri": default_tracking_uri(preset) if any(parent_run_ids.values()) else None,
    }
    configured = int(options.get("concurrent_trials", 0)) or len(grid)
    concurrent = max(1, min(configured, len(grid), int((cores or os.cpu_count() or 1) // max(threads, 1))))
    scheduler = significant_halving(
        {task: finetune_epochs(preset, task) for task in tasks},
        tie_ses(preset),
        {task: sweep_rungs(preset, task) for task in tasks},
    )
    tuner = tune.Tuner(
        tune.with_resources(_trial, {"cpu": threads, "gpu": gpus}),
        param_space=space,
        tune_config=tune.TuneConfig(
            metric=METRIC, mode="max", max_concurrent_trials=concurrent, reuse_actors=True, scheduler=scheduler
        ),
        run_config=tune.RunConfig(
            name=setting_name,
            storage_path=str(out / "ray"),
            verbose=0,
            failure_config=tune.FailureConfig(max_failures=int(options.get("max_failures", 2))),
        ),
    )
    trials = {task: [] for task in tasks}
    for result in tuner.fit():
        history = result.metrics_dataframe
        curve = history[METRIC].tolist() if history is not None and METRIC in history else []
        items = history[ITEMS].dropna().tolist() if history is not None and ITEMS in history else []
        epochs = history[EPOCH_METRIC].astype(int).tolist() if history is not None and EPOCH_METRIC in history else []
        task, lr = result.config["trial"]["task"], result.config["trial"]["lr"]
        # A trial that resumed (a killed or finished sweep run again) reports only the epochs it ran
        # this time: its checkpoint holds every epoch's validation.
        recorded = checkpoint_curve(trial_dir(out / task, lr))
        if recorded is not None and len(recorded[0]) >= len(curve):
            curve, epochs, items = recorded[0], recorded[1], [recorded[2]] if recorded[2] else items
        trials[task].append(
            {
                "lr": lr,
                "best_val_accuracy": max(curve) if curve else None,
                "val_items": int(items[-1]) if items else None,
                "val_accuracy_by_epoch": curve,
                "val_epochs": epochs if len(epochs) == len(curve) else None,
                "error": str(result.error) if result.error else None,
            }
        )
    return trials


def checkpoint_curve(folder: Path) -> tuple[list[float], list[int], int | None] | None:
    """A trial's validation accuracy per validated epoch, those epochs (from 1) and the val items,
    from the latest checkpoint in its folder (the training loop keeps every epoch's metrics there);
    None without one."""
    from ..engine.checkpoint import latest_checkpoint, read_state

    found = latest_checkpoint(Path(folder) / "checkpoint")
    if found is None:
        return None
    accuracy, items = METRIC.removeprefix(VAL_PREFIX), ITEMS.removeprefix(VAL_PREFIX)
    points = [(epoch + 1, m) for epoch, m in enumerate(read_state(found)["extra"]["history"]) if accuracy in m]
    return [m[accuracy] for _, m in points], [e for e, _ in points], (points[-1][1].get(items) if points else None)


def _absolute_inputs(inputs: RunInputs) -> dict:
    """The run's inputs as a trial's config carries them to `run_inputs` (plain strings, shown in
    Ray's params.json): those that exist as absolute paths, as a trial runs in Ray's folder for it,
    not the sweep's; others (a hub id) as given."""
    absolute = lambda p: str(Path(p).resolve()) if p is not None and Path(p).exists() else (str(p) if p else None)
    return {field.name: absolute(getattr(inputs, field.name)) for field in dataclasses.fields(inputs)}


def _summarise(setting_name, task, trials, preset, out, parent) -> dict:
    if not any(t["best_val_accuracy"] is not None for t in trials):
        raise RuntimeError(f"sweep {setting_name}/{task}: every trial failed: {[t['error'] for t in trials]}")
    ses, rungs = tie_ses(preset), sweep_rungs(preset, task)
    best = choose_rate(trials, ses, preset_lr(preset, task, setting_entry(setting_name).family), rungs)
    leader = max(rate_contenders(trials, ses, rungs), key=lambda t: (t["best_val_accuracy"], -t["lr"]))
    seed = sweep_seed(preset)
    summary = {
        "setting": setting_name,
        "task": task,
        "seed": seed,
        "lr": best["lr"],
        "val_accuracy": best["best_val_accuracy"],
        # The rule's trace: the best-scoring contender's rate, and whether the chosen one tied with it.
        "tie_ses": ses,
        "best_scoring_lr": leader["lr"],
        "tied": best["best_val_accuracy"] < leader["best_val_accuracy"],
        "trials": sorted(trials, key=lambda t: t["lr"]),
    }
    io.write_json(out / "best.json", summary, indent=2)
    parent.log_metrics({"best_val_accuracy": best["best_val_accuracy"], "best_lr": best["lr"]})
    return summary


def trial_dir(task_dir, lr: float) -> Path:
    """The folder of one trial of a task's sweep (checkpoint/ and best/, as any fine-tuning run)."""
    return Path(task_dir) / "trials" / f"lr_{lr:g}"


def continue_trial(task_dir, seed: int, out) -> Path | None:
    """Start the chosen rate's run for `seed` where the sweep's own trial of it stopped.

    The trial is that very run (same preset, rate and seed; trials run with the sweep's seed),
    finished or, where the scheduler stopped it early, cut short. Its checkpoint and best weights are
    copied into OUT, whose fine-tuning then resumes from them as from its own crash (a finished
    trial's: it only scores the best epoch), to the same metrics as a run from scratch. Returns the trial folder, or
    None (another seed, OUT already has a checkpoint of its own, or the trial left none).
    """
    from ..engine.checkpoint import latest_checkpoint

    best = json.loads((Path(task_dir) / "best.json").read_text())
    if int(best["seed"]) != seed:
        return None
    out, trial = Path(out), trial_dir(task_dir, float(best["lr"]))
    checkpoint = latest_checkpoint(trial / "checkpoint")
    if latest_checkpoint(out / "checkpoint") is not None or checkpoint is None:
        return None
    for source, name in ((trial / "best", "best"), (checkpoint, "checkpoint")):
        if source.is_dir():
            with io.atomic_dir(out / name) as partial:
                shutil.copytree(source, partial, dirs_exist_ok=True)
    return trial


def sweep_seed(preset: dict) -> int:
    """Trials run with the first of the preset's seeds."""
    return study_seeds(preset)[0]


def sweep_rungs(preset: dict, task: str) -> list[int]:
    """The epochs at which the sweep compares a task's rates (`asha_rungs`), none where
    sweep.stop_at_rungs is false: every rate then runs to its last epoch and the choice reads the
    best scores alone."""
    if not preset.get("sweep", {}).get("stop_at_rungs", True):
        return []
    return asha_rungs(finetune_epochs(preset, task))


def tie_ses(preset: dict) -> float:
    """sweep.tie_ses: how many standard errors of the difference two rates' val accuracies must
    part by for the sweep to stop or pass over the lower one."""
    return float(preset.get("sweep", {}).get("tie_ses", TIE_SES))


def preset_lr(preset: dict, task: str, family: str | None = None) -> float | None:
    """The rate a task's fine-tuning section gives (finetune.<section>.lr, the family's own where
    its `families` entry gives one), which a sweep keeps unless another beats it beyond the noise."""
    if TASKS[task].options_key not in preset.get("finetune", {}):
        return None
    lr = finetune_options(preset, task, family).get("lr")
    return float(lr) if lr is not None else None


def sweep_lrs(preset: dict, task: str, family: str | None = None) -> list[float]:
    """The learning rates to try on a task: sweep.lrs, or its entry for the task's optimiser
    section (vcr, vqa, refcoco) when the rates differ by task; a model family's own list for the
    section where sweep.family_lrs gives one (each system tries as many rates, around its own)."""
    key = TASKS[task].options_key
    own = preset["sweep"].get("family_lrs", {}).get(family, {})
    if key in own:
        return own[key]
    lrs = preset["sweep"]["lrs"]
    return lrs[key] if isinstance(lrs, dict) else lrs


def read_best_lr(path) -> float:
    path = Path(path)
    try:
        return float(json.loads(path.read_text())["lr"])
    except (OSError, KeyError, ValueError) as exc:
        raise ValueError(f"{path}: no learning rate in the sweep's best.json ({exc})") from None
