# Helpers shared by the rules: config validation, canonical names, output paths.
from snakemake.utils import validate

validate(config, schema="../schemas/config.schema.yaml")

PRESET = config["name"]
RESULTS = f"results/{PRESET}"
DATA = config["data"].get("root", f"{RESULTS}/data")
SYNTHETIC_DATASETS = ["detector", "conceptual_captions", "text_corpus", "vqa", "vcr", "refcoco+"]


wildcard_constraints:
    dataset="|".join(d.replace("+", r"\+") for d in SYNTHETIC_DATASETS),


def preset_file():
    """The preset file this run was started with (the first --configfile)."""
    files = workflow.configfiles
    if not files:
        raise WorkflowError("give a preset: --configfile experiments/<preset>.yaml")
    return files[0]


def data_outputs():
    if config["data"]["source"] != "synthetic":
        return []
    return expand(f"{DATA}/{{dataset}}/.spec.json", dataset=SYNTHETIC_DATASETS)
