# The RoI detector and the feature stores every later stage reads.


rule train_detector:
    input:
        data_outputs(["detector"]),
    output:
        weights=f"{LAYOUT.detector}/detector.safetensors",
        config=f"{LAYOUT.detector}/detector_config.json",
        metrics=f"{LAYOUT.detector}/metrics.json",
    log:
        f"{LAYOUT.logs}/train_detector.log",
    benchmark:
        f"{LAYOUT.benchmarks}/train_detector.tsv",
    params:
        preset=preset_file(),
        data=lambda wc: f"{data_root(wc)}/detector",
        out=lambda wc, output: os.path.dirname(output.weights),
        depends=depends_on("seed", "detector"),
    threads: MACHINE_CORES
    conda:
        CONDA_ENV
    shell:
        "vlbert train-detector --config {params.preset} --data {params.data} "
        "--out {params.out} --threads {threads} > {log} 2>&1"


rule extract_rois:
    input:
        data=lambda wc: data_outputs([wc.dataset]),
        detector=rules.train_detector.output.weights,
    output:
        f"{LAYOUT.features}/{{dataset}}.{{split}}.{{boxes}}.h5",
    log:
        f"{LAYOUT.logs}/extract_rois/{{dataset}}.{{split}}.{{boxes}}.log",
    benchmark:
        f"{LAYOUT.benchmarks}/extract_rois/{{dataset}}.{{split}}.{{boxes}}.tsv",
    params:
        preset=preset_file(),
        gt=lambda wc: "--gt-boxes" if wc.boxes == "gt" else "",
        data=data_root,
        detector=lambda wc, input: os.path.dirname(input.detector),
        depends=depends_on("features"),
    priority: extract_priority
    threads: MACHINE_CORES
    conda:
        CONDA_ENV
    shell:
        "vlbert extract-rois --config {params.preset} --data {params.data} --detector {params.detector} "
        "--dataset '{wildcards.dataset}' --split {wildcards.split} {params.gt} --out {output} "
        "--threads {threads} --quiet > {log} 2>&1"
