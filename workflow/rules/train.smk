# BERT initialisation (embedded default), pre-training per setting, and the features of a setting
# whose pre-training tuned Fast R-CNN.


# With model.wordpiece_vocab_size, bert-init also trains the vocabulary on the world's language.
BERT_INIT_TEXTS = (["text_corpus", "conceptual_captions", "vqa", "vcr", "refcoco+"]
                   if config.get("model", {}).get("wordpiece_vocab_size") else ["text_corpus"])


rule bert_init:
    input:
        data_outputs(BERT_INIT_TEXTS),
    output:
        f"{RESULTS}/bert_init/bert/config.json",
    log:
        f"{RESULTS}/logs/bert_init.log",
    benchmark:
        f"{RESULTS}/benchmarks/bert_init.tsv",
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
    benchmark:
        f"{RESULTS}/benchmarks/pretrain/{{setting}}.tsv",
    params:
        preset=preset_file(),
        bert=bert_checkpoint(),
        depends=depends_on("seed", "model", "pretrain", "training"),
    # Pre-training heads the longest chains (pretrain -> sweep -> seeds), so it goes first when
    # cores are short, the longest first. Without priorities a mini run started setting d's
    # pre-training 29 minutes in, and its chain then ran alone at the end with the other core
    # idle for 4.5 minutes; with one priority for all, `full` (the longest) started third.
    priority: pretrain_priority
    threads: workflow.cores
    resources:
        gpu=GPU,
    shell:
        "vlbert pretrain --config {params.preset} --setting {wildcards.setting} --data {DATA} "
        "--bert {params.bert} --out {RESULTS}/pretrain/{wildcards.setting} --threads {threads} "
        "--device {DEVICE} --quiet > {log} 2>&1"


rule tune_features:
    input:
        pretrained=f"{RESULTS}/pretrain/{{setting}}/best/model.safetensors",
        stores=[f"{RESULTS}/features/{name}.h5" for name in TASK_STORE_NAMES],
    output:
        [f"{RESULTS}/features/tuned/{{setting}}/{name}.h5" for name in TASK_STORE_NAMES],
    log:
        f"{RESULTS}/logs/tune_features/{{setting}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/tune_features/{{setting}}.tsv",
    params:
        preset=preset_file(),
    priority: pretrain_priority
    threads: workflow.cores
    resources:
        gpu=GPU,
    shell:
        "vlbert tune-features --config {params.preset} --pretrained {RESULTS}/pretrain/{wildcards.setting}/best "
        "--store {input.stores} --out {RESULTS}/features/tuned/{wildcards.setting} --data {DATA} "
        "--threads {threads} --device {DEVICE} --quiet > {log} 2>&1"
