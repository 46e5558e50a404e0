"""What a reader meets is clean: the executed notebooks make reproduce keeps (and a notebook executed the
way it executes them), README.md and the command line's own words show no absolute path of the machine
that ran them, no progress bars, no raw dict dumps, and never name the reference documents otherwise."""

import ast

import pytest

from rkstudy.notebook import READER_PROBLEMS, reader_problems
from rkstudy.paths import REPO

COMMITTED = REPO / "results" / "notebooks"


def test_the_scan_finds_what_it_looks_for(tmp_path):
    import json

    def output(**o):
        return {"cell_type": "code", "source": [], "outputs": [o], "metadata": {}, "execution_count": 1}

    cells = [output(output_type="stream", name="stderr",
                    text=["/tmp/repro/.venv/lib/python3.11/site-packages/tqdm/auto.py:21: TqdmWarning: x\n"]),
             output(output_type="stream", name="stderr", text=["windows:  40%|####      | 4/10 [00:01<00:02]\r"]),
             output(output_type="execute_result", data={"text/plain": ["[{'graph': 'conv', 'width': 64}]"]}),
             {"cell_type": "markdown", "source": ["the seeds' figures"], "metadata": {}},
             output(output_type="display_data", data={"text/plain": ["<Markdown object>"],
                                                       "text/markdown": ["| a | b |\n|---|---|\n| 1 | 2 |"]}),
             output(output_type="stream", name="stdout", text=["seeded random weights, seed 0: ok\n"])]
    path = tmp_path / "x.ipynb"
    path.write_text(json.dumps({"cells": cells}))
    found = reader_problems(path)
    assert [f.split(": ")[1] for f in found] == [
        "an absolute path of the machine that ran it", "a progress bar", "a dict or list of dicts printed raw",
        "the reference documents by another name"]


def _scan(folder):
    notebooks = sorted(folder.glob("*.ipynb"))
    return notebooks, [p for nb in notebooks for p in reader_problems(nb)]


RECORDING = [
    # a study notebook's first import is rkstudy's (its modules bring tqdm in)
    "import warnings\nfrom pathlib import Path\nfrom rkstudy.notebook import Study, fields\n"
    "from rkstudy.process import shows_progress\nfrom rkstudy.walk import window\nfrom tqdm.auto import tqdm",
    "warnings.warn('a study says something')\nsum(1 for _ in tqdm(range(50), desc='steps', mininterval=0, "
    "disable=not shows_progress()))",
    "print('config:', fields({'widths': (64, 128), 'ladder': {'rungs': (128, 192)}}))",
    "study = Study('synthetic', True)\nstudy.root = Path(ROOT)\n"
    "study.table('t', [{'window': 93, 'min_snr_db': 73.2, 'where': 'fp32'}], 't')",
]


def _executed(tmp_path, recorded: bool):
    import os

    import nbformat
    import papermill

    from rkstudy.process import RECORDED

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(f"ROOT = {str(tmp_path)!r}")]
                                  + [nbformat.v4.new_code_cell(c) for c in RECORDING])
    source, out = tmp_path / f"in-{recorded}.ipynb", tmp_path / f"out-{recorded}.ipynb"
    nbformat.write(nb, source)
    before = os.environ.pop(RECORDED, None)
    try:
        if recorded:
            os.environ[RECORDED] = "1"  # the kernel inherits it, as make reproduce's kernels do
        papermill.execute_notebook(str(source), str(out), kernel_name="rkstudy", progress_bar=False,
                                   cwd=str(tmp_path))
    finally:
        os.environ.pop(RECORDED, None)
        if before is not None:
            os.environ[RECORDED] = before
    return out


@pytest.mark.notebooks  # starts a Jupyter kernel twice
def test_a_recorded_run_shows_a_reader_no_paths_bars_or_dumps(tmp_path):
    """The same cells executed as make reproduce executes a notebook (RKSTUDY_RECORDED) and as a person's
    kernel runs them: the recorded one is clean, the other shows the bar and the machine's paths a reader
    would meet, so the scan and the recording both do what they say."""
    clean = reader_problems(_executed(tmp_path, recorded=True))
    assert clean == []
    noisy = " ".join(reader_problems(_executed(tmp_path, recorded=False)))
    assert "a progress bar" in noisy and "an absolute path of the machine that ran it" in noisy


def test_the_committed_executed_notebooks_are_clean():
    """Re-made by the final make reproduce; fails on notebooks executed before the scan existed."""
    notebooks, problems = _scan(COMMITTED)
    assert len(notebooks) >= 10 and problems == []


def test_the_readme_is_clean():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    for what in ("an absolute path of the machine that ran it", "a dict or list of dicts printed raw",
                 "the reference documents by another name"):
        assert not READER_PROBLEMS[what].search(text), what


def _strings(path):
    return [n.value for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def test_nothing_the_command_line_can_print_calls_them_seeds():
    """Every string the package holds (help, errors, table titles, printed lines) and every command's
    help as printed."""
    seeds = READER_PROBLEMS["the reference documents by another name"]
    said = [(p.relative_to(REPO), s) for p in sorted((REPO / "rkstudy").rglob("*.py")) for s in _strings(p)
            if seeds.search(s)]
    assert said == []
    import argparse

    from rkstudy.cli import parser

    def helps(p):  # every command's and subcommand's help, as `rkstudy ... --help` prints it
        yield p.format_help()
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    yield from helps(sub)

    texts = list(helps(parser()))
    assert len(texts) >= 30
    paths = READER_PROBLEMS["an absolute path of the machine that ran it"]
    assert [t.splitlines()[0] for t in texts if seeds.search(t) or paths.search(t)] == []
