# Learning-rate sweeps (Ray Tune) per setting over all its tasks, then the chosen rates re-run
# with every seed; the sweep's own seed continues its trial of the chosen rate (--continue-trial)
# from the trial's last checkpoint instead of running it again. One job per setting and stage:
# a job's start-up (imports, a Ray session) is paid once for all its tasks, and its trials share
# Ray's worker processes.


rule sweep:
    input:
        pretrained=pretrained_input,
        bert=bert_input(),
        features=task_features,
        detector=DETECTOR,
    output:
        [str(LAYOUT.sweep_best("{setting}", task)) for task in TASKS],
    wildcard_constraints:
        setting="|".join(ALL_TASKS_SETTINGS),
    log:
        f"{LAYOUT.logs}/sweep/{{setting}}.log",
    benchmark:
        f"{LAYOUT.benchmarks}/sweep/{{setting}}.tsv",
    params:
        preset=preset_file(),
        bert=bert_param,
        tasks=lambda wc: " ".join(finetune_tasks(wc.setting)),
        data=data_root,
        features=task_features_dir,
        out=lambda wc: str(LAYOUT.sweep(wc.setting)),
        device=DEVICE,
        depends=setting_depends_on("finetune", "sweep", "training"),
    priority: chain_priority("sweep")
    threads: SWEEP_THREADS
    resources:
        gpu=GPU,
    conda:
        CONDA_ENV
    shell:
        "vlbert sweep --config {params.preset} --setting {wildcards.setting} --task {params.tasks} "
        "--data {params.data} --features {params.features} --bert {params.bert} --out {params.out} "
        "--cores {threads} --device {params.device} --quiet > {log} 2>&1"


rule finetune_seeds:
    input:
        best=lambda wc: [str(LAYOUT.sweep_best(wc.setting, task)) for task in finetune_tasks(wc.setting)],
        pretrained=seeds_pretrained_input,
        bert=bert_input(),
        features=seeds_task_features,
    output:
        [f"{LAYOUT.finetune_run('{setting}', task, seed)}/metrics.json" for task in TASKS for seed in SEEDS],
    wildcard_constraints:
        setting="|".join(ALL_TASKS_SETTINGS),
    log:
        f"{LAYOUT.logs}/finetune/{{setting}}.log",
    benchmark:
        f"{LAYOUT.benchmarks}/finetune_seeds/{{setting}}.tsv",
    params:
        preset=preset_file(),
        bert=bert_param,
        tasks=lambda wc: " ".join(finetune_tasks(wc.setting)),
        seeds=" ".join(str(s) for s in SEEDS),
        data=data_root,
        features=seeds_features_dirs,
        sweep=lambda wc, input: os.path.dirname(os.path.dirname(input.best[0])),
        out=lambda wc: str(LAYOUT.finetune(wc.setting)),
        device=DEVICE,
        depends=setting_depends_on("finetune", "training", "sweep.seeds"),
    priority: chain_priority("seeds")
    threads: 1
    resources:
        gpu=GPU,
    conda:
        CONDA_ENV
    shell:
        "vlbert finetune --config {params.preset} --setting {wildcards.setting} --task {params.tasks} "
        "--lr-from {params.sweep} --continue-trial --seed {params.seeds} --data {params.data} "
        "--features {params.features} --bert {params.bert} "
        "--out {params.out} --threads {threads} --device {params.device} --quiet > {log} 2>&1"


# The same for the settings whose family fine-tunes Table 4's tasks alone (the systems table's
# columns; registry.ModelFamily.table4_tasks_only): their outputs are those tasks' alone.
use rule sweep as sweep_table4_tasks with:
    output:
        [str(LAYOUT.sweep_best("{setting}", task)) for task in TABLE4_TASKS],
    wildcard_constraints:
        setting="|".join(TABLE4_ONLY_SETTINGS),


use rule finetune_seeds as finetune_seeds_table4_tasks with:
    output:
        [f"{LAYOUT.finetune_run('{setting}', task, seed)}/metrics.json" for task in TABLE4_TASKS for seed in SEEDS],
    wildcard_constraints:
        setting="|".join(TABLE4_ONLY_SETTINGS),


# Pre-training's effect against fine-tuning data (finetune.data_fractions): its settings fine-tuned
# on shares of each Table 4 task's training set, at the rate the whole set's sweep chose, each seed.
rule finetune_fractions:
    input:
        best=[str(LAYOUT.sweep_best("{setting}", task)) for task in TABLE4_TASKS],
        pretrained=seeds_pretrained_input,
        bert=bert_input(),
        features=seeds_task_features,
    output:
        [f"{LAYOUT.finetune_fraction('{setting}', '{fraction}')}/{task}/seed{seed}/metrics.json"
         for task in TABLE4_TASKS for seed in SEEDS],
    log:
        f"{LAYOUT.logs}/finetune_fractions/{{setting}}_{{fraction}}.log",
    benchmark:
        f"{LAYOUT.benchmarks}/finetune_fractions/{{setting}}_{{fraction}}.tsv",
    params:
        preset=preset_file(),
        bert=bert_param,
        tasks=" ".join(TABLE4_TASKS),
        seeds=" ".join(str(s) for s in SEEDS),
        data=data_root,
        features=seeds_features_dirs,
        sweep=lambda wc, input: os.path.dirname(os.path.dirname(input.best[0])),
        out=lambda wc: str(LAYOUT.finetune_fraction(wc.setting, wc.fraction)),
        device=DEVICE,
        depends=setting_depends_on("finetune", "training", "sweep.seeds"),
    priority: chain_priority("seeds")
    threads: 1
    resources:
        gpu=GPU,
    conda:
        CONDA_ENV
    shell:
        "vlbert finetune --config {params.preset} --setting {wildcards.setting} --task {params.tasks} "
        "--lr-from {params.sweep} --train-fraction {wildcards.fraction} --seed {params.seeds} "
        "--data {params.data} --features {params.features} --bert {params.bert} "
        "--out {params.out} --threads {threads} --device {params.device} --quiet > {log} 2>&1"
