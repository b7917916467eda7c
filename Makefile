# fp8bench quickstart: `make run` (set up, run the default sweep on this machine, ingest, print where) and
# `make test`. Both bootstrap .venv on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
SWEEP ?= quick
# and a short training study (BF16 x 3 seeds vs emulated FP8 formats; ~3 min on 2 cores); TRAIN_SWEEP= skips it
TRAIN_SWEEP ?= train-tiny
# 2.13.0 is the CPU build that lies on this kind of machine's disk (a plain `torch` pulls a multi-GB CUDA build).
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.installed

# asv: the machine name is the GPU model (or the CPU's), so histories of one GPU kind line up.
ASV_MACHINE ?= $(shell $(BIN)/python -c "import torch; print(torch.cuda.get_device_name(0).replace(' ', '-') if torch.cuda.is_available() else 'cpu-' + __import__('platform').machine())" 2>/dev/null)

.PHONY: run test test-fast lint plan clean asv asv-gate asv-history publish results-page audit readme-picture slurm-up slurm-down

# The venv takes ~2.8 GB (triton ~1 GB, torch ~0.75 GB); --no-cache-dir keeps pip from adding copies of the
# wheels in ~/.cache on a disk that may be short (a CI run once failed on "No space left on device").
PIP_INSTALL := $(BIN)/python -m pip install -q --no-cache-dir

# pip's own notes (index mirrors, setuptools' editable-install banner) go to a log, shown only on failure.
INSTALL_LOG := $(VENV)/install.log
LOGGED = >>$(INSTALL_LOG) 2>&1 || { tail -40 $(INSTALL_LOG); exit 1; }

# torch through pip (it reads this machine's pip configuration, where the CPU wheel lies), its bytecode compiled
# on every core (a file that does not compile is compiled at import); the rest through uv, parallel, with that
# torch pinned (uv reads PyPI, not pip's configuration), and through pip when uv fails. Why and how long:
# docs/architecture.md, "Tests in tiers". uv's cache sits on the venv's disk (hard links) and is removed.
EXTRAS := .[dev,cpu-extras,integrations]
UV_CACHE := $(VENV)/.uv-cache
TORCH_PIN := $(VENV)/torch-pin.txt

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@echo "installing fp8bench and its dependencies into $(VENV) (log: $(INSTALL_LOG))"
	@$(PIP_INSTALL) --upgrade pip $(LOGGED)
	@$(PIP_INSTALL) --no-compile "$(TORCH)" $(LOGGED)
	@$(BIN)/python -m compileall -q -j 0 "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/torch" >>$(INSTALL_LOG) 2>&1 || true
	@echo "torch==$$($(BIN)/python -c 'import importlib.metadata as m; print(m.version("torch"))')" > $(TORCH_PIN)
	@if $(PIP_INSTALL) uv >>$(INSTALL_LOG) 2>&1 && UV_CACHE_DIR=$(UV_CACHE) $(BIN)/uv pip install -q --python $(BIN)/python --compile-bytecode --constraint $(TORCH_PIN) -e "$(EXTRAS)" >>$(INSTALL_LOG) 2>&1; then \
	  rm -rf $(UV_CACHE); echo "installed with uv" >>$(INSTALL_LOG); \
	else \
	  rm -rf $(UV_CACHE); \
	  echo "uv did not install the project (see $(INSTALL_LOG)): pip installs it" | tee -a $(INSTALL_LOG); \
	  $(PIP_INSTALL) -e "$(EXTRAS)" $(LOGGED); \
	fi
	@touch $(STAMP)

# The sweep on this machine, then everything under results/ (the committed H200 exports too) into one DuckDB.
run: $(STAMP)
	$(BIN)/fp8bench run sweep=$(SWEEP)
	@if [ -n "$(TRAIN_SWEEP)" ]; then echo "$(BIN)/fp8bench run sweep=$(TRAIN_SWEEP)"; $(BIN)/fp8bench run sweep=$(TRAIN_SWEEP); fi
	$(BIN)/fp8bench ingest results
	$(BIN)/fp8bench report --out results/site
	@if command -v chromium >/dev/null 2>&1; then $(BIN)/python scripts/screenshot.py results/site results/site/overview.png >/dev/null && echo "overview picture: $(CURDIR)/results/site/overview.png (make readme-picture copies it to docs/overview.png)"; else echo "no chromium here: no overview picture"; fi
	@echo "DuckDB file: $(CURDIR)/results/fp8bench.duckdb"
	@echo "report: $(CURDIR)/results/site/index.html"

