# Helpers shared by the rules: config validation, canonical names, output paths.
import os

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from vlbert.config import ConfigError, data_fractions, pretraining_seed, study_seeds, study_settings
from vlbert.config import validate as validate_preset
from vlbert.hardware import gpu_visible
from vlbert.layout import Layout
from vlbert.registry import (DATASETS, FEATURE_STORES, PRETRAINING_STORES, SETTINGS, TABLE4_TASKS, TASKS,
                             WRITER_VERSIONS, finetune_tasks)

# The package's validation first: it names the key in the preset's terms and checks what a schema
# cannot (NaN and infinities pass its bounds).
try:
    validate_preset(config, workflow.configfiles[0] if workflow.configfiles else "<config>")
except ConfigError as exc:
    raise WorkflowError(str(exc)) from None
validate(config, schema="../schemas/config.schema.yaml")

PRESET = config["name"]

# The preset's `features` keys a store's content depends on.
STORE_CONTENT_KEYS = ("score_threshold", "min_boxes", "max_boxes", "dtype", "class_topk")
# Extraction of each split runs as this many chunk jobs (rule extract_rois), gathered by index_store.
scattergather:
    extract=config.get("features", {}).get("chunks", 1),


# Every results path comes from vlbert/layout.py, the one the CLI's defaults and MLflow's store read.
LAYOUT = Layout(PRESET)
DATA = config["data"].get("root", str(LAYOUT.data))
# The feature stores every task reads (a fine-tuning job's inputs).
TASK_STORE_NAMES = sorted({store.name for spec in TASKS.values() for store in spec.stores.values()})
# The settings that fine-tune Table 4's tasks alone (their family's `table4_tasks_only`): their
# sweeps and seeds are the rules of finetune.smk named `*_table4_tasks` (a rule's outputs are fixed).
TABLE4_ONLY_SETTINGS = [name for name in SETTINGS if finetune_tasks(name) == TABLE4_TASKS]
ALL_TASKS_SETTINGS = [name for name in SETTINGS if name not in TABLE4_ONLY_SETTINGS]


wildcard_constraints:
    dataset="|".join(d.replace("+", r"\+") for d in DATASETS),
    boxes="det|gt",
    split=r"[A-Za-z0-9-]+",
    setting="|".join(SETTINGS),
    seed=r"\d+",
    fraction=r"0\.\d+",
    scatteritem=r"\d+-of-\d+",


def preset_file():
    """The preset file this run was started with (the first --configfile)."""
    files = workflow.configfiles
    if not files:
        raise WorkflowError("give a preset: --configfile experiments/<preset>.yaml")
    return files[0]


# The cores a job that uses the whole machine takes: --cores where Snakemake runs the jobs here. A
# cluster executor has no --cores; there each job's cores come from the profile (`set-threads`,
# which the SLURM plugin turns into --cpus-per-task), and a rule it does not name takes one.
try:
    MACHINE_CORES = workflow.cores
except WorkflowError:
    MACHINE_CORES = 1
# A sweep job takes cpus_per_trial x concurrent_trials cores, unless the profile sets its threads
# (the default profile: one, so that it shares a small machine with another job).
SWEEP_THREADS = min(MACHINE_CORES, config.get("sweep", {}).get("cpus_per_trial", 1)
                    * config.get("sweep", {}).get("concurrent_trials", 1))
SEEDS = study_seeds(config)
# The settings of the preset's model families (`systems`): Table 4's rows, and the other systems'.
STUDY_SETTINGS = study_settings(config)
# Every rule runs in the one environment of the package (`--use-conda` builds it; `make` builds .venv).
CONDA_ENV = "../envs/vlbert.yaml"
# Where jobs train: the preset's `device`, `auto` (a GPU where the job finds one) unless it says.
DEVICE = str(config.get("device", "auto"))


