"""The error classes a command can end in, and the exit code each means.

Exit 0: everything passed. Exit 1: a gate or a build failed (the measurement is the answer, and it
says no). Exit 2: bad usage or input that cannot be used (a missing or corrupt file, a wrong name, a
shape that does not parse, an engine that does not match). Exit 128 + N: stopped by signal N (130:
Ctrl-C; while a measured child runs, 129 for SIGHUP and 143 for SIGTERM too). Every message is one line
naming the fix.

Board side: standard library only.
"""

from __future__ import annotations

import signal


class RkstudyError(Exception):
    """Base of the errors the command line turns into one line and an exit code."""

    exit_code = 1


class UsageError(RkstudyError, ValueError):
    """Bad arguments: conflicting flags, a value out of range, a name that is not there."""

    exit_code = 2


class InputError(RkstudyError, ValueError):
    """An input that cannot be used: a missing, empty, truncated or corrupt file."""

    exit_code = 2


class EngineMismatch(InputError):
    """An engine, slice or contract that does not fit what it is used with (another voice, another
    SoC, another schema, bytes changed after conversion). The message names the command that makes
    a matching one."""


class NeedsConverter(UsageError):
    """A host-only step (graph surgery, a build, the simulator) asked for where the converter
    environment is not installed, such as on a board."""


class BoardUnavailable(RkstudyError, RuntimeError):
    """No RKNNLite runtime, no NPU driver or no librknnrt here, or a board that does not say its SoC: the
    message names what to install or where to run instead. Exit 2."""

    exit_code = 2


class Failed(RkstudyError):
    """A gate or a build said no. Exit 1."""

    exit_code = 1


class Interrupted(RkstudyError):
    """The command was stopped by a signal: Ctrl-C (SIGINT), or while a measured child runs SIGHUP (the terminal
    or the SSH connection went away) or SIGTERM (`kill`, `timeout`, a service stop). Exit 128 + the signal's
    number, the shell's code for a process that signal ended: 130 for Ctrl-C."""

    exit_code = 130

    def __init__(self, message: str, signum: int = signal.SIGINT):
        super().__init__(message)
        self.exit_code = 128 + int(signum)


class StreamClosed(RkstudyError):
    """The reader of a run's audio stream (`speak --stream -`) went away before the text was spoken. Exit 141,
    what a shell shows for a writer ended by SIGPIPE."""

    exit_code = 141


def one_line(text: str, limit: int = 400) -> str:
    """`text` folded onto one line (compiler and protobuf messages span many)."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
