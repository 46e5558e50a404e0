"""`make reproduce` (`rkstudy reproduce`): every study in full mode from one clean commit, selectable
and resumable, with each study's minutes recorded.

The steps are the notebooks in notebooks/ (run with papermill, QUICK = False, the executed copy kept
under results/notebooks/), then the walker benchmark; after any of them, the results index is
regenerated and `rkstudy results diff` of HEAD's committed tables against the new ones is written to
results/benchmarks/reproduce_diff.md.

* Selectable: `--study kokoro_generator 01b_piper_decoder_stateful` (study names or notebook stems,
  or a comma list) runs those only.
* Resumable: a plain run skips the steps already finished at this commit (build/reproduce/state.json,
  keyed by the commit). A step counts as finished only when its notebook ran to the end and every
  study it makes has tables written by this run and stamped with this commit.
* Parallel where memory allows: `--jobs 2` runs two steps at once, longest expected first. Most of a
  study's time is one busy core (a compiler or simulator child, or onnxruntime on small windows), so
  two at a time on two cores nearly halve the wall time. A second step starts only when the peaks
  last recorded for it and for the running ones (each step's largest process, default 8 GiB when
  none is recorded) fit in nine tenths of the machine's memory; when the next in line does not
  fit, the longest one after it that does takes the slot. With more than one job, each
  step's output goes to build/reproduce/logs/<step>.log instead of the terminal, and each step gets
  its share of the cores as its thread count (shared_threads).
* Recorded: results/benchmarks/reproduce.csv has one row per step (a step not run at this commit
  keeps the row of the run that timed it, marked carried), with its wall minutes (under contention
  when steps ran side by side) and the peak of its largest process, and a total row: the wall time
  of this commit's invocations up to the last step each finished, summed (a resumed run adds its
  own; the time of a step that failed or was interrupted is not a reproduce's and is left out).
* Pinned: every step runs with rkstudy.process.pinned_environment() (a variable the caller set is kept),
  which holds torch's oneDNN/ATen/MKL and numpy's OpenBLAS and SIMD loops to their AVX2 code paths, so an
  AVX-512 host computes those as an AVX2-only one does; each row's `numerics_pinned` says so.
  onnxruntime and the simulator have no such switch (their moves between hosts are the diff's tolerances).
* Orphans removed: a figure under a study's figures/ that the study's run did not draw is deleted when
  the step finishes (rkstudy.tables.provenance.orphan_figures), so the index never embeds it.
* Checked: once every step is finished at this commit, `rkstudy results check` runs on the tree and
  its problems make the run fail (exit 1).

It refuses a tree with uncommitted changes outside results/: the stamps would say `-dirty`, and
tables are only ever committed from a clean tree.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from .. import atomic
from ..errors import Failed, UsageError
from ..process import RECORDED, pinned_environment
from . import bench, provenance, results

TABLE = "reproduce"
STATE = Path("build") / "reproduce" / "state.json"
COMMITTED = Path("build") / "reproduce" / "committed"
DIFF = Path("results") / "benchmarks" / "reproduce_diff.md"
LOGS = Path("build") / "reproduce" / "logs"
WALKER = "walker"
UNKNOWN_PEAK_GB = 8.0   # a step with no recorded peak is assumed this large when deciding what runs beside it
# Of the machine's memory, for the summed recorded peaks of the steps running at once. A peak is one
# process's maximum for a moment, not the step's footprint throughout: on a 2-core, 23.5 GiB machine
# the run at f77f7c4 had pairs whose peaks summed to 21.8, 24.3 and 25.6 GiB side by side, and none
# ran out of memory. Nine tenths (21.2 GiB there) stays below every sum that ran.
MEMORY_SHARE = 0.9

# runner(command, cwd, log) -> (exit code, peak RSS of the command's largest process in GiB or None);
# `log` is where its output goes (None: the terminal)
Runner = Callable[[list[str], Path, "Path | None"], "tuple[int, float | None]"]


@dataclass(frozen=True)
class ReproduceStep:
    name: str                  # the notebook's stem, or "walker"
    studies: tuple[str, ...]   # the result folders it writes
    command: tuple[str, ...]
    tables: tuple[str, ...] = ()  # when it writes only some of a folder's tables (benchmarks)

    def label(self) -> str:
        return f"{self.name} ({', '.join(self.studies)})" if self.studies else self.name


def steps(repo: Path) -> list[ReproduceStep]:
    """Every notebook in notebooks/, in order, then the walker benchmark."""
    made = provenance.notebook_studies(repo)
    out = []
    for nb in sorted((Path(repo) / "notebooks").glob("*.ipynb")):
        studies = tuple(s for s, notebooks in made.items() if f"notebooks/{nb.name}" in notebooks)
        out.append(ReproduceStep(nb.stem, studies, (sys.executable, "-m", "papermill", "--cwd", "notebooks", "--kernel",
                                           "rkstudy", "-p", "QUICK", "False", f"notebooks/{nb.name}",
                                           f"results/notebooks/{nb.name}")))
    out.append(ReproduceStep(WALKER, ("benchmarks",), (sys.executable, "-m", "rkstudy", "bench", "walker"),
                             tables=(WALKER,)))
    return out


def select(all_steps: list[ReproduceStep], names: Sequence[str]) -> list[ReproduceStep]:
    """The steps named by study names or notebook stems ("kokoro_generator", "03_kokoro_generator"),
    in run order; names may also come as one comma or space separated string."""
    wanted = [n for item in names for n in re.split(r"[,\s]+", item) if n]
    chosen = set()
    for name in wanted:
        hits = [s.name for s in all_steps if name == s.name or name in s.studies]
        if not hits:
            choices = ", ".join(sorted({s.name for s in all_steps} | {x for s in all_steps for x in s.studies}))
            raise UsageError(f"no study or notebook {name!r} to reproduce; choose from {choices}")
        chosen.update(hits)
    return [s for s in all_steps if s.name in chosen]


def git(repo: Path, *args: str) -> str:
    proc = provenance.Git(repo).run(*args)
    if proc.returncode != 0:
        raise UsageError(f"`git {' '.join(args)}` failed in {repo}: {proc.stderr.strip()}; reproduce runs in a "
                         "git checkout of the project")
    return proc.stdout


def require_clean(repo: Path) -> str:
    """HEAD's full hash, when no tracked file outside results/ differs from it."""
    changed = [line[3:] for line in git(repo, "status", "--porcelain", "--untracked-files=no", "--", ".",
                                        ":(exclude)results").splitlines() if line.strip()]
    if changed:
        shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
        raise UsageError(f"uncommitted changes outside results/ ({shown}): commit or stash them first; tables "
                         "are only made from a clean tree, so every row's stamp names a commit")
    return git(repo, "rev-parse", "HEAD").strip()


