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

A child is forked from a fork server that has imported the toolkit once (ForkServer): importing torch,
onnx and rknn.api is most of a small build's time, and the studies build hundreds of one-op probes. A
build with another toolkit version's environment (or with RKSTUDY_FORK_SERVER=0) starts a fresh interpreter.

The same child can stay alive after the build and serve simulator inference (see
rkstudy.runtime.SimulatorRunner), because the toolkit's simulator only runs a model built in the
same process.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
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
from ..contract import QUANTIZED_DTYPES
from ..errors import Failed, NeedsConverter, UsageError, one_line
from ..gates import board_risk
from ..paths import REPO
from ..tables.results import toolkit_version
from ..targets import TARGETS, record
from . import log as toolkit_log
from ._child import VARIANT_MARK

REGTASK_LIMIT = 100_000  # past this, the overflow is the ~800k-line regime that ruins an engine
BUILD_TIMEOUT_S = 3 * 3600  # generous: the widest encoder builds here took ~25 min on 2 cores
# Set (to a reason) in a process that must start no toolkit child, nor may any process it starts: the
# fast test tier sets it for every test not marked `simulator` (tests/conftest.py).
NO_CHILD_ENV = "RKSTUDY_NO_TOOLKIT_CHILD"
TAIL_LINES = 30
# Set to 0 to start every toolkit child as a fresh interpreter instead of forking it from the fork server.
FORK_SERVER_ENV = "RKSTUDY_FORK_SERVER"


class _Exec:
    """A toolkit child started as a fresh interpreter (another toolkit version's environment, or with
    the fork server turned off): `python -m rkstudy.toolkit._child SPEC FD`."""

    def __init__(self, python: str, spec: str, conn_sock: socket.socket, workdir: str, env: dict):
        child_fd = conn_sock.detach()
        self._proc = subprocess.Popen([python, "-m", "rkstudy.toolkit._child", spec, str(child_fd)],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      pass_fds=(child_fd,), env=env, cwd=workdir, start_new_session=True)
        os.close(child_fd)
        self.pid = self._proc.pid
        self.stdout = self._proc.stdout

    def alive(self) -> bool:
        return self._proc.poll() is None

    def wait(self, timeout: float | None) -> int | None:
        """Its exit code (negative: the signal that ended it), or None when `timeout` passed first."""
        try:
            return self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None


class ForkServer:
    """One long-lived toolkit process per interpreter that has imported the toolkit (torch, onnx, rknn.api:
    about 2.5 s here) and forks a child per build on request (rkstudy.toolkit._child.fork_server). The
    server reaps its children and reports each exit status; a reader thread here hands them to whoever
    waits. Started on first use, in this process only (a forked copy of this process starts its own)."""

    _instances: dict[int, ForkServer] = {}
    _lock = threading.Lock()

    def __init__(self):
        # datagram-like: one request (its JSON and its two fds) per message, never split or merged
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        fd = theirs.detach()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self._server = subprocess.Popen([sys.executable, "-m", "rkstudy.toolkit._child", "--fork-server", str(fd)],
                                        stdin=subprocess.DEVNULL, pass_fds=(fd,), env=env, start_new_session=True)
        os.close(fd)
        self._sock = ours
        self._replies = ours.makefile("rb")
        self._cond = threading.Condition()
        self._pids: list[int] = []          # replies to requests, in order
        self._status: dict[int, int] = {}   # exit statuses reported, by pid
        self._closed = False
        threading.Thread(target=self._read, daemon=True).start()

    @classmethod
    def get(cls) -> ForkServer:
        with cls._lock:
            server = cls._instances.get(os.getpid())
            if server is None or server._closed:
                server = cls._instances[os.getpid()] = ForkServer()
            return server

    def _read(self) -> None:
        for line in self._replies:
            msg = json.loads(line)
            with self._cond:
                if "status" in msg:
                    self._status[msg["pid"]] = msg["status"]
                else:
                    self._pids.append(msg["pid"])
                self._cond.notify_all()
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def fork(self, spec: str, workdir: str, conn_fd: int, out_fd: int) -> int:
        """Start a child running `spec` in `workdir`; its pid."""
        with self._lock:
            request = {"spec": spec, "workdir": workdir, "env": {**os.environ, "PYTHONUNBUFFERED": "1"}}
            socket.send_fds(self._sock, [json.dumps(request).encode()], [conn_fd, out_fd])
            with self._cond:
                if not self._cond.wait_for(lambda: self._pids or self._closed, timeout=120) or not self._pids:
                    raise Failed("the toolkit fork server did not answer; set RKSTUDY_FORK_SERVER=0 to start each "
                                 "build in a fresh interpreter instead")
                return self._pids.pop(0)

    def wait(self, pid: int, timeout: float | None) -> int | None:
        """`pid`'s exit code once the server has reaped it, or None when `timeout` passed first."""
        with self._cond:
            self._cond.wait_for(lambda: pid in self._status or self._closed, timeout=timeout)
            return self._status.pop(pid, None)


