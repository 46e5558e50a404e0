"""`make reproduce` orchestration (rkstudy.tables.reproduce) in a temporary git repository, with a fake
notebook runner that writes what a notebook would: no real notebook runs here."""

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from rkstudy.errors import Failed, UsageError
from rkstudy.tables import reproduce, results


def git(repo, *args):
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def notebook(study):
    return json.dumps({"cells": [{"cell_type": "code", "metadata": {"tags": ["parameters"]}, "source": "QUICK = True"},
                                 {"cell_type": "code", "metadata": {}, "source": f'study = Study("{study}", QUICK)'}],
                       "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


STUDIES = {"00_alpha": "alpha", "01_beta": "beta"}
MINUTES = {"00_alpha": 2.0, "01_beta": 5.0, "walker": 0.5}


def row(commit, **values):
    return {**values, "rkstudy_version": "0.1.0", "commit": commit, "toolkit_version": "rknn-toolkit2 2.5.0",
            "target": "none", "where": "host", "date": "2026-12-01", "machine_cpu": "AMD EPYC",
            "machine_isa": "avx512", "machine_threads": 1, "numerics_pinned": "avx2"}


@pytest.fixture
def repo(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    for stem, study in STUDIES.items():
        (repo / "notebooks").mkdir(exist_ok=True)
        (repo / "notebooks" / f"{stem}.ipynb").write_text(notebook(study))
    (repo / "code.py").write_text("x = 1\n")
    (repo / ".gitignore").write_text("build/\n")
    results.write_table("alpha", "sweep", [row("0" * 12, frames=64, regtask=10)], root=repo / "results")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "start")
    monkeypatch.setattr(results, "commit", lambda: head(repo))
    return repo


def head(repo):
    return git(repo, "rev-parse", "--short=12", "HEAD")


class FakeRunner:
    """Runs nothing: for each command, what its notebook or benchmark would write, and the minutes it
    takes on a fake clock. `fail` names steps that exit 1, `silent` ones that write no table."""

    def __init__(self, repo, fail=(), silent=(), regtask=10):
        self.repo, self.fail, self.silent, self.regtask = repo, set(fail), set(silent), regtask
        self.commands, self.logs, self.now = [], [], 0.0

    def clock(self):
        return self.now

    def __call__(self, command, cwd, log=None):
        assert cwd == self.repo
        self.commands.append(command)
        self.logs.append(log)
        return self.step(command), 1.5

    def step(self, command):
        if command[1:3] == ["-m", "papermill"]:
            stem = command[-2].split("/")[-1].removesuffix(".ipynb")
            assert command[-4:-2] == ["QUICK", "False"] and command[-1] == f"results/notebooks/{stem}.ipynb"
        elif command[-2:] == ["bench", "walker"]:
            stem = "walker"
        else:
            assert command[-2:] == ["results", "index"]
            (self.repo / "results" / "README.md").write_text("index\n")
            return 0
        return self.advance(stem)

    def advance(self, stem):
        self.now += MINUTES[stem] * 60
        if stem in self.fail:
            return 1
        if stem not in self.silent:
            study, table = ("benchmarks", "walker") if stem == "walker" else (STUDIES[stem], "sweep")
            results.write_table(study, table, [row(head(self.repo), frames=64, regtask=self.regtask)],
                                root=self.repo / "results")
        return 0


def run(repo, runner, *names, restart=False):
    return reproduce.reproduce(repo, names, runner=runner, clock=runner.clock, restart=restart)


def table(repo):
    return {r["step"]: r for r in results.read_table(repo / "results" / "benchmarks" / "reproduce.csv")}


def ran(runner):
    return [c[-2].split("/")[-1] if "papermill" in c else " ".join(c[-2:]) for c in runner.commands]


def test_a_full_run_times_each_step_and_ends_with_the_index_and_the_diff(repo, capsys):
    runner = FakeRunner(repo, regtask=11)
    assert run(repo, runner) == 0
    assert ran(runner) == ["00_alpha.ipynb", "01_beta.ipynb", "bench walker", "results index"]
    assert runner.commands[0] == [sys.executable, "-m", "papermill", "--cwd", "notebooks", "--kernel", "rkstudy", "-p",
                                  "QUICK", "False", "notebooks/00_alpha.ipynb", "results/notebooks/00_alpha.ipynb"]
    rows = table(repo)
    assert {k: (r["minutes"], r["carried_from"], r["commit"]) for k, r in rows.items()} == {
        "00_alpha": ("2", "", head(repo)), "01_beta": ("5", "", head(repo)), "walker": ("0.5", "", head(repo)),
        "total": ("7.5", "", head(repo))}
    assert rows["total"]["studies"] == "3 of 3 steps at this commit, up to 1 at once"
    assert rows["total"]["summed_minutes"] == "7.5"  # a time of its own, so a rerun's diff reports it, never fails
    assert rows["00_alpha"]["where"] == "host" and rows["00_alpha"]["peak_gb"] == "1.5"
    assert runner.logs == [None] * 4  # one job: the output goes to the terminal
    out = capsys.readouterr().out
    assert "reproduce [1/3] 00_alpha (alpha): running, no earlier run recorded" in out
    assert ("reproduce [2/3] 01_beta (beta): finished in 5.0 min, peak 1.5 GiB -> results/benchmarks/reproduce.csv"
            in out)
    assert f"3 of 3 finished at {head(repo)} (7.5 min of wall time, 7.5 summed over steps)" in out
    assert out.splitlines()[-1].startswith("results check: 4 tables, 7 rows in 3 studies: every row and figure is "
                                           "stamped")
    state = json.loads((repo / "build" / "reproduce" / "state.json").read_text())
    assert state["commit"] == git(repo, "rev-parse", "HEAD") and sorted(state["steps"]) == ["00_alpha", "01_beta",
                                                                                            "walker"]
    diff = (repo / "results" / "benchmarks" / "reproduce_diff.md").read_text()  # HEAD's tables against the new
    assert diff.startswith(f"# Results diff: the tables committed at {head(repo)} (A) against this run's (B)")
    assert "| (the one row) | `regtask` | exact (by name), exact | 10 | 11 | +1 (+10.00%) |" in diff
    assert "Tables only in B" in diff and "`beta/sweep`" in diff


def test_an_interrupted_run_continues_from_the_first_step_not_finished(repo, capsys):
    runner = FakeRunner(repo, fail={"01_beta"})
    with pytest.raises(Failed, match=r"01_beta \(beta\) stopped after 5.0 min \(exit 1\); fix it and run "
                                     "`make reproduce` again to continue from it"):
        run(repo, runner)
    assert ran(runner) == ["00_alpha.ipynb", "01_beta.ipynb"]
    assert table(repo)["total"]["studies"].startswith("1 of 3 steps at this commit")
    again = FakeRunner(repo)
    assert run(repo, again) == 0
    assert ran(again) == ["01_beta.ipynb", "bench walker", "results index"]
    out = capsys.readouterr().out
    assert f"reproduce: 00_alpha (alpha) finished at {head(repo)} in 2.0 min; skipped" in out
    assert {k: r["minutes"] for k, r in table(repo).items()} == {"00_alpha": "2", "01_beta": "5", "walker": "0.5",
                                                                "total": "7.5"}
    nothing = FakeRunner(repo)
    assert run(repo, nothing) == 0 and nothing.commands == []  # all finished at this commit
    restarted = FakeRunner(repo)
    assert run(repo, restarted, restart=True) == 0 and len(restarted.commands) == 4


def test_a_step_counts_as_finished_only_when_it_wrote_its_tables_at_this_commit(repo):
    with pytest.raises(Failed, match=r"00_alpha \(alpha\) ran to the end but no table under results/alpha/ was "
                                     "written; it does not count as finished"):
        run(repo, FakeRunner(repo, silent={"00_alpha"}))
    assert reproduce.read_state(repo, git(repo, "rev-parse", "HEAD")) == {}

    class OtherCommit(FakeRunner):
        def __call__(self, command, cwd, log=None):
            code = super().__call__(command, cwd, log)
            results.write_table("alpha", "other", [row("0123456789ab", frames=1)], root=self.repo / "results")
            return code

    with pytest.raises(Failed, match="results/alpha/other.csv is stamped 0123456789ab, not"):
        run(repo, OtherCommit(repo))


def test_a_finished_run_fails_when_its_tables_do_not_pass_the_check(repo, capsys):
    class Unstamped(FakeRunner):
        def __call__(self, command, cwd, log=None):
            if command[-2:] == ["bench", "walker"]:
                (self.repo / "results" / "beta" / "bare.csv").write_text("frames\n1\n")
            return super().__call__(command, cwd, log)

    assert run(repo, Unstamped(repo)) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-2].startswith("results/beta/bare.csv: unstamped: no rkstudy_version")
    assert out[-1].startswith("results check: 1 problems in 5 tables")


def test_a_new_commit_starts_over_and_a_selection_runs_only_what_it_names(repo, capsys):
    first = head(repo)
    run(repo, FakeRunner(repo))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "tables")
    (repo / "code.py").write_text("x = 2\n")
    git(repo, "commit", "-qam", "code")
    runner = FakeRunner(repo)
    assert run(repo, runner, "beta") == 0
    assert ran(runner) == ["01_beta.ipynb", "results index"]
    rows = table(repo)
    assert (rows["01_beta"]["commit"], rows["01_beta"]["carried_from"], rows["01_beta"]["expected_minutes"]) == (
        head(repo), "", "5")
    # the steps not run at this commit keep the row (and stamp) of the run that timed them, marked carried
    assert (rows["00_alpha"]["commit"], rows["00_alpha"]["carried_from"]) == (first, "results/benchmarks/reproduce.csv")
    assert rows["total"]["minutes"] == "5" and rows["total"]["studies"].startswith("1 of 3 steps at this commit")
    assert f"running, expected 5 min (as run at {first})" in capsys.readouterr().out
    both = FakeRunner(repo)
    run(repo, both, "00_alpha,walker")
    assert ran(both) == ["00_alpha.ipynb", "bench walker", "results index"]


