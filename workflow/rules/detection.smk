# The RoI detector and the feature stores every later stage reads.


# One rule makes the study's detector folder, as the preset's backend says: the other would make
# the same file, and Snakemake would take it where the first one's inputs are missing.
if DETECTOR_BACKEND == "torchvision":

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

else:

    rule describe_detector:
        """detector.backend: detectron2: the study's detector folder for the given model (no training)."""
        input:
            config=config.get("detector", {}).get("detectron2", {}).get("config", []),
            weights=config.get("detector", {}).get("detectron2", {}).get("weights", []),
        output:
            f"{LAYOUT.detector}/detector_config.json",
        log:
            f"{LAYOUT.logs}/describe_detector.log",
        params:
            preset=preset_file(),
            out=lambda wc, output: os.path.dirname(output[0]),
        conda:
            CONDA_ENV
        shell:
            "vlbert describe-detector --config {params.preset} --out {params.out} > {log} 2>&1"


rule extract_rois:
    """One chunk of a split's shards (the scatter: `features.chunks` jobs a split, one GPU each on a
    cluster); a killed chunk keeps the shards it finished."""
    input:
        data=lambda wc: data_outputs([wc.dataset]),
        detector=DETECTOR,
    output:
        f"{LAYOUT.features}/{{dataset}}.{{split}}.{{boxes}}.shards/chunk_{{scatteritem}}.json",
    log:
        f"{LAYOUT.logs}/extract_rois/{{dataset}}.{{split}}.{{boxes}}.{{scatteritem}}.log",
    benchmark:
        f"{LAYOUT.benchmarks}/extract_rois/{{dataset}}.{{split}}.{{boxes}}.{{scatteritem}}.tsv",
    params:
        preset=preset_file(),
        gt=lambda wc: "--gt-boxes" if wc.boxes == "gt" else "",
        data=data_root,
        detector=lambda wc, input: os.path.dirname(input.detector),
        store=lambda wc: f"{LAYOUT.features}/{wc.dataset}.{wc.split}.{wc.boxes}.h5",
        device=DEVICE,
        # What the stores hold, not how they are cut (images_per_shard, chunks): those leave results alone.
        depends=depends_on(*(f"features.{key}" for key in STORE_CONTENT_KEYS)),
    priority: extract_priority
    threads: MACHINE_CORES
    resources:
        gpu=GPU,
    conda:
        CONDA_ENV
    shell:
        "vlbert extract-rois --config {params.preset} --data {params.data} --detector {params.detector} "
        "--dataset '{wildcards.dataset}' --split {wildcards.split} {params.gt} --out {params.store} "
        "--chunk {wildcards.scatteritem} --device {params.device} --threads {threads} --quiet > {log} 2>&1"


rule index_store:
    """The gather: the store's index over every chunk's shards (reads only their small arrays)."""
    input:
        gather.extract(f"{LAYOUT.features}/{{{{dataset}}}}.{{{{split}}}}.{{{{boxes}}}}.shards/chunk_{{scatteritem}}.json"),
    output:
        f"{LAYOUT.features}/{{dataset}}.{{split}}.{{boxes}}.h5",
    log:
        f"{LAYOUT.logs}/index_store/{{dataset}}.{{split}}.{{boxes}}.log",
    priority: extract_priority
    conda:
        CONDA_ENV
    shell:
        "vlbert index-store --out {output} {input} > {log} 2>&1"
