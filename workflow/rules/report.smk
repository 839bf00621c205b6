# The report: Table 4, the paper's findings and the figures, read back from MLflow.


rule report:
    input:
        finetune_outputs(),
        detector_metrics=f"{RESULTS}/detector/metrics.json",
    output:
        table=report(f"{REPORT}/table4.md", caption="../report/table4.rst", category="Table 4"),
        csv=f"{REPORT}/table4.csv",
        tex=f"{REPORT}/table4.tex",
        findings=report(f"{REPORT}/findings.md", caption="../report/findings.rst", category="Findings"),
        runs=f"{REPORT}/runs.csv",
        pretraining_table=report(f"{REPORT}/pretraining.md", caption="../report/pretraining.rst", category="Pre-training"),
        detector=report(f"{REPORT}/detector.md", caption="../report/detector.rst", category="Detector"),
        bars=report(f"{REPORT}/figures/table4_bars.png", caption="../report/table4_bars.rst", category="Figures"),
        heatmap=report(f"{REPORT}/figures/delta_heatmap.png", caption="../report/delta_heatmap.rst", category="Figures"),
        sweeps=report(f"{REPORT}/figures/lr_sweeps.png", caption="../report/lr_sweeps.rst", category="Figures"),
        pretraining=report(f"{REPORT}/figures/pretraining_loss.png", caption="../report/pretraining_loss.rst",
                           category="Figures"),
        grounding=report(f"{REPORT}/figures/pretraining_grounding.png", caption="../report/pretraining_grounding.rst",
                         category="Figures"),
    log:
        f"{RESULTS}/logs/report.log",
    benchmark:
        f"{RESULTS}/benchmarks/report.tsv",
    params:
        preset=preset_file(),
        out=lambda wc, output: os.path.dirname(output.table),
    conda:
        CONDA_ENV
    shell:
        "vlbert report --config {params.preset} --out {params.out} > {log} 2>&1"
