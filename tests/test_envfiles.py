"""One source of truth for the pins: pyproject.toml. The conda files may only restate them."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from ruamel.yaml import YAML

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
EXTRAS = PYPROJECT["project"]["optional-dependencies"]


def pins(requirements):
    """{name: spec} for every requirement that carries a version spec."""
    out = {}
    for req in requirements:
        m = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*([<>=!~][^;#]*)?", req)
        if m and m.group(2):
            out[m.group(1).lower().replace("_", "-")] = m.group(2).strip()
    return out


ALL_PINS = pins(PYPROJECT["project"]["dependencies"] + [r for e in EXTRAS.values() for r in e])


@pytest.mark.parametrize("name,extras_needed", [("environment-converter.yml", {"converter"}),
                                                ("environment-board.yml", {"board"})])
def test_conda_file_agrees_with_pyproject(name, extras_needed):
    env = YAML(typ="safe").load((REPO / name).read_text())
    conda = [d for d in env["dependencies"] if isinstance(d, str)]
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    # python: the conda pin must satisfy requires-python
    py = next(d for d in conda if d.startswith("python"))
    major, minor = map(int, py.split("=")[1].split(".")[:2])
    assert (3, 10) <= (major, minor) < (3, 13), PYPROJECT["project"]["requires-python"]
    # the package itself, with extras that exist in pyproject
    editable = [p for p in pip if p.startswith("-e .")]
    assert len(editable) == 1, f"{name} must install this package (-e .[extras])"
    extras = set(re.search(r"\[(.*)\]", editable[0]).group(1).split(","))
    assert extras_needed <= extras and extras <= set(EXTRAS), extras
    # anything else pinned there must carry pyproject's pin exactly
    for pkg, spec in pins(conda[1:] + [p for p in pip if not p.startswith("-")]).items():
        assert ALL_PINS.get(pkg) == spec, f"{name} pins {pkg}{spec}, pyproject says {ALL_PINS.get(pkg)}"


def test_toolkit_pin_is_in_one_place():
    toolkit = PYPROJECT["tool"]["rkstudy"]["toolkit"]
    assert toolkit == "rknn-toolkit2==2.5.0"
    makefile = (REPO / "Makefile").read_text()
    assert "rknn-toolkit2" not in makefile  # the Makefile reads it from pyproject
    lite = pins(EXTRAS["board"])["rknn-toolkit-lite2"]
    assert lite.startswith("==" + toolkit.split("==")[1])  # board runtime matches the compiler


LONG_TARGETS = ("test", "test-fast", "reproduce", "bench")


@pytest.mark.parametrize("target", LONG_TARGETS)
def test_long_targets_run_in_their_own_scratch_folder(target):
    recipe = re.search(rf"^{re.escape(target)}:[^\n]*\n((?:\t[^\n]*\n)+)", (REPO / "Makefile").read_text(), re.M)
    lines = recipe.group(1).splitlines() if recipe else []
    assert lines and lines[0].startswith("\t$(SCRATCH);"), f"make {target} writes its temporary files to /tmp"
    # each recipe line is a shell of its own: TMPDIR holds only in the first unless the rest continue it
    assert all(line.endswith("\\") for line in lines[:-1]), \
        f"make {target}: a recipe line after the first runs outside the scratch folder"


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize("status", [0, 3])
def test_the_scratch_folder_is_gone_when_the_run_ends(tmp_path, status):
    """The recipe's temporary files land in one folder under the caller's TMPDIR, and the folder goes
    when the recipe ends, whether it passed or failed, with the recipe's exit code kept."""
    probe = tmp_path / "probe.mk"
    probe.write_text(f"probe:\n\t$(SCRATCH); echo \"$$TMPDIR\"; {sys.executable} -c 'import tempfile; "
                     f"tempfile.mkdtemp(prefix=\"left-\")'; exit {status}\n")
    caller = tmp_path / "tmp"
    caller.mkdir()
    # a make above this test (make test) passes its jobserver in MAKEFLAGS: this make is not its child
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    run = subprocess.run(["make", "--no-print-directory", "-s", "-f", str(REPO / "Makefile"), "-f", str(probe),
                          "probe"], capture_output=True, text=True, cwd=REPO, env={**env, "TMPDIR": str(caller)})
    assert (run.returncode == 0) == (status == 0), run.stderr
    scratch = Path(run.stdout.strip().splitlines()[-1])
    assert scratch.parent == caller and scratch.name.startswith("rkstudy-run-")
    assert not scratch.exists() and list(caller.iterdir()) == []
