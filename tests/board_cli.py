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

from rkstudy.paths import REPO

BOARDS = REPO / "tests" / "fixtures" / "boards"
BOARD_VARIABLES = ("LIBRKNNRT_PATH", "SUDO_UID", "SUDO_GID", "RKSTUDY_DEBUG", "RKNNLITE_REPLAY_INIT_CODE")


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
