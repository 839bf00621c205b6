# Helpers shared by the rules: config validation, canonical names, output paths.
from snakemake.utils import validate

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


def preset_file():
    """The preset file this run was started with (the first --configfile)."""
    files = workflow.configfiles
    if not files:
        raise WorkflowError("give a preset: --configfile experiments/<preset>.yaml")
    return files[0]


def data_outputs(datasets=SYNTHETIC_DATASETS):
    """The make-data stamps of these data sets; nothing for real data, which is given."""
    if config["data"]["source"] != "synthetic":
        return []
    return expand(f"{DATA}/{{dataset}}/.spec.json", dataset=datasets)


def feature_outputs():
    return [f"{RESULTS}/features/{d}.{s}.{b}.h5" for d, s, b in FEATURE_STORES]
