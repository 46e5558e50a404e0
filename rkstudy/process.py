"""What a process measures of itself (its own peak resident set), and how it speaks when its output is
kept for readers (a recorded run: progress lines off, warnings without this machine's paths).

Both measured children read it the same way: a board run's child (rkstudy.board.run) and a toolkit
build child (rkstudy.toolkit._child) each report it to the parent that started them.

Board side: standard library only.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def peak_rss_kb() -> int:
    """This process's own peak resident set (VmHWM, kB) since its exec; 0 where /proc has none.

    The measured children report it themselves: wait4's ru_maxrss is floored by the parent's
    high-water mark (a fork/vfork child inherits it at exec), so it is not the child's own."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


# Set by `make reproduce` and the notebook tests for the notebooks they execute: their outputs are kept
# for readers (results/notebooks/, build/quick-notebooks/), who read them on another machine.
RECORDED = "RKSTUDY_RECORDED"


def recorded() -> bool:
    """Whether this process's output is kept for readers: an executed notebook's, not a person's terminal."""
    return os.environ.get(RECORDED, "") not in ("", "0")


def shows_progress(progress: bool = True) -> bool:
    """Whether a long step shows its tqdm line: as the caller asks, and never in a recorded run, where
    each refresh of the bar would be one more stream in the executed notebook."""
    return progress and not recorded()


def short_path(filename: str) -> str:
    """A source file as a reader elsewhere can find it: inside an installed package from the package
    on (torch/onnx/utils.py), inside this repository from its root (rkstudy/gates.py), else its name."""
    from .paths import REPO

    text = str(filename)
    if "site-packages/" in text:
        return text.rsplit("site-packages/", 1)[1]
    try:
        return str(Path(text).resolve().relative_to(REPO))
    except ValueError:
        return Path(text).name


def for_readers() -> None:
    """In a recorded run, a warning prints as one line naming its source file the way short_path does
    (never this machine's absolute paths), and tqdm's note that the kernel has no widget library, which
    says nothing about the study, is not printed."""
    import warnings

    def one_line(message, category, filename, lineno, line=None):
        return f"{category.__name__}: {message} ({short_path(filename)}:{lineno})\n"

    def show(message, category, filename, lineno, file=None, line=None):
        print(one_line(message, category, filename, lineno).rstrip("\n"), file=file or sys.stderr)

    warnings.formatwarning = one_line
    warnings.showwarning = show
    warnings.filterwarnings("ignore", message="IProgress not found")
