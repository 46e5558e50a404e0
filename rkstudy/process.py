"""What a process measures of itself: its own peak resident set.

Both measured children read it the same way: a board run's child (rkstudy.board.run) and a toolkit
build child (rkstudy.toolkit._child) each report it to the parent that started them.

Board side: standard library only.
"""

from __future__ import annotations

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
