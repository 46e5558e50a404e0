"""Per-core NPU load during a run, sampled from the driver's debugfs file in a background thread.

Why: the core mask decides how a job spreads, and the RKNN decoder-path document ("NPU core
use") read this file to find that AUTO puts every engine on one core ("Core0: 55%, Core1: 0%,
Core2: 0%" for the whole qwen3_tts vocoder run) and that 0_1_2 spreads Kokoro to 95/18/19. A
summary of the samples (mean and max per core) is that reading, made repeatable.

The file's format is the driver's (rknpu_debugger.c, rknpu_load_show): "NPU load: " then, on a
multi-core NPU, " Core%d: " and "%2.d%%," per core ("NPU load:  Core0: 55%, Core1:  0%, Core2:
0%,"); on a single-core NPU (RK3566) just "%2.d%%". Each value is the core's busy share over the
driver's own load interval (RKNPU_LOAD_INTERVAL, 1 s), so sampling faster repeats values and a
decode shorter than that reads the interval before it.

A board run samples during the decode only: the child starts its sampler when the first context has
initialized (rkstudy.board.runner.after_init), so the init's own load is not in the row, and it
reads the NPU's devfreq cur_freq beside the load, so the clock in the row is the clock during the
run (under rknpu_ondemand the clock after it is another).

Board side: standard library only. Reading debugfs needs root.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..paths import on_board
from . import sysfs
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


def unreadable(path: Path, exc: OSError) -> OSError:
    """The error for a load file that cannot be read, with its fix."""
    if isinstance(exc, PermissionError):
        return PermissionError(f"cannot read {path}: debugfs needs root (run with sudo, or mount debugfs "
                               "readable for your group)")
    if isinstance(exc, FileNotFoundError):
        return FileNotFoundError(f"no {path}: the rknpu driver's debugfs is not mounted (mount -t debugfs "
                                 "none /sys/kernel/debug) or this is not a vendor rknpu kernel")
    return exc


class LoadSampler:
    """`with LoadSampler() as s: run...` (or s.start() ... s.stop()) samples the load file every
    `interval` seconds, and the NPU clock file `clock` (a devfreq cur_freq) beside it when given.

    s.samples holds (monotonic time, {core: percent}) and s.clocks_hz the clock readings; s.summary()
    gives mean/max per core. The load file is read when sampling starts and that reading is the first
    sample, so a missing or unreadable file fails at the start with the fix, not silently with no
    samples, and even a block shorter than `interval` has one. `load=False` samples the clock only.
    """

    def __init__(self, path=None, interval: float = 0.1, clock=None, load: bool = True):
        self.path = (Path(path) if path is not None else on_board(NPU_LOAD)) if load else None
        self.clock = Path(clock) if clock is not None else None
        self.interval = interval
        self.samples: list[tuple[float, dict[str, int]]] = []
        self.clocks_hz: list[int] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _read(self) -> dict[str, int]:
        return parse_load(self.path.read_text())

    def _sample(self) -> None:
        if self.path is not None:
            self.samples.append((time.monotonic(), self._read()))
        if self.clock is not None:
            try:
                self.clocks_hz.append(int(self.clock.read_text().split()[0]))
            except (OSError, ValueError, IndexError):
                self.errors += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._sample()
            except (OSError, ValueError, IndexError):
                self.errors += 1  # a half-written file during a rewrite; the next read is whole

    def start(self) -> LoadSampler:
        try:
            self._sample()
        except OSError as exc:
            raise unreadable(self.path, exc) from exc
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def __enter__(self) -> LoadSampler:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def summary(self) -> dict[str, CoreLoad]:
        cores = sorted({c for _, s in self.samples for c in s}, key=lambda c: int(c[4:]))
        out = {}
        for core in cores:
            values = [s[core] for _, s in self.samples if core in s]
            out[core] = CoreLoad(sum(values) / len(values), max(values), len(values))
        return out

    def clock_field(self) -> str:
        """The NPU clock over the samples (Hz): one value when it held, "low-high" when it moved."""
        if not self.clocks_hz:
            return ""
        low, high = min(self.clocks_hz), max(self.clocks_hz)
        return str(low) if low == high else f"{low}-{high}"


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


def board_sampler(interval: float = 0.1) -> LoadSampler | None:
    """The sampler of a board run, not started: the load where its file is readable (else one line on
    stderr saying why: a run without root still runs, its row just has no load) and the NPU clock where
    the board has a devfreq node; None where it has neither."""
    node = sysfs.npu_devfreq()
    clock = on_board(f"{node}/cur_freq") if node else None
    sampler = LoadSampler(interval=interval, clock=clock)
    try:
        sampler._read()
        return sampler
    except OSError as exc:
        print(f"NPU load not sampled: {unreadable(sampler.path, exc)}", file=sys.stderr)
    except ValueError as exc:
        print(f"NPU load not sampled: {exc}", file=sys.stderr)
    return LoadSampler(interval=interval, clock=clock, load=False) if clock is not None else None
