# Quick start on a fresh machine with only python3:  make demo   |   make test
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# torch first: a bare `torch` requirement can pull GBs of CUDA wheels. Override for GPU boxes.
TORCH_SPEC ?= torch==2.13.0
UI_PORT ?= 5000
DOCS_PORT ?= 8000

# One target at a time, `make -j` or not: two installs into one .venv at once would break it, and nothing
# here gains from make's parallelism (pytest runs its own processes).
.NOTPARALLEL:

.PHONY: install install-dev browser demo test test-fast lint docs docs-serve ui bench clean gpu-acceptance

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

# pip byte-compiles what it installs, but not this editable package: compileall does, once, so that no process
# (each Ray worker imports it) compiles it again where PYTHONDONTWRITEBYTECODE keeps Python from saving it.
COMPILE := $(PY) -m compileall -q sweeps trainables examples tests

$(VENV)/.installed: pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e .
	$(COMPILE)
	@touch $@

# The dev extra in one resolve with the rest (a fresh `make test` installs the project once, not twice).
$(VENV)/.installed-dev: pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	$(COMPILE)
	@touch $(VENV)/.installed $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

demo: install
	$(PY) -m sweeps run --restart examples/demo.yaml

# Debian's Chromium for the MLflow-UI browser test (Playwright drives it; nothing is downloaded
# by the test tool itself). Needs root or sudo; without them the UI test skips with the reason.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q chromium >/dev/null 2>&1 || \
	  { $$SUDO apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q chromium >/dev/null 2>&1; } || \
	  echo "WARNING: could not install chromium; the MLflow UI browser test will skip"; }

# Every test's time lands in test-artifacts/junit.xml (ignored by git): what each lane of the two processes took.
test: install-dev browser docs
	$(PY) -m pytest -q -rs --durations=30 -n 2 --dist loadgroup --junitxml=test-artifacts/junit.xml

# Every test that needs no Ray cluster (unit tests, the loop in one process and under torchrun): ~2 min here.
test-fast: install-dev
	$(PY) -m pytest -q -rs -n 2 -m "not ray"

lint: install-dev
	$(VENV)/bin/ruff check sweeps trainables tests benchmarks
	$(VENV)/bin/mypy sweeps trainables

# The documentation site from docs/ (MkDocs + Material, offline) into site/: fails when a reference page is
# stale (regenerate them with `$(PY) -m sweeps.ops.docs`), a link is broken or a page is missing from the nav.
docs: install-dev
	$(PY) -m sweeps.ops.docs --check
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

docs-serve: docs
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:$(DOCS_PORT)

ui: install
	$(VENV)/bin/mlflow ui --backend-store-uri sqlite:///mlflow.db --host 127.0.0.1 --port $(UI_PORT)

clean:
	rm -rf mlflow.db mlartifacts ray_results .cache site

# The CPU benchmark set; results append to benchmarks/results.jsonl. docs/benchmarks.md quotes fuller
# runs, each with its command and the results.jsonl row it came from.
bench: install
	cd benchmarks && ../$(PY) data_pipeline.py --rounds 3
	cd benchmarks && ../$(PY) telemetry_overhead.py --pairs 6
	cd benchmarks && ../$(PY) precision_ladder.py --rounds 3 --precisions 32 bf16-mixed
	cd benchmarks && ../$(PY) loop_parity.py --rounds 3 --steps 300
	cd benchmarks && ../$(PY) sweep_overhead.py --rounds 1 --variants default,lean-reuse
	cd benchmarks && ../$(PY) search_landscape.py --seeds 10 --budget 40

# GPU acceptance on a CUDA machine: sweeps doctor --gpu-checks, the GPT-2 small and image-cnn precision x batch
# grids, the memory probe + compile, loop parity against benchmarks/plain_ddp.py. Each stage that runs appends a
# results.jsonl row; a table ends the run. Without CUDA every stage skips with its reason. On a fresh GPU machine,
# install the torch build for its CUDA first, e.g. make gpu-acceptance TORCH_SPEC=torch==2.11.0 (see TORCH_SPEC).
# GPU_ACCEPTANCE_ARGS, e.g. "--stages gpt,parity --out /data/acceptance" (default: all stages, a temp folder).
GPU_ACCEPTANCE_ARGS ?=
gpu-acceptance: install
	$(PY) benchmarks/gpu_acceptance.py $(GPU_ACCEPTANCE_ARGS)
