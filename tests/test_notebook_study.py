"""Study.conclude: a notebook's "What this shows" is rendered from the rows it cites, so the prose
cannot drift from the tables; a missing row fails loudly, except a full-run-only statement in quick
mode, which says it was skipped."""

import pytest

from rkstudy.notebook import MAX_STATEMENTS, Cite, Study, says, shown_path
from rkstudy.paths import REPO


def _study(quick: bool) -> Study:
    study = Study("synthetic", quick)
    study.tables["window_sweep"] = ([
        {"window": 93, "kind": "interior", "min_snr_db": 73.2148},
        {"window": 93, "kind": "tail", "min_snr_db": 104.5},
        {"window": 55, "kind": "interior", "min_snr_db": -3.17}], "windows")
    study.tables["builds"] = ([{"target": "rk3588", "regtask": 18}], "builds")
    return study


def test_statements_render_from_the_cited_rows_and_name_them():
    text = _study(quick=False).conclusions([
        says("The worst interior window of the 93-frame window scores {:.1f} dB against a full decode",
             ("window_sweep", {"window": 93, "kind": "interior"}, "min_snr_db")),
        says("{} lines at 93 frames on {}, {:.2f} dB at 55", ("builds", {"target": "rk3588"}, "regtask"),
             Cite("builds", {"target": "rk3588"}, "target"),
             ("window_sweep", {"window": "55", "kind": "interior"}, "min_snr_db"))])
    assert text.split("\n") == [
        "- The worst interior window of the 93-frame window scores 73.2 dB against a full decode "
        "(`window_sweep`: window=93, kind=interior, min_snr_db)",
        "- 18 lines at 93 frames on rk3588, -3.17 dB at 55 (`builds`: target=rk3588, regtask; "
        "`builds`: target=rk3588, target; `window_sweep`: window=55, kind=interior, min_snr_db)"]


@pytest.mark.parametrize("cite, why", [
    (("window_sweep", {"window": 77}, "min_snr_db"), "selects 0 rows"),
    (("window_sweep", {"window": 93}, "min_snr_db"), "selects 2 rows"),
    (("window_sweep", {"window": 55}, "max_snr_db"), "no column 'max_snr_db'"),
    (("window_plan", {"window": 93}, "min_snr_db"), "table 'window_plan' was not recorded")])
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


def test_at_most_ten_statements():
    cite = ("builds", {"target": "rk3588"}, "regtask")
    assert len(_study(False).conclusions([says("{}", cite)] * MAX_STATEMENTS).split("\n")) == MAX_STATEMENTS == 10
    with pytest.raises(ValueError, match="11 statements"):
        _study(False).conclusions([says("{}", cite)] * (MAX_STATEMENTS + 1))


def test_paths_a_reader_sees_are_relative_to_the_repository():
    assert shown_path(REPO / "results" / "x" / "t.csv").as_posix() == "results/x/t.csv"
    assert "build/quick-results/synthetic" in repr(Study("synthetic", True))
    assert str(REPO) not in repr(Study("synthetic", True))
