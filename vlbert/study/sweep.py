"""Learning-rate sweeps with Ray Tune: the one module that talks to Ray.

For one (setting, task): a grid over the preset's learning rates, ASHA stopping poor trials on
the validation metric, at most as many concurrent trials as the job's cores (or GPUs) allow, a
crashed trial retried. Trials never look at the test split. MLflow: the sweep is a parent run,
every trial a child run (mlflow.parentRunId) in the same experiment. The result is `best.json`.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from .. import io
from ..tracking import NullTracker, make_tracker

METRIC = "val_accuracy"
FAULT_ONCE = "VLBERT_FAULT_ONCE"   # test hook: a trial crashes once if this file does not exist yet


class _TuneReporter:
    """A Tracker that also hands each epoch's validation accuracy to Ray Tune (for ASHA)."""

    def __init__(self, tracker):
        self.tracker = tracker
        self.reported = False

    def __getattr__(self, name):
        return getattr(self.tracker, name)

    def log_metrics(self, metrics: dict, step=None) -> None:
        from ray import tune
        self.tracker.log_metrics(metrics, step)
        if METRIC in metrics:
            self.reported = True
            tune.report({METRIC: metrics[METRIC], "epoch": metrics.get("epoch", 0)})


def _trial(config: dict) -> None:
    """One learning rate: a fine-tuning run without a look at test. Runs in a Ray worker."""
    import torch

    from ..engine.build import load_processor
    from ..engine.finetune import finetune
    from .registry import setting

    torch.set_num_threads(config["threads"])
    marker = os.environ.get(FAULT_ONCE)
    if marker and not Path(marker).exists():
        Path(marker).write_text("crashed once")
        raise RuntimeError("injected fault (VLBERT_FAULT_ONCE): this trial is retried")
    if config["tracking_uri"]:
        os.environ["MLFLOW_TRACKING_URI"] = config["tracking_uri"]
    preset = config["preset"]
    tags = {"setting": config["setting"], "task": config["task"], "seed": config["seed"], "lr": config["lr"]}
    tracker = (make_tracker(preset, f"trial-{config['setting']}-{config['task']}-lr{config['lr']:g}",
                            {"stage": "sweep_trial", **tags}, parent_run_id=config["parent_run_id"])
               if config["parent_run_id"] else NullTracker())
    status, reporter = "FAILED", _TuneReporter(tracker)
    try:
        tracker.log_params({"lr": config["lr"], "seed": config["seed"]})
        finetune(preset, setting(config["setting"]), config["task"], config["lr"], config["seed"],
                 Path(config["out"]) / f"lr_{config['lr']:g}", config["data_root"], config["features_dir"],
                 reporter, load_processor(config["bert"], preset["model"].get("max_text_length", 64)),
                 pretrained=config["pretrained"], bert=config["bert"], detector_dir=config["detector"],
                 device=config["device"], progress=False, score_test=False)
        status = "FINISHED"
    except BaseException:
        # Ray ends a trial from inside tune.report when ASHA stops it (or it reached max_t).
        status = "KILLED" if reporter.reported else "FAILED"
        raise
    finally:
        tracker.close(status)


def run_sweeps(preset: dict, setting_name: str, tasks: list[str], out, *, data_root, features_dir, bert, detector,
               pretrained=None, device: str = "cpu", cores: int | None = None, make_parent=None) -> dict:
    """Sweep the preset's learning rates for one setting on each task, in one Ray session.

    Writes OUT/<task>/best.json per task and returns {task: summary}. `make_parent(task)` gives
    each task's MLflow parent run (a Tracker); trials log to child runs under it.
    """
    import ray

    out = Path(out).resolve()
    address = preset.get("sweep", {}).get("address")
    if address:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    else:  # a local Ray sized to this job; a short temp dir keeps its socket paths legal
        ray.init(num_cpus=cores or os.cpu_count() or 1, num_gpus=0 if device == "cpu" else None,
                 include_dashboard=False, _temp_dir=tempfile.mkdtemp(prefix="ray", dir="/tmp"),
                 log_to_driver=False, configure_logging=False)
    summaries = {}
    try:
        for task in tasks:
            parent = make_parent(task) if make_parent else NullTracker()
            try:
                summaries[task] = _sweep_task(preset, setting_name, task, out / task, parent, data_root=data_root,
                                              features_dir=features_dir, bert=bert, detector=detector,
                                              pretrained=pretrained, device=device, cores=cores)
                parent.log_artifact(out / task / "best.json")
            except BaseException:
                parent.close("FAILED")
                raise
            parent.close()
    finally:
        ray.shutdown()
    return summaries


