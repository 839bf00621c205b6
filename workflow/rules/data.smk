# The synthetic world, one data set per job (embedded default only; real data is given).


rule make_data:
    output:
        f"{DATA}/{{dataset}}/.spec.json",
    log:
        f"{LAYOUT.logs}/make_data/{{dataset}}.log",
    benchmark:
        f"{LAYOUT.benchmarks}/make_data/{{dataset}}.tsv",
    params:
        preset=preset_file(),
        data=lambda wc, output: os.path.dirname(os.path.dirname(output[0])),
        # A writer's version, where its files changed since a folder was made (registry.WRITER_VERSIONS).
        depends=lambda wc: depends_on("seed", "data.synthetic.image_size", f"data.synthetic.{wc.dataset}")
        + (f" writer {WRITER_VERSIONS[wc.dataset]}" if wc.dataset in WRITER_VERSIONS else ""),
    conda:
        CONDA_ENV
    shell:
        "vlbert make-data --config {params.preset} --out {params.data} --only '{wildcards.dataset}' "
        "--quiet > {log} 2>&1"


# What a model that does not look at the image scores on each task: the report puts it beside Table 4.
rule floors:
    input:
        data_outputs(["vqa", "vcr", "refcoco+"]),
    output:
        str(LAYOUT.floors),
    log:
        f"{LAYOUT.logs}/floors.log",
    benchmark:
        f"{LAYOUT.benchmarks}/floors.tsv",
    params:
        preset=preset_file(),
    conda:
        CONDA_ENV
    shell:
        "vlbert floors --config {params.preset} --out {output} > {log} 2>&1"
