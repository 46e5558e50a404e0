"""Per-core NPU load during a run, sampled from the driver's debugfs file in a background thread.

Why: the core mask decides how a job spreads, and the seeds (000_6e5d138aacebdbda.txt, "NPU core
use") read this file to find that AUTO puts every engine on one core ("Core0: 55%, Core1: 0%,
Core2: 0%" for the whole qwen3_tts vocoder run) and that 0_1_2 spreads Kokoro to 95/18/19. A
summary of the samples (mean and max per core) is that reading, made repeatable.

The file's format is the driver's (rknpu_debugger.c, rknpu_load_show): "NPU load: " then, on a
multi-core NPU, " Core%d: " and "%2.d%%," per core ("NPU load:  Core0: 55%, Core1:  0%, Core2:
0%,"); on a single-core NPU (RK3566) just "%2.d%%". Each value is the core's busy share over the
driver's own load interval, so sampling faster than that interval repeats values.

Board side: standard library only. Reading debugfs needs root.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..paths import on_board
from .sysfs import NPU_LOAD

_CORE = re.compile(r"Core(\d+):\s*(\d*)%")
_SINGLE = re.compile(r"NPU load:\s*(\d*)%")


def parse_load(text: str) -> dict[str, int]:
    """{"Core0": 55, "Core1": 0, ...}; a single-core NPU's reading is reported as Core0.

    An empty field counts as 0 ("%2.d" can print nothing for 0)."""
    cores = {f"Core{n}": int(v or 0) for n, v in _CORE.findall(text)}
    if cores:
        return cores
    m = _SINGLE.search(text)
    if m:
        return {"Core0": int(m.group(1) or 0)}
    raise ValueError(f"not an rknpu load line: {text.strip()[:80]!r}")


@dataclass(frozen=True)
class CoreLoad:
    mean: float
    max: int
    samples: int


class LoadSampler:
    """`with LoadSampler() as s: run...` samples the load file every `interval` seconds.

    s.samples holds (monotonic time, {core: percent}); s.summary() gives mean/max per core.
    The file is read once before the thread starts, so a missing or unreadable file fails at
    `with` with the fix, not silently with no samples.
    """

    def __init__(self, path=None, interval: float = 0.1):
        self.path = Path(path) if path is not None else on_board(NPU_LOAD)
        self.interval = interval
        self.samples: list[tuple[float, dict[str, int]]] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _read(self) -> dict[str, int]:
        return parse_load(self.path.read_text())

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.monotonic(), self._read()))
            except (OSError, ValueError):
                self.errors += 1  # a half-written file during a rewrite; the next read is whole
            self._stop.wait(self.interval)

    def __enter__(self) -> LoadSampler:
        try:
            self._read()
        except PermissionError as exc:
            raise PermissionError(f"cannot read {self.path}: debugfs needs root (run with sudo, or "
                                  "mount debugfs readable for your group)") from exc
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"no {self.path}: the rknpu driver's debugfs is not mounted "
                                    "(mount -t debugfs none /sys/kernel/debug) or this is not a "
                                    "vendor rknpu kernel") from exc
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, CoreLoad]:
        cores = sorted({c for _, s in self.samples for c in s}, key=lambda c: int(c[4:]))
        out = {}
        for core in cores:
            values = [s[core] for _, s in self.samples if core in s]
            out[core] = CoreLoad(sum(values) / len(values), max(values), len(values))
        return out


def format_summary(summary: dict[str, CoreLoad]) -> str:
    """"Core0 mean 55% max 57%, Core1 mean 0% max 0%" (one line for a log)."""
    return ", ".join(f"{c} mean {v.mean:.0f}% max {v.max}%" for c, v in summary.items()) or "no samples"


def row_fields(summary: dict[str, CoreLoad] | None) -> dict[str, str | int]:
    """The columns a results row carries, the same on every SoC: per-core means and maxima joined
    by "/" in core order ("55/0/0"), and the sample count. None (the file was not readable) gives
    empty values, so a table mixes readable and unreadable runs without changing its columns."""
    if not summary:
        return {"npu_load_mean_pct": "", "npu_load_max_pct": "", "npu_load_samples": 0}
    return {"npu_load_mean_pct": "/".join(f"{v.mean:.0f}" for v in summary.values()),
            "npu_load_max_pct": "/".join(str(v.max) for v in summary.values()),
            "npu_load_samples": min(v.samples for v in summary.values())}


@contextmanager
def sampled(interval: float = 0.1) -> Iterator[LoadSampler | None]:
    """A LoadSampler over the block when the board's load file is readable; None otherwise, with
    one line on stderr saying why (a run without root still runs, its row just has no load)."""
    sampler = LoadSampler(interval=interval)
    try:
        sampler.__enter__()
    except OSError as exc:
        print(f"NPU load not sampled: {exc}", file=sys.stderr)
        yield None
        return
    try:
        yield sampler
    finally:
        sampler.__exit__()
