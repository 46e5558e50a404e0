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

    def lines(n, text):
        return {"cell_type": "code", "source": [], "metadata": {}, "execution_count": 1,
                "outputs": [{"output_type": "stream", "name": "stdout", "text": [f"{text} {i}\n"]} for i in range(n)]}

    cells = [output(output_type="stream", name="stderr",
                    text=["/tmp/repro/.venv/lib/python3.11/site-packages/tqdm/auto.py:21: TqdmWarning: x\n"]),
             output(output_type="stream", name="stderr", text=["windows:  40%|####      | 4/10 [00:01<00:02]\r"]),
             output(output_type="execute_result", data={"text/plain": ["[{'graph': 'conv', 'width': 64}]"]}),
             {"cell_type": "markdown", "source": ["the seeds' figures"], "metadata": {}},
             output(output_type="display_data", data={"text/plain": ["<Markdown object>"],
                                                       "text/markdown": ["| a | b |\n|---|---|\n| 1 | 2 |"]}),
             output(output_type="stream", name="stdout", text=["seeded random weights, seed 0: ok\n"]),
             output(output_type="stream", name="stdout", text=['{\n "engine": null,\n "family": "piper_decoder"\n}\n']),
             output(output_type="stream", name="stdout", text=["[torch.onnx] Run decompositions... ✅\n"]),
             output(output_type="stream", name="stderr", text=[
                 "UserWarning: Constant folding - Only steps=1 can be constant folded (torch/onnx/utils.py:709)\n",
                 "W1205 00:30:35.763000 13864 torch/onnx/_internal/exporter/_registration.py:107] torchvision is "
                 "not installed\n"]),
             output(output_type="stream", name="stderr", text=["AbortPredicted: the toolkit is expected to refuse "
                                                               "this graph (rkstudy/families/x/producer.py:252)\n"]),
             lines(9, "Piper decoder 93-frame window, rk3588: search"),  # a progress log
             lines(5, "wrote CPU_plan.wav")]  # one summary line per synthesis
    path = tmp_path / "x.ipynb"
    path.write_text(json.dumps({"cells": cells}))
    found = reader_problems(path)
    assert [f.split(": ")[1] for f in found] == [
        "an absolute path of the machine that ran it", "a warning", "a progress bar",
        "a dict or list of dicts printed raw", "the reference documents by another name", "a JSON document printed raw",
        "an exporter's progress lines", "a warning", "a warning", "a progress log"]
    assert "cell 10: a progress log: 9 stdout outputs in a row" in found[-1]


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
    # the warning is still one (the scan names it, for its source to silence or explain), on one line, pathless
    assert [p.split(": ", 2)[1:] for p in clean] == [["a warning", "UserWarning: a study says something ("
                                                                   + clean[0].rpartition("(")[2]]]
    noisy = " ".join(reader_problems(_executed(tmp_path, recorded=False)))
    assert "a progress bar" in noisy and "an absolute path of the machine that ran it" in noisy


def _predating(notebook) -> str:
    """Why the committed executed `notebook` predates the code that would make it now (empty when it does not):
    the run that executed it (its studies' headlines name the commit) is older than the studies' producing code
    or than this check. Such a notebook is re-made by the next full `make reproduce`, not held to today's scan."""
    import json as _json

    from rkstudy.tables import provenance

    git = provenance.Git(REPO)
    if git.run("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        return "a shallow clone lacks the commits the runs are stamped with"
    studies = [s for s, nbs in provenance.notebook_studies(REPO).items() if f"notebooks/{notebook.name}" in nbs]
    for study in studies:
        headlines = REPO / "results" / study / "headlines.json"
        commit = _json.loads(headlines.read_text(encoding="utf-8")).get("commit", "") if headlines.is_file() else ""
        full = git.resolve(commit) if commit and not commit.endswith("-dirty") else None
        if full is None:
            return f"{study}'s run is stamped {commit or 'nothing'}"
        paths = [*(provenance.producing_code(REPO, study) or []), "tests/test_readers.py"]
        changed = git.changed(full, paths)
        if changed:
            return f"{study} was run at {commit}; {len(changed)} files of its code or this check changed since"
    return ""


@pytest.mark.parametrize("name", sorted(p.name for p in COMMITTED.glob("*.ipynb")))
def test_the_committed_executed_notebooks_read_as_a_paper(name):
    """What make reproduce keeps reads as a paper: no raw dumps, no progress logs, no warnings. A notebook
    executed before its code or this check changed is skipped (the next full re-make runs it again), and
    only then."""
    path = COMMITTED / name
    why = _predating(path)
    if why:
        pytest.skip(f"{name} predates the code: {why}")
    assert reader_problems(path) == []


@pytest.mark.notebooks
def test_the_notebooks_executed_in_this_test_run_read_as_a_paper():
    """The quick-mode notebooks `pytest --nbmake notebooks/` executed (notebooks/conftest.py keeps each copy,
    run as make reproduce runs it), checked in the same test run as the code that made them."""
    from rkstudy.paths import NOTEBOOKS, QUICK_NOTEBOOKS

    problems = []
    for source in sorted(NOTEBOOKS.glob("*.ipynb")):
        executed = QUICK_NOTEBOOKS / source.name
        assert executed.is_file() and executed.stat().st_mtime >= source.stat().st_mtime, (
            f"no quick-mode run of {source.name} newer than it in {QUICK_NOTEBOOKS}: run the notebooks first "
            "(`pytest --nbmake notebooks/`, the first step of `make test`)")
        problems += reader_problems(executed)
    assert problems == []


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


def test_known_warnings_silences_exactly_the_harmless_ones_it_names(caplog):
    """Each library warning KNOWN_WARNINGS names (with why it is harmless) is dropped where it is raised, a
    warning it does not name still reaches the reader, and the logger's filter goes with the block."""
    import logging
    import warnings

    from rkstudy.process import KNOWN_WARNINGS, known_warnings

    assert all(why for _, why in KNOWN_WARNINGS.values())
    messages = {
        "slice-folding": "Constant folding - Only steps=1 can be constant folded for opset >= 10 onnx::Slice op.",
        "traced-shape": "Converting a tensor to a Python float might cause the trace to be incorrect.",
        "weight-norm": "`torch.nn.utils.weight_norm` is deprecated in favor of `torch.nn.utils.parametrizations`.",
        "instance-norm-train": "ONNX export mode is set to TrainingMode.EVAL, but operator 'instance_norm' is set to "
                               "train=True. Exporting with train=True."}
    logger = logging.getLogger(KNOWN_WARNINGS["torchvision"][0].removeprefix("logger:"))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with known_warnings(*messages, "torchvision"):
            for text in messages.values():
                warnings.warn(text, UserWarning, stacklevel=1)
            warnings.warn("a warning nobody named", UserWarning, stacklevel=1)
            logger.warning("torchvision is not installed. Skipping torchvision::nms")
        logger.warning("after the block")
    assert [str(w.message) for w in seen] == ["a warning nobody named"]
    assert [r.getMessage() for r in caplog.records if r.name == logger.name] == ["after the block"]
    with pytest.raises(KeyError, match="not in rkstudy.process.KNOWN_WARNINGS"):
        with known_warnings("anything"):
            pass
