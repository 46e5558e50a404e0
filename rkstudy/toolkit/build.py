"""The build wrapper: config -> load_onnx -> build -> export_rknn -> release, in a child process.

Why a child process:
* the compiler is C++ and writes its diagnostics (the REGTASK "bit width of field value exceeds
  the limit" lines among them) straight to fds 1 and 2, outside Python logging; in a child those
  fds are a pipe this process reads, logs and counts;
* a graph the compiler cannot fold (Shape -> ConstantOfShape chains) aborts it with a core dump
  and no traceback; in a child that is an exit status, reported with the last log lines, and the
  notebook kernel survives;
* a build that floods REGTASK lines (the reference documents saw ~800k for one engine) is killed once it passes
  the limit, instead of running for minutes to produce an engine that voices clipped noise.

How the child starts (forked from a fork server that imported the toolkit once, or a fresh interpreter of
another toolkit's environment) is rkstudy.toolkit.forkserver's; which environment builds,
rkstudy.toolkit.envs'; what a quantized build is, rkstudy.toolkit.calibration's; how an engine is keyed and
found in the cache, rkstudy.toolkit.engine_cache's. This module is the build itself and its report.

The same child can stay alive after the build and serve simulator inference (see
rkstudy.toolkit.simulator.SimulatorRunner), because the toolkit's simulator only runs a model built in the
same process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

from .. import atomic, cache, graph
from ..errors import Failed, UsageError, one_line
from ..gates import board_risk
from ..paths import REPO
from ..targets import TARGETS, record
from . import log as toolkit_log
from ._child import LOG_MARK
from .calibration import Calibration
from .engine_cache import default_engine_path, engine_key
from .envs import require_toolkit, toolkit_env
from .forkserver import start_child

REGTASK_LIMIT = 100_000  # past this, the overflow is the ~800k-line regime that ruins an engine
BUILD_TIMEOUT_S = 3 * 3600  # generous: the widest encoder builds here took ~25 min on 2 cores
# Set (to a reason) in a process that must start no toolkit child, nor may any process it starts: the
# fast test tier sets it for every test not marked `simulator` (tests/conftest.py).
NO_CHILD_ENV = "RKSTUDY_NO_TOOLKIT_CHILD"
TAIL_LINES = 30
NPU_MASK = "0_1_2"   # the core mask a build row's predicted NPU time assumes: the board runner's default


class BuildFailed(Failed):
    """The toolkit did not produce an engine; the message names the step, the error and the log.
    `report` is the BuildReport of the failed build (None when the child died serving inference)."""

    report: BuildReport | None = None


@dataclass
class BuildReport:
    """What one build did. `status` is ok, failed (a toolkit step returned an error),
    aborted (the compiler died on a signal), regtask-limit (killed past the REGTASK limit) or
    timeout (killed past the build timeout). `peak_rss_mb` is the toolkit child's own peak
    (its VmHWM, as it last reported it; see EngineProcess._recv)."""

    status: str
    target: str
    onnx: str
    engine: str | None
    engine_bytes: int
    seconds: float
    regtask: int
    toolkit_version: str
    log: str
    regtask_max: int = 0  # largest field value a REGTASK line reported (limit 0x1fff)
    dtype: str = "fp16"  # what the engine computes in: fp16, or a quantized build's Calibration.label
    peak_rss_mb: float = 0.0
    failed_step: str | None = None
    error: str | None = None
    log_tail: list[str] = field(default_factory=list)
    shape_sets: list[dict] = field(default_factory=list)  # a multi-shape build's input sets, largest first

    where = "host"  # a build is a host-side measurement (rkstudy.tables.results.stamp reads this)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @classmethod
    def recorded(cls, saved: Mapping) -> BuildReport:
        """A report as a build record holds it. The build cache is shared by every checkout on a machine, so a
        record may carry fields another version of this class added: the engine is the same (its key matched),
        and the fields this version knows are read."""
        from dataclasses import fields

        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in saved.items() if k in known})

    def prediction(self, cores: str = NPU_MASK):
        """What the engine would take per call on the NPU of its target under the core mask `cores`: the cost
        model's prediction from this build's layer table (rkstudy.toolkit.cost.for_build), made once per
        report and mask. A build that was not verbose, or made no engine, gives one that says why."""
        from .cost import for_build

        made = self.__dict__.setdefault("_predictions", {})   # not a field: a recorded report stays as it was
        if cores not in made:
            made[cores] = for_build(self, cores)
        return made[cores]

    def row(self) -> dict:
        """Results-row fragment: dtype (fp16 or int8 w8a8), size, seconds, REGTASK lines and largest
        value, converter peak RSS, the board-risk verdict of what the compiler logged
        (rkstudy.gates.board_risk), and the NPU cost model's predicted ms per call with its terms
        (`npu_ms_predicted`, `npu_ms_<term>`, `npu_cost_note`: a prediction, not a board number; see
        rkstudy.toolkit.cost.Prediction.row)."""
        return {"status": self.status, "target": self.target, "dtype": self.dtype, "regtask": self.regtask,
                "regtask_max_value": self.regtask_max,
                "engine_mb": round(self.engine_bytes / 1e6, 3), "build_s": round(self.seconds, 1),
                "converter_peak_mb": round(self.peak_rss_mb, 1),
                "failed_step": self.failed_step or "", "error": one_line(self.error or "", 160),
                "board_risk": board_risk({"status": self.status, "target": self.target, "regtask": self.regtask,
                                          "regtask_max_value": self.regtask_max}),
                **self.prediction().row(), "where": self.where}

    def raise_for_status(self) -> BuildReport:
        if not self.ok:
            last = next((line for line in reversed(self.log_tail) if line.strip()), "")
            exc = BuildFailed(one_line(f"{self.target} build of {Path(self.onnx).name} {self.status}"
                                       f"{' at ' + self.failed_step if self.failed_step else ''}: {self.error} "
                                       f"(last log line: {last!r}; full log: {self.log})", 600))
            exc.report = self
            raise exc
        return self


def check_target(target: str, quantize: Calibration | None = None) -> None:
    """A target the toolkit builds for, in the dtype it builds there, said before a child starts."""
    if target not in TARGETS:
        raise UsageError(f"target {target!r} is not one this project builds for; use one of "
                         f"{', '.join(TARGETS)}")
    if not record(target).fp16 and quantize is None:
        raise UsageError(f"rknn-toolkit2 builds no fp16 engine for {target} (\"Current target_platform({target}) "
                         "not support do_quantization = False\"): make a quantized build, "
                         "quantize=Calibration(feeds) (int8 w8a8)")


class EngineProcess:
    """A toolkit child: builds one engine and, with `serve=True`, keeps it for simulator runs.

    `analysis` ({"inputs": [npy paths in input order], "output_dir": dir}, or a list of them) also runs
    the toolkit's per-layer rknn.accuracy_analysis on the simulator after the build, once per input set
    (see rkstudy.toolkit.convert.accuracy_analysis). `quantize` (a Calibration) makes it a quantized
    build: its feeds are written into the child's own directory and calibrate rknn.build.

    `session=True` (with `quantize`) makes it a quantization session instead: the child calibrates once
    (hybrid_quantization_step1), `tensors` lists the toolkit's quantization config, and each `variant`
    call builds that calibration with some of those tensors in float16 and serves it on the simulator
    (`run`) until the next (see rkstudy.toolkit._child)."""

    def __init__(self, onnx_path, target: str, shapes: Mapping[str, Sequence[int]] | None = None,
                 out=None, *, optimization_level: int = 3, serve: bool = False,
                 regtask_limit: int = REGTASK_LIMIT, outputs: Sequence[str] | None = None,
                 log=None, verbose: bool = True, timeout: float = BUILD_TIMEOUT_S,
                 analysis: Mapping | Sequence[Mapping] | None = None, quantize: Calibration | None = None,
                 toolkit: str | None = None, shape_sets: Sequence[Mapping[str, Sequence[int]]] | None = None,
                 session: bool = False):
        check_target(target, quantize)
        if session and (quantize is None or quantize.keep_fp16 or quantize.auto_hybrid_cos is not None
                        or quantize.int16_overflow):
            raise UsageError("a quantization session calibrates one plain quantized build and chooses the float16 "
                             "tensors per variant: pass quantize=Calibration(feeds) without keep_fp16, "
                             "auto_hybrid_cos or int16_overflow")
        self.session = session
        self.tensors: list[dict] = []  # a session's quantization-config tensors (name, dtype)
        self._capture: list[str] | None = None  # a session variant's log lines while it builds
        self._marked = threading.Event()
        self.toolkit = toolkit_env(toolkit)
        if toolkit is None:
            require_toolkit()
        self.child_toolkit: str | None = None  # what the child says it imported (its first message)
        if os.environ.get(NO_CHILD_ENV):
            raise UsageError(f"this run starts no toolkit child: {os.environ[NO_CHILD_ENV]}")
        self.onnx = Path(onnx_path).resolve()
        if not self.onnx.is_file():
            raise FileNotFoundError(f"no ONNX model at {self.onnx}")
        self.timeout = timeout
        self.timed_out = False
        self.peak_rss_mb = 0.0
        self.build_peak_rss_mb = 0.0  # the peak up to the end of the build (before a simulator starts)
        self._simulating = False
        self.target = target
        # in the graph's input order: the toolkit reads each dynamic_input set positionally
        self.shape_sets = shape_sets_for(shape_sets, graph_input_names(self.onnx)) if shape_sets else []
        if self.shape_sets:  # the graph's own input shapes may be dynamic: the sets pin them
            self.shapes = dict(self.shape_sets[0])
        else:
            given = shapes if shapes is not None else graph.input_shapes(self.onnx)
            self.shapes = {k: [int(d) for d in v] for k, v in given.items()}
        self.out = Path(out).resolve() if out else None
        self.regtask_limit = regtask_limit
        self.regtask = 0
        self.regtask_max = 0
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.killed_for_regtask = False
        self.log = Path(log) if log else (self.out.with_suffix(".log") if self.out
                                           else cache.cache_dir("logs") / f"{self.onnx.stem}-{target}.log")
        self.log.parent.mkdir(parents=True, exist_ok=True)
        if self.out:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            self.out.unlink(missing_ok=True)  # a stale engine must never pass for this build's
            # the toolkit writes the engine under a temporary name; it is renamed into place only
            # when the build succeeds, so a killed build never leaves a truncated engine behind
            self._partial = self.out.with_name(f".{self.out.stem}.{os.getpid()}.part.rknn")

        # The toolkit writes check*.onnx (and, past 2 GB, check_external_data/) into its working
        # directory and reads them back: two builds sharing one delete each other's files and the
        # compiler segfaults. Each child gets a directory of its own (the calibration set lives there too).
        self._workdir = tempfile.mkdtemp(prefix="rkstudy-build-")
        self.dtype = quantize.label if quantize else "fp16"
        spec = {"onnx": str(self.onnx), "target": target, "inputs": self.shapes,
                "outputs": list(outputs) if outputs else None, "out": str(self._partial) if self.out else None,
                "optimization_level": optimization_level, "serve": serve, "verbose": verbose,
                "analysis": (dict(analysis) if isinstance(analysis, Mapping) else [dict(a) for a in analysis])
                if analysis else None, "session": session,
                "dynamic_input": [[s[n] for n in self.shapes] for s in self.shape_sets] or None,
                "quantize": quantize.spec(quantize.write(Path(self._workdir) / "calibration", list(self.shapes)))
                if quantize else None}
        fd, self._spec = tempfile.mkstemp(prefix="rkstudy-spec-", suffix=".json")
        with os.fdopen(fd, "w") as fh:
            json.dump(spec, fh)
        # One duplex socket per side carries step reports and arrays; fds 1/2 stay the log.
        parent, child = socket.socketpair()
        self.conn = Connection(parent.detach())
        self._started = time.monotonic()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if self.toolkit.python != sys.executable and (REPO / "pyproject.toml").is_file():
            # another environment's child must run this code, whatever checkout its editable install names
            env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
        self.proc = start_child(self.toolkit, self._spec, child, self._workdir, env)
        self.step: str | None = None
        self.error: str | None = None
        self._finished = False
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        with open(self.log, "w", encoding="utf-8", errors="replace") as log:
            for raw in self.proc.stdout:
                line = toolkit_log.strip_ansi(raw.decode("utf-8", errors="replace").rstrip("\n"))
                log.write(line + "\n")
                self.tail.append(line)
                if self._capture is not None:
                    self._capture.append(line)
                if line.startswith(LOG_MARK):
                    self._marked.set()
                if toolkit_log.is_regtask(line):
                    if self.killed_for_regtask:
                        # lines still in the pipe after the kill: how many arrive is timing, not the graph,
                        # so a killed build's count stops at the limit's first line past it (a lower bound)
                        continue
                    self.regtask += 1
                    value = toolkit_log.regtask_value(line)
                    if value is not None:  # the magnitude is what separates a harmless overflow from a ruinous one
                        self.regtask_max = max(self.regtask_max, value)
                    if self.regtask > self.regtask_limit and not self.killed_for_regtask:
                        self.killed_for_regtask = True
                        self._kill()

    def _kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):  # not yet its own group leader: the child alone
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _recv(self, timeout: float | None = None):
        """Next message from the child, or None when it has gone away (or `timeout` passed: then
        the child is killed, since a compiler that hangs never answers).

        Every message carries the child's own peak RSS (VmHWM of its post-exec address space).
        wait4's ru_maxrss cannot give it: a child started by fork/vfork + exec inherits the
        parent's high-water mark at exec, so from a notebook kernel holding gigabytes every build
        would report at least the kernel's peak."""
        try:
            if timeout is not None and not self.conn.poll(max(0.0, timeout)):
                self.timed_out = True
                self._kill()
                return None
            msg = self.conn.recv()
        except (EOFError, ConnectionResetError, OSError):
            return None
        if isinstance(msg, dict) and msg.get("peak_rss_kb"):
            self.peak_rss_mb = max(self.peak_rss_mb, msg["peak_rss_kb"] / 1024)
            if not self._simulating:
                self.build_peak_rss_mb = self.peak_rss_mb
        if isinstance(msg, dict) and msg.get("event") == "start" and msg.get("step") == "init_runtime":
            # from here on the peak is the simulator's, not the converter's: a served build reports
            # the same converter peak as a plain one
            self._simulating = True
        if isinstance(msg, dict) and msg.get("tensors"):
            self.tensors = list(msg["tensors"])
        if isinstance(msg, dict) and msg.get("toolkit"):
            self.child_toolkit = msg["toolkit"]
        return msg

    def wait_built(self) -> BuildReport:
        """Block until the engine is built (and, when serving, the simulator is up), at most
        `timeout` seconds from the start."""
        while True:
            msg = self._recv(timeout=self.timeout - (time.monotonic() - self._started))
            if msg is None:
                return self._finish()
            if msg["event"] == "start":  # the step now running: what a timeout or a signal interrupts
                self.step = msg["step"]
            elif msg["event"] == "failed":
                self.step, self.error = msg["step"], msg["error"]
                return self._finish()
            elif msg["event"] in ("ready", "done"):
                self._marked.wait(timeout=30)  # the pump has every log line up to the child's mark
                report = self._report("ok")
                if msg["event"] == "done":
                    self._finish(report)
                return report

    def _reap(self, timeout: float) -> int:
        """Wait for the child (killing it past `timeout`); its exit code."""
        rc = self.proc.wait(timeout)
        if rc is None:
            self._kill()
            rc = self.proc.wait(None)
        return rc

    def _finish(self, report: BuildReport | None = None) -> BuildReport:
        self._finished = True
        rc = self._reap(timeout=60)
        self._reader.join(timeout=10)
        self.conn.close()
        if os.path.exists(self._spec):
            os.unlink(self._spec)
        shutil.rmtree(self._workdir, ignore_errors=True)
        if report is not None and rc == 0:
            report.peak_rss_mb = self.build_peak_rss_mb
            return report
        if self.timed_out:
            return self._report("timeout", error=f"killed after {self.timeout:.0f} s without finishing "
                                f"{self.step or 'start-up'}; raise --timeout if the graph is simply large")
        if self.killed_for_regtask:
            return self._report("regtask-limit", error=f"killed once past {self.regtask_limit} REGTASK lines (the "
                                f"count {self.regtask} is a lower bound): an axis overflows the 13-bit field "
                                "by far; narrow the window or slice the long axis")
        if rc < 0:
            name = signal.Signals(-rc).name
            return self._report("aborted", error=f"the toolkit died on {name} during "
                                f"{self.step or 'start-up'} (a compiler abort; see the log tail)")
        return self._report("failed", error=self.error or f"the toolkit exited with code {rc}")

    def _report(self, status: str, error: str | None = None) -> BuildReport:
        ok = status == "ok"
        if self.out:
            if ok and self._partial.exists():
                os.replace(self._partial, self.out)
            self._partial.unlink(missing_ok=True)
        engine = str(self.out) if ok and self.out and self.out.exists() else None
        return BuildReport(status=status, target=self.target, onnx=str(self.onnx), engine=engine,
                           engine_bytes=os.path.getsize(engine) if engine else 0,
                           seconds=time.monotonic() - self._started, regtask=self.regtask,
                           regtask_max=self.regtask_max, dtype=self.dtype, peak_rss_mb=self.build_peak_rss_mb,
                           toolkit_version=self.child_toolkit or self.toolkit.version, log=str(self.log),
                           failed_step=None if ok else self.step, error=error,
                           log_tail=list(self.tail), shape_sets=[dict(s) for s in self.shape_sets])

    def variant(self, keep: Sequence[str], out: Path | str, quantize: Calibration) -> BuildReport:
        """Build the session's calibration with the config tensors `keep` in float16 into `out` and start
        it on the simulator (session mode only; `quantize` is the Calibration it makes, for the report's
        dtype). The report's log is this variant's own lines (its layer table when verbose), written
        beside the engine; a variant the toolkit refuses is a `failed` report with its error, a toolkit
        crash an `aborted` one (the session is over then)."""
        if not self.session or self._finished:
            raise UsageError("variant() needs a running quantization session (EngineProcess(..., session=True))")
        out = Path(out).resolve()
        out.parent.mkdir(parents=True, exist_ok=True)
        out.unlink(missing_ok=True)
        partial = out.with_name(f".{out.stem}.{os.getpid()}.part.rknn")
        started, self.regtask, self.regtask_max, self.error = time.monotonic(), 0, 0, None  # per variant
        self._marked.clear()
        self._capture = []
        self.conn.send({"keep": list(keep), "out": str(partial)})
        status, error = "failed", None
        while True:
            msg = self._recv(timeout=self.timeout)
            if msg is None:  # the child died or hung: the session is over, the report says how
                dead = self._finish()
                status, error = dead.status, dead.error
                break
            if msg["event"] == "start":
                self.step = msg["step"]
            elif msg["event"] == "ready":
                status = "ok"
                break
            elif msg["event"] == "refused":
                error = msg["error"]
                break
        self._marked.wait(timeout=30)  # the pump has every line up to the child's mark
        lines, self._capture = self._capture or [], None
        ok = status == "ok" and partial.exists()
        if ok:
            os.replace(partial, out)
        partial.unlink(missing_ok=True)
        log = atomic.write_text(out.with_suffix(".log"), "\n".join(lines) + "\n")
        return BuildReport(status=status if ok or status != "ok" else "failed", target=self.target, onnx=str(self.onnx),
                           engine=str(out) if ok else None, engine_bytes=os.path.getsize(out) if ok else 0,
                           seconds=time.monotonic() - started, regtask=self.regtask, regtask_max=self.regtask_max,
                           dtype=quantize.label, peak_rss_mb=self.peak_rss_mb,
                           toolkit_version=self.child_toolkit or self.toolkit.version, log=str(log),
                           failed_step=None if ok else self.step, error=None if ok else error,
                           log_tail=lines[-TAIL_LINES:])

    def run(self, inputs: Sequence) -> list:
        """Simulator inference on the engine this child built (serve mode only)."""
        try:
            self.conn.send([x for x in inputs])
        except (BrokenPipeError, OSError) as exc:
            raise BuildFailed(f"the simulator child for {self.onnx.name} has exited") from exc
        msg = self._recv()
        if msg is None:
            report = self._finish()
            raise BuildFailed(f"the simulator died during inference: {report.error}\n"
                              + "\n".join(report.log_tail[-12:]))
        if msg["event"] == "error":
            raise RuntimeError(f"simulator inference failed: {msg['error']}")
        return msg["outputs"]

    def close(self) -> None:
        """Stop serving, release the toolkit, and remove the child's spec and directory."""
        if self._finished:
            return
        if self.proc.alive():
            try:
                self.conn.send(None)
                self._recv()
            except (BrokenPipeError, OSError):
                pass
        self._finish()


