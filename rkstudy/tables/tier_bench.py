"""The fast test tier as a benchmark (results/benchmarks/test_fast): `make test-fast` timed once, against
the three minutes it is for. The tier is what a developer runs after each edit, so its budget holds on a
clone's first run, when the build cache starts empty and the run fills it with the models' derived files;
`first_run` says which kind of run a row is.

    python -m rkstudy.tables.tier_bench     # (make bench runs it between the walker and make test)
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from ..paths import REPO, cache_root
from .bench import machine, record

FAST_BUDGET_S = 3 * 60


def fast_tier_wall(repo: Path = REPO) -> dict:
    """Run `make test-fast` once in `repo` and time it. `within_budget` holds only for a run that passed in
    time; `first_run` is whether the build cache held no derived file when it started (only `wheels/`,
    where `make lite-wheel`, a prerequisite of the target, puts the board runtime's wheel it downloads)."""
    cache = cache_root() if Path(repo) == REPO else Path(repo) / "build" / "cache"
    first_run = not (cache.is_dir() and any(p.name != "wheels" for p in cache.iterdir()))
    t0 = time.monotonic()
    proc = subprocess.run(["make", "test-fast"], cwd=repo)
    seconds = time.monotonic() - t0
    return {"benchmark": "test_fast_wall", "windows": "", "window": "", "channels": "", "samples_per_frame": "",
            "value": round(seconds, 1), "unit": "s", "budget": FAST_BUDGET_S,
            "within_budget": proc.returncode == 0 and seconds < FAST_BUDGET_S, "first_run": first_run,
            "machine": machine()}


def main() -> int:
    row = fast_tier_wall()
    print(f"make test-fast: {row['value']} s (budget {FAST_BUDGET_S} s{', first run' if row['first_run'] else ''})"
          f" -> {record(row, 'test_fast')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
