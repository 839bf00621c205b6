#!/usr/bin/env bash
# Snakemake runs this inside the new environment, from its working directory: the repository root.
set -euo pipefail
python -m pip install --quiet -e .