def test_selection_by_study_or_stem():
    Step = reproduce.ReproduceStep
    steps = [Step("00_alpha", ("alpha",), ()), Step("01_pair", ("beta", "gamma"), ()),
             Step("walker", ("benchmarks",), ())]
    assert [s.name for s in reproduce.select(steps, ["gamma 00_alpha"])] == ["00_alpha", "01_pair"]
    assert [s.name for s in reproduce.select(steps, ["walker,beta"])] == ["01_pair", "walker"]
    with pytest.raises(UsageError, match="no study or notebook 'delta' to reproduce; choose from 00_alpha, 01_pair"):
        reproduce.select(steps, ["delta"])


def test_it_refuses_a_tree_with_uncommitted_code_but_not_changed_tables(repo):
    (repo / "code.py").write_text("x = 3\n")
    runner = FakeRunner(repo)
    with pytest.raises(UsageError, match=r"uncommitted changes outside results/ \(code.py\): commit or stash them"):
        run(repo, runner)
    assert runner.commands == []
    git(repo, "checkout", "code.py")
    (repo / "results" / "alpha" / "sweep.csv").write_text("changed\n")
    assert run(repo, FakeRunner(repo)) == 0


def test_list_shows_what_is_finished_and_the_expected_minutes(repo, capsys):
    nb = repo / "results" / "notebooks" / "01_beta.ipynb"
    nb.parent.mkdir(parents=True)
    nb.write_text(json.dumps({"cells": [], "metadata": {"papermill": {"duration": 1234.5,
                                                                      "end_time": "2026-11-30T18:00:00"}}}))
    run(repo, FakeRunner(repo), "alpha")
    capsys.readouterr()
    assert reproduce.reproduce(repo, (), listing=True) == 0
    assert capsys.readouterr().out.splitlines() == [
        "[1/3] 00_alpha (alpha): finished at this commit in 2.0 min",
        "[2/3] 01_beta (beta): expected 21 min (papermill's time in results/notebooks/01_beta.ipynb, 2026-11-30)",
        "[3/3] walker (benchmarks): no earlier run recorded"]