def read_state(repo: Path, head: str) -> dict:
    """{step: {"minutes", "peak_gb", "finished"}} finished at `head`; empty for another commit's state."""
    return _state(repo, head).get("steps", {})


def read_walls(repo: Path, head: str) -> list[float]:
    """The wall minutes of each earlier invocation at `head` (a resumed run adds its own)."""
    return _state(repo, head).get("wall_minutes", [])


def _state(repo: Path, head: str) -> dict:
    path = Path(repo) / STATE
    if path.is_file():
        state = json.loads(path.read_text(encoding="utf-8"))
        if state.get("commit") == head:
            return state
    return {}


def write_state(repo: Path, head: str, done: dict, walls: Sequence[float] = ()) -> None:
    atomic.write_text(Path(repo) / STATE, json.dumps({"commit": head, "steps": done, "wall_minutes": list(walls)},
                                                     indent=1) + "\n")


def last_recorded(repo: Path) -> dict[str, dict]:
    """{step: row} from the reproduce table as committed before this run rewrites it."""
    path = Path(repo) / "results" / "benchmarks" / f"{TABLE}.csv"
    return {r["step"]: r for r in results.read_table(path)} if path.is_file() else {}


def tables(repo: Path, step: ReproduceStep) -> dict[Path, int]:
    """{table: its mtime in ns} for what `step` writes, as it is now."""
    out = {}
    for study in step.studies:
        folder = Path(repo) / "results" / study
        csvs = [folder / f"{t}.csv" for t in step.tables] if step.tables else sorted(folder.glob("*.csv"))
        out.update({p: p.stat().st_mtime_ns for p in csvs if p.is_file()})
    return out


