"""Where a preset's study keeps its files: every results path, in one place.

The workflow's rules, the CLI's defaults and the MLflow store all read them from here, so a run
started by hand finds what the DAG wrote. Paths are relative to the folder the study runs in.
A name may be a Snakemake wildcard (`layout.pretrained("{setting}")`): the rules build their
patterns with the same methods.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

RESULTS = Path("results")
REPORTS = Path("reports")


@dataclass(frozen=True)
class Layout:
    """The paths of one preset's study: results/<preset>/... and reports/<preset>/."""

    preset: str

    @property
    def results(self) -> Path:
        return RESULTS / self.preset

    @property
    def data(self) -> Path:
        """The synthetic world `make-data` writes (real data sets are given by the preset)."""
        return self.results / "data"

    @property
    def detector(self) -> Path:
        return self.results / "detector"

    @property
    def features(self) -> Path:
        """The detector's feature stores, <dataset>.<split>.<boxes>.h5."""
        return self.results / "features"

    def tuned_features(self, setting: str, seed: int | str | None = None) -> Path:
        """The stores a setting that tunes Fast R-CNN recomputes with its pre-trained module (that of
        its pre-training with `seed`, as `pretrain`)."""
        root = self.features / "tuned" / setting
        return root if seed is None else root / f"seed{seed}"

    @property
    def bert_init(self) -> Path:
        return self.results / "bert_init"

    @property
    def bert(self) -> Path:
        """The small BERT `bert-init` pre-trains (a preset's model.bert replaces it)."""
        return self.bert_init / "bert"

    def pretrain(self, setting: str, seed: int | str | None = None) -> Path:
        """A setting's pre-training; with `seed`, the one a fine-tuning seed has of its own
        (`pretrain.per_seed`, config.pretraining_seed)."""
        root = self.results / "pretrain" / setting
        return root if seed is None else root / f"seed{seed}"

    def pretrained(self, setting: str, seed: int | str | None = None) -> Path:
        """The checkpoint a setting's fine-tuning starts from: its pre-training's best epoch."""
        return self.pretrain(setting, seed) / "best"

    def finetune_fraction(self, setting: str, fraction: float | str) -> Path:
        """Where a setting's runs on a share of each training set go (`finetune.data_fractions`)."""
        return self.finetune(setting) / f"fraction{fraction}"

    @property
    def sweeps(self) -> Path:
        return self.results / "sweep"

    def sweep(self, setting: str) -> Path:
        return self.sweeps / setting

    def sweep_best(self, setting: str, task: str) -> Path:
        """The learning rate a setting's sweep chose for a task."""
        return self.sweep(setting) / task / "best.json"

    def finetune(self, setting: str) -> Path:
        return self.results / "finetune" / setting

    def finetune_run(self, setting: str, task: str, seed: int | str) -> Path:
        return self.finetune(setting) / task / f"seed{seed}"

    @property
    def floors(self) -> Path:
        """The tasks' blind floors, computed from the data files (`vlbert floors`)."""
        return self.results / "floors.json"

    @property
    def mlflow_db(self) -> Path:
        """The SQLite tracking store, where the preset names no tracking.uri."""
        return self.results / "mlflow.db"

    @property
    def logs(self) -> Path:
        return self.results / "logs"

    @property
    def benchmarks(self) -> Path:
        """The rules' `benchmark:` files (bench/study_time.py reads them)."""
        return self.results / "benchmarks"

    @property
    def reports(self) -> Path:
        return REPORTS / self.preset
