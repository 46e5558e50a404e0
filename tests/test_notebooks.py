"""Every study notebook in quick mode (papermill), then the headline numbers it recorded, checked
against the gates with tolerances (recommenders' pattern: running is not enough, the numbers must hold).

Quick mode writes to build/quick-results/ (never the committed results/); the executed notebooks go
to build/quick-notebooks/.
"""

import json
import math

import pytest

from rkstudy.paths import NOTEBOOKS, QUICK_RESULTS, REPO

pytestmark = pytest.mark.notebooks

# study -> notebook, and {headline: (low, high)} the quick run must land in (inclusive)
EXPECT = {
    "toolchain": ("00_toolchain.ipynb", {
        "simulator vs fp32 on the probe, rk3588": (40, math.inf),
        "simulator vs fp32 on the probe, rk3566": (40, math.inf),
        "REGTASK lines, Conv1d at 32768 frames, rk3588": (10, 1000),
        "REGTASK lines, Conv1d at 32768 frames, rk3566": (0, 0),
        "simulator vs fp32, worst over the sweep": (40, math.inf)}),
    "piper_decoder": ("01_piper_decoder.ipynb", {
        "interior window SNR at 93 frames, worst (fp32)": (60, math.inf),
        "tail window 47 frames with the decoder mask (fp32)": (100, math.inf),
        "wrong seam: output RMS ratio": (0.1, 0.5),
        "simulator rk3588 vs full-length fp32 decode": (30, math.inf),
        "simulator rk3588: best lag": (0, 0),
        "rk3588 engine, 93-frame window": (20.0, 22.5),
        "REGTASK lines, rk3588 93-frame engine": (18, 18),
        "CPU RTF, windowed / monolithic": (1.2, 5.0),
        "receptive field, frames left / right of a perturbed frame (max)": (20, 45),
        "minimum context for 80 dB on speech (emit 45)": (16, 32)}),
    "inflect_decoder": ("01_piper_decoder.ipynb", {
        "context 32 at 480 frames (fp32)": (100, math.inf),
        "rk3588 engine, 256-frame window": (24.0, 27.0)}),
    "piper_encoder": ("02_piper_encoder.ipynb", {
        "raw slice nodes": (992, 992),
        "rewritten vs raw slice, worst (fp32)": (120, math.inf),
        "pad-safe, worst (fp32)": (120, math.inf),
        "simulator vs fp32, worst over widths": (50, math.inf),
        "rk3588 engine at width 64": (30, 36),
        "duration drift in the simulator, largest |%|": (0, 5.0),
        # the banded rewrite (quick: widths 64 and 128); research run: 15.3 and 16.4 MB, 62.2-62.3 dB
        "banded: rk3588 engine at width 128": (14.0, 20.0),
        "gather / banded engine bytes at width 64": (1.8, 2.6),
        "banded vs raw slice, worst (fp32)": (120, math.inf),
        "banded: max |diff| vs raw slice (fp32)": (0, 1e-5),
        "banded: simulator vs fp32, worst over widths": (50, math.inf),
        "banded minus gather: simulator worst at shared widths": (-3.0, 3.0),
        "banded: duration drift in the simulator, largest |%|": (0, 5.0)}),
}


def run_notebook(name: str) -> None:
    import papermill

    out = REPO / "build" / "quick-notebooks"
    out.mkdir(parents=True, exist_ok=True)
    papermill.execute_notebook(str(NOTEBOOKS / name), str(out / name), parameters={"QUICK": True},
                               cwd=str(NOTEBOOKS), kernel_name="rkstudy", progress_bar=False)


@pytest.fixture(scope="module")
def executed():
    done = set()

    def ensure(name: str) -> None:
        if name not in done:
            run_notebook(name)
            done.add(name)
    return ensure


@pytest.mark.parametrize("study", list(EXPECT))
def test_notebook_headlines(study, executed):
    notebook, expected = EXPECT[study]
    executed(notebook)
    recorded = json.loads((QUICK_RESULTS / study / "headlines.json").read_text())["headlines"]
    for name, (low, high) in expected.items():
        value = float(recorded[name]["value"])
        assert low <= value <= high, f"{study}: {name} = {value}, expected in [{low}, {high}]"


def test_every_notebook_is_checked():
    assert sorted({nb for nb, _ in EXPECT.values()}) == sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))


def test_notebooks_name_the_project_kernel_and_a_parameters_cell():
    for path in NOTEBOOKS.glob("*.ipynb"):
        nb = json.loads(path.read_text())
        assert nb["metadata"]["kernelspec"]["name"] == "rkstudy", path.name
        tagged = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
        assert len(tagged) == 1 and "QUICK = True" in "".join(tagged[0]["source"]), path.name


def test_executed_notebooks_stay_readable_on_a_code_host():
    """`make reproduce` keeps the executed notebooks under results/notebooks/: at most 3 MB each, and
    every embedded audio clip at most 5 s (the full renders go to the cache)."""
    import base64
    import io
    import wave

    from rkstudy.paths import RESULTS

    for path in sorted((RESULTS / "notebooks").glob("*.ipynb")):
        assert path.stat().st_size <= 3_000_000, f"{path.name} is {path.stat().st_size / 1e6:.1f} MB"
        nb = json.loads(path.read_text())
        for cell in nb["cells"]:
            for out in cell.get("outputs", []):
                html = out.get("data", {}).get("text/html", "")
                html = "".join(html) if isinstance(html, list) else html
                for b64 in html.split('base64,')[1:]:
                    data = base64.b64decode(b64.split('"')[0])
                    with wave.open(io.BytesIO(data)) as w:
                        assert w.getnframes() / w.getframerate() <= 5.0 + 1e-6, path.name