# README's picture (tracked): the overview picture of the site `make run` built last, copied on purpose only, so
# that a run leaves the clone unmodified.
readme-picture: results/site/overview.png
	cp results/site/overview.png docs/overview.png

# README's headline table, docs/results.md's and docs/training.md's tables, from the committed result sets only (never this
# checkout's own runs: fp8bench.data.store.LOCAL_RESULT_DIRS); tests/test_docs.py fails when any is stale.
COMMITTED := $(filter-out results/runs/ results/hydra/ results/site/,$(wildcard results/*/))
results-page: $(STAMP)
	rm -f results/committed.duckdb
	$(BIN)/fp8bench ingest $(COMMITTED) --db results/committed.duckdb
	$(BIN)/fp8bench report --markdown README.md docs/results.md docs/training.md docs/why-not-2x.md --db results/committed.duckdb

# Every figure README.md and docs/ publish, rebuilt from the committed samples alone (the sets COMMITTED names);
# exit 1 naming each that differs or cannot be rebuilt. tests/test_audit.py runs it in `make test`.
audit: $(STAMP)
	$(BIN)/fp8bench audit

plan: $(STAMP)
	$(BIN)/fp8bench plan sweep=$(SWEEP)

# The import layering (.importlinter) is part of the tests: a change that breaks it fails here. One pytest worker
# per core (pytest-xdist), each test module on one worker (its module fixtures built once), torch's threads
# shared out among the workers (tests/conftest.py).
# The tests write bytecode caches (__pycache__/, ignored by git) even where PYTHONDONTWRITEBYTECODE is set, as on
# the dev and CI machines: otherwise every process they start compiles fp8bench's modules again (~0.5 s each).
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest

test: $(STAMP)
	$(BIN)/ruff check fp8bench tests kernels benchmarks scripts asv_plugins hydra_plugins
	$(BIN)/lint-imports --no-cache
	$(PYTEST) -q -m "not gpu" -n auto --dist loadfile

# The edit-test loop: lint, layering and every test not marked slow (under half a minute on two cores).
test-fast: $(STAMP)
	$(BIN)/ruff check fp8bench tests kernels benchmarks scripts asv_plugins hydra_plugins
	$(BIN)/lint-imports --no-cache
	$(PYTEST) -q -m "not gpu and not slow" -n auto --dist loadfile

# A one-node Slurm with accounting on this machine (root; installs Debian's packages where missing), for the
# Slurm tests (tests/test_slurm.py) and for trying hydra/launcher=slurm-cpu: docs/slurm.md.
slurm-up:
	scripts/slurm/cluster.sh up

slurm-down:
	scripts/slurm/cluster.sh down

# Record this commit's asv results for this machine and publish the asv site (offline) into results/site/asv.
asv: $(STAMP)
	$(BIN)/asv machine --yes --machine $(ASV_MACHINE)
	$(BIN)/asv run --python=same --machine $(ASV_MACHINE) --set-commit-hash $$(git rev-parse HEAD) --show-stderr
	$(BIN)/asv publish
	$(BIN)/python scripts/asv_offline.py

# The CI gate: build BASE and HEAD into their own environments (asv_plugins/fp8bench_env.py: no package index
# needed), run the suite's lower-is-better series on both and fail on a regression asv calls, then judge every
# recorded series with fp8bench asv-compare (the rule of fp8bench compare). asv reads every series as
# lower-is-better, so the gate runs only those (TFLOPS, speedup and SQNR are tracked as time, time_vs_bf16 and
# noise_power). scripts/asv_gate.py keeps asv's results in a temporary folder: the clone is left as it was.
BASE ?= HEAD~1
HEAD ?= HEAD
ASV_GATE := track_(time_ms|time_vs_bf16|noise_power|peak_mem_bytes)
asv-gate: $(STAMP)
	$(BIN)/python scripts/asv_gate.py --machine $(ASV_MACHINE) --bench '$(ASV_GATE)' $(BASE) $(HEAD)

# A history in one command: every commit of RANGE (e.g. v1..main), each in its own environment.
RANGE ?= HEAD~3..HEAD
asv-history: $(STAMP)
	$(BIN)/asv machine --yes --machine $(ASV_MACHINE)
	$(BIN)/asv run --machine $(ASV_MACHINE) --show-stderr $(RANGE)

# fp8bench's site with asv's inside it, committed to the gh-pages branch (push it, or PUSH=--push).
publish: $(STAMP)
	$(BIN)/python scripts/publish.py $(PUSH)

clean:
	rm -rf $(VENV) results/runs results/hydra results/*.duckdb results/site
