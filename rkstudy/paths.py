"""Every path the project uses, in one place (cookiecutter-data-science's `config.py`).

Board side: standard library only.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "data"
TEXTS = DATA / "texts"
REFERENCE = DATA / "reference"
REFERENCE_FIGURES = REFERENCE / "figures.csv"
RESULTS = REPO / "results"
NOTEBOOKS = REPO / "notebooks"
QUICK_RESULTS = REPO / "build" / "quick-results"
# The notebooks as `pytest --nbmake notebooks/` executed them (quick mode), kept for the reader checks
QUICK_NOTEBOOKS = REPO / "build" / "quick-notebooks"


def cache_root() -> Path:
    """Build outputs (slices, engines, logs, audio): `$RKSTUDY_CACHE`, default `build/cache`."""
    return Path(os.environ.get("RKSTUDY_CACHE", REPO / "build" / "cache"))


def results_root(quick: bool) -> Path:
    """Where tables go: the committed `results/` in full mode, a scratch folder in quick mode, so a
    quick test run never overwrites the committed tables. `$RKSTUDY_RESULTS` wins over both."""
    if os.environ.get("RKSTUDY_RESULTS"):
        return Path(os.environ["RKSTUDY_RESULTS"])
    return QUICK_RESULTS if quick else RESULTS


def figures(study: str, quick: bool) -> Path:
    """`<results root>/<study>/figures/`: the PNGs a notebook writes for readers on a code host."""
    return results_root(quick) / study / "figures"


def sysroot() -> Path:
    """Root under which board files (/proc, /sys, /dev) are read: `$RKSTUDY_SYSROOT`, default `/`.

    Tests point it at a recorded tree (tests/fixtures/boards/...) so every board-only line runs in CI.
    """
    return Path(os.environ.get("RKSTUDY_SYSROOT", "/"))


def on_board(path: str) -> Path:
    """An absolute board path (`/sys/...`) under sysroot()."""
    return sysroot() / path.lstrip("/")