def _sweep_task(preset, setting_name, task, out, parent, *, data_root, features_dir, bert, detector, pretrained,
                device, cores) -> dict:
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    from ..tracking import default_tracking_uri
    options = preset.get("sweep", {})
    lrs = options["lrs"]
    seed = options.get("seeds", [preset["seed"]])[0]
    threads = int(options.get("cpus_per_trial", 1))
    gpus = float(options.get("gpus_per_trial", 0 if device == "cpu" else 1))
    parent_run_id = getattr(parent, "run_id", None)
    epochs = max(1, round(preset["finetune"][_options_key(task)]["epochs"] * preset["finetune"].get("epoch_factor", 1.0)))
    resolve = lambda p: str(Path(p).resolve()) if p is not None and Path(p).exists() else (str(p) if p else None)
    space = {"lr": tune.grid_search(lrs), "seed": seed, "threads": threads, "preset": preset,
             "setting": setting_name, "task": task, "out": str(out / "trials"), "data_root": resolve(data_root),
             "features_dir": resolve(features_dir), "bert": resolve(bert), "detector": resolve(detector),
             "pretrained": resolve(pretrained), "device": device, "parent_run_id": parent_run_id,
             "tracking_uri": default_tracking_uri(preset) if parent_run_id else None}
    concurrent = max(1, min(len(lrs), int((cores or os.cpu_count() or 1) // max(threads, 1))))
    tuner = tune.Tuner(
        tune.with_resources(_trial, {"cpu": threads, "gpu": gpus}), param_space=space,
        tune_config=tune.TuneConfig(metric=METRIC, mode="max", max_concurrent_trials=concurrent, reuse_actors=True,
                                    scheduler=ASHAScheduler(time_attr="training_iteration", max_t=epochs,
                                                            grace_period=max(1, epochs // 4), reduction_factor=2)),
        run_config=tune.RunConfig(name=f"{setting_name}_{task}", storage_path=str(out / "ray"), verbose=0,
                                  failure_config=tune.FailureConfig(max_failures=int(options.get("max_failures", 2)))))
    grid = tuner.fit()
    trials = []
    for result in grid:
        history = result.metrics_dataframe
        curve = history[METRIC].tolist() if history is not None and METRIC in history else []
        trials.append({"lr": result.config["lr"], "best_val_accuracy": max(curve) if curve else None,
                       "val_accuracy_by_epoch": curve, "error": str(result.error) if result.error else None})
    finished = [t for t in trials if t["best_val_accuracy"] is not None]
    if not finished:
        raise RuntimeError(f"sweep {setting_name}/{task}: every trial failed: {[t['error'] for t in trials]}")
    best = max(finished, key=lambda t: (t["best_val_accuracy"], -t["lr"]))
    summary = {"setting": setting_name, "task": task, "seed": seed, "lr": best["lr"],
               "val_accuracy": best["best_val_accuracy"], "trials": sorted(trials, key=lambda t: t["lr"])}
    io.write_json(out / "best.json", summary, indent=2)
    parent.log_metrics({"best_val_accuracy": best["best_val_accuracy"], "best_lr": best["lr"]})
    return summary


def _options_key(task: str) -> str:
    return "vqa" if task == "vqa" else "refcoco" if task.startswith("refcoco") else "vcr"


def read_best_lr(path) -> float:
    path = Path(path)
    try:
        return float(json.loads(path.read_text())["lr"])
    except (OSError, KeyError, ValueError) as exc:
        raise ValueError(f"{path}: no learning rate in the sweep's best.json ({exc})") from None
