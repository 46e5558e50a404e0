"""Study.conclude: a notebook's "What this shows" is rendered from the rows it cites, so the prose
cannot drift from the tables; a missing row fails loudly, except a full-run-only statement in quick
mode, which says it was skipped."""

import ast
import json

import pytest

from rkstudy.notebook import MAX_STATEMENTS, Cite, Study, says, shown_path
from rkstudy.paths import REPO


def _study(quick: bool) -> Study:
    study = Study("synthetic", quick)
    study.tables["window_sweep"] = ([
        {"window": 93, "kind": "interior", "min_snr_db": 73.2148},
        {"window": 93, "kind": "tail", "min_snr_db": 104.5},
        {"window": 55, "kind": "interior", "min_snr_db": -3.17}], "windows")
    study.tables["builds"] = ([{"target": "rk3588", "regtask": 18, "snr_db": 43.1},
                               {"target": "rk3566", "regtask": 355, "snr_db": ""}], "builds")
    return study


def test_statements_render_from_the_cited_rows_and_name_them():
    text = _study(quick=False).conclusions([
        says("The worst interior window of the 93-frame window scores {:.1f} dB against a full decode",
             ("window_sweep", {"window": 93, "kind": "interior"}, "min_snr_db")),
        says("{} lines for the 93-frame window on {}, {:.2f} dB at 55", ("builds", {"target": "rk3588"}, "regtask"),
             Cite("builds", {"target": "rk3588"}, "target"),
             ("window_sweep", {"window": "55", "kind": "interior"}, "min_snr_db"))])
    assert text.split("\n") == [
        "- The worst interior window of the 93-frame window scores 73.2 dB against a full decode "
        "(`window_sweep`: window=93, kind=interior, min_snr_db)",
        "- 18 lines for the 93-frame window on rk3588, -3.17 dB at 55 (`builds`: target=rk3588, regtask; "
        "`builds`: target=rk3588, target; `window_sweep`: window=55, kind=interior, min_snr_db)"]


@pytest.mark.parametrize("cite, why", [
    (("window_sweep", {"window": 77}, "min_snr_db"), "selects 0 rows"),
    (("window_sweep", {"window": 93}, "min_snr_db"), "selects 2 rows"),
    (("window_sweep", {"window": 55}, "max_snr_db"), "no column 'max_snr_db'"),
    (("window_plan", {"window": 93}, "min_snr_db"), "table 'window_plan' was not recorded"),
    (("builds", {"target": "rk3566"}, "snr_db"), "the cell is empty")])
def test_a_missing_or_ambiguous_row_fails_loudly_in_both_modes(cite, why):
    for quick in (False, True):
        with pytest.raises(KeyError, match=why):
            _study(quick).conclusions([says("{} dB", cite)])


def test_a_full_run_only_statement_says_it_was_skipped_in_quick_mode_only():
    statement = says("The 28-frame context reaches {:.1f} dB", ("window_plan", {"context": 28}, "snr_db"),
                     full_only=True)
    assert _study(quick=True).conclusions([statement]) == (
        "- *Not measured in quick mode (full run only):* The 28-frame context reaches … dB "
        "(`window_plan`: context=28, snr_db)")
    with pytest.raises(KeyError, match="window_plan"):
        _study(quick=False).conclusions([statement])
    # present in quick mode too: rendered from the row like any other
    present = says("{:.0f} dB", ("window_sweep", {"window": 55}, "min_snr_db"), full_only=True)
    assert _study(quick=True).conclusions([present]) == "- -3 dB (`window_sweep`: window=55, min_snr_db)"


def test_a_value_the_format_cannot_take_fails_naming_the_statement():
    with pytest.raises(ValueError, match=r"synthetic, statement 1 .* cannot take \['rk3588'\]"):
        _study(False).conclusions([says("{:.1f} dB", ("builds", {"target": "rk3588"}, "target"))])


def test_at_most_ten_statements():
    cite = ("builds", {"target": "rk3588"}, "regtask")
    assert len(_study(False).conclusions([says("{}", cite)] * MAX_STATEMENTS).split("\n")) == MAX_STATEMENTS == 10
    with pytest.raises(ValueError, match="11 statements"):
        _study(False).conclusions([says("{}", cite)] * (MAX_STATEMENTS + 1))


def test_paths_a_reader_sees_are_relative_to_the_repository():
    assert shown_path(REPO / "results" / "x" / "t.csv").as_posix() == "results/x/t.csv"
    assert "build/quick-results/synthetic" in repr(Study("synthetic", True))
    assert str(REPO) not in repr(Study("synthetic", True))


CONCLUDING = ["00_toolchain.ipynb", "01_piper_decoder.ipynb", "01b_piper_decoder_stateful.ipynb",
              "02_piper_encoder.ipynb", "03_kokoro_generator.ipynb", "04_qwen3_vocoder.ipynb",
              "05_flow_estimator_memory.ipynb", "06_lint.ipynb", "09_npu_cost.ipynb"]