def graph_input_names(onnx_path: Path) -> list[str]:
    """The graph's inputs in its own order (initializers listed as inputs left out)."""
    g = graph.load(onnx_path, load_external_data=False).graph
    init = {i.name for i in g.initializer}
    return [vi.name for vi in g.input if vi.name not in init]


def shape_sets_for(shape_sets: Sequence[Mapping[str, Sequence[int]]], names: Sequence[str] | None = None
                   ) -> list[dict[str, list[int]]]:
    """The input shape sets of a multi-shape build (config's dynamic_input: one engine that runs
    at each set), checked: two or more distinct sets, each naming every input once (`names`, or the
    first set's), each input with one rank throughout. Largest set first: the toolkit's MaxShape,
    which its memory plan and eval_memory describe."""
    sets = [{k: [int(d) for d in v] for k, v in s.items()} for s in shape_sets]
    names = list(names) if names is not None else list(sets[0]) if sets else []
    if len({json.dumps(s, sort_keys=True) for s in sets}) < 2:
        raise UsageError(f"a multi-shape build needs two or more distinct input shape sets, got {len(sets)}; "
                         "pass one shape mapping for a single-shape engine")
    for s in sets:
        if sorted(s) != sorted(names):
            raise UsageError(f"a shape set names inputs {sorted(s)}, the graph takes {sorted(names)}; "
                             "give every input a shape in every set")
        ranks = [len(s[n]) != len(sets[0][n]) for n in names]
        if any(ranks) or any(d < 1 for n in names for d in s[n]):
            raise UsageError(f"shape set {s} does not keep each input's rank of {sets[0]} with positive sizes")
    order = sorted(sets, key=lambda s: -sum(int(np.prod(s[n])) for n in names))
    return [{n: s[n] for n in names} for s in order]


