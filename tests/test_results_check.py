"""`rkstudy results check` on synthetic result trees in a temporary git repository: each kind of
problem it reports, and a clean tree that passes."""

import json
import subprocess

import pytest

from rkstudy.tables import provenance, results


def git(repo, *args):
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def notebook(*cells):
    return json.dumps({"cells": [{"cell_type": "code", "metadata": {}, "source": c} for c in cells],
                       "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


def write(repo, rel, text):
    path = repo / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


MACHINE = {"machine_cpu": "AMD EPYC", "machine_isa": "avx512", "machine_threads": 1, "numerics_pinned": "avx2"}


def row(commit, where="host", target="none", **values):
    return {**values, "rkstudy_version": "0.1.0", "commit": commit, "toolkit_version": "rknn-toolkit2 2.5.0",
            "target": target, "where": where, "date": "2026-12-01", **MACHINE}


def table(repo, study, name, rows):
    results.write_table(study, name, rows, root=repo / "results")


@pytest.fixture
def repo(tmp_path):
    """A project with one family (alpha), its notebook, a shared module it imports, one it does not,
    a child module it starts by name, and data; one commit, whose short hash the tables carry."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    write(repo, "rkstudy/__init__.py", "__version__ = '0.1.0'\n")
    write(repo, "rkstudy/shared.py", "def helper():\n    return 1\n")
    write(repo, "rkstudy/child.py", "X = 1\n")
    write(repo, "rkstudy/unused.py", "Y = 2\n")
    write(repo, "rkstudy/plotting.py", "Z = 3\n")
    write(repo, "rkstudy/cli.py", "def main(argv):\n    from . import unused\n")  # the dispatcher
    write(repo, "rkstudy/families/__init__.py", "")
    write(repo, "rkstudy/families/alpha/__init__.py", "")
    write(repo, "rkstudy/families/alpha/study.py",
          "import subprocess\nfrom ... import shared\n\n\ndef run():\n"
          "    subprocess.run(['python', '-m', 'rkstudy.child'])\n")
    write(repo, "notebooks/00_alpha.ipynb", notebook("QUICK = True",
                                                     "%matplotlib inline\nfrom rkstudy import plotting\n"
                                                     "study = Study(\"alpha\", QUICK)",
                                                     "if BOARD:\n    from rkstudy.cli import main"))
    write(repo, "data/texts/a.txt", "a text\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "start")
    return repo


def head(repo):
    return git(repo, "rev-parse", "--short=12", "HEAD")


def commit_change(repo, rel, text, message="change"):
    write(repo, rel, text)
    git(repo, "add", rel)
    git(repo, "commit", "-q", "-m", message)


def kinds(repo):
    problems, _ = provenance.check(repo)
    return sorted(p.kind for p in problems), problems


def test_a_clean_tree_passes(repo, capsys):
    c = head(repo)
    table(repo, "alpha", "sweep", [row(c, frames=64, snr_db=60.1, engine_bytes="", engine_mb="", where="simulator",
                                       target="rk3588"),
                                   row(c, frames=128, snr_db="", engine_bytes=2_000_000, engine_mb=2.0)])
    table(repo, "alpha", "gate", [row(c, gate="g", measured=60.1, threshold=30, unit="dB", snr_db=60.1,
                                      where="fp32")])
    write(repo, "results/alpha/headlines.json", json.dumps({"study": "alpha", "commit": c, "headlines": {}}))
    assert provenance.main(repo) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out == ["results check: 2 tables, 3 rows in 1 studies: every row and figure is stamped by a clean "
                   "ancestor commit whose code is HEAD's, on a named machine"]


def test_a_table_made_before_rows_named_their_machine_says_so(repo):
    """An older table has the stamp but not the machine columns: the check names it, once per study, and
    goes on checking its commits (it does not stop at the missing columns)."""
    c = head(repo)
    old = {k: v for k, v in row(c, frames=64).items() if k not in results.MACHINE}
    write(repo, "results/alpha/old.csv", ",".join(old) + "\n" + ",".join(map(str, old.values())) + "\n")
    table(repo, "alpha", "new", [row(c, frames=64), {**row(c, frames=128), "machine_cpu": ""}])
    got, problems = kinds(repo)
    assert got == ["no-machine", "no-machine"]
    study = next(p for p in problems if p.path == "results/alpha")
    assert study.message.startswith("1 of 2 tables (old) have no machine_cpu, machine_isa, machine_threads, "
                                    "numerics_pinned columns: made before rows named the machine")
    assert next(p for p in problems if p.path.endswith("new.csv")).message.startswith("rows 2: no machine recorded")
    write(repo, "results/alpha/old.csv", ",".join(old) + "\n" + ",".join(map(str, {**old, "commit": "abc"}.values())))
    assert "unknown-commit" in kinds(repo)[0]  # its commit is still checked


def _png(repo, study, name, stamp=True):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1])
    root = repo / "results"
    if stamp:
        path = results.save_figure(fig, study, name, root=root)
    else:
        path = root / study / "figures" / f"{name}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path)
    plt.close(fig)
    return path


def test_figures_are_checked_like_tables(repo, monkeypatch):
    """A figure is stamped by the run that drew it, and that run is the one that wrote the study's headlines
    (which list every figure it drew): an unstamped, stale, orphaned or missing figure is a problem."""
    c = head(repo)
    monkeypatch.setattr(results, "commit", lambda: c)
    table(repo, "alpha", "sweep", [row(c, frames=64)])
    drawn = _png(repo, "alpha", "sweep")
    orphan = _png(repo, "alpha", "retracted")
    results.record_headlines("alpha", {}, root=repo / "results", figures={"sweep": results.file_digest(drawn),
                                                                          "gone": "0" * 64})
    got, problems = kinds(repo)
    assert got == ["figure-missing", "figure-orphan"]
    assert next(p for p in problems if p.kind == "figure-orphan").path == "results/alpha/figures/retracted.png"
    orphan.unlink()
    results.record_headlines("alpha", {}, root=repo / "results", figures={"sweep": results.file_digest(drawn)})
    assert kinds(repo)[0] == []
    drawn.write_bytes(drawn.read_bytes() + b"\0")  # replaced since the run drew it
    assert kinds(repo)[0] == ["figure-stale"]
    _png(repo, "alpha", "sweep", stamp=False)
    got, problems = kinds(repo)
    assert got == ["figure-unstamped"] and "which run drew it is unknown" in problems[0].message


def test_a_run_that_listed_no_figures_leaves_orphans_to_the_notebooks(repo):
    """Headlines written before runs listed their figures: a figure no notebook of the study names is an
    orphan all the same (the committed tree's retracted quantization figure), the others are unstamped."""
    c = head(repo)
    table(repo, "alpha", "sweep", [row(c, frames=64)])
    write(repo, "results/alpha/headlines.json", json.dumps({"study": "alpha", "commit": c, "headlines": {}}))
    _png(repo, "alpha", "alpha", stamp=False)  # a name the notebook holds as a string
    _png(repo, "alpha", "quantization_snr_vs_int8_share", stamp=False)
    got, problems = kinds(repo)
    assert got == ["figure-orphan", "figure-unstamped"]
    assert next(p for p in problems if p.kind == "figure-orphan").message.startswith(
        "no notebook of alpha names a figure 'quantization_snr_vs_int8_share'")


def test_a_figure_stamped_by_an_older_commit_makes_its_study_stale(repo, monkeypatch):
    c = head(repo)
    monkeypatch.setattr(results, "commit", lambda: c)
    table(repo, "alpha", "sweep", [row(c, frames=64)])
    drawn = _png(repo, "alpha", "sweep")
    results.record_headlines("alpha", {}, root=repo / "results", figures={"sweep": results.file_digest(drawn)})
    commit_change(repo, "rkstudy/plotting.py", "Z = 4\n")
    got, problems = kinds(repo)
    assert got == ["stale"] and "rkstudy/plotting.py" in problems[0].files


def test_unstamped_table_and_row(repo):
    c = head(repo)
    write(repo, "results/alpha/bare.csv", "frames,snr_db\n64,60.1\n")
    table(repo, "alpha", "sweep", [row(c, frames=64), row("", frames=128)])
    got, problems = kinds(repo)
    assert got == ["unstamped", "unstamped"]
    assert {p.path for p in problems} == {"results/alpha/bare.csv", "results/alpha/sweep.csv"}
    assert "rows 2: no commit" in next(p.message for p in problems if p.path.endswith("sweep.csv"))


def test_dirty_unknown_and_not_ancestor_commits(repo):
    c = head(repo)
    git(repo, "checkout", "-q", "-b", "other")
    commit_change(repo, "notes.txt", "elsewhere\n")
    elsewhere = head(repo)
    git(repo, "checkout", "-q", "main")
    table(repo, "alpha", "a", [row(c + "-dirty", frames=1)])
    table(repo, "alpha", "b", [row("0123456789ab", frames=1)])
    table(repo, "alpha", "c", [row(elsewhere, frames=1)])
    table(repo, "alpha", "d", [row("unknown", frames=1)])
    _, problems = kinds(repo)
    by_table = {p.path.rsplit("/", 1)[1]: p.kind for p in problems if p.kind != "mixed-commits"}
    assert by_table == {"a.csv": "dirty", "b.csv": "unknown-commit", "c.csv": "not-ancestor",
                        "d.csv": "unknown-commit"}
    mixed = [p for p in problems if p.kind == "mixed-commits"]
    assert len(mixed) == 1 and "stamped by 4 commits" in mixed[0].message


def test_one_study_one_commit_except_carried_rows(repo):
    first = head(repo)
    commit_change(repo, "README.md", "readme\n")  # not producing code: nothing goes stale
    second = head(repo)
    table(repo, "alpha", "a", [row(second, frames=1)])
    table(repo, "alpha", "b", [row(first, frames=1)])
    got, problems = kinds(repo)
    assert got == ["mixed-commits"]
    assert first in problems[0].message and second in problems[0].message
    # the same older row, carried and saying so, is excepted
    table(repo, "alpha", "b", [row(first, frames=1, carried_from="results/alpha/b.csv"),
                               row(second, frames=2, carried_from="")])
    assert kinds(repo)[0] == []
    # but a carried row's commit is still checked
    table(repo, "alpha", "b", [row("0123456789ab", frames=1, carried_from="results/alpha/b.csv")])
    got, problems = kinds(repo)
    assert got == ["unknown-commit"] and "rows 1" in problems[0].message


@pytest.mark.parametrize("changed", ["rkstudy/shared.py", "rkstudy/families/alpha/study.py", "rkstudy/child.py",
                                     "rkstudy/plotting.py", "rkstudy/__init__.py", "data/texts/a.txt"])
def test_stale_when_producing_code_changed(repo, changed):
    c = head(repo)
    table(repo, "alpha", "a", [row(c, frames=1)])
    commit_change(repo, changed, "# changed\n")
    got, problems = kinds(repo)
    assert got == ["stale"]
    assert problems[0].files == (changed,) and changed in problems[0].message and c in problems[0].message


def test_stale_when_the_notebook_changed_not_when_other_code_did(repo):
    c = head(repo)
    table(repo, "alpha", "a", [row(c, frames=1)])
    commit_change(repo, "rkstudy/unused.py", "Y = 3\n")
    assert kinds(repo)[0] == []
    commit_change(repo, "notebooks/00_alpha.ipynb", notebook("QUICK = True", "study = Study(\"alpha\", QUICK)\n1"))
    got, problems = kinds(repo)
    assert got == ["stale"] and problems[0].files == ("notebooks/00_alpha.ipynb",)


def test_import_closure_follows_relative_imports_notebook_cells_and_child_modules(repo):
    files = provenance.producing_code(repo, "alpha")
    # the command-line dispatcher counts, but not every command it could import (rkstudy/unused.py)
    assert files == ["data", "notebooks/00_alpha.ipynb", "rkstudy/__init__.py", "rkstudy/child.py", "rkstudy/cli.py",
                     "rkstudy/families/__init__.py", "rkstudy/families/alpha", "rkstudy/families/alpha/__init__.py",
                     "rkstudy/families/alpha/study.py", "rkstudy/plotting.py", "rkstudy/shared.py"]
    assert provenance.producing_code(repo, "nobody") is None


def test_a_study_nothing_writes(repo):
    table(repo, "orphan", "a", [row(head(repo), frames=1)])
    got, problems = kinds(repo)
    assert got == ["no-producer"] and problems[0].path == "results/orphan"


@pytest.mark.parametrize(("stamp", "values", "study", "says"), [
    ({"where": "host"}, {"sim_worst_snr_db": 60.0}, "alpha", "where=host beside simulator output in sim_worst_snr_db"),
    ({"where": "fp32"}, {"simulator_nonfinite": 0}, "alpha", "where=fp32 beside simulator output"),
    ({"where": "fp32", "target": "rk3588"}, {"snr_db": 120.0}, "alpha", "where=fp32 with target=rk3588"),
    ({"where": "simulator", "target": "none"}, {"snr_db": 60.0}, "alpha", "where=simulator with target=none"),
    ({"where": "board", "target": "rk3588"}, {"rtf": 0.1}, "alpha", "where=board outside results/board/"),
    ({"where": "replay", "target": "rk3588"}, {"rtf": 0.1}, "alpha", "where=replay outside results/board/"),
    ({"where": "npu", "target": "rk3588"}, {"rtf": 0.1}, "alpha", "where='npu' is none of"),
])
def test_where_that_disagrees_with_the_runner(repo, stamp, values, study, says):
    table(repo, study, "a", [row(head(repo), **stamp, **values)])
    got, problems = kinds(repo)
    assert got == ["where"] and says in problems[0].message


def test_where_rules_pass_what_a_runner_writes(repo):
    c = head(repo)
    table(repo, "alpha", "a", [row(c, where="simulator", target="rk3566", sim_worst_snr_db=60.0, sim_counts=3),
                               row(c, where="host", target="rk3588", sim_worst_snr_db="", sim_counts=0)])
    table(repo, "board", "alpha", [row(c, where="board", target="rk3588", rtf=0.1),
                                   row(c, where="replay", target="rk3566", rtf=0.2)])
    assert kinds(repo)[0] == []


@pytest.mark.parametrize(("values", "says"), [
    ({"engine_bytes": 104_857_600, "engine_mb": 100.0}, "engine_bytes=104857600 and engine_mb=100 "),  # MiB as MB
    ({"peak_gib": 2.65, "peak_gb": 2.65}, "peak_gib=2.65 and peak_gb=2.65 are one quantity"),   # GiB called GB
    ({"walk_s": 0.5, "walk_ms": 0.5}, "walk_s=0.5 and walk_ms=0.5"),
    ({"peak_mib": 1024, "peak_gib": 2}, "peak_mib=1024 and peak_gib=2"),
    ({"measured": 2.65, "unit": "GB", "converter_peak_gib": 2.65},
     "unit=GB for 2.65, which is converter_peak_gib (GiB)"),
    ({"measured": 12.5, "unit": "s", "walk_ms": 12.5}, "unit=s for 12.5, which is walk_ms (ms)"),
])
def test_unit_that_disagrees_with_the_scale(repo, values, says):
    table(repo, "alpha", "a", [row(head(repo), **values)])
    got, problems = kinds(repo)
    assert got == ["unit"] and says in problems[0].message


def test_units_that_convert_pass(repo):
    c = head(repo)
    table(repo, "alpha", "a", [row(c, engine_bytes=901_928_284, engine_mb=901.93, peak_gib=2.65, peak_gb=2.85,
                                   walk_s=0.0125, walk_ms=12.5, measured=2.85, unit="GB"),
                               row(c, engine_bytes=0, engine_mb=0, peak_gib="", peak_gb=1.0, walk_s=2, walk_ms=2000,
                                   measured=1.0, unit="GB")])
    assert kinds(repo)[0] == []


def test_benchmarks_are_one_table_per_run_and_board_rows_accumulate(repo):
    first = head(repo)
    write(repo, "rkstudy/tables/bench.py", "from . import shared\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "bench")
    second = head(repo)
    table(repo, "benchmarks", "walker", [row(second, value=0.02, unit="ms/window")])
    table(repo, "benchmarks", "make_test", [row(second, value=1200.0, unit="s")])
    table(repo, "board", "alpha", [row(first, where="board", target="rk3588", rtf=0.1),
                                   row(second, where="board", target="rk3588", rtf=0.1)])
    assert kinds(repo)[0] == []
    table(repo, "benchmarks", "elsewhere", [row(second, value=1.0, unit="s")])
    got, problems = kinds(repo)
    assert got == ["no-producer"] and problems[0].path == "results/benchmarks/elsewhere"


def test_one_line_per_problem_a_summary_and_json(repo, capsys):
    c = head(repo)
    write(repo, "results/alpha/bare.csv", "frames\n1\n")
    table(repo, "alpha", "a", [row(c + "-dirty", frames=1), row(c + "-dirty", frames=2)])
    assert provenance.main(repo) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[:-1] == [
        f"results/alpha/a.csv: dirty: rows 1-2 stamped {c}-dirty: made from a tree with uncommitted code; "
        "rerun them from a clean tree",
        "results/alpha/bare.csv: unstamped: no rkstudy_version, commit, toolkit_version, target, where, date "
        "column; write it with rkstudy.tables.results.write_table from stamped rows"]
    assert lines[-1] == "results check: 2 problems in 2 tables, 3 rows in 1 studies (dirty 1, unstamped 1)"
    assert provenance.main(repo, as_json=True) == 1
    got = json.loads(capsys.readouterr().out)
    assert (got["tables"], got["rows"]) == (2, 3)
    assert [p["kind"] for p in got["problems"]] == ["dirty", "unstamped"]


def test_the_command_line_has_it():
    from rkstudy.cli import parser

    args = parser().parse_args(["results", "check", "--json"])
    assert args.json and args.func.__name__ == "_cmd_results_check"


def test_the_committed_tables_pass():
    """The tree as committed: every table `make reproduce` wrote is stamped by a clean ancestor commit
    whose producing code is HEAD's, so changing a study's code without re-making its tables fails here."""
    from rkstudy.paths import REPO

    shallow = git(REPO, "rev-parse", "--is-shallow-repository")
    if shallow == "true":
        pytest.skip("a shallow clone lacks the commits the tables are stamped with: git fetch --unshallow")
    problems, counts = provenance.check(REPO)
    assert counts["tables"] >= 100 and counts["studies"] >= 11, counts
    assert not problems, "\n".join([p.line() for p in problems] + [provenance.summary(problems, counts)])


def test_import_closure_follows_a_registry_that_imports_its_modules_by_computed_names(tmp_path):
    """A rule registry (rkstudy.lint.rules) imports its modules by f-strings on __name__; a change to one of
    them changes what the study wrote, so the closure holds every module of that package."""
    files = {"rkstudy/__init__.py": "",
             "rkstudy/lint/__init__.py": 'import importlib\nRULES = f"{__name__}.rules"\n',
             "rkstudy/lint/rules/__init__.py": ('import importlib\nfor m in ("a", "b"):\n'
                                                '    importlib.import_module(f"{__name__}.{m}")\n'),
             "rkstudy/lint/rules/a.py": "", "rkstudy/lint/rules/b.py": "", "rkstudy/other/__init__.py": "",
             "rkstudy/other/c.py": ""}
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    got = provenance.import_closure(tmp_path, [("import rkstudy.lint", "rkstudy")])
    assert got == {"rkstudy/__init__.py", "rkstudy/lint/__init__.py", "rkstudy/lint/rules/__init__.py",
                   "rkstudy/lint/rules/a.py", "rkstudy/lint/rules/b.py"}
