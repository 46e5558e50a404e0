"""JupyterLab opens every notebook with the project's kernel: a headless server, checked through its
REST API (`make lab` starts the same server for a person)."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from rkstudy.paths import NOTEBOOKS

pytestmark = pytest.mark.lab

TOKEN = "rkstudy-test"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    port = free_port()
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path_factory.mktemp("jrt")),
           "JUPYTER_CONFIG_DIR": str(tmp_path_factory.mktemp("jcfg"))}
    proc = subprocess.Popen([sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}",
                             "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={TOKEN}", "--allow-root",
                             f"--ServerApp.root_dir={NOTEBOOKS}"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            get(base, "/api/status")
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail("JupyterLab did not start within 90 s")
            time.sleep(0.5)
    yield base
    proc.terminate()
    proc.wait(timeout=30)


def get(base: str, path: str) -> dict:
    req = urllib.request.Request(base + path, headers={"Authorization": f"token {TOKEN}"})
    with urllib.request.urlopen(req, timeout=20) as resp:
        return json.loads(resp.read())


def test_lab_serves_the_lab_page(lab):
    req = urllib.request.Request(lab + "/lab", headers={"Authorization": f"token {TOKEN}"})
    with urllib.request.urlopen(req, timeout=20) as resp:
        assert resp.status == 200 and b"JupyterLab" in resp.read()


def test_every_notebook_opens_with_the_project_kernel(lab):
    specs = get(lab, "/api/kernelspecs")["kernelspecs"]
    assert "rkstudy" in specs, "the project's kernel is not installed: run `make venv`"
    python = specs["rkstudy"]["spec"]["argv"][0]
    # the kernel is this environment's own python (the venv's, not the base interpreter it links to)
    assert os.path.abspath(python) == os.path.abspath(sys.executable)
    names = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))
    assert names
    for name in names:
        model = get(lab, f"/api/contents/{name}")
        assert model["type"] == "notebook" and model["content"]["cells"], name
        assert model["content"]["metadata"]["kernelspec"]["name"] == "rkstudy", name
