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
        depends=lambda wc: depends_on("seed", "data.synthetic.image_size", f"data.synthetic.{wc.dataset}"),
    conda:
        CONDA_ENV
    shell:
        "vlbert make-data --config {params.preset} --out {params.data} --only '{wildcards.dataset}' "
        "--quiet > {log} 2>&1"