class _Forked:
    """A toolkit child forked from the ForkServer: the same child as _Exec, without importing torch,
    onnx and the toolkit again."""

    def __init__(self, spec: str, conn_sock: socket.socket, workdir: str):
        out_parent, out_child = socket.socketpair()
        self._server = ForkServer.get()
        try:
            self.pid = self._server.fork(spec, workdir, conn_sock.fileno(), out_child.fileno())
        finally:
            conn_sock.close()
            out_child.close()
        self.stdout = out_parent.makefile("rb")
        out_parent.close()  # the file object keeps the socket open
        self._rc: int | None = None

    def alive(self) -> bool:
        return self.wait(0) is None

    def wait(self, timeout: float | None) -> int | None:
        if self._rc is None:
            self._rc = self._server.wait(self.pid, timeout)
        return self._rc


def start_child(toolkit: Toolkit, spec: str, conn_sock: socket.socket, workdir: str, env: dict):
    """A toolkit child running `spec`: forked from the fork server when it builds with this interpreter's
    toolkit (a one-op probe then takes a third of the time: the imports are the server's), else a fresh
    interpreter of the toolkit's own environment."""
    if toolkit.python == sys.executable and os.environ.get(FORK_SERVER_ENV, "1") != "0":
        return _Forked(spec, conn_sock, workdir)
    return _Exec(toolkit.python, spec, conn_sock, workdir, env)


class BuildFailed(Failed):
    """The toolkit did not produce an engine; the message names the step, the error and the log.
    `report` is the BuildReport of the failed build (None when the child died serving inference)."""

    report: BuildReport | None = None


def toolkit_available() -> bool:
    """rknn-toolkit2 is importable here (checked without importing it: it pulls torch)."""
    try:
        return importlib.util.find_spec("rknn") is not None and importlib.util.find_spec("rknn.api") is not None
    except (ImportError, ValueError):
        return False


def require_toolkit() -> None:
    if not toolkit_available():
        raise NeedsConverter("the RKNN toolkit (rknn-toolkit2) is not installed here: run `make toolkit` "
                             "(or pip install --no-deps rknn-toolkit2==2.5.0) on the host")


@dataclass(frozen=True)
class Toolkit:
    """A converter environment: the interpreter a build child runs, and the toolkit it imports
    ('rknn-toolkit2 2.3.2'; what keys the engine cache and what BuildReport.toolkit_version says)."""

    python: str
    version: str


def toolkit_env(version: str | None = None) -> Toolkit:
    """The environment that builds with rknn-toolkit2 `version`: this one when it is None or the
    version installed here, else `.venv-rknn-<version>` beside the code (made by `make toolkit-venv
    TOOLKIT=<version>`), whose toolkit is read from its installed metadata, not assumed from its name."""
    here = toolkit_version()
    if version is None or here == f"rknn-toolkit2 {version}":
        return Toolkit(sys.executable, here)
    venv = REPO / f".venv-rknn-{version}"
    found = sorted(venv.glob("lib/python*/site-packages/rknn_toolkit2-*.dist-info"))
    python = venv / "bin" / "python"
    if not found or not python.exists():
        raise NeedsConverter(f"rknn-toolkit2 {version} has no environment here ({venv.name} is missing): run "
                             f"`make toolkit-venv TOOLKIT={version}` ([tool.rkstudy] toolkits lists the versions)")
    return Toolkit(str(python), f"rknn-toolkit2 {found[-1].name.removesuffix('.dist-info').split('-', 1)[1]}")


