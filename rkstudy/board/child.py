"""The measured child: a job (a stage's board run, a whole text's synthesis) run in a dedicated process,
for `rkstudy board run` and `rkstudy speak` alike.

Why a child: the row's peak RSS is then the job's own (its runtime, its engines), not the parent's or a
notebook kernel's; a wedged NPU that never returns is killed at a timeout with its process group; and a
failure in the job reaches the user as one line naming the fix, the traceback only under --debug.

The parent writes the job's spec (a JSON file in a temporary folder that the parent removes, whatever
ends the run), starts `python -m MODULE SPEC` in its own session, and reads back its result (JSON), its
arrays (.npz) or the one-line error it met. The child is in its own session so that a terminal's Ctrl-C
reaches the parent alone, which then stops the child itself; SIGHUP (a closed terminal, a dropped SSH
connection) and SIGTERM (`kill`, `timeout`, a service stop) do the same while the child lives, so nothing
is left holding the NPU past its timeout.

Board side: standard library and numpy only.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..errors import InputError, Interrupted, StreamClosed, UsageError
from ..process import peak_rss_kb
from . import load, sysfs
from .runner import after_init

CHILD_TIMEOUT_S = 1800.0  # a wedged NPU never returns from inference; no board run here takes minutes
TIMEOUT_ENV = "RKSTUDY_BOARD_TIMEOUT"  # seconds; a longer run than the default sets it
STOP_GRACE_S = 10.0  # a wedged NPU can hold the child in the driver past SIGTERM
# The signals that stop the measured child with its parent, as Ctrl-C does; the exit code is 128 + the signal's
# number (rkstudy.errors.Interrupted): 129 for SIGHUP, 143 for SIGTERM (130 stays Ctrl-C's).
STOP_SIGNALS = (signal.SIGHUP, signal.SIGTERM)


class _Stopped(BaseException):
    """A stop signal, raised in the parent while its child lives (as Ctrl-C raises KeyboardInterrupt), so that
    every `with` above the wait unwinds: the child's temporary folder and the callers' are removed."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _stopping_on_signals():
    """SIGHUP and SIGTERM raise _Stopped for the duration of the block, and the previous handlers are back after
    it. A signal this process ignores stays ignored (`nohup rkstudy board run ...` is meant to outlive its
    terminal). Signal handlers belong to the main thread: called from another, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stopped(signum, _frame):
        raise _Stopped(signum)

    previous = {sig: signal.signal(sig, stopped) for sig in STOP_SIGNALS if signal.getsignal(sig) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for sig, handler in previous.items():  # None: a handler set outside Python, which cannot be put back
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def run_child(module: str, spec: dict, *, label: str, prefix: str, timeout: float | None = None,
              default_timeout: float = CHILD_TIMEOUT_S) -> tuple[dict, dict]:
    """Run `spec["job"]` in a child (`python -m MODULE SPEC_JSON`, whose entry is child_main) and return its
    result and arrays. `label` names the run in every message ("the board run of e.rknn", "the synthesis");
    `prefix` names its temporary folder. The child is bounded by `timeout` seconds (default: $RKSTUDY_BOARD_TIMEOUT,
    else `default_timeout`) and killed with its process group past it.

    A child that fails raises its own one-line error here (RknnError for a failed run, exit 1; BoardUnavailable or
    the input error it met, exit 2). Ctrl-C, SIGHUP or SIGTERM to the parent stop the child (stop_child), remove
    the temporary folders and raise Interrupted: exit 130 for Ctrl-C, 128 + the signal's number for the others.

    A job that streams (audio heard while the rest is synthesized) plugs in here: its spec names a pipe or a
    file in the same folder (`folder / "stream.pcm"`) that the child writes PCM chunks to as they are made, and
    the single wait in _run becomes a loop of short waits that forwards what arrived in between, until the child
    exits or the deadline passes. The handlers, the deadline, the stop and the result read back stay as they are.
    """
    timeout = timeout or float(os.environ.get(TIMEOUT_ENV) or default_timeout)
    with _stopping_on_signals():
        try:
            with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
                return _run(module, spec, Path(tmp), label=label, timeout=timeout)
        except _Stopped as stop:  # before the child started, or as its folder was removed
            raise _interrupted(stop.signum, f"{label} wrote nothing") from None


def _interrupted(signum: int, what: str) -> Interrupted:
    if signum == signal.SIGINT:
        return Interrupted(f"interrupted: {what}")
    return Interrupted(f"stopped by {signal.Signals(signum).name}: {what}", signum=signum)


def _run(module: str, spec: dict, folder: Path, *, label: str, timeout: float) -> tuple[dict, dict]:
    from .dmesg import RknnError

    spec = {**spec, "result": str(folder / "result.json"), "arrays": str(folder / "arrays.npz"),
            "error": str(folder / "error.json")}
    spec_path = folder / "spec.json"
    spec_path.write_text(json.dumps(spec))
    # the child's temporary files go in this folder, which the parent removes however the run ends: a child
    # stopped at any instant cannot clean up after itself (Python's own first look for a writable temporary
    # folder writes a probe file there, and a stop signal that lands on it leaves the file behind)
    (folder / "tmp").mkdir()
    # its own session: the timeout kills its whole group, and a terminal's Ctrl-C or hang-up reaches the parent
    # only, which stops the child itself (stop_child) rather than leave it holding the NPU
    proc = subprocess.Popen([sys.executable, "-m", module, str(spec_path)],
                            env={**os.environ, "TMPDIR": str(folder / "tmp")}, start_new_session=True)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise RknnError(f"{label} did not finish in {timeout:.0f} s and was killed (a wedged NPU? dmesg | tail "
                        f"names it); reboot the board if the NPU stays busy, or set {TIMEOUT_ENV}=<seconds> for "
                        "a longer run") from None
    except KeyboardInterrupt:
        raise _interrupted(signal.SIGINT, f"{label} wrote nothing; {stop_child(proc)}") from None
    except _Stopped as stop:
        raise _interrupted(stop.signum, f"{label} wrote nothing; {stop_child(proc)}") from None
    error = Path(spec["error"])
    if error.is_file():
        failure = json.loads(error.read_text())
        if failure["exit"] == StreamClosed.exit_code:
            raise StreamClosed(failure["message"])
        raise (RknnError if failure["exit"] == 1 else InputError)(failure["message"])
    if proc.returncode != 0 or not Path(spec["result"]).is_file():
        raise RknnError(ended(label, proc.returncode))
    result = json.loads(Path(spec["result"]).read_text())
    with np.load(spec["arrays"]) as data:
        return result, {k: data[k] for k in data.files}


# What a measured child that died on a signal met, in one line each (the child wrote nothing: no result, no error)
CRASHES = {
    signal.SIGSEGV: "crashed inside the runtime (SIGSEGV): a graph librknnrt cannot run, as the rel-logit chain "
                    "crashed it on the Piper duration-encoder pull request's board (rc=139); `rkstudy lint` on the "
                    "engine's graph names the patterns known to do this, and `dmesg | tail` what the kernel saw",
    signal.SIGABRT: "aborted inside the runtime (SIGABRT: a check in librknnrt or a corrupted heap); `dmesg | tail` "
                    "and --debug say more, and `rkstudy lint` on the engine's graph names the patterns it knows",
    signal.SIGBUS: "crashed inside the runtime (SIGBUS: a mapping the NPU driver took back); `dmesg | tail` says why",
    signal.SIGKILL: "was killed (SIGKILL: the kernel's out-of-memory killer, most often; `dmesg | tail` says which)",
}


def ended(label: str, returncode: int) -> str:
    """The one line for a child that ended without its result: the signal that ended it and what that means,
    or its exit code."""
    if returncode < 0:
        sig = signal.Signals(-returncode)
        said = CRASHES.get(sig, f"was ended by {sig.name} (`dmesg | tail` says why)")
        return f"{label} {said}; nothing was written"
    return f"{label} ended with exit {returncode} and no result (killed by the system? dmesg | tail says why)"


def stop_child(proc: subprocess.Popen, grace: float = STOP_GRACE_S) -> str:
    """End a measured child and its process group: SIGTERM (at once, wherever it is: still importing, or inside
    an init; the driver releases its contexts as the process goes), then SIGKILL past `grace` seconds or at a
    second Ctrl-C, SIGHUP or SIGTERM. Says how it ended."""
    def signal_group(sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:  # it ended on its own meanwhile
            pass

    signal_group(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
        return "its child process stopped with it"
    except (subprocess.TimeoutExpired, KeyboardInterrupt, _Stopped):
        signal_group(signal.SIGKILL)
        proc.wait()
        return "its child process was killed, as it did not stop (a wedged NPU? dmesg | tail says)"


def child_failure(exc: BaseException) -> tuple[str, int]:
    """A child's error as one line naming the fix, and the exit code it stands for."""
    from ..errors import RkstudyError
    from .dmesg import RknnError

    text = " ".join(str(exc).split())
    if isinstance(exc, RkstudyError):
        return text, exc.exit_code
    if isinstance(exc, RknnError):
        return text, 1
    if isinstance(exc, ImportError):
        return (f"the board child cannot import {exc.name or text} ({text}): reinstall the board environment "
                "(make board-env, or pip install -e '.[board]'), then rkstudy doctor --board"), 2
    return (f"unexpected {type(exc).__name__} in the board child: {text} (rerun with --debug for the traceback, "
            "and please report it)"), 1


