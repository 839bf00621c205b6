# The VL-BERT ablation study as a DAG. Run it with `make reproduce` (or see README.md).
# Every rule calls the `vlbert` CLI; the config is one preset from experiments/.

include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/detection.smk"


rule all:
    input:
        data_outputs(),
        feature_outputs(),