# Jobs that train ask for a GPU when the preset trains on one, or says `auto` on a machine with
# one (the default profile runs one such job at a time; the SLURM profile maps it to --gpus=1:
# a cluster whose submit host has no GPU needs `device: cuda` to ask for them).
GPU = 1 if DEVICE.startswith("cuda") or (DEVICE == "auto" and gpu_visible()) else 0
# The study's detector folder: the Faster R-CNN rule train_detector trains (torchvision), or the
# description of a given detectron2 model (rule describe_detector). Later rules take its weights,
# or the description, as their input; the weights' identity is in every store they read.
DETECTOR_BACKEND = config.get("detector", {}).get("backend", "torchvision")
DETECTOR = (f"{LAYOUT.detector}/detector.safetensors" if DETECTOR_BACKEND == "torchvision"
            else f"{LAYOUT.detector}/detector_config.json")
# What the report says of the detector: the trained one's val metrics, the given one's description.
DETECTOR_REPORT = f"{LAYOUT.detector}/metrics.json" if DETECTOR_BACKEND == "torchvision" else DETECTOR


def data_root(wildcards):
    """The data root: the synthetic world make_data writes, or the real data sets (given, so not
    an input a rule can name). A function, as Snakemake's linter asks of a path param that
    prefixes an input."""
    return DATA


def data_outputs(datasets=DATASETS):
    """The make-data stamps of these data sets; nothing for real data, which is given."""
    if config["data"]["source"] != "synthetic":
        return []
    return expand(f"{DATA}/{{dataset}}/.spec.json", dataset=datasets)


def feature_outputs():
    return [f"{LAYOUT.features}/{store.name}.h5" for store in FEATURE_STORES]


def bert_input():
    return [] if config.get("model", {}).get("bert") else [f"{LAYOUT.bert}/config.json"]


def bert_param(wildcards, input):
    """The BERT a job reads: the preset's (a hub id or folder), else the folder of bert_init's
    config.json, named by the job's input."""
    return config.get("model", {}).get("bert") or os.path.dirname(input.bert[0])


# The pre-training each fine-tuning seed starts from: None for the setting's own (the one its sweeps
# use), a seed where it has one of its own (pretrain.per_seed; rule pretrain_seed).
PRETRAINING_SEEDS = [pretraining_seed(config, seed) for seed in SEEDS]


def pretrained_input(wildcards):
    """The setting's own pre-training (a sweep's start)."""
    if not SETTINGS[wildcards.setting].pretrains:
        return []
    return [f"{LAYOUT.pretrained(wildcards.setting)}/model.safetensors"]


def seeds_pretrained_input(wildcards):
    """Every pre-training the setting's seeds start from (the CLI finds each seed's by itself)."""
    if not SETTINGS[wildcards.setting].pretrains:
        return []
    return [f"{LAYOUT.pretrained(wildcards.setting, seed)}/model.safetensors"
            for seed in dict.fromkeys(PRETRAINING_SEEDS)]


def task_features_dir(wildcards, seed=None):
    """Where a setting's fine-tuning reads its features: a setting that tuned Fast R-CNN in
    pre-training reads the stores its tuned module made (rule tune_features; that of the
    pre-training with `seed`: tune_features_seed)."""
    if SETTINGS[wildcards.setting].tune_frcnn:
        return str(LAYOUT.tuned_features(wildcards.setting, seed))
    return str(LAYOUT.features)


def task_features(wildcards, seed=None):
    return [f"{task_features_dir(wildcards, seed)}/{name}.h5" for name in TASK_STORE_NAMES]


def seeds_features_dirs(wildcards):
    """finetune's --features for the setting's seeds: one folder, or one for each seed."""
    dirs = [task_features_dir(wildcards, seed) for seed in PRETRAINING_SEEDS]
    return dirs[0] if len(set(dirs)) == 1 else " ".join(dirs)


def seeds_task_features(wildcards):
    return [path for seed in dict.fromkeys(PRETRAINING_SEEDS) for path in task_features(wildcards, seed)]