ALGORITHMS = ("normal", "mmse", "kl_divergence")  # min/max, minimum mean squared error, KL divergence
METHODS = ("channel", "layer")  # one weight scale per output channel, or one per layer


@dataclass(frozen=True, eq=False)
class Calibration:
    """What makes a quantized build: the calibration feeds ({input name: array}, one dict per sample)
    the toolkit runs to find each tensor's range, and the toolkit's quantization settings.

    The defaults are the toolkit's own (rknn.config: quantized_dtype w8a8, i.e. 8-bit asymmetric
    weights and activations; algorithm normal, i.e. min/max; per-channel weights), so `label` names
    exactly what was built. `dtype` is any of QUANTIZED_DTYPES (w8a16: 8-bit weights, 16-bit
    activations; w16a16i_dfp: 16-bit dynamic fixed point; w4a16: 4-bit weights), `algorithm` any of
    ALGORITHMS, `method` any of METHODS. The feeds are written as .npy files plus the dataset .txt the
    toolkit reads (one line per sample: that sample's .npy paths in input order).

    Two ways to keep part of the graph in float16, because plain int8 can lose a decoder whole:
    `keep_fp16` (tensor names of the toolkit's quantization config: its layers as accuracy_analysis
    names them, and also the casts at the graph's inputs and outputs and the tensors the compiler
    inserts, e.g. a tiled conv's `_tile0_conv`, which that report does not list) runs the toolkit's
    hybrid_quantization_step1 / step2 with those tensors set to float16; `auto_hybrid_cos` runs
    rknn.build(auto_hybrid=True) with that cosine threshold (config's auto_hybrid_cos_thresh), letting
    the toolkit choose.

    `int16_overflow` makes it a float build instead (rknn.build(do_quantization=False, dataset=...,
    auto_hybrid=True), rknn-toolkit2 >= 2.3.2): the toolkit runs the feeds to find each layer's range
    and computes in int16 the layers whose range exceeds float16's; the rest stays float16."""

    feeds: Sequence[Mapping[str, object]]
    dtype: str = "w8a8"
    algorithm: str = "normal"
    method: str = "channel"
    keep_fp16: Sequence[str] = ()
    auto_hybrid_cos: float | None = None
    int16_overflow: bool = False

    def __post_init__(self):
        if not self.feeds:
            raise UsageError("a quantized build needs at least one calibration feed; pass Calibration([{name: array}])")
        for what, value, known in (("dtype", self.dtype, tuple(QUANTIZED_DTYPES)),
                                   ("algorithm", self.algorithm, ALGORITHMS), ("method", self.method, METHODS)):
            if value not in known:
                raise UsageError(f"quantized {what} {value!r} is not one rknn.config documents; use one of "
                                 f"{', '.join(known)}")
        if self.keep_fp16 and self.auto_hybrid_cos is not None:
            raise UsageError("keep_fp16 and auto_hybrid_cos are two ways to choose the float16 layers; pass one")
        if self.int16_overflow and (self.keep_fp16 or self.auto_hybrid_cos is not None):
            raise UsageError("int16_overflow is a float build (nothing quantized to int8); drop keep_fp16 and "
                             "auto_hybrid_cos, or drop int16_overflow for an int8 build")
        object.__setattr__(self, "keep_fp16", tuple(dict.fromkeys(self.keep_fp16)))

    @property
    def weight_bits(self) -> int:
        """The bits of the weights a quantized layer of this build computes with (float16 layers: 16)."""
        return 16 if self.int16_overflow else QUANTIZED_DTYPES[self.dtype][0]

    @property
    def settings(self) -> str:
        """The quantizer's settings in one phrase, defaults included: 'w8a8 normal channel'."""
        return f"{self.dtype} {self.algorithm} {self.method}"

    @property
    def label(self) -> str:
        """The dtype column of a quantized build: 'int8 w8a8' (the bits of the weights name it), then the
        calibration algorithm and the per-layer method unless they are the defaults ('int8 w8a8 mmse',
        'int8 w8a8 layer'), then ' hybrid (12 layers fp16)' or ' auto-hybrid cos 0.99' when part of it
        stays float16."""
        if self.int16_overflow:
            return "fp16 auto-hybrid int16"
        label = f"int{QUANTIZED_DTYPES[self.dtype][0]} {self.dtype}"
        if self.algorithm != "normal":  # the toolkit's min/max default goes unnamed
            label += f" {self.algorithm}"
        if self.method != "channel":
            label += f" {self.method}"
        if self.keep_fp16:
            n = len(self.keep_fp16)
            label += f" hybrid ({n} layer{'s' if n != 1 else ''} fp16)"
        elif self.auto_hybrid_cos is not None:
            label += f" auto-hybrid cos {self.auto_hybrid_cos:g}"
        return label

    def with_fp16(self, keep: Sequence[str]) -> Calibration:
        """The same calibration and settings with `keep` (config tensor names) in float16."""
        from dataclasses import replace

        return replace(self, keep_fp16=tuple(keep), auto_hybrid_cos=None)

    def key(self, names: Sequence[str]) -> str:
        """Digest of the settings and every calibration array (by content, in input order)."""
        arrays = [np.ascontiguousarray(feed[n]) for feed in self.feeds for n in names]
        hybrid = [("keep_fp16", sorted(self.keep_fp16))] if self.keep_fp16 else []
        hybrid += [("auto_hybrid_cos", float(self.auto_hybrid_cos))] if self.auto_hybrid_cos is not None else []
        hybrid += [("int16_overflow", True)] if self.int16_overflow else []
        return cache.digest(self.dtype, self.algorithm, self.method, *hybrid,  # plain int8 keys stay as they were
                            [(str(a.dtype), a.shape) for a in arrays], *[a.tobytes() for a in arrays])

    def data_key(self, names: Sequence[str]) -> str:
        """Digest of what the toolkit's calibration pass sees (settings and arrays, no hybrid choice):
        one hybrid_quantization_step1 serves every keep_fp16 choice with this key."""
        arrays = [np.ascontiguousarray(feed[n]) for feed in self.feeds for n in names]
        return cache.digest(self.dtype, self.algorithm, self.method,
                            [(str(a.dtype), a.shape) for a in arrays], *[a.tobytes() for a in arrays])

    def write(self, folder: Path, names: Sequence[str]) -> Path:
        """The .npy files and the dataset .txt under `folder`; the .txt's path."""
        folder.mkdir(parents=True, exist_ok=True)
        lines = []
        for i, feed in enumerate(self.feeds):
            missing = [n for n in names if n not in feed]
            if missing:
                raise UsageError(f"calibration feed {i} has no array for {', '.join(missing)}; give every "
                                 f"feed one array per graph input ({', '.join(names)})")
            paths = []
            for j, name in enumerate(names):
                paths.append(folder / f"{i}_{j}.npy")
                np.save(paths[-1], np.asarray(feed[name]))
            lines.append(" ".join(str(p) for p in paths))
        dataset = folder / "dataset.txt"
        dataset.write_text("\n".join(lines) + "\n")
        return dataset

    def record(self) -> dict:
        """What a compiled contract records of this build (rkstudy.contract.QUANTIZATION_FIELDS)."""
        return {"dtype": self.dtype, "algorithm": self.algorithm, "method": self.method, "label": self.label,
                "calibration_samples": len(self.feeds), "fp16_tensors": len(self.keep_fp16)}

    def spec(self, dataset: Path) -> dict:
        return {"dataset": str(dataset), "quantized_dtype": self.dtype, "quantized_algorithm": self.algorithm,
                "quantized_method": self.method, "keep_fp16": list(self.keep_fp16),
                "auto_hybrid_cos": self.auto_hybrid_cos, "int16_overflow": self.int16_overflow}


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

    def row(self) -> dict:
        """Results-row fragment: dtype (fp16 or int8 w8a8), size, seconds, REGTASK lines and largest
        value, converter peak RSS, and the board-risk verdict of what the compiler logged
        (rkstudy.gates.board_risk)."""
        return {"status": self.status, "target": self.target, "dtype": self.dtype, "regtask": self.regtask,
                "regtask_max_value": self.regtask_max,
                "engine_mb": round(self.engine_bytes / 1e6, 3), "build_s": round(self.seconds, 1),
                "converter_peak_mb": round(self.peak_rss_mb, 1),
                "failed_step": self.failed_step or "", "error": one_line(self.error or "", 160),
                "board_risk": board_risk({"status": self.status, "target": self.target, "regtask": self.regtask,
                                          "regtask_max_value": self.regtask_max}),
                "where": self.where}

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
                 log=None, verbose: bool = False, timeout: float = BUILD_TIMEOUT_S,
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
                if line.startswith(VARIANT_MARK):
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