def test_the_command_line_and_the_makefile_call_it():
    from pathlib import Path

    from rkstudy.cli import parser

    args = parser().parse_args(["reproduce", "--study", "kokoro_generator", "06_lint", "--restart"])
    assert args.study == ["kokoro_generator", "06_lint"] and args.restart and not args.listing
    makefile = (Path(__file__).resolve().parent.parent / "Makefile").read_text()
    assert "\t$(SCRATCH); $(PY) -m rkstudy reproduce --jobs $(JOBS) $(if $(STUDY),--study $(STUDY))\n" in makefile
    assert parser().parse_args(["reproduce", "--jobs", "2"]).jobs == 2


class SideBySide(FakeRunner):
    """Each notebook waits (up to 5 s) until the other one has started: it finishes only if both
    really run at once. The fake clock is the real one."""

    def __init__(self, repo):
        super().__init__(repo)
        self.started = {stem: threading.Event() for stem in STUDIES}

    def clock(self):
        return time.monotonic()

    def advance(self, stem):
        if stem in self.started:
            self.started[stem].set()
            other = next(s for s in STUDIES if s != stem)
            if not self.started[other].wait(5):
                return 3
        return super().advance(stem)


def test_two_jobs_run_the_longest_first_side_by_side_with_their_output_in_logs(repo, capsys):
    nb = repo / "results" / "notebooks" / "01_beta.ipynb"
    nb.parent.mkdir(parents=True)
    nb.write_text(json.dumps({"cells": [], "metadata": {"papermill": {"duration": 1234.5}}}))
    runner = SideBySide(repo)
    assert reproduce.reproduce(repo, (), runner=runner, clock=runner.clock, jobs=2, memory_gb=24) == 0
    # walker and alpha have no recorded time, so they go first; beta (21 min last time) next
    assert ran(runner)[:3] == ["00_alpha.ipynb", "bench walker", "01_beta.ipynb"]
    assert runner.logs[:3] == [repo / "build" / "reproduce" / "logs" / f"{s}.log" for s in ("00_alpha", "walker",
                                                                                            "01_beta")]
    rows = table(repo)
    assert rows["total"]["studies"].startswith("3 of 3 steps at this commit, up to 2 at once")
    assert float(rows["total"]["minutes"]) < 0.5  # the wall time of this run, not the fake minutes
    assert "output in build/reproduce/logs/01_beta.log" in capsys.readouterr().out


