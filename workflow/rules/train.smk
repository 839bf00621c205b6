# BERT initialisation (embedded default), pre-training per setting, and the features of a setting
# whose pre-training tuned Fast R-CNN.


# With model.wordpiece_vocab_size, bert-init also trains the vocabulary on the world's language.
BERT_INIT_TEXTS = (["text_corpus", "conceptual_captions", "vqa", "vcr", "refcoco+"]
                   if config.get("model", {}).get("wordpiece_vocab_size") else ["text_corpus"])


rule bert_init:
    input:
        data_outputs(BERT_INIT_TEXTS),
    output:
        f"{LAYOUT.bert}/config.json",
    log:
        f"{LAYOUT.logs}/bert_init.log",
    benchmark:
        f"{LAYOUT.benchmarks}/bert_init.tsv",
    params:
        preset=preset_file(),
        data=data_root,
        out=lambda wc, output: os.path.dirname(os.path.dirname(output[0])),
        device=DEVICE,
        depends=depends_on("seed", "model", "bert_init"),
    threads: MACHINE_CORES
    resources:
        gpu=GPU,
    conda:
        CONDA_ENV
    shell:
        "vlbert bert-init --config {params.preset} --data {params.data} --out {params.out} "
        "--threads {threads} --device {params.device} --quiet > {log} 2>&1"


rule pretrain:
    input:
        bert=bert_input(),
        detector=DETECTOR,
        captions=[f"{LAYOUT.features}/{store.name}.h5" for store in PRETRAINING_STORES.values()],
    output:
        f"{LAYOUT.pretrained('{setting}')}/model.safetensors",
    log:
        f"{LAYOUT.logs}/pretrain/{{setting}}.log",
    benchmark:
        f"{LAYOUT.benchmarks}/pretrain/{{setting}}.tsv",
    params:
        preset=preset_file(),
        bert=bert_param,
        data=data_root,
        out=lambda wc: str(LAYOUT.pretrain(wc.setting)),
        device=DEVICE,
        depends=setting_depends_on("seed", "model", "pretrain", "training"),
    # Pre-training heads the longest chains: without priorities a mini run started setting d's
    # pre-training 29 minutes in, and its chain then ran alone at the end with a core idle.
    priority: chain_priority("pretrain")
    threads: MACHINE_CORES
    resources:
        gpu=GPU,
    conda:
        CONDA_ENV
    shell:
        "vlbert pretrain --config {params.preset} --setting {wildcards.setting} --data {params.data} "
        "--bert {params.bert} --out {params.out} --threads {threads} "
        "--device {params.device} --quiet > {log} 2>&1"


# A fine-tuning seed's own pre-training (pretrain.per_seed): the setting's, made with that seed.
rule pretrain_seed:
    input:
        bert=bert_input(),
        detector=DETECTOR,
        captions=[f"{LAYOUT.features}/{store.name}.h5" for store in PRETRAINING_STORES.values()],
    output:
        f"{LAYOUT.pretrained('{setting}', '{seed}')}/model.safetensors",
    log:
        f"{LAYOUT.logs}/pretrain/{{setting}}_seed{{seed}}.log",
    benchmark:
        f"{LAYOUT.benchmarks}/pretrain/{{setting}}_seed{{seed}}.tsv",
    params:
        preset=preset_file(),
        bert=bert_param,
        data=data_root,
        out=lambda wc: str(LAYOUT.pretrain(wc.setting, wc.seed)),
        device=DEVICE,
        depends=setting_depends_on("model", "pretrain", "training"),
    priority: chain_priority("pretrain_seed")
    threads: MACHINE_CORES
    resources:
        gpu=GPU,
    conda:
        CONDA_ENV
    shell:
        "vlbert pretrain --config {params.preset} --setting {wildcards.setting} --seed {wildcards.seed} "
        "--data {params.data} --bert {params.bert} --out {params.out} --threads {threads} "
        "--device {params.device} --quiet > {log} 2>&1"


rule tune_features:
    input:
        pretrained=f"{LAYOUT.pretrained('{setting}')}/model.safetensors",
        stores=[f"{LAYOUT.features}/{name}.h5" for name in TASK_STORE_NAMES],
    output:
        [f"{LAYOUT.tuned_features('{setting}')}/{name}.h5" for name in TASK_STORE_NAMES],
    log:
        f"{LAYOUT.logs}/tune_features/{{setting}}.log",
    benchmark:
        f"{LAYOUT.benchmarks}/tune_features/{{setting}}.tsv",
    params:
        preset=preset_file(),
        pretrained=lambda wc, input: os.path.dirname(input.pretrained),
        out=lambda wc: str(LAYOUT.tuned_features(wc.setting)),
        data=data_root,
        device=DEVICE,
    priority: chain_priority("sweep")
    threads: MACHINE_CORES
    resources:
        gpu=GPU,
    conda:
        CONDA_ENV
    shell:
        "vlbert tune-features --config {params.preset} --pretrained {params.pretrained} "
        "--store {input.stores} --out {params.out} --data {params.data} "
        "--threads {threads} --device {params.device} --quiet > {log} 2>&1"


# The features of a fine-tuning seed's own pre-training, for a setting that tuned Fast R-CNN.
use rule tune_features as tune_features_seed with:
    input:
        pretrained=f"{LAYOUT.pretrained('{setting}', '{seed}')}/model.safetensors",
        stores=[f"{LAYOUT.features}/{name}.h5" for name in TASK_STORE_NAMES],
    output:
        [f"{LAYOUT.tuned_features('{setting}', '{seed}')}/{name}.h5" for name in TASK_STORE_NAMES],
    log:
        f"{LAYOUT.logs}/tune_features/{{setting}}_seed{{seed}}.log",
    benchmark:
        f"{LAYOUT.benchmarks}/tune_features/{{setting}}_seed{{seed}}.tsv",
    params:
        preset=preset_file(),
        pretrained=lambda wc, input: os.path.dirname(input.pretrained),
        out=lambda wc: str(LAYOUT.tuned_features(wc.setting, wc.seed)),
        data=data_root,
        device=DEVICE,
    priority: chain_priority("seeds")
