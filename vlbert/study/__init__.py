"""The ablation study: its settings, tasks, sweeps and report."""
