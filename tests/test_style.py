"""`make lint` holds: ruff over the package, the tests and the notebooks (config in pyproject.toml)."""

import subprocess
import sys

from rkstudy.paths import REPO


def test_ruff_is_clean():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "rkstudy", "tests", "notebooks"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]