def written(repo: Path, step: ReproduceStep, short: str, before: dict[Path, int]) -> list[str]:
    """Why `step`'s tables do not count as written by this run at `short` (empty when they do);
    `before` is tables() from before it ran."""
    problems = []
    now = tables(repo, step)
    for study in step.studies:
        folder = Path(repo) / "results" / study
        fresh = [p for p, mtime in now.items() if p.parent == folder and before.get(p) != mtime]
        if not fresh:
            problems.append(f"no table under results/{study}/ was written")
        for path in fresh:
            commits = {r["commit"] for r in results.read_table(path) if not r.get(results.CARRIED)}
            if commits - {short}:
                problems.append(f"results/{study}/{path.name} is stamped {', '.join(sorted(commits))}, not {short}")
    return problems


def prior_peaks(recorded: dict[str, dict]) -> dict[str, float]:
    """{step: GiB} the largest process of each step reached in the last recorded run."""
    return {name: float(row["peak_gb"]) for name, row in recorded.items() if row.get("peak_gb")}


def available_gb() -> float:
    """The machine's memory in GiB (MemTotal), which the steps running at once share."""
    with open("/proc/meminfo", encoding="ascii") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    raise Failed("no MemTotal in /proc/meminfo: cannot tell how many steps fit in memory; run with --jobs 1")


def prior_minutes(repo: Path, all_steps: list[ReproduceStep],
                  recorded: dict[str, dict]) -> dict[str, tuple[float, str]]:
    """{step: (minutes, where that figure comes from)} from the last recorded run: the reproduce
    table, else papermill's own duration in the executed notebook under results/notebooks/."""
    out = {}
    for step in all_steps:
        row = recorded.get(step.name)
        executed = Path(repo) / "results" / "notebooks" / f"{step.name}.ipynb"
        if row is not None and row.get("minutes"):
            out[step.name] = (float(row["minutes"]), f"as run at {row['commit']}")
        elif executed.is_file():
            meta = json.loads(executed.read_text(encoding="utf-8")).get("metadata", {}).get("papermill", {})
            if meta.get("duration"):
                source = f"papermill's time in results/notebooks/{executed.name}, {meta.get('end_time', '')[:10]}"
                out[step.name] = (round(meta["duration"] / 60, 1), source)
    return out


def expected(step: ReproduceStep, prior: dict[str, tuple[float, str]]) -> str:
    if step.name not in prior:
        return "no earlier run recorded"
    minutes, source = prior[step.name]
    return f"expected {minutes:.0f} min ({source})"


def record(repo: Path, all_steps: list[ReproduceStep], done: dict, recorded: dict[str, dict],
           prior: dict[str, tuple[float, str]], walls: Sequence[float], jobs: int = 1) -> Path:
    """results/benchmarks/reproduce.csv: this commit's minutes and peak per step (beside the last
    recorded figure), the last recorded row for a step not run at this commit (carried, with its
    stamp), and the total: the wall time of this commit's invocations (`walls`, the running one
    included), which is what a user waits; with steps side by side it is less than their sum."""
    rows = []
    for step in all_steps:
        before = recorded.get(step.name)
        base = {"step": step.name, "studies": " ".join(step.studies),
                "expected_minutes": prior[step.name][0] if step.name in prior else ""}
        if step.name in done:
            rows.append({**base, "minutes": done[step.name]["minutes"], "summed_minutes": "",
                         "peak_gb": done[step.name].get("peak_gb", ""),
                         results.CARRIED: ""})
        elif before is not None and before.get("minutes"):
            carried = results.carried(before, f"results/benchmarks/{TABLE}.csv")
            rows.append({**base, "expected_minutes": before.get("expected_minutes", ""), "minutes": before["minutes"],
                         "summed_minutes": "", "peak_gb": before.get("peak_gb", ""), **carried})
    count = sum(s.name in done for s in all_steps)
    summed = round(sum(float(done[s.name]["minutes"]) for s in all_steps if s.name in done), 2)
    # the summed minutes are a column of their own: a time, which two runs of the same code differ in, where the
    # scope text (steps run, jobs) is exact
    rows.append({"step": "total", "studies": f"{count} of {len(all_steps)} steps at this commit, up to {jobs} at once",
                 "expected_minutes": "", "minutes": round(sum(walls), 2), "summed_minutes": summed,
                 "peak_gb": "", results.CARRIED: ""})
    return bench.record(rows, TABLE, title="Benchmark: `make reproduce`, minutes per step at one commit",
                        root=Path(repo) / "results")