# The scheduler's priorities: the job whose chain (pretrain [-> tune_features] -> sweep -> seeds)
# has the most work left goes first when cores are short (critical-path list scheduling), so that
# no long chain is left to run alone at the end. Work is counted in VL-BERT fine-tuning jobs (a
# sweep or a seeds job of a VL-BERT row); each family's weights are its registry entry's
# (ModelFamily.finetune_cost, .pretrain_cost).
def pretrain_cost(setting) -> float:
    """Pre-training in the same units: masking region pixels runs the Fast R-CNN module once
    more, the text corpus adds a text-only half batch, tuning Fast R-CNN backpropagates through it."""
    if not setting.pretrains:
        return 0.0
    cost = setting.model_family.pretrain_cost
    cost *= 2 if setting.masked_roi and setting.model_family.masks_region_pixels else 1
    return cost * (1.6 if setting.text_corpus else 1) * (2.5 if setting.tune_frcnn else 1)


def chain_priority(stage):
    """The priority of a `stage` job of a setting: ten times the work left in its chain."""
    finetune_jobs_left = {"pretrain": 2, "pretrain_seed": 1, "sweep": 2, "seeds": 1}[stage]

    def priority(wildcards):
        setting = SETTINGS[wildcards.setting]
        left = finetune_jobs_left * setting.model_family.finetune_cost
        return round(10 * (left + (pretrain_cost(setting) if stage.startswith("pretrain") else 0)))
    return priority


def extract_priority(wildcards):
    """The caption stores gate every pre-training job; the task stores gate the no-pretraining
    rows' sweeps, the longest of which (the costliest family's) heads one of the longest chains."""
    if wildcards.dataset == "conceptual_captions":
        return 100
    return round(10 * 2 * max(SETTINGS[name].model_family.finetune_cost for name in STUDY_SETTINGS))


def finetune_outputs():
    """Every fine-tuning run's metrics: each setting on each of its tasks and seeds, and the data-fraction
    runs (finetune.data_fractions)."""
    fractions, settings = data_fractions(config)
    runs = [f"{LAYOUT.finetune_run(setting, task, seed)}/metrics.json"
            for setting in STUDY_SETTINGS for task in finetune_tasks(setting) for seed in SEEDS]
    return runs + expand(
        f"{LAYOUT.finetune_fraction('{setting}', '{fraction}')}/{{task}}/seed{{seed}}/metrics.json",
        setting=settings, fraction=fractions, task=TABLE4_TASKS, seed=SEEDS)



# The model families' names: where one keys a preset entry (a fine-tuning section's `families`
# and `reinitialise`, the sweep's `family_lrs`, `model.vilbert`), the entry is that family's alone.
FAMILY_NAMES = frozenset(setting.family for setting in SETTINGS.values())


def family_view(value, family):
    """`value` without the entries that other model families' names key (and without a section
    that held only such entries: `families: {vilbert: ...}` is absent for VL-BERT, as before it
    was written)."""
    if not isinstance(value, dict):
        return value
    view = {}
    for key, entry in value.items():
        if key in FAMILY_NAMES and key != family:
            continue
        entry_view = family_view(entry, family)
        if isinstance(entry, dict) and entry and not entry_view:
            continue
        view[key] = entry_view
    return view


def depends_on(*keys, leave_out=("finetune.data_fractions", "pretrain.per_seed"), family=None):
    """The preset values a rule's output depends on, as a string Snakemake records: changing one
    of them in the preset re-runs that rule (and what follows), and nothing else; `leave_out`
    names the keys inside those that no output depends on (which extra runs the study makes), and
    `family` a setting's model family: other families' entries are not its jobs' inputs."""
    import json

    picked = {}
    for key in keys:
        value = config
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        for left in leave_out:
            if left.startswith(key + ".") and isinstance(value, dict):
                value = {k: v for k, v in value.items() if k != left.removeprefix(key + ".")}
        picked[key] = value if family is None else family_view(value, family)
    return json.dumps(picked, sort_keys=True)


def setting_depends_on(*keys):
    """depends_on for the jobs of a `setting` wildcard, in its family's view of the keys."""
    return lambda wildcards: depends_on(*keys, family=SETTINGS[wildcards.setting].family)
