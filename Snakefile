# The VL-BERT ablation study as a DAG. Run it with `make reproduce` (or see README.md).
# Every rule calls the `vlbert` CLI; the config is one preset from experiments/.
#
#   make_data -> train_detector -> extract_rois -> pretrain[setting] -> sweep[setting]
#                bert_init (embedded default) ---/                         -> finetune[setting, task, seed] -> report
#   (detector.backend: detectron2: describe_detector, the given model, in train_detector's place)

include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/detection.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/finetune.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        rules.report.output,
