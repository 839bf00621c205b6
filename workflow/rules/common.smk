# Helpers shared by the rules: config validation, canonical names, output paths.
from snakemake.utils import validate

from vlbert.study.registry import SETTINGS, TASKS

validate(config, schema="../schemas/config.schema.yaml")

PRESET = config["name"]
RESULTS = f"results/{PRESET}"
DATA = config["data"].get("root", f"{RESULTS}/data")
SYNTHETIC_DATASETS = ["detector", "conceptual_captions", "text_corpus", "vqa", "vcr", "refcoco+"]


# The feature stores the study reads: (data set, split, boxes). VCR uses its given boxes, as
# VL-BERT does; RefCOCO+ has a detected-regions and a ground-truth-regions track.
FEATURE_STORES = [
    ("conceptual_captions", "train", "det"), ("conceptual_captions", "val", "det"),
    ("vqa", "train2014", "det"), ("vqa", "val2014", "det"), ("vqa", "test-dev2015", "det"),
    ("vcr", "train", "gt"), ("vcr", "val", "gt"), ("vcr", "test", "gt"),
    ("refcoco+", "all", "det"), ("refcoco+", "all", "gt"),
]


wildcard_constraints:
    dataset="|".join(d.replace("+", r"\+") for d in SYNTHETIC_DATASETS),
    boxes="det|gt",
    split=r"[A-Za-z0-9-]+",
    setting="|".join(SETTINGS),
    task="|".join(TASKS),
    seed=r"\d+",


def preset_file():
    """The preset file this run was started with (the first --configfile)."""
    files = workflow.configfiles
    if not files:
        raise WorkflowError("give a preset: --configfile experiments/<preset>.yaml")
    return files[0]


# A sweep job takes cpus_per_trial x concurrent_trials cores; on a small machine several sweeps
# then run side by side, their start-up costs overlapping.
SWEEP_THREADS = min(workflow.cores, config.get("sweep", {}).get("cpus_per_trial", 1)
                    * config.get("sweep", {}).get("concurrent_trials", 1))
PRETRAIN_SETTINGS = [s for s, spec in SETTINGS.items() if spec.pretrains]
SEEDS = config.get("sweep", {}).get("seeds", [config["seed"]])
REPORT = f"reports/{PRESET}"
# Jobs that train ask for a GPU when the preset trains on one (the SLURM profile maps it).
GPU = 1 if str(config.get("device", "cpu")).startswith("cuda") else 0
DEVICE = config.get("device", "cpu")
# The features each task reads (see vlbert.engine.tasks).
TASK_FEATURES = {
    "vqa": ["vqa.train2014.det", "vqa.val2014.det", "vqa.test-dev2015.det"],
    "vcr_q2a": ["vcr.train.gt", "vcr.val.gt", "vcr.test.gt"],
    "vcr_qa2r": ["vcr.train.gt", "vcr.val.gt", "vcr.test.gt"],
    "refcoco_det": ["refcoco+.all.det"],
    "refcoco_gt": ["refcoco+.all.gt"],
}


def data_outputs(datasets=SYNTHETIC_DATASETS):
    """The make-data stamps of these data sets; nothing for real data, which is given."""
    if config["data"]["source"] != "synthetic":
        return []
    return expand(f"{DATA}/{{dataset}}/.spec.json", dataset=datasets)


def feature_outputs():
    return [f"{RESULTS}/features/{d}.{s}.{b}.h5" for d, s, b in FEATURE_STORES]


def bert_checkpoint():
    """The preset's BERT (a hub id or folder), else the one bert_init trains."""
    return config.get("model", {}).get("bert") or f"{RESULTS}/bert_init/bert"


def bert_input():
    return [] if config.get("model", {}).get("bert") else [f"{RESULTS}/bert_init/bert/config.json"]


def pretrained_input(wildcards):
    if wildcards.setting == "no_pretrain":
        return []
    return [f"{RESULTS}/pretrain/{wildcards.setting}/best/model.safetensors"]


def all_task_features(wildcards=None):
    return sorted({f"{RESULTS}/features/{name}.h5" for names in TASK_FEATURES.values() for name in names})


def finetune_outputs():
    return expand(f"{RESULTS}/finetune/{{setting}}/{{task}}/seed{{seed}}/metrics.json",
                  setting=list(SETTINGS), task=list(TASKS), seed=SEEDS)


TASK_OPTIONS = {"vqa": "vqa", "vcr_q2a": "vcr", "vcr_qa2r": "vcr", "refcoco_det": "refcoco", "refcoco_gt": "refcoco"}


def depends_on(*keys):
    """The preset values a rule's output depends on, as a string Snakemake records: changing one
    of them in the preset re-runs that rule (and what follows), and nothing else."""
    import json

    picked = {}
    for key in keys:
        value = config
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        picked[key] = value
    return json.dumps(picked, sort_keys=True)
