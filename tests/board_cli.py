"""The command line as a user's shell runs it: `python -m rkstudy ...` in a subprocess from the repository
root, for the tests whose point is the process boundary (exit codes, what reaches stderr, a child run).

With `board`, the subprocess sees a board: RKSTUDY_SYSROOT points at a recorded tree (a name under
tests/fixtures/boards, or a path) and the RKNNLite replay double (tests/doubles) is importable in place of
the real runtime. Variables that steer the board half (a runtime library path, sudo's ids, a debug switch,
the double's forced init code) are dropped, so the recorded tree alone decides what the code finds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from rkstudy.paths import REPO

BOARDS = REPO / "tests" / "fixtures" / "boards"
# What stage 2 records of a clean build that passed the white-noise gate (rkstudy.toolkit.convert.build_record), for
# the placeholder engines tests compile contracts for without a toolkit
STAGE2_BUILD = {"regtask": 0, "regtask_max_value": 0, "gate": "simulator_vs_fp32_white_noise", "threshold_db": 15.0,
                "simulator_db": 42.0}
BOARD_VARIABLES = ("LIBRKNNRT_PATH", "SUDO_UID", "SUDO_GID", "RKSTUDY_DEBUG", "RKNNLITE_REPLAY_INIT_CODE")


def place(folder, contract, graph, target: str, toolkit: str = "rknn-toolkit2 2.5.0", key: str = "k",
          build: dict | None = None):
    """A placeholder engine for `target` beside `graph`, with the compiled contract stage 2 would write (its build
    record `build`, a clean one by default): the double serves the graph the contract names, never the bytes."""
    engine = Path(folder) / contract.engine_name(target, key)
    engine.write_bytes(f"placeholder engine for {target} by {toolkit}".encode())
    contract.compiled(target=target, toolkit=toolkit, onnx_path=graph, engine_path=engine,
                      build=build or STAGE2_BUILD).write_beside(engine)
    return engine


def port_engine_set(d, *, frames: int, context: int, mel_frames: int, build: dict | None = None):
    """`d/engines/`: a real `rkstudy port` window graph (a seeded HiFi-GAN V3) beside a placeholder engine per SoC
    (`--target all`), each with its compiled contract; `d/in.npz`: a seeded mel of `mel_frames` frames. Returns the
    window's contract and graph."""
    import numpy as np
    import onnx

    from rkstudy.families.port import architectures, producer
    from rkstudy.targets import ALL_TARGETS

    v = architectures.BUILDERS["hifigan_v3"]()
    onnx.save(v.model, d / "voc.onnx")
    window = producer.produce_window(producer.port_from_flags(d / "voc.onnx", ["mel:2:1"], [], [f"audio:{v.hop}"]),
                                     frames, context)
    (d / "engines").mkdir()
    graph = window.save(d / "engines" / f"voc_w{frames}.onnx")
    for target in ALL_TARGETS:
        place(d / "engines", window.contract, graph, target, build=build)
    mel = np.random.default_rng(0).standard_normal((1, architectures.MELS, mel_frames)).astype(np.float32)
    np.savez(d / "in.npz", mel=mel)
    return window.contract, graph


def run_cli(*argv, board=None, env=None, check: int | None = 0, timeout: float = 900) -> subprocess.CompletedProcess:
    """Run the command line on `argv`; `check` is the exit code it must end with (None: any), and a
    mismatch fails with the end of its stdout and stderr."""
    full = {**os.environ, "PYTHONPATH": str(REPO)}
    if board is not None:
        root = board if os.path.isabs(str(board)) else BOARDS / board
        full.update(RKSTUDY_SYSROOT=str(root), PYTHONPATH=os.pathsep.join([str(REPO / "tests" / "doubles"), str(REPO)]))
        for key in BOARD_VARIABLES:
            full.pop(key, None)
    full.update(env or {})
    proc = subprocess.run([sys.executable, "-m", "rkstudy", *map(str, argv)], capture_output=True, text=True,
                          env=full, cwd=REPO, timeout=timeout)
    if check is not None:
        assert proc.returncode == check, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def signal_while_the_child_runs(argv, *, board, env: dict, child_module: str, signum: int, tmp: Path,
                                after: float = 1.0, ignore: tuple = ()):
    """Start the command line on `argv` as a terminal starts a command (SIGINT, SIGHUP and SIGTERM at their
    defaults, whatever this test run inherited; `ignore`d as nohup leaves SIGHUP), with its temporary folders
    under `tmp`; once its measured
    child (`python -m child_module`) has run `after` seconds, send the parent `signum`. Returns the parent
    (ended), its stdout and stderr, and the child as psutil saw it."""
    import signal
    import time

    import psutil

    full = {**os.environ, "RKSTUDY_SYSROOT": str(BOARDS / board), "TMPDIR": str(tmp),
            "PYTHONPATH": os.pathsep.join([str(REPO / "tests" / "doubles"), str(REPO)])}
    for key in BOARD_VARIABLES:
        full.pop(key, None)
    full.update(env)

    def as_a_terminal_starts_it():
        for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN if sig in ignore else signal.SIG_DFL)

    parent = subprocess.Popen([sys.executable, "-m", "rkstudy", *map(str, argv)], env=full, cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              preexec_fn=as_a_terminal_starts_it)
    deadline = time.monotonic() + 300
    children = []
    while not children and time.monotonic() < deadline and parent.poll() is None:
        time.sleep(0.2)
        children = [c for c in psutil.Process(parent.pid).children(recursive=True)
                    if child_module in " ".join(c.cmdline())]
    assert children, "the measured child never started: " + "".join(parent.communicate(timeout=60))[-3000:]
    time.sleep(after)
    parent.send_signal(signum)
    out, err = parent.communicate(timeout=60)
    return parent, out, err, children[0]
