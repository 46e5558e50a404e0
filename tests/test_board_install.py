"""The board extra resolves on every Python a board image ships (3.10, 3.11, 3.12) against aarch64
wheels only: pip's resolver in dry-run mode, for that platform, from the requirements pyproject.toml
declares (rknn-toolkit-lite2 listed without its aarch64 marker, which pip would evaluate on this host).
"""

import re
import subprocess
import sys

import pytest
import tomllib

# tests/ is on sys.path, as for board_cli: a package may install a top-level `tests` of its own
from test_envfiles import PYPROJECT, REPO

UNREACHABLE = ("Network is unreachable", "Failed to establish a new connection", "Temporary failure in name resolution",
               "Max retries exceeded", "ConnectionError", "No route to host")


def board_requirements() -> list[str]:
    """Core dependencies plus the board extra, markers dropped."""
    reqs = PYPROJECT["project"]["dependencies"] + PYPROJECT["project"]["optional-dependencies"]["board"]
    return [r.split(";")[0].strip() for r in reqs]


def test_board_extra_holds_only_what_board_code_imports():
    names = {re.match(r"[A-Za-z0-9_.\-]+", r).group(0).lower() for r in board_requirements()}
    assert {"rknn-toolkit-lite2", "numpy", "tqdm", "onnxruntime", "soundfile"} <= names  # soundfile: speak's audio
    assert {"pystoi", "scipy"} <= names and "pesq" not in names  # the gate's STOI; PESQ-WB compiles C (an sdist)
    board = PYPROJECT["project"]["optional-dependencies"]["board"]
    assert any(r.startswith("rknn-toolkit-lite2==2.5.0;") and "aarch64" in r for r in board)
    assert tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"] == ">=3.10,<3.13"


@pytest.mark.slow
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
    assert any(w.startswith("soundfile-") for w in would), would
    assert "pystoi-0.4.1" in would and any(w.startswith("scipy-") for w in would), would  # the gate's STOI


@pytest.mark.slow
def test_pesq_has_no_wheel_so_the_board_extra_leaves_it_out(tmp_path):
    """pesq==0.0.4 is published as an sdist only (its C is compiled at install): no aarch64 board installs it
    without a compiler and Python's headers, which is why the board gate reports PESQ-WB as not scored there."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--platform",
           "manylinux2014_aarch64", "--python-version", "3.11", "--implementation", "cp", "-d", str(tmp_path),
           "--disable-pip-version-check", "pesq==0.0.4"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    if any(s in out for s in UNREACHABLE):
        pytest.skip(f"pip cannot reach the package index: {out.strip().splitlines()[-1]}")
    assert proc.returncode != 0 and "No matching distribution found for pesq==0.0.4" in out, out[-2000:]


# --- make board-env on a python3 without ensurepip (Debian and Ubuntu without python3-venv) ----------------------
@pytest.fixture
def python_without_ensurepip(tmp_path):
    """A python3 that has `venv` and no `ensurepip`, as Debian and Ubuntu ship it until python3-venv is
    installed: this interpreter with an `ensurepip` that cannot be imported first on its path."""
    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "ensurepip.py").write_text("raise ModuleNotFoundError(\"No module named 'ensurepip'\", name='ensurepip')\n")
    fake = tmp_path / "python3"
    fake.write_text(f"#!/bin/sh\nPYTHONPATH={stub} exec {sys.executable} \"$@\"\n")
    fake.chmod(0o755)
    assert subprocess.run([str(fake), "-c", "import venv; import ensurepip"], capture_output=True).returncode != 0
    return fake


def make(*args) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", "-C", str(REPO), *args], capture_output=True, text=True,
                          timeout=600)


def test_board_env_without_ensurepip_names_the_package_and_leaves_no_venv(python_without_ensurepip, tmp_path):
    venv = tmp_path / ".venv-board"
    proc = make("board-env", f"PYTHON={python_without_ensurepip}", f"BOARD_VENV={venv}")
    v = sys.version_info
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert (f"board-env: {python_without_ensurepip} has no ensurepip, so a venv it makes has no pip: sudo apt install "
            f"python3.{v.minor}-venv (Debian/Ubuntu), then make board-env again") in proc.stdout
    assert not venv.exists()


@pytest.mark.slow
def test_a_venv_left_without_pip_is_made_again(tmp_path):
    """What an earlier `python3 -m venv` leaves where ensurepip was missing: a venv with no pip, which the
    next run would otherwise take as made and die in with "No module named pip"."""
    venv = tmp_path / ".venv-board"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    assert subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "--version"], capture_output=True).returncode
    proc = make("board-venv", f"PYTHON={sys.executable}", f"BOARD_VENV={venv}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"board-env: {venv} has no pip (made before python3-venv was installed?): making it again" in proc.stdout
    assert subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "--version"], capture_output=True).returncode == 0
