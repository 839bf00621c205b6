# BERT initialisation (embedded default), pre-training per setting.


rule bert_init:
    input:
        data_outputs(["text_corpus"]),
    output:
        f"{RESULTS}/bert_init/bert/config.json",
    log:
        f"{RESULTS}/logs/bert_init.log",
    params:
        preset=preset_file(),
        depends=depends_on("seed", "model", "bert_init"),
    threads: workflow.cores
    resources:
        gpu=GPU,
    shell:
        "vlbert bert-init --config {params.preset} --data {DATA} --out {RESULTS}/bert_init "
        "--threads {threads} --device {DEVICE} --quiet > {log} 2>&1"


rule pretrain:
    input:
        bert_input(),
        rules.train_detector.output.weights,
        f"{RESULTS}/features/conceptual_captions.train.det.h5",
        f"{RESULTS}/features/conceptual_captions.val.det.h5",
    output:
        f"{RESULTS}/pretrain/{{setting}}/best/model.safetensors",
    log:
        f"{RESULTS}/logs/pretrain/{{setting}}.log",
    params:
        preset=preset_file(),
        bert=bert_checkpoint(),
        depends=depends_on("seed", "model", "pretrain", "training"),
    threads: workflow.cores
    resources:
        gpu=GPU,
    shell:
        "vlbert pretrain --config {params.preset} --setting {wildcards.setting} --data {DATA} "
        "--bert {params.bert} --out {RESULTS}/pretrain/{wildcards.setting} --threads {threads} "
        "--device {DEVICE} --quiet > {log} 2>&1"
