# The two set-up commands (README): `make reproduce` and `make test`. Both create .venv with the
# pinned dependencies when it is missing or pyproject.toml changed, and reuse it otherwise.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PRESET ?= mini
STAMP := $(VENV)/.installed

.PHONY: reproduce reproduce-systems test test-fast test-cluster cluster-deps lint format ui bench clean-results

$(STAMP): pyproject.toml
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e ".[test]"
	@touch $(STAMP)

SNAKEMAKE = PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/snakemake --profile workflow/profiles/default --configfile experiments/$(PRESET).yaml

reproduce: $(STAMP)  ## the paper's ablation (VL-BERT's Table 4, its controls, the data fractions) on the embedded default (PRESET=smoke for a quick one)
	$(SNAKEMAKE) --config 'systems=[vlbert]'

reproduce-systems: $(STAMP)  ## adds ViLBERT's and Pixel-BERT's rows and the systems table, reusing what `make reproduce` made
	$(SNAKEMAKE)

test: $(STAMP)  ## the whole test suite, slow end-to-end tests included (the cluster's: test-cluster)
	$(VENV)/bin/python -m pytest -m "not cluster"

test-fast: $(STAMP)  ## without the slow end-to-end tests: about 3 minutes on 2 cores
	$(VENV)/bin/python -m pytest -m "not slow and not cluster"

# The Debian packages of the cluster test: SLURM with its accounting (slurmdbd over MariaDB), munge,
# PostgreSQL. Installed when missing and this is root; otherwise the test says which are missing.
CLUSTER_PACKAGES := munge slurm-wlm slurm-client slurmdbd mariadb-server postgresql
cluster-deps:
	@missing=$$(for p in $(CLUSTER_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ] && [ "$$(id -u)" = 0 ]; then \
		echo "apt-get install $$missing"; apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	elif [ -n "$$missing" ]; then echo "missing Debian packages (as root: make cluster-deps): $$missing"; fi

# -s: the cluster run's listing shows as it ends, and a failure's report (with its jobs' logs) comes last.
test-cluster: $(STAMP) cluster-deps  ## the smoke study through SLURM, a Ray head and an MLflow server on PostgreSQL, all started here
	$(VENV)/bin/python -m pytest -m cluster -s tests/test_cluster.py

lint: $(STAMP)  ## ruff (lint and format) and Snakemake's linter on every preset; CI runs it first
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	@for preset in experiments/*.yaml; do \
		echo "snakemake --lint --configfile $$preset"; \
		$(VENV)/bin/snakemake --lint --configfile $$preset >/dev/null 2>&1 || \
			{ $(VENV)/bin/snakemake --lint --configfile $$preset; exit 1; }; \
	done

format: $(STAMP)  ## fix what ruff can: import order, then the format
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

ui: $(STAMP)  ## MLflow's UI over the preset's runs on 127.0.0.1; prints the runs table's address
	$(VENV)/bin/vlbert ui --config experiments/$(PRESET).yaml

bench: $(STAMP)
	$(VENV)/bin/python bench/make_data.py

clean-results:
	rm -rf results/$(PRESET)
