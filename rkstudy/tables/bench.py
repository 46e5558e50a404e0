"""Benchmarks recorded in results/benchmarks/ (never asserted in tests: timing is machine noise).

* walker: the window walker's own per-window cost with a null engine (measured by rkstudy.walk.bench).
* make-test: the wall time of the whole test suite, against the 30-minute CI budget.
* reproduce: each study's minutes in `make reproduce` and the total (written by rkstudy.tables.reproduce).
"""

from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path

from ..paths import REPO
from . import results

TEST_BUDGET_S = 30 * 60


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores"


def make_test_wall(repo: Path = REPO) -> dict:
    """Run `make test` once and time it (the run's own pass/fail is recorded too)."""
    t0 = time.monotonic()
    proc = subprocess.run(["make", "test"], cwd=repo)
    seconds = time.monotonic() - t0
    return {"benchmark": "make_test_wall", "windows": "", "window": "", "channels": "",
            "samples_per_frame": "", "value": round(seconds, 1), "unit": "s", "budget": TEST_BUDGET_S,
            "within_budget": proc.returncode == 0 and seconds < TEST_BUDGET_S,
            "machine": machine()}


def record(rows: dict | list[dict], table: str, title: str | None = None, root: Path | None = None) -> Path:
    """Stamp benchmark rows (host-side timings; a carried row keeps its own stamp) and write
    `<root>/benchmarks/<table>` (root: results/, or $RKSTUDY_RESULTS)."""
    rows = [rows] if isinstance(rows, dict) else list(rows)
    return results.write_table("benchmarks", table, [results.stamp(r, results.HOST) for r in rows], root=root,
                               title=title or f"Benchmark: {rows[0]['benchmark']}")