def default_engine_path(onnx_path: Path, target: str, key: str) -> Path:
    """The one naming scheme for engines in the cache: derived from the stage contract in the ONNX
    metadata when there is one (family, compiled width, target), from the file name otherwise,
    and keyed by everything that made the engine; an engine already built under that key is found
    whatever its name."""
    from .. import contract as contracts

    props = graph.metadata(onnx_path)
    if contracts.METADATA_KEY in props:
        name = contracts.from_metadata(props, where=onnx_path.name, remake="its producer").engine_name(target, key)
    else:
        name = f"{onnx_path.stem}-{target}-{key}.rknn"
    path = cache.cache_dir("engines") / name
    if not path.exists():
        # the key is over the graph's bytes: the same graph saved under another name (a lint probe of the
        # toolchain's conv) is the same engine
        path = next(iter(sorted(path.parent.glob(f"*-{target}-{key}.rknn"))), path)
    return path


def engine_key(onnx_path, target: str, shapes: Mapping[str, Sequence[int]] | None = None, *,
               optimization_level: int = 3, quantize: Calibration | None = None,
               toolkit: str | None = None, shape_sets: Sequence[Mapping[str, Sequence[int]]] = ()
               ) -> tuple[str, dict[str, list[int]]]:
    """The content key of an engine (ONNX bytes, target, shapes, level, toolkit, calibration, and the
    shape sets of a multi-shape engine) and the shapes it was built at: one key, whoever builds it
    (build_engine, a simulator child, lint)."""
    onnx_path = Path(onnx_path)
    shapes = {k: [int(d) for d in v] for k, v in
              (shapes if shapes is not None else graph.input_shapes(onnx_path)).items()}
    env = toolkit_env(toolkit)
    key = cache.digest(onnx_path, target, shapes, optimization_level, env.version,
                       # an fp16 key has no calibration term, nor a single-shape key a sets term
                       *([quantize.key(list(shapes))] if quantize else []),
                       *([("shape_sets", list(shape_sets))] if shape_sets else []))
    return key, shapes


