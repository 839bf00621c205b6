# Learning-rate sweeps (Ray Tune) per (setting, task), then the chosen rate re-run with every seed.


rule sweep:
    input:
        pretrained_input,
        bert_input(),
        lambda wc: [f"{RESULTS}/features/{name}.h5" for name in TASK_FEATURES[wc.task]],
        rules.train_detector.output.weights,
    output:
        f"{RESULTS}/sweep/{{setting}}/{{task}}/best.json",
    log:
        f"{RESULTS}/logs/sweep/{{setting}}.{{task}}.log",
    params:
        preset=preset_file(),
        bert=bert_checkpoint(),
        depends=lambda wc: depends_on("finetune.epoch_factor", f"finetune.{TASK_OPTIONS[wc.task]}", "sweep",
                                      "training"),
    threads: SWEEP_THREADS
    resources:
        gpu=GPU,
    shell:
        "vlbert sweep --config {params.preset} --setting {wildcards.setting} --task {wildcards.task} "
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
        # `vlbert finetune` puts several seeds in OUT/seed<N>/, a single one in OUT itself.
        out=lambda wc: f"{RESULTS}/finetune/{wc.setting}/{wc.task}" + (f"/seed{SEEDS[0]}" if len(SEEDS) == 1 else ""),
        depends=lambda wc: depends_on("finetune.epoch_factor", f"finetune.{TASK_OPTIONS[wc.task]}", "training",
                                      "sweep.seeds"),
    threads: 1
    resources:
        gpu=GPU,
    shell:
        "vlbert finetune --config {params.preset} --setting {wildcards.setting} --task {wildcards.task} "
        "--lr-from {input.best} --seed {params.seeds} --data {DATA} --bert {params.bert} "
        "--out {params.out} --threads {threads} --device {DEVICE} --quiet > {log} 2>&1"
