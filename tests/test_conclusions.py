"""Every notebook's "What this shows" is rendered from its tables: the section's prose names no number,
the code cell after it concludes with `says(...)` statements, and no statement types a number its
cites do not name (read from the notebooks' sources, so a typed number fails here before a run)."""

import ast
import json

import pytest

from rkstudy.notebook import Cite, Study, says, theirs, typed_numbers
from rkstudy.paths import NOTEBOOKS
from rkstudy.tables import claims

HEADING = "## What this shows"


def cells(path):
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def source(cell):
    return "".join(cell["source"])


def says_calls(code: str):
    lines = [ln for ln in code.splitlines() if not ln.lstrip().startswith(("%", "!"))]
    for node in ast.walk(ast.parse("\n".join(lines))):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "says":
            yield node


def constants(nodes) -> list[str]:
    return [str(n.value) for node in nodes for n in ast.walk(node) if isinstance(n, ast.Constant)]


NOTEBOOK_PATHS = sorted(NOTEBOOKS.glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOK_PATHS, ids=lambda p: p.stem)
def test_what_this_shows_is_rendered_from_rows(path):
    nb = cells(path)
    heads = [i for i, c in enumerate(nb) if c["cell_type"] == "markdown" and source(c).startswith(HEADING)]
    assert heads, f"{path.name}: no '{HEADING}' section"
    for i in heads:
        prose = source(nb[i])
        assert claims.numbers_in(prose) == [], f"{path.name}: its conclusion prose types {claims.numbers_in(prose)}"
        following = next((c for c in nb[i + 1:] if c["cell_type"] == "code"), None)
        assert following is not None and ".conclude(" in source(following), \
            f"{path.name}: the code cell after '{HEADING}' must render its statements with study.conclude"


@pytest.mark.parametrize("path", NOTEBOOK_PATHS, ids=lambda p: p.stem)
def test_no_statement_types_a_number(path):
    found, typed = 0, []
    for cell in cells(path):
        if cell["cell_type"] != "code":
            continue
        for call in says_calls(source(cell)):
            found += 1
            first = call.args[0] if call.args else None
            assert isinstance(first, ast.Constant) and isinstance(first.value, str), \
                f"{path.name}: says() takes its text as a literal: {ast.unparse(call)[:100]}"
            named = constants(call.args[1:]) + constants(k.value for k in call.keywords)
            numbers = claims.typed_numbers(first.value, named)
            if numbers:
                typed.append(f"{first.value[:70]!r} types {', '.join(numbers)}")
    assert found, f"{path.name}: no says() statement"
    assert typed == [], path.name


def test_a_typed_number_is_refused_and_a_cited_one_is_not():
    with pytest.raises(ValueError, match="types 98"):
        says("worst window {:.1f} dB, below their 98 dB", ("window_sweep", {"window": 93}, "min_snr_db"))
    ok = says("the {}-frame window scores {:.1f} dB against theirs, {}", ("window_sweep", {"window": 93}, "window"),
              ("window_sweep", {"window": 93}, "min_snr_db"),
              theirs("interior window SNR vs full-length decode at 93 (45+24+24)", "piper_decoder"))
    assert typed_numbers(ok.text, ok.cites) == []


def test_statements_render_theirs_summaries_and_the_reading_they_hold(tmp_path):
    study = Study("piper_decoder", quick=True)
    study.root = tmp_path
    study.table("window_sweep", [{"window": w, "kind": "interior", "min_snr_db": snr, "where": "fp32"}
                                 for w, snr in ((77, 22.6), (93, 73.2))], "sweep", show=False)
    text = study.conclusions([
        says("worst over the sweep {:.1f} dB over {} windows; theirs at 93: {}",
             Cite("window_sweep", {"kind": "interior"}, "min_snr_db", "min"),
             Cite("window_sweep", {"kind": "interior"}, "window", "count"),
             theirs("interior window SNR vs full-length decode at 93 (45+24+24)", "piper_decoder")),
        says("the widest window is the best ({:.1f} dB)", ("window_sweep", {"window": 93}, "min_snr_db"),
             holds=lambda snr: snr > 80)])
    first, second = text.splitlines()
    assert first.startswith("- worst over the sweep 22.6 dB over 2 windows; theirs at 93: 98+ dB (")
    assert "min of min_snr_db" in first and "the reference documents: interior window SNR" in first
    assert second.startswith("- **Not so in this run**") and "73.2 dB" in second


def test_every_simulator_headline_carries_its_board_risk():
    """A headline whose name says simulator passes the engine rows it was measured on (`risk=`), so the
    index shows the board-risk verdict in the same row (record_headlines refuses one without it too)."""
    checked = 0
    for path in NOTEBOOK_PATHS:
        for cell in cells(path):
            if cell["cell_type"] != "code":
                continue
            lines = [ln for ln in source(cell).splitlines() if not ln.lstrip().startswith(("%", "!"))]
            for node in ast.walk(ast.parse("\n".join(lines))):
                if not (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "headline" and node.args):
                    continue
                name = " ".join(constants([node.args[0]])).lower()
                if "simulator" in name:
                    checked += 1
                    assert "risk" in {k.arg for k in node.keywords}, f"{path.name}: {ast.unparse(node)[:120]}"
    assert checked >= 20


def test_a_simulator_headline_without_its_risk_is_refused(tmp_path):
    from rkstudy.tables import results

    with pytest.raises(ValueError, match="simulator number without a board risk"):
        results.record_headlines("toolchain", {"simulator vs fp32": {"value": 63.1, "unit": "dB"}}, root=tmp_path)
    study = Study("toolchain", quick=True)
    study.root = tmp_path
    rows = [{"target": "rk3588", "regtask": 0, "regtask_max_value": 0},
            {"target": "rk3588", "regtask": 18, "regtask_max_value": 16352}]
    study.headline("simulator vs fp32, worst over two engines", 42.2, "dB", risk=rows)
    study.finish()
    recorded = results.read_headlines("toolchain", tmp_path)["headlines"]["simulator vs fp32, worst over two engines"]
    assert recorded["board_risk"].startswith("at risk: 18 REGTASK lines, largest field value 16,352")
    assert recorded["board_risk"].endswith("[1 of 2 engines at risk]")