def cached_report(out: Path, key: str, *, verbose: bool = False) -> BuildReport | None:
    """The recorded report of the engine at `out` when it was built under `key` (and, for a `verbose`
    request, by a verbose build: only its log has the layer table and the memory plan)."""
    record = Path(out).with_suffix(".json")
    if not (Path(out).exists() and record.exists()):
        return None
    saved = json.loads(record.read_text())
    if saved.get("key") != key or (verbose and not saved.get("verbose")):
        return None
    return BuildReport(**saved["report"])


def record_report(out: Path, key: str, report: BuildReport, *, verbose: bool = False) -> None:
    """Record a successful build beside its engine, so the next request for `key` reads it back."""
    if report.ok:
        atomic.write_text(Path(out).with_suffix(".json"),
                          json.dumps({"key": key, "verbose": verbose, "report": asdict(report)}, indent=1))


def build_engine(onnx_path, target: str, shapes: Mapping[str, Sequence[int]] | None = None,
                 out=None, *, optimization_level: int = 3, regtask_limit: int = REGTASK_LIMIT,
                 reuse: bool = True, verbose: bool = False, timeout: float = BUILD_TIMEOUT_S,
                 quantize: Calibration | None = None, toolkit: str | None = None,
                 shape_sets: Sequence[Mapping[str, Sequence[int]]] | None = None) -> BuildReport:
    """Compile `onnx_path` for `target` into `out` in a child process and return its report: dtype,
    status, engine bytes, seconds, REGTASK lines and largest field value, the converter child's peak
    RSS (BuildReport.row() is the results-row fragment every family uses).

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