def committed_results(repo: Path) -> Path | None:
    """HEAD's results/ unpacked under build/ (the tables this run replaces), or None when HEAD has none."""
    proc = subprocess.run(["git", "archive", "--format=tar", "HEAD", "results"], cwd=repo, capture_output=True,
                          timeout=300)
    if proc.returncode != 0:
        return None
    target = Path(repo) / COMMITTED
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
        tar.extractall(target, filter="data")
    return target / "results"


def run_command(command: list[str], cwd: Path, log: Path | None = None) -> tuple[int, float | None]:
    """Run `command`, its output to `log` (or the terminal); its exit code and the peak RSS in GiB of
    its largest process: the kernel's maximum over the child and every descendant it waited for
    (papermill's kernel, the compiler and simulator children). The run is recorded
    (rkstudy.process.RECORDED): the executed notebook it keeps is read on other machines, so its
    kernel shows no progress bars and no absolute paths in its warnings."""
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, RECORDED: "1"}
    with open(log, "w", encoding="utf-8") if log is not None else open(os.devnull) as out:
        proc = subprocess.Popen(command, cwd=cwd, stdout=out if log is not None else None,
                                stderr=subprocess.STDOUT if log is not None else None, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, round(usage.ru_maxrss * 1024 / 2**30, 2)  # ru_maxrss is in KiB on Linux



THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def shared_threads(jobs: int, cores: int | None = None) -> dict[str, str]:
    """The thread count of each step when `jobs` run at once: the cores shared out, at least one. Left to
    themselves, torch, OpenBLAS, the toolkit's OpenMP loops and rkstudy's onnxruntime sessions (which read
    OMP_NUM_THREADS) each start a thread per core in every step, so two steps on two cores keep four or
    more threads busy and each waits on the other's (the last run's steps took 247 minutes summed side by
    side against 204 as each was last timed). A variable already set is the caller's choice and is kept."""
    if jobs <= 1:
        return {}
    share = str(max(1, (cores or os.cpu_count() or 1) // jobs))
    return {name: share for name in THREAD_VARIABLES if name not in os.environ}


def pinned(environ) -> dict[str, str]:
    """The variables of rkstudy.process.pinned_environment() the caller has not set: every step makes tables
    whose numbers should not depend on which vector ISA the host has, where a library lets that be pinned."""
    return {name: value for name, value in pinned_environment().items() if name not in environ}


@contextlib.contextmanager
def environment(extra: dict[str, str]):
    """`extra` in os.environ (which run_command hands to every step) while the block runs."""
    saved = {name: os.environ.get(name) for name in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def order(todo: list[ReproduceStep], prior: dict[str, tuple[float, str]], jobs: int) -> list[ReproduceStep]:
    """Run order: as listed with one job; longest expected first with more (a long step started last
    would leave a core idle at the end), steps with no recorded time first of all. Played forward with
    the recorded peaks (makespan), this order's schedule matched the measured total of the last run to the
    tenth of a minute, and no reordering of it shortened that schedule: the large steps cannot run beside
    each other in memory, so their sum bounds the wall time, and what shortens it is shorter or smaller
    large steps."""
    if jobs == 1:
        return todo
    return sorted(todo, key=lambda s: -prior[s.name][0] if s.name in prior else -math.inf)


def makespan(steps_in_order: list[ReproduceStep], minutes: dict[str, float], peaks: dict[str, float],
             memory_gb: float, jobs: int) -> float:
    """The minutes a run in this order would take if each step took its recorded minutes: the same
    start rule as Schedule (next_fitting as slots free), played forward. Printed before a run as what to
    expect."""
    pending, running, now = list(steps_in_order), [], 0.0  # running: (end, step)
    while pending or running:
        while pending and len(running) < jobs:
            step = next_fitting(pending, [s for _, s in running], peaks, memory_gb)
            if step is None:
                break
            pending.remove(step)
            running.append((now + minutes[step.name], step))
        if not running:  # nothing fits even alone: it would run alone
            step = pending.pop(0)
            running.append((now + minutes[step.name], step))
        running.sort(key=lambda r: r[0])
        now, _ = running.pop(0)
    return now


def fits(step: ReproduceStep, running: Sequence[ReproduceStep], peaks: dict[str, float], memory_gb: float) -> bool:
    """Whether `step` may start beside `running`: their recorded peaks fit in MEMORY_SHARE of memory."""
    if not running:
        return True
    need = sum(peaks.get(s.name, UNKNOWN_PEAK_GB) for s in [*running, step])
    return need <= MEMORY_SHARE * memory_gb


def next_fitting(pending: Sequence[ReproduceStep], running: Sequence[ReproduceStep], peaks: dict[str, float],
                 memory_gb: float) -> ReproduceStep | None:
    """The first of `pending` (in run order) that fits beside `running`, or None. A step too large for
    the memory the running ones leave waits for them, and a smaller one takes the free slot meanwhile:
    waiting in line would leave a core idle for as long as the largest step runs."""
    return next((s for s in pending if fits(s, running, peaks, memory_gb)), None)


def list_steps(repo: Path, all_steps: list[ReproduceStep], prior: dict[str, tuple[float, str]]) -> int:
    """`--list`: each step, finished at this commit (and in how long) or what it is expected to take."""
    head = git(repo, "rev-parse", "HEAD").strip()
    done = read_state(repo, head)
    for i, step in enumerate(all_steps, 1):
        state = (f"finished at this commit in {done[step.name]['minutes']} min" if step.name in done
                 else expected(step, prior))
        print(f"[{i}/{len(all_steps)}] {step.label()}: {state}")
    return 0


class Schedule:
    """One invocation's run of `todo`: up to `jobs` steps at once, each started when its recorded peak
    fits beside the running ones (next_fitting), each recorded in the state file and the reproduce
    table as it finishes. A failed step stops new starts; the ones running are let finish and are
    recorded, so a rerun continues from the failed one."""

    def __init__(self, repo: Path, head: str, all_steps: list[ReproduceStep], todo: list[ReproduceStep], *,
                 done: dict, walls: list[float], recorded: dict, prior: dict, peaks: dict[str, float],
                 runner: Runner, clock: Callable[[], float], jobs: int, memory_gb: float):
        self.repo, self.head, self.short = repo, head, head[:12]
        self.all_steps, self.todo = all_steps, todo
        self.done, self.walls, self.recorded, self.prior, self.peaks = done, walls, recorded, prior, peaks
        self.runner, self.clock, self.jobs, self.memory_gb = runner, clock, jobs, memory_gb
        self.numbers = {s.name: i for i, s in enumerate(todo, 1)}
        self.running: dict[Future, tuple[ReproduceStep, dict, float]] = {}
        self.failures: list[str] = []
        self.began = clock()
        self.walls.append(0.0)  # this invocation's wall time, updated as its steps finish

    def run(self) -> list[str]:
        """Run every step; the failures, one line each (empty when all finished)."""
        pending = list(self.todo)
        with ThreadPoolExecutor(max_workers=self.jobs) as pool:
            while pending or self.running:
                while pending and not self.failures and len(self.running) < self.jobs:
                    step = next_fitting(pending, [s for s, _, _ in self.running.values()], self.peaks, self.memory_gb)
                    if step is None:
                        break
                    pending.remove(step)
                    self.start(pool, step)
                if not self.running:
                    break
                for future in wait(list(self.running), return_when=FIRST_COMPLETED).done:
                    self.finish(future)
        write_state(self.repo, self.head, self.done, self.walls)
        return self.failures

    def start(self, pool: ThreadPoolExecutor, step: ReproduceStep) -> None:
        log = self.repo / LOGS / f"{step.name}.log" if self.jobs > 1 else None
        print(f"reproduce [{self.numbers[step.name]}/{len(self.todo)}] {step.label()}: running, "
              f"{expected(step, self.prior)}" + (f"; output in {log.relative_to(self.repo)}" if log else ""),
              flush=True)
        self.done.pop(step.name, None)
        write_state(self.repo, self.head, self.done, self.walls)
        before, t0 = tables(self.repo, step), self.clock()
        self.running[pool.submit(self.runner, list(step.command), self.repo, log)] = (step, before, t0)

    def finish(self, future: Future) -> None:
        step, before, t0 = self.running.pop(future)
        code, peak = future.result()
        minutes = round((self.clock() - t0) / 60, 2)
        if code != 0:
            self.failures.append(f"{step.label()} stopped after {minutes} min (exit {code}); fix it and run "
                                 f"`make reproduce` again to continue from it")
            return
        missing = written(self.repo, step, self.short, before)
        if missing:
            self.failures.append(f"{step.label()} ran to the end but {'; '.join(missing)}; it does not count as "
                                 "finished")
            return
        removed = remove_orphans(self.repo, step)
        if removed:
            print(f"reproduce: {step.label()} drew no {', '.join(removed)}: removed", flush=True)
        now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        self.walls[-1] = round((self.clock() - self.began) / 60, 2)  # up to the last step it finished
        self.done[step.name] = {"minutes": minutes, "peak_gb": peak if peak is not None else "", "finished": now}
        write_state(self.repo, self.head, self.done, self.walls)
        table = record(self.repo, self.all_steps, self.done, self.recorded, self.prior, self.walls, self.jobs)
        print(f"reproduce [{self.numbers[step.name]}/{len(self.todo)}] {step.label()}: finished in {minutes} min"
              + (f", peak {peak} GiB" if peak is not None else "") + f" -> {table.relative_to(self.repo)}", flush=True)


def remove_orphans(repo: Path, step: ReproduceStep) -> list[str]:
    """Delete the figures under each of `step`'s studies that its run did not draw (the run lists what it
    drew in the study's headlines.json): a figure no current code draws must not stay beside the tables,
    nor in the index. Returns them, repository-relative."""
    removed = []
    for study in step.studies:
        for png in provenance.orphan_figures(Path(repo) / "results" / study):
            png.unlink()
            removed.append(png.relative_to(repo).as_posix())
    return removed


def index_and_diff(repo: Path, short: str, runner: Runner) -> None:
    """After a run that made tables: the results index regenerated, and the diff of HEAD's committed
    tables against this run's written to results/benchmarks/reproduce_diff.md."""
    if runner([sys.executable, "-m", "rkstudy", "results", "index"], repo, None)[0] != 0:
        raise Failed("`rkstudy results index` failed after the studies ran; run it alone to see why")
    committed = committed_results(repo)
    if committed is not None:
        from . import diff as results_diff

        text, _ = results_diff.report(committed, repo / "results",
                                      labels=(f"the tables committed at {short}", "this run's"), repo=repo)
        atomic.write_text(repo / DIFF, text)
        print(f"reproduce: {text.splitlines()[2]} -> {DIFF}")


def check_when_complete(repo: Path) -> int:
    """Once every study was made at this commit, the committed tree must pass `rkstudy results check`."""
    problems, counts = provenance.check(repo)
    for p in problems:
        print(p.line())
    print(provenance.summary(problems, counts))
    return 1 if problems else 0


def reproduce(repo: Path, names: Sequence[str] = (), *, restart: bool = False, runner: Runner = run_command,
              listing: bool = False, clock: Callable[[], float] = time.monotonic, jobs: int = 1,
              memory_gb: float | None = None, disk: tuple[Path, float] | None = None) -> int:
    """Run the steps `names` selects (all by default) that are not finished at HEAD (all of them with
    `restart`), `jobs` at a time as memory allows; then regenerate the index and the diff, and, once
    every step is finished at HEAD, check the committed tree. Returns the exit code (1 when the check
    finds problems); a step that fails raises Failed after the running ones finish. `listing` only
    prints each step's state. `runner`, `clock` and `memory_gb` are what tests replace; `disk` (the cache's
    folder and the GB free there, as `main` measures them) refuses a run that would fill it (disk_refusal)."""
    repo = Path(repo)
    if jobs < 1:
        raise UsageError(f"--jobs {jobs}: give at least 1")
    all_steps = steps(repo)
    chosen = select(all_steps, names) if names else all_steps
    recorded = last_recorded(repo)
    prior = prior_minutes(repo, all_steps, recorded)
    if listing:
        return list_steps(repo, all_steps, prior)
    head = require_clean(repo)
    short = head[:12]
    done = {} if restart else read_state(repo, head)
    walls = [] if restart else read_walls(repo, head)
    peaks = prior_peaks(recorded)
    memory = memory_gb if memory_gb is not None else (available_gb() if jobs > 1 else 0.0)
    todo = order([s for s in chosen if names or s.name not in done], prior, jobs)
    if disk is not None and (refusal := disk_refusal(disk[1], disk_needed_gb(todo, all_steps, prior), disk[0])):
        raise UsageError(refusal)
    for step in chosen:
        if step not in todo:
            print(f"reproduce: {step.label()} finished at {short} in {done[step.name]['minutes']} min; skipped "
                  "(--restart runs it again)")
    (repo / "results" / "notebooks").mkdir(parents=True, exist_ok=True)
    known = [prior[s.name][0] for s in todo if s.name in prior]
    expect = ""
    if known:
        expect = f"; {sum(known):.0f} min as last recorded for {len(known)} of them, one after another"
        if len(known) == len(todo) and jobs > 1:
            wall = makespan(todo, {s.name: prior[s.name][0] for s in todo}, peaks, memory, jobs)
            expect += f", about {wall:.0f} min at {jobs} at once as memory allows"
    print(f"reproduce: {len(todo)} steps to run at {short}, up to {jobs} at once{expect}", flush=True)
    schedule = Schedule(repo, head, all_steps, todo, done=done, walls=walls, recorded=recorded, prior=prior,
                        peaks=peaks, runner=runner, clock=clock, jobs=jobs, memory_gb=memory)
    threads = shared_threads(jobs)
    if threads:
        print(f"reproduce: {jobs} steps share {os.cpu_count()} cores: "
              + ", ".join(f"{k}={v}" for k, v in threads.items()), flush=True)
    pins = pinned(os.environ)
    if pins:
        print("reproduce: numerics pinned: " + " ".join(f"{k}={v}" for k, v in pins.items()), flush=True)
    with environment({**threads, **pins}):
        failures = schedule.run()
    if failures:
        raise Failed("; ".join(failures))
    if todo:
        index_and_diff(repo, short, runner)
    summed = sum(float(d["minutes"]) for d in done.values())
    left = [s.name for s in all_steps if s.name not in done]
    print(f"reproduce: {len(todo)} steps in {(clock() - schedule.began) / 60:.1f} min this time; {len(done)} of "
          f"{len(all_steps)} finished at {short} ({sum(walls):.1f} min of wall time, {summed:.1f} summed over steps)"
          + (f"; not yet: {', '.join(left)}" if left else ""))
    return check_when_complete(repo) if not left else 0


# The disk a run of every step takes: the build cache of the fresh-clone run at 79e9bd1 (AMD EPYC, 2026-12-07)
# reached about 30 GB (engines, simulator children's outputs, slices, logs); the executed notebooks and the
# results add a few more. That run's shared disk filled in its last minutes and two steps failed on ENOSPC
# inside the toolkit's build, after two hours: a run that cannot finish is refused before it starts.
FULL_RUN_DISK_GB = 35.0


def disk_needed_gb(todo: Sequence[ReproduceStep], all_steps: Sequence[ReproduceStep],
                   prior: dict[str, tuple[float, str]]) -> float:
    """What `todo` needs free on disk: FULL_RUN_DISK_GB times its share of the recorded minutes (a step's
    cache grows with its builds, which is most of its time; a rough share, and all of it when a step has no
    recorded time)."""
    if not todo:
        return 0.0
    if any(s.name not in prior for s in all_steps):
        return FULL_RUN_DISK_GB
    total = sum(prior[s.name][0] for s in all_steps) or 1.0
    return FULL_RUN_DISK_GB * min(1.0, sum(prior[s.name][0] for s in todo) / total)


def disk_refusal(free_gb: float, needed_gb: float, where: Path) -> str | None:
    """The one line refusing a run that would fill the disk, or None when it fits."""
    if free_gb >= needed_gb:
        return None
    return (f"the steps to run need about {needed_gb:.0f} GB free for the build cache at {where} (a full run's "
            f"reached about 30 GB) and {free_gb:.1f} GB are free: remove old clones' build/cache folders, or set "
            "RKSTUDY_CACHE to a folder on a larger disk")


def free_disk_gb(path: Path) -> float:
    """Free GB on the disk holding `path` (its nearest existing folder)."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free / 1e9


def main(names: Sequence[str], restart: bool = False, listing: bool = False, jobs: int = 1) -> int:
    from ..paths import REPO, cache_root

    return reproduce(REPO, names, restart=restart, listing=listing, jobs=jobs,
                     disk=(cache_root(), free_disk_gb(cache_root())))
