"""`pytest --nbmake notebooks/` (the first step of `make test`) runs each notebook as `make reproduce` does, as a
recorded run (rkstudy.process.RECORDED: no progress bars, warnings without this machine's paths), and keeps each
executed copy under build/quick-notebooks/, where tests/test_readers.py reads what a reader of it would meet in
the same test run instead of waiting for the next full re-make."""

from __future__ import annotations

import os

import nbformat

from rkstudy import atomic
from rkstudy.paths import QUICK_NOTEBOOKS
from rkstudy.process import RECORDED

os.environ[RECORDED] = "1"  # before any kernel starts: each inherits it

try:
    from nbmake import pytest_items
except ImportError:  # nbmake not installed: nothing executes the notebooks, nothing to keep
    pytest_items = None

if pytest_items is not None and not getattr(pytest_items.NotebookRun.execute, "keeps_a_copy", False):
    _execute = pytest_items.NotebookRun.execute

    def _execute_and_keep(self):
        """nbmake's run of one notebook, its executed copy written beside the others (nbmake keeps none
        unless asked to overwrite the source, which must keep its outputs cleared)."""
        result = _execute(self)
        atomic.write_text(QUICK_NOTEBOOKS / self.filename.name, nbformat.writes(result.nb))
        return result

    _execute_and_keep.keeps_a_copy = True
    pytest_items.NotebookRun.execute = _execute_and_keep
