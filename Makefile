# fp8bench quickstart: `make run` (set up, run the default sweep on this machine, ingest, print where) and
# `make test`. Both bootstrap .venv on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
SWEEP ?= quick
# 2.13.0 is the CPU build that lies on this kind of machine's disk (a plain `torch` pulls a multi-GB CUDA build).
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: run test lint plan clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev,cpu-extras]"
	touch $(STAMP)

# The sweep on this machine, then everything under results/ (the committed H200 exports too) into one DuckDB.
run: $(STAMP)
	$(BIN)/fp8bench run sweep=$(SWEEP)
	$(BIN)/fp8bench ingest results
	$(BIN)/fp8bench report --out results/site
	@echo "DuckDB file: $(CURDIR)/results/fp8bench.duckdb"
	@echo "report: $(CURDIR)/results/site/index.html"

plan: $(STAMP)
	$(BIN)/fp8bench plan sweep=$(SWEEP)

test: $(STAMP)
	$(BIN)/ruff check fp8bench tests kernels benchmarks scripts
	$(BIN)/python -m pytest -q -m "not gpu"

clean:
	rm -rf $(VENV) results/runs results/hydra results/*.duckdb results/site
