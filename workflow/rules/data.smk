# The synthetic world, one data set per job (embedded default only; real data is given).


rule make_data:
    output:
        f"{DATA}/{{dataset}}/.spec.json",
    log:
        f"{RESULTS}/logs/make_data/{{dataset}}.log",
    params:
        preset=preset_file(),
    shell:
        "vlbert make-data --config {params.preset} --out {DATA} --only '{wildcards.dataset}' "
        "--quiet > {log} 2>&1"
