"""A DRAM read ceiling: stream an array many times the size of the last-level cache, report GB/s.

Why the size matters: the RKNN decoder-path document ("Conditions on the board numbers")
measured their board's DRAM read ceiling at 26.4-29.4 GB/s with a cache-bypassing STREAM triad
(4 A76 threads, 804 MB working set) and sysbench with a 64 MB buffer, and note that sysbench's
default 1 MB buffer reports 61 GB/s "because it never leaves L3". Those are their figures on their
board. This module's working set is at least `factor` x the LLC this machine reports
(/sys/devices/system/cpu/cpu0/cache/index*/size, the highest level), so the read cannot be served
from cache, and the figure it prints is labelled with the machine it ran on.

What it measures: numpy's sum over a float64 array (a read-only stream; each thread reduces its own
contiguous slice, and numpy releases the GIL inside the reduction). It is a read ceiling as numpy
sees it, not a STREAM triad: the two are comparable in kind, not to the digit.

Board side: standard library and numpy.
"""

from __future__ import annotations

import os
import re
import statistics
import threading
import time
from dataclasses import dataclass

import numpy as np

from ..errors import UsageError
from ..paths import on_board

CACHE_DIR = "/sys/devices/system/cpu/cpu0/cache"
DEFAULT_FACTOR = 8
FALLBACK_BYTES = 1 << 30  # when the LLC size cannot be read
_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]?)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """"3072K" -> 3145728 (the kernel's cache size format)."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"not a cache size: {text!r}")
    return int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2).upper()]


def llc_bytes() -> int | None:
    """Size of the highest-level data or unified cache cpu0 sees (under rkstudy.paths.sysroot()),
    or None if unreported."""
    best = None
    for index in sorted(on_board(CACHE_DIR).glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size = parse_size((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if kind in ("Unified", "Data") and (best is None or level > best[0]):
            best = (level, size)
    return best[1] if best else None


@dataclass(frozen=True)
class DramReading:
    label: str
    gb_per_s: float  # best of the repeats (the ceiling), bytes over wall-clock seconds
    median_gb_per_s: float
    cpu_gb_per_s: float  # best of the repeats, each thread's bytes over its own CPU seconds, summed
    loadavg_1m: float  # above the CPU count, the wall figure is CPU-starved: read cpu_gb_per_s
    working_set_bytes: int
    llc_bytes: int | None
    threads: int
    repeats: int
    cpus: list[int] | None

    def row(self) -> dict:
        """The reading as a results row (where/target are stamped by the caller: a host run is
        rkstudy.tables.results.HOST, a board run says board)."""
        return {"label": self.label, "threads": self.threads, "gb_per_s_best": self.gb_per_s,
                "gb_per_s_median": self.median_gb_per_s, "gb_per_cpu_s": self.cpu_gb_per_s,
                "working_set_mib": self.working_set_bytes / 2**20,
                "llc_mib": self.llc_bytes / 2**20 if self.llc_bytes else "", "repeats": self.repeats,
                "cpus": " ".join(map(str, self.cpus)) if self.cpus else "", "loadavg_1m": self.loadavg_1m}

    def line(self) -> str:
        llc = f"{self.llc_bytes / 2**20:.0f} MiB LLC" if self.llc_bytes else "LLC unknown"
        return (f"{self.label}: DRAM read {self.gb_per_s:.2f} GB/s best, {self.median_gb_per_s:.2f} median "
                f"wall-clock; {self.cpu_gb_per_s:.2f} GB/s per CPU-second ({self.threads} thread(s), "
                f"{self.working_set_bytes / 2**20:.0f} MiB working set, {llc}, numpy float64 sum, best of "
                f"{self.repeats}, load average {self.loadavg_1m:.2f})")


def _stream(slices: list[np.ndarray]) -> tuple[float, list[float]]:
    """(wall seconds to read every slice once, one thread per slice; each thread's CPU seconds).

    The CPU seconds exclude time a thread spent descheduled, which on a shared machine is most of
    the wall time."""
    cpu = [0.0] * len(slices)

    def read(i: int) -> None:
        c0 = time.thread_time()
        np.add.reduce(slices[i])
        cpu[i] = time.thread_time() - c0

    threads = [threading.Thread(target=read, args=(i,)) for i in range(1, len(slices))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    read(0)
    for t in threads:
        t.join()
    return time.perf_counter() - t0, cpu


def read_bandwidth(working_set: int | None = None, *, threads: int = 1, repeats: int = 5,
                   factor: int = DEFAULT_FACTOR, cpus: list[int] | None = None,
                   label: str = "host") -> DramReading:
    """Read `working_set` bytes (default: factor x LLC) `repeats` times; GB/s is bytes / seconds / 1e9.

    `cpus` pins the process while measuring (on an RK3588, the A76 cluster: cpus 4-7), and the
    previous affinity is restored after.
    """
    llc = llc_bytes()
    if working_set is None:
        working_set = factor * llc if llc else FALLBACK_BYTES
    if llc and working_set < factor * llc:
        raise UsageError(f"a {working_set} B working set is under {factor}x the {llc} B LLC: the read "
                         "would be served from cache, not DRAM; give a larger one or none (default: "
                         f"{factor}x the LLC)")
    n = working_set // 8
    array = np.ones(n, dtype=np.float64)  # written once so every page is resident before timing
    slices = np.array_split(array, threads)
    before = os.sched_getaffinity(0) if cpus else None
    try:
        if cpus:
            os.sched_setaffinity(0, cpus)
        _stream(slices)  # warm-up pass: page tables, thread start-up
        runs = [_stream(slices) for _ in range(repeats)]
    finally:
        if before is not None:
            os.sched_setaffinity(0, before)
    rates = [array.nbytes / wall / 1e9 for wall, _ in runs]
    cpu_rates = [sum(sl.nbytes / max(c, 1e-9) for sl, c in zip(slices, cpu)) / 1e9 for _, cpu in runs]
    return DramReading(label, max(rates), statistics.median(rates), max(cpu_rates), os.getloadavg()[0],
                       int(array.nbytes), llc, threads, repeats, list(cpus) if cpus else None)
