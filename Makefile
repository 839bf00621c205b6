# The two set-up commands (README): `make reproduce` and `make test`. Both create .venv with the
# pinned dependencies when it is missing or pyproject.toml changed, and reuse it otherwise.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PRESET ?= mini
STAMP := $(VENV)/.installed

.PHONY: reproduce test test-fast bench clean-results

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

bench: $(STAMP)
	$(VENV)/bin/python bench/make_data.py

clean-results:
	rm -rf results/$(PRESET)
