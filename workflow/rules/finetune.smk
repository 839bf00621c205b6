# Learning-rate sweeps (Ray Tune) per setting over all its tasks, then the chosen rates re-run
# with every seed; the sweep's own seed continues its trial of the chosen rate (--continue-trial)
# from the trial's last checkpoint instead of running it again. One job per setting and stage:
# a job's start-up (imports, a Ray session) is paid once for its five tasks, and its trials share
# Ray's worker processes.


rule sweep:
    input:
        pretrained_input,
        bert_input(),
        task_features,
        rules.train_detector.output.weights,
    output:
        [f"{RESULTS}/sweep/{{setting}}/{task}/best.json" for task in TASKS],
    log:
        f"{RESULTS}/logs/sweep/{{setting}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/sweep/{{setting}}.tsv",
    params:
        preset=preset_file(),
        bert=bert_checkpoint(),
        tasks=" ".join(TASKS),
        features=task_features_dir,
        depends=depends_on("finetune", "sweep", "training"),
    priority: 10
    threads: SWEEP_THREADS
    resources:
        gpu=GPU,
    shell:
        "vlbert sweep --config {params.preset} --setting {wildcards.setting} --task {params.tasks} "
        "--data {DATA} --features {params.features} --bert {params.bert} --out {RESULTS}/sweep/{wildcards.setting} "
        "--cores {threads} --device {DEVICE} --quiet > {log} 2>&1"


rule finetune_seeds:
    input:
        best=[f"{RESULTS}/sweep/{{setting}}/{task}/best.json" for task in TASKS],
        pretrained=pretrained_input,
        features=task_features,
    output:
        [f"{RESULTS}/finetune/{{setting}}/{task}/seed{seed}/metrics.json" for task in TASKS for seed in SEEDS],
    log:
        f"{RESULTS}/logs/finetune/{{setting}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/finetune_seeds/{{setting}}.tsv",
    params:
        preset=preset_file(),
        bert=bert_checkpoint(),
        tasks=" ".join(TASKS),
        seeds=" ".join(str(s) for s in SEEDS),
        features=task_features_dir,
        depends=depends_on("finetune", "training", "sweep.seeds"),
    threads: 1
    resources:
        gpu=GPU,
    shell:
        "vlbert finetune --config {params.preset} --setting {wildcards.setting} --task {params.tasks} "
        "--lr-from {RESULTS}/sweep/{wildcards.setting} --continue-trial --seed {params.seeds} --data {DATA} "
        "--features {params.features} --bert {params.bert} "
        "--out {RESULTS}/finetune/{wildcards.setting} --threads {threads} --device {DEVICE} --quiet > {log} 2>&1"