@pytest.mark.parametrize("name", CONCLUDING)
def test_each_notebook_ends_with_what_it_shows_before_its_last_cell(name):
    """The conclusions sit between the headlines and the last cell (reference claims, then finish), under
    a "What this shows" heading, and each conclude() call holds at most ten statements."""
    import ast
    import json

    from rkstudy.paths import NOTEBOOKS

    cells = json.loads((NOTEBOOKS / name).read_text())["cells"]
    source = ["".join(c["source"]) for c in cells]
    assert "finish()" in source[-1] and cells[-1]["cell_type"] == "code"
    assert cells[-2]["cell_type"] == "code" and ".conclude(" in source[-2]
    assert cells[-3]["cell_type"] == "markdown" and source[-3].startswith("## What this shows")
    calls = [n for n in ast.walk(ast.parse(source[-2]))
             if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "conclude"]
    assert calls and all(isinstance(c.args[0], ast.List) and 0 < len(c.args[0].elts) <= MAX_STATEMENTS for c in calls)


def test_an_engine_row_is_shown_with_its_board_risk(tmp_path, monkeypatch):
    shown = []
    monkeypatch.setattr(Study, "show", staticmethod(lambda rows, columns=None: shown.append(columns)))
    study = Study("synthetic", quick=True)
    study.root = tmp_path
    study.table("builds", [{"target": "rk3588", "regtask": 18, "regtask_max_value": 16352, "snr_db": 43.1,
                            "where": "simulator"}], "builds", show=["target", "snr_db"])
    study.table("sweep", [{"window": 93, "min_snr_db": 73.2, "where": "fp32"}], "sweep", show=["window", "min_snr_db"])
    assert shown == [["target", "snr_db", "board_risk"], ["window", "min_snr_db"]]


def test_an_engine_figure_headline_carries_its_engines_board_risk(tmp_path, monkeypatch):
    """An engine's size or its REGTASK lines recorded without `risk` stands beside the verdict of the engine
    rows of this run that hold it: an at-risk or known-bad engine's size never reads as a clean one's."""
    monkeypatch.setattr(Study, "show", staticmethod(lambda rows, columns=None: None))
    study = Study("synthetic", quick=True)
    study.root = tmp_path
    study.table("builds", [
        {"window": 93, "status": "ok", "regtask": 18, "regtask_max_value": 16352, "engine_mb": 21.126,
         "where": "simulator", "target": "rk3588"},
        {"window": 256, "status": "ok", "regtask": 28774, "regtask_max_value": 65408, "engine_mb": 25.476,
         "where": "simulator", "target": "rk3588"},
        {"window": 64, "status": "ok", "regtask": 0, "regtask_max_value": 0, "engine_mb": 2.5,
         "where": "simulator", "target": "rk3566"}], "builds")
    study.table("plan", [{"window": 95, "emit": 39, "where": "host"}], "plan")
    study.headline("rk3588 engine, 93-frame window", 21.126, "MB")
    study.headline("rk3588 engine, 256-frame window", 25.476, "MB")
    study.headline("REGTASK lines, rk3588 93-frame engine", 18, "lines")
    study.headline("REGTASK lines, rk3566 64-frame engine", 0, "lines")
    study.headline("planned emit", 39, "frames")                       # not an engine's figure
    study.headline("rk3588 engine, 93-frame window, by hand", 21.126, "MB", risk="clean")  # the notebook's word wins
    h = study.headline_values
    assert h["rk3588 engine, 93-frame window"]["board_risk"].startswith("at risk: 18 REGTASK lines")
    assert h["REGTASK lines, rk3588 93-frame engine"]["board_risk"].startswith("at risk: 18 REGTASK lines")
    assert h["rk3588 engine, 256-frame window"]["board_risk"].startswith("known bad on a board")
    assert h["REGTASK lines, rk3566 64-frame engine"]["board_risk"] == "clean"
    assert "board_risk" not in h["planned emit"]
    assert h["rk3588 engine, 93-frame window, by hand"]["board_risk"] == "clean"
    study.finish()
    recorded = json.loads((tmp_path / "synthetic" / "headlines.json").read_text())["headlines"]
    assert recorded["rk3588 engine, 256-frame window"]["board_risk"].startswith("known bad on a board")


def test_a_unit_is_not_written_after_a_reference_figure_that_renders_its_own():
    """A reference figure renders as its value and unit ("0.49 dB"): text that adds the unit again reads "0.49 dB
    dB" (notebook 03's conclusion did)."""
    from rkstudy.notebook import theirs

    figure = theirs("ggml-vs-RKNN output SNR (per-window statistics)", "kokoro_generator")
    with pytest.raises(ValueError, match="writes dB after a reference figure"):
        says("the document reads its {} dB", figure)
    assert says("the document reads its {}", figure).cites == (figure,)
    assert says("the document reads its {} dBFS-free number", figure)  # another word, not the unit


def test_every_statement_the_notebooks_make_passes_the_checks_says_makes():
    """Each `says(...)` in every notebook's conclusion, evaluated as written (those whose arguments name a notebook
    variable are left to the notebook runs): no typed number, no unit written twice."""
    from rkstudy.notebook import theirs

    evaluated, refused = 0, []
    for path in sorted((REPO / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            source = "".join(cell["source"]) if cell["cell_type"] == "code" else ""
            if "says(" not in source:
                continue
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "says":
                    try:
                        eval(compile(ast.Expression(node), path.name, "eval"), {"says": says, "theirs": theirs})
                    except NameError:
                        continue
                    except ValueError as refusal:
                        refused.append(f"{path.name}: {refusal}")
                    evaluated += 1
    assert evaluated >= 30 and refused == []