def report_child_failure(exc: BaseException, spec_path: str, command: str) -> int:
    """A measured child's error handed to its parent: one line (child_failure) in the error file the spec
    names, or on stderr when it names none; the traceback only with RKSTUDY_DEBUG=1. Its exit code."""
    if os.environ.get("RKSTUDY_DEBUG") == "1":
        import traceback

        traceback.print_exc()
    message, code = child_failure(exc)
    error = json.loads(Path(spec_path).read_text()).get("error")
    if error:
        Path(error).write_text(json.dumps({"message": message, "exit": code}))
    else:
        print(f"{command}: error: {message}", file=sys.stderr)
    return code


def measured(run, sample_npu: bool = True) -> dict:
    """`run()`'s result dict with what the board saw while it ran: per-core NPU load and the NPU clock
    (sampling starts after the first engine's init, so the row measures the work, not the init) and the
    process's peak RSS. Shared by every measured child (a stage's board run, a whole text's synthesis)."""
    sampler = load.board_sampler() if sample_npu else None
    governor: list[str] = []

    def begin_sampling() -> None:
        governor.append(sysfs.npu_clock()["governor"] or "")
        if sampler is not None:
            try:
                sampler.start()
            except OSError as exc:
                print(f"NPU load not sampled: {exc}", file=sys.stderr)

    after_init(begin_sampling)
    try:
        out = run()
    finally:
        if sampler is not None:
            sampler.stop()
    out["npu_load"] = load.row_fields(sampler.summary() if sampler and sampler.path else None)
    out["npu_clock"] = {"npu_governor": governor[0] if governor else "",
                        "npu_freq_hz": sampler.clock_field() if sampler else ""}
    out["peak_rss_kb"] = peak_rss_kb()
    return out