def cached_report(out: Path, key: str, *, verbose: bool = False) -> BuildReport | None:
    """The recorded report of the engine at `out` when it was built under `key` (and, for a `verbose`
    request, by a verbose build: only its log has the layer table and the memory plan)."""
    record = Path(out).with_suffix(".json")
    if not (Path(out).exists() and record.exists()):
        return None
    saved = json.loads(record.read_text())
    if saved.get("key") != key or (verbose and not saved.get("verbose")):
        return None
    return BuildReport.recorded(saved["report"])


def record_report(out: Path, key: str, report: BuildReport, *, verbose: bool = False) -> None:
    """Record a successful build beside its engine, so the next request for `key` reads it back."""
    if report.ok:
        atomic.write_text(Path(out).with_suffix(".json"),
                          json.dumps({"key": key, "verbose": verbose, "report": asdict(report)}, indent=1))


def build_engine(onnx_path, target: str, shapes: Mapping[str, Sequence[int]] | None = None,
                 out=None, *, optimization_level: int = 3, regtask_limit: int = REGTASK_LIMIT,
                 reuse: bool = True, verbose: bool = True, timeout: float = BUILD_TIMEOUT_S,
                 quantize: Calibration | None = None, toolkit: str | None = None,
                 shape_sets: Sequence[Mapping[str, Sequence[int]]] | None = None) -> BuildReport:
    """Compile `onnx_path` for `target` into `out` in a child process and return its report: dtype,
    status, engine bytes, seconds, REGTASK lines and largest field value, the converter child's peak
    RSS and the NPU cost model's prediction (BuildReport.row() is the results-row fragment every family uses).

    Builds are `verbose` by default: only a verbose log has the layer table the prediction is made from, and
    measured on this host verbosity costs no build time beyond the load's noise (the Piper 93-frame window
    and the Kokoro W = 128 window built both ways twice) and the engine is the same; the log grows from
    0.1 to 0.23 MB (Piper) and 0.54 to 1.9 MB (Kokoro).

    The engine is fp16 unless `quantize` (a Calibration) is given: then it is quantized with the
    toolkit's settings the Calibration names (default w8a8: int8), calibrated on its feeds.

    With `reuse`, an engine already built from the same ONNX bytes, target, shapes, level, toolkit
    (and calibration set and settings) is returned from its recorded report instead of being rebuilt
    (for a `verbose` request, only a verbose build's record serves: its log is what the caller reads).
    `out` defaults to the cache (default_engine_path). `toolkit` ('2.3.2') builds in that version's
    environment (toolkit_env); None builds with the toolkit installed here. `shape_sets` (two or
    more {input: shape} mappings) makes one engine that runs at each of them (config's
    dynamic_input; see shape_sets_for); `shapes` is then ignored.
    """
    check_target(target, quantize)
    onnx_path = Path(onnx_path)
    graph.load(onnx_path)  # an unreadable graph is an input error, said before a child starts
    sets = shape_sets_for(shape_sets, graph_input_names(onnx_path)) if shape_sets else []
    key, shapes = engine_key(onnx_path, target, dict(sets[0]) if sets else shapes,
                             optimization_level=optimization_level, quantize=quantize, toolkit=toolkit,
                             shape_sets=sets)
    out = Path(out) if out else default_engine_path(onnx_path, target, key)
    with cache.locked(out):  # two studies running side by side that ask for one engine build it once
        if reuse and (saved := cached_report(out, key, verbose=verbose)) is not None:
            return saved
        proc = EngineProcess(onnx_path, target, shapes, out, optimization_level=optimization_level,
                             regtask_limit=regtask_limit, verbose=verbose, timeout=timeout, quantize=quantize,
                             toolkit=toolkit, shape_sets=sets or None)
        report = proc.wait_built()
        record_report(out, key, report, verbose=verbose)
        return report