def test_a_second_job_waits_when_the_recorded_peaks_do_not_fit_in_memory(repo):
    # no peak recorded: 8 GiB each, 16 GiB > 0.9 x 12 GiB, so one at a time; the side-by-side
    # notebooks would then wait for each other in vain and exit 3
    runner = SideBySide(repo)
    with pytest.raises(Failed, match=r"00_alpha \(alpha\) stopped after .* min \(exit 3\)"):
        reproduce.reproduce(repo, ("alpha", "beta"), runner=runner, clock=runner.clock, jobs=2, memory_gb=12)
    Step = reproduce.ReproduceStep
    assert reproduce.fits(Step("b", (), ()), [Step("a", (), ())], {"a": 3.0, "b": 5.0}, 12)
    assert not reproduce.fits(Step("b", (), ()), [Step("a", (), ())], {"a": 3.0}, 12)


def test_a_step_that_does_not_fit_lets_a_smaller_one_take_the_slot():
    # the peaks of the run at f77f7c4 on this 2-core, 23.5 GiB machine (21.2 GiB for steps side by side):
    # beside Kokoro neither lint nor the levers fit, the port study does; beside lint, the levers do
    peaks = {"03": 14.18, "06": 12.92, "08": 7.64, "04": 11.39, "07": 4.12, "01": 2.75}
    step = {name: reproduce.ReproduceStep(name, (), ()) for name in peaks}
    pending = [step[n] for n in ("06", "08", "04", "07", "01")]
    assert reproduce.next_fitting(pending, [step["03"]], peaks, 23.5) is step["07"]
    assert reproduce.next_fitting(pending[1:], [step["06"]], peaks, 23.5) is step["08"]
    assert reproduce.next_fitting(pending[2:], [step["06"]], peaks, 23.5) is step["07"]
    assert reproduce.next_fitting(pending, [], peaks, 23.5) is step["06"]
    assert reproduce.next_fitting(pending[:3], [step["03"]], peaks, 23.5) is None