def write_child_result(spec: dict, out: dict) -> None:
    """A measured child's audio and arrays to the spec's .npz and the rest of its result to its JSON,
    for the parent to read back."""
    arrays = {"audio": np.asarray(out.pop("audio"), np.float32), **out.pop("arrays", {})}
    np.savez(spec["arrays"], **arrays)
    Path(spec["result"]).write_text(json.dumps(out))


def job_named(name: str) -> Callable:
    """The job a spec names ("module:function"), imported in the child."""
    import importlib

    module, _, attr = name.partition(":")
    return getattr(importlib.import_module(module), attr)


def child_main(argv, child: Callable[[str], int], command: str) -> int:
    """A measured child's entry (`python -m MODULE SPEC_JSON`): `child(spec_path)` runs the job and writes its
    result; every failure becomes one line in the spec's error file for the parent to raise (the traceback too,
    on stderr, under RKSTUDY_DEBUG=1, which `--debug` sets). `command` is the user's command the usage names."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise UsageError(f"usage: python -m {child.__module__} SPEC_JSON (started by `{command}`)")
    try:
        return child(argv[0])
    except KeyboardInterrupt:  # a Ctrl-C sent to the child itself: the parent says what happened
        return 130
    except Exception as exc:  # noqa: BLE001 - every child error reaches the parent as one line
        return report_child_failure(exc, argv[0], command)

