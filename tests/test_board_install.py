"""The board extra resolves on every Python a board image ships (3.10, 3.11, 3.12) against aarch64
wheels only: pip's resolver in dry-run mode, for that platform, from the requirements pyproject.toml
declares (rknn-toolkit-lite2 listed without its aarch64 marker, which pip would evaluate on this host).
"""

import re
import subprocess
import sys

import pytest
import tomllib

from tests.test_envfiles import PYPROJECT, REPO

UNREACHABLE = ("Network is unreachable", "Failed to establish a new connection", "Temporary failure in name resolution",
               "Max retries exceeded", "ConnectionError", "No route to host")


def board_requirements() -> list[str]:
    """Core dependencies plus the board extra, markers dropped."""
    reqs = PYPROJECT["project"]["dependencies"] + PYPROJECT["project"]["optional-dependencies"]["board"]
    return [r.split(";")[0].strip() for r in reqs]


def test_board_extra_holds_only_what_board_code_imports():
    names = {re.match(r"[A-Za-z0-9_.\-]+", r).group(0).lower() for r in board_requirements()}
    assert "soundfile" not in names  # audio is written with the standard library's wave
    assert {"rknn-toolkit-lite2", "numpy", "tqdm", "onnxruntime"} <= names
    board = PYPROJECT["project"]["optional-dependencies"]["board"]
    assert any(r.startswith("rknn-toolkit-lite2==2.5.0;") and "aarch64" in r for r in board)
    assert tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"] == ">=3.10,<3.13"


@pytest.mark.parametrize("python", ["3.10", "3.11", "3.12"])
def test_board_extra_resolves_for_aarch64(python, tmp_path):
    req = tmp_path / "board-requirements.txt"
    req.write_text("\n".join(board_requirements()) + "\n")
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--only-binary=:all:",
           "--platform", "manylinux2014_aarch64", "--platform", "manylinux_2_28_aarch64",
           "--python-version", python, "--implementation", "cp", "--target", str(tmp_path / "target"),
           "--disable-pip-version-check", "-r", str(req)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0 and any(s in out for s in UNREACHABLE):
        pytest.skip(f"pip cannot reach the package index: {out.strip().splitlines()[-1]}")
    assert proc.returncode == 0, out[-2000:]
    would = re.search(r"Would install (.*)", out).group(1).split()
    assert "rknn-toolkit-lite2-2.5.0" in would and "numpy-1.26.4" in would, would
    assert any(w.startswith("onnxruntime-1.23.2") for w in would), would
