"""Benchmarks recorded in results/benchmarks/ (never asserted in tests: timing is machine noise).

* walker: the window walker's own per-window cost with a null engine, against a budget of
  0.2 ms per window, 1% of the ~21 ms one Piper window takes on the RK3588 NPU.
* make-test: the wall time of the whole test suite, against the 30-minute CI budget.
* reproduce: each study's minutes in `make reproduce` and the total (written by rkstudy.tables.reproduce).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from ..paths import REPO
from ..walk import window
from . import results

WALKER_BUDGET_MS = 0.2
TEST_BUDGET_S = 30 * 60


def _machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores"


def walker_overhead(frames: int = 45 * 2000, emit: int = 45, context: int = 24, channels: int = 192,
                    samples_per_frame: int = 256, repeats: int = 5) -> dict:
    """Median over `repeats` walks of the per-window time with an engine that does no work."""
    win = emit + 2 * context
    latent = np.random.default_rng(0).standard_normal((channels, frames)).astype(np.float32)
    out = np.zeros((1, win * samples_per_frame), dtype=np.float32)
    n_windows = len(window.plan_windows(frames, emit, context))
    per_window = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        audio = window.walk_windows(latent, lambda x, m: out, emit=emit, context=context,
                                    samples_per_frame=samples_per_frame, progress=False)
        per_window.append((time.perf_counter() - t0) / n_windows * 1e3)
    assert audio.shape[-1] == frames * samples_per_frame
    ms = float(np.median(per_window))
    return {"benchmark": "walker_null_engine", "windows": n_windows, "window": f"{emit}+2x{context}",
            "channels": channels, "samples_per_frame": samples_per_frame,
            "value": round(ms, 4), "unit": "ms/window", "budget": WALKER_BUDGET_MS,
            "within_budget": ms < WALKER_BUDGET_MS, "machine": _machine()}


def make_test_wall(repo: Path = REPO) -> dict:
    """Run `make test` once and time it (the run's own pass/fail is recorded too)."""
    t0 = time.monotonic()
    proc = subprocess.run(["make", "test"], cwd=repo)
    seconds = time.monotonic() - t0
    return {"benchmark": "make_test_wall", "windows": "", "window": "", "channels": "",
            "samples_per_frame": "", "value": round(seconds, 1), "unit": "s", "budget": TEST_BUDGET_S,
            "within_budget": proc.returncode == 0 and seconds < TEST_BUDGET_S,
            "machine": _machine()}


def record(rows: dict | list[dict], table: str, title: str | None = None, root: Path | None = None) -> Path:
    """Stamp benchmark rows (host-side timings; a carried row keeps its own stamp) and write
    `<root>/benchmarks/<table>` (root: results/, or $RKSTUDY_RESULTS)."""
    rows = [rows] if isinstance(rows, dict) else list(rows)
    return results.write_table("benchmarks", table, [results.stamp(r, results.HOST) for r in rows], root=root,
                               title=title or f"Benchmark: {rows[0]['benchmark']}")


def main(which: str) -> int:
    if which == "walker":
        row = walker_overhead()
        print(f"walker: {row['value']} ms/window over {row['windows']} windows "
              f"(budget {WALKER_BUDGET_MS} ms) -> {record(row, 'walker')}")
    elif which == "make-test":
        row = make_test_wall()
        print(f"make test: {row['value']} s (budget {TEST_BUDGET_S} s) -> {record(row, 'make_test')}")
    else:
        print(f"unknown benchmark {which!r}; choose walker or make-test", file=sys.stderr)
        return 2
    return 0
