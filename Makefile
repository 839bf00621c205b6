# The two set-up commands (README): `make reproduce` and `make test`. Both create .venv with the
# pinned dependencies when it is missing or pyproject.toml changed, and reuse it otherwise.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PRESET ?= mini
STAMP := $(VENV)/.installed

.PHONY: reproduce test test-fast lint format ui bench clean-results

$(STAMP): pyproject.toml
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e ".[test]"
	@touch $(STAMP)

reproduce: $(STAMP)  ## run the whole study on the embedded default (PRESET=smoke for a quick one)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/snakemake --profile workflow/profiles/default --configfile experiments/$(PRESET).yaml

test: $(STAMP)  ## the whole test suite, slow end-to-end tests included
	$(VENV)/bin/python -m pytest

test-fast: $(STAMP)  ## without the slow end-to-end tests
	$(VENV)/bin/python -m pytest -m "not slow"

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