def test_every_notebook_defaults_to_quick_mode_and_reads_the_committed_tables_only():
    """papermill's `-p QUICK False` needs a `parameters` cell, and `pytest --nbmake notebooks/` (which
    passes no parameters) must run each notebook in quick mode, whose tables go to build/quick-results."""
    from rkstudy.paths import NOTEBOOKS
    from rkstudy.tables import provenance

    notebooks = sorted(NOTEBOOKS.glob("*.ipynb"))
    assert len(notebooks) >= 8
    for nb in notebooks:
        cells = json.loads(nb.read_text())["cells"]
        params = [c for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])]
        assert len(params) == 1, f"{nb.name}: one cell tagged `parameters`"
        assert "QUICK = True" in "".join(params[0]["source"]).splitlines(), nb.name
        for cell in provenance.code_cells(nb):
            assert "results_root(quick=False)" not in cell and "root=RESULTS" not in cell, nb.name
            for line in cell.splitlines():
                if "RESULTS" in line:  # the committed tables, read (a script's table)
                    assert any(w in line for w in ("import RESULTS", "read_table(")), (nb.name, line)


def test_the_expected_wall_time_plays_the_schedule_forward_with_the_memory_rule():
    """Two large steps that do not fit beside each other run one after the other, each beside the small
    ones; the schedule played forward says when the last one ends (the figure printed before a run)."""
    Step = reproduce.ReproduceStep
    big_a, big_b, small_c, small_d = Step("a", (), ()), Step("b", (), ()), Step("c", (), ()), Step("d", (), ())
    minutes = {"a": 20.0, "b": 15.0, "c": 12.0, "d": 12.0}
    peaks = {"a": 15.0, "b": 15.0, "c": 1.0, "d": 1.0}
    order = reproduce.order([small_c, big_b, small_d, big_a], {k: (v, "") for k, v in minutes.items()}, 2)
    assert [s.name for s in order] == ["a", "b", "c", "d"]
    # b does not fit beside a: a with c (0-12), then d (12-24); b waits for a (20) and runs beside d: 35
    assert reproduce.makespan(order, minutes, peaks, memory_gb=20, jobs=2) == 35.0
    # with room for both, a and b run side by side from the start: c 15-27, d 20-32
    assert reproduce.makespan(order, minutes, peaks, memory_gb=40, jobs=2) == 32.0


def test_steps_side_by_side_share_the_cores_as_their_thread_count(repo, monkeypatch):
    """Two jobs on two cores: each step starts with one thread per library, the parent's environment is
    as it was afterwards, and a count the caller set is kept."""
    for name in reproduce.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert reproduce.shared_threads(1, cores=2) == {}
    assert reproduce.shared_threads(2, cores=2) == dict.fromkeys(reproduce.THREAD_VARIABLES, "1")
    assert reproduce.shared_threads(2, cores=8)["OMP_NUM_THREADS"] == "4"
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert "OMP_NUM_THREADS" not in reproduce.shared_threads(2, cores=2)
    monkeypatch.delenv("OMP_NUM_THREADS")

    seen = []

    class Watching(SideBySide):
        def __call__(self, command, cwd, log=None):
            seen.append({name: os.environ.get(name) for name in reproduce.THREAD_VARIABLES})
            return super().__call__(command, cwd, log)

    monkeypatch.setattr(reproduce.os, "cpu_count", lambda: 2)
    runner = Watching(repo)
    assert reproduce.reproduce(repo, (), runner=runner, clock=runner.clock, jobs=2, memory_gb=24) == 0
    steps = [s for s, c in zip(seen, runner.commands) if c[-2:] != ["results", "index"]]
    assert steps and all(s == dict.fromkeys(reproduce.THREAD_VARIABLES, "1") for s in steps)
    assert all(os.environ.get(name) is None for name in reproduce.THREAD_VARIABLES)


