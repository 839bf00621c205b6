# Learning-rate sweeps (Ray Tune) per setting, then the chosen rate re-run with every seed.


rule sweep:
    input:
        pretrained_input,
        bert_input(),
        all_task_features,
        rules.train_detector.output.weights,
    output:
        [f"{RESULTS}/sweep/{{setting}}/{task}/best.json" for task in TASKS],
    log:
        f"{RESULTS}/logs/sweep/{{setting}}.log",
    params:
        preset=preset_file(),
        bert=bert_checkpoint(),
        tasks=" ".join(TASKS),
        depends=depends_on("finetune", "sweep.lrs", "sweep.seeds", "training"),
    threads: workflow.cores
    resources:
        gpu=GPU,
    shell:
        "vlbert sweep --config {params.preset} --setting {wildcards.setting} --task {params.tasks} "
        "--data {DATA} --bert {params.bert} --out {RESULTS}/sweep/{wildcards.setting} --cores {threads} "
        "--device {DEVICE} --quiet > {log} 2>&1"


rule finetune_seeds:
    input:
        best=f"{RESULTS}/sweep/{{setting}}/{{task}}/best.json",
        pretrained=pretrained_input,
    output:
        [f"{RESULTS}/finetune/{{setting}}/{{task}}/seed{seed}/metrics.json" for seed in SEEDS],
    log:
        f"{RESULTS}/logs/finetune/{{setting}}.{{task}}.log",
    params:
        preset=preset_file(),
        bert=bert_checkpoint(),
        seeds=" ".join(str(s) for s in SEEDS),
        depends=lambda wc: depends_on("finetune.epoch_factor", f"finetune.{TASK_OPTIONS[wc.task]}", "training",
                                      "sweep.seeds"),
    threads: 1
    resources:
        gpu=GPU,
    shell:
        "vlbert finetune --config {params.preset} --setting {wildcards.setting} --task {wildcards.task} "
        "--lr-from {input.best} --seed {params.seeds} --data {DATA} --bert {params.bert} "
        "--out {RESULTS}/finetune/{wildcards.setting}/{wildcards.task} "
        "--threads {threads} --device {DEVICE} --quiet > {log} 2>&1"
