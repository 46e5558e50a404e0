"""What a reader meets is clean: the executed notebooks (those the notebook tests execute in quick mode,
under build/quick-notebooks/, and the committed full-mode ones make reproduce keeps), README.md and the
command line's own words show no absolute path of the machine that ran them, no progress bars, no raw
dict dumps, and never call the reference documents "seeds"."""

import ast
import subprocess
import sys

import pytest

from rkstudy.notebook import READER_PROBLEMS, reader_problems
from rkstudy.paths import REPO

QUICK_NOTEBOOKS = REPO / "build" / "quick-notebooks"
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


def test_the_quick_notebooks_the_tests_executed_are_clean():
    notebooks, problems = _scan(QUICK_NOTEBOOKS)
    if not notebooks:
        pytest.skip("no notebook executed in quick mode yet (tests/test_notebooks.py writes build/quick-notebooks/)")
    assert problems == []


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
    helps = subprocess.run([sys.executable, "-m", "rkstudy", "--help"], capture_output=True, text=True, check=True)
    commands = helps.stdout.split("{", 1)[1].split("}", 1)[0].split(",")
    assert len(commands) >= 10
    for command in commands:
        out = subprocess.run([sys.executable, "-m", "rkstudy", command, "--help"], capture_output=True, text=True)
        assert out.returncode == 0 and not seeds.search(out.stdout), command
        assert not READER_PROBLEMS["an absolute path of the machine that ran it"].search(out.stdout), command