def test_every_step_runs_with_its_numerics_pinned_and_a_callers_choice_is_kept(repo, monkeypatch):
    """torch's and numpy's kernels are held to the AVX2 code path in every step that makes tables (where the
    host is x86), and a variable the caller set wins; the parent's environment is as it was afterwards."""
    from rkstudy import process

    monkeypatch.setattr(process, "pinned_environment", lambda: dict(process.PINNED_NUMERICS))
    monkeypatch.setattr(reproduce, "pinned_environment", lambda: dict(process.PINNED_NUMERICS))
    for name in process.PINNED_NUMERICS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Zen")
    seen = []

    class Watching(FakeRunner):
        def __call__(self, command, cwd, log=None):
            seen.append({name: os.environ.get(name) for name in process.PINNED_NUMERICS})
            return super().__call__(command, cwd, log)

    runner = Watching(repo)
    assert run(repo, runner) == 0
    expected = {**process.PINNED_NUMERICS, "OPENBLAS_CORETYPE": "Zen"}
    steps = [s for s, c in zip(seen, runner.commands) if c[-2:] != ["results", "index"]]
    assert len(steps) == 3 and all(s == expected for s in steps)
    assert all(os.environ.get(name) is None for name in process.PINNED_NUMERICS if name != "OPENBLAS_CORETYPE")
    assert process.numerics_pinned(expected).startswith("ATEN_CPU_CAPABILITY=avx2 ")  # partial: spelled out
    assert process.numerics_pinned(process.PINNED_NUMERICS) == "avx2"


def test_a_finished_step_removes_the_figures_its_run_did_not_draw(repo, capsys):
    """A figure under a study's figures/ that its run did not list in headlines.json (a retracted plot) is
    deleted when the step finishes, so neither the tree nor the index keeps it; the drawn one stays."""
    figures = repo / "results" / "alpha" / "figures"
    figures.mkdir(parents=True)
    (figures / "retracted.png").write_bytes(b"\x89PNG old")

    class Drawing(FakeRunner):
        def advance(self, stem):
            code = super().advance(stem)
            if stem == "00_alpha":
                (figures / "sweep.png").write_bytes(b"\x89PNG new")
                results.record_headlines("alpha", {}, root=self.repo / "results",
                                         figures={"sweep": results.file_digest(figures / "sweep.png")})
            return code

    runner = Drawing(repo)
    run(repo, runner, "alpha")
    assert sorted(p.name for p in figures.iterdir()) == ["sweep.png"]
    assert "reproduce: 00_alpha (alpha) drew no results/alpha/figures/retracted.png: removed" in capsys.readouterr().out


def test_a_run_that_would_fill_the_disk_is_refused_before_any_step_starts(repo):
    # the last fresh-clone run filled a shared disk after two hours: two steps failed inside the toolkit on ENOSPC
    runner = FakeRunner(repo)
    cache = repo / "build" / "cache"
    with pytest.raises(UsageError, match=r"need about 35 GB free for the build cache at .*build/cache .* 12\.0 GB "
                                         r"are free: remove old clones' build/cache folders, or set RKSTUDY_CACHE"):
        reproduce.reproduce(repo, (), runner=runner, clock=runner.clock, disk=(cache, 12.0))
    assert runner.commands == [] and not (repo / "results" / "benchmarks").exists()
    assert reproduce.reproduce(repo, (), runner=runner, clock=runner.clock, disk=(cache, 40.0)) == 0
    # what is left at this commit needs its share of the recorded minutes, and nothing once all is finished
    steps = reproduce.steps(repo)
    prior = {s.name: (m, "") for s, m in zip(steps, (10.0, 30.0, 0.0))}
    assert reproduce.disk_needed_gb(steps[1:2], steps, prior) == pytest.approx(35.0 * 30 / 40)
    assert reproduce.disk_needed_gb(steps, steps, {}) == 35.0 and reproduce.disk_needed_gb([], steps, prior) == 0.0
    assert reproduce.free_disk_gb(repo / "not" / "made" / "yet") > 0
