# The report: Table 4, the paper's findings, the three systems' table and the figures, read back from MLflow.


rule report:
    input:
        finetune_outputs(),
        detector=DETECTOR_REPORT,
        floors=str(LAYOUT.floors),
    output:
        table=report(f"{LAYOUT.reports}/table4.md", caption="../report/table4.rst", category="Table 4"),
        csv=f"{LAYOUT.reports}/table4.csv",
        controls=report(f"{LAYOUT.reports}/table4_controls.md", caption="../report/table4_controls.rst", category="Table 4"),
        controls_csv=f"{LAYOUT.reports}/table4_controls.csv",
        refcoco=report(f"{LAYOUT.reports}/refcoco.md", caption="../report/refcoco.rst", category="Table 4"),
        refcoco_csv=f"{LAYOUT.reports}/refcoco.csv",
        tex=f"{LAYOUT.reports}/table4.tex",
        findings=report(f"{LAYOUT.reports}/findings.md", caption="../report/findings.rst", category="Findings"),
        runs=f"{LAYOUT.reports}/runs.csv",
        systems=report(f"{LAYOUT.reports}/systems.md", caption="../report/systems.rst", category="Systems"),
        systems_csv=f"{LAYOUT.reports}/systems.csv",
        systems_tex=f"{LAYOUT.reports}/systems.tex",
        systems_findings=report(f"{LAYOUT.reports}/systems_findings.md", caption="../report/systems.rst",
                                category="Systems"),
        systems_figure=report(f"{LAYOUT.reports}/figures/systems.png", caption="../report/systems.rst",
                              category="Figures"),
        pretraining_table=report(f"{LAYOUT.reports}/pretraining.md", caption="../report/pretraining.rst", category="Pre-training"),
        detector=report(f"{LAYOUT.reports}/detector.md", caption="../report/detector.rst", category="Detector"),
        bars=report(f"{LAYOUT.reports}/figures/table4_bars.png", caption="../report/table4_bars.rst", category="Figures"),
        heatmap=report(f"{LAYOUT.reports}/figures/delta_heatmap.png", caption="../report/delta_heatmap.rst", category="Figures"),
        sweeps=report(f"{LAYOUT.reports}/figures/lr_sweeps.png", caption="../report/lr_sweeps.rst", category="Figures"),
        pretraining=report(f"{LAYOUT.reports}/figures/pretraining_loss.png", caption="../report/pretraining_loss.rst",
                           category="Figures"),
        grounding=report(f"{LAYOUT.reports}/figures/pretraining_grounding.png", caption="../report/pretraining_grounding.rst",
                         category="Figures"),
    log:
        f"{LAYOUT.logs}/report.log",
    benchmark:
        f"{LAYOUT.benchmarks}/report.tsv",
    params:
        preset=preset_file(),
        out=lambda wc, output: os.path.dirname(output.table),
    conda:
        CONDA_ENV
    shell:
        "vlbert report --config {params.preset} --out {params.out} > {log} 2>&1"
