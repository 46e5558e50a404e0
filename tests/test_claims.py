"""The reference documents' claims beside ours: the spec evaluator on a synthetic study (every verdict
kind, the loud failures), the Study method that records the table, and the committed spec against
the committed tables and the reference figures it must cover."""

import ast
import csv
import json
import math

import pytest

from rkstudy.notebook import Study
from rkstudy.paths import NOTEBOOKS, RESULTS
from rkstudy.tables import claims, results
from rkstudy.tables.results import Origin

STUDY = "piper_decoder"  # its reference figures are real rows of data/reference/figures.csv
INTERIOR_93 = "interior window SNR vs full-length decode at 93 (45+24+24)"
W93_LINES = "REGTASK lines: Piper w93 engine"


def spec_file(tmp_path, *rows):
    path = tmp_path / "claims.csv"
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=claims.COLUMNS, lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({c: "" for c in claims.COLUMNS} | {"study": STUDY, "quick": "same"} | row)
    return path


def tables():
    sweep = [{"window": w, "kind": "interior", "min_snr_db": snr, "where": "fp32", "target": "none"}
             for w, snr in ((77, 22.6), (93, 73.2))]
    builds = [{"window": 93, "target": t, "regtask": n, "where": "host"} for t, n in (("rk3588", 18), ("rk3566", 355))]
    return {"window_sweep": sweep, "builds": builds}


def claim(cid, **row):
    return {"claim": cid, **row}


def test_every_verdict_kind_from_this_runs_tables(tmp_path):
    path = spec_file(
        tmp_path,
        claim("interior-93", figure=INTERIOR_93, table="window_sweep", column="min_snr_db",
              rows="window=93; kind=interior", summary="value", comparison="same: worst interior window",
              rule="tolerance", low="98", cause="an open question: the latents differ"),
        claim("w93-rk3566", figure=W93_LINES + " @rk3566", table="builds", column="regtask", rows="target=rk3566",
              summary="value", comparison="same", rule="tolerance", low="355", high="355"),
        claim("w93-rk3588", figure=W93_LINES + " @rk3588", table="builds", column="regtask", rows="target=rk3588",
              summary="value", comparison="same", rule="tolerance", low="0", high="0"),
        claim("sweep-range", figure=INTERIOR_93, table="window_sweep", column="min_snr_db", summary="range",
              comparison="differs: every width", rule="differs", cause="other widths"),
        claim("w77-direction", figure=INTERIOR_93, table="window_sweep", column="min_snr_db", rows="window=77",
              summary="value", comparison="differs: another width", rule="tolerance", high="60",
              cause="a narrower window is far from exact, against {window_sweep[window=93].min_snr_db} dB at 93"),
        claim("resize-board", figure="mask upsample by Resize: board", comparison="differs: a board run",
              rule="board only"),
        claim("padded-1", figure="wrong seam (dec.conv_pre input fed pre-flow z): output RMS",
              comparison="differs: nothing here", rule="not measured", cause="no table decodes it"),
        claim("other", figure=W93_LINES + " @rk3588", table="toolkit_levers/regtask-w93-rk3588-2.3.2",
              comparison="differs: another notebook", rule="elsewhere"),
        claim("engines", figure=INTERIOR_93, table="builds", column="regtask", rows="target=rk3399",
              summary="count", comparison="same", rule="tolerance", low="1"))
    got = {r["claim"]: r for r in claims.evaluate(STUDY, tables(), quick=False, path=path)}
    assert got["interior-93"]["verdict"] == ("differs: ours 73.2 dB, theirs 98+ dB, 24.8 below the band [98, inf]: "
                                             "an open question: the latents differ")
    assert got["interior-93"]["ours_from"] == "window_sweep.min_snr_db[window=93; kind=interior] value"
    assert (got["interior-93"]["where"], got["interior-93"]["target"]) == ("fp32", "none")
    assert got["w93-rk3566"]["verdict"] == "reproduced" and got["w93-rk3566"]["theirs"] == "355 lines"
    assert (got["w93-rk3566"]["where"], got["w93-rk3566"]["target"]) == ("host", "rk3566")
    assert got["w93-rk3588"]["verdict"].startswith("differs: ours 18 lines, theirs 0 lines, 18 above the band [0, 0]: "
                                                   "an open question")
    assert got["sweep-range"]["verdict"] == "differs: ours 22.6 to 73.2 dB, theirs 98+ dB: other widths"
    assert got["w77-direction"]["verdict"] == ("consistent: ours 22.6 dB, theirs 98+ dB: a narrower window is far "
                                               "from exact, against 73.2 dB at 93")
    assert got["resize-board"]["verdict"] == "board only" and got["resize-board"]["ours"] == ""
    assert got["padded-1"]["verdict"] == "not measured here: no table decodes it"
    assert got["other"]["verdict"] == "measured in toolkit_levers: claim regtask-w93-rk3588-2.3.2"
    assert got["engines"]["ours"] == "0 dB" and got["engines"]["verdict"].startswith("differs: ours 0 dB")
    assert claims.counts([r["verdict"] for r in got.values()]) == {
        "reproduced": 1, "consistent": 1, "differs": 4, "board only": 1, "measured elsewhere": 1, "not measured": 1}


def test_a_verdict_moves_with_its_measurement(tmp_path):
    """Nothing typed stands between the row and the verdict: the same spec row on a moved measurement
    gives the other verdict, and a different quantity leaving the band its reading needs loses that
    reading."""
    path = spec_file(
        tmp_path,
        claim("w93", figure=W93_LINES + " @rk3588", table="builds", column="regtask", rows="target=rk3588",
              summary="value", comparison="same", rule="tolerance", low="0", high="0",
              cause="the toolkit version"),
        claim("w77", figure=INTERIOR_93, table="window_sweep", column="min_snr_db", rows="window=77",
              summary="value", comparison="differs: another width", rule="tolerance", high="60",
              cause="a narrower window is far from exact"))
    measured = tables()
    before = {r["claim"]: r["verdict"] for r in claims.evaluate(STUDY, measured, quick=False, path=path)}
    assert before["w93"].startswith("differs: ours 18 lines") and before["w93"].endswith(": the toolkit version")
    assert before["w77"].startswith("consistent: ours 22.6 dB")
    measured["builds"][0]["regtask"] = 0
    measured["window_sweep"][0]["min_snr_db"] = 70.0
    after = {r["claim"]: r["verdict"] for r in claims.evaluate(STUDY, measured, quick=False, path=path)}
    assert after["w93"] == "reproduced"
    assert after["w77"].startswith("differs: ours 70 dB, theirs 98+ dB, 10 above the band [-inf, 60]")
    assert "an open question" in after["w77"]


@pytest.mark.parametrize("row, message", [
    (dict(table="tail_windows", column="snr_db"),
     "claim c: table 'tail_windows' was not written by this notebook (it wrote builds, window_sweep); "
     "fix data/reference/claims.csv"),
    (dict(column="snr_db"), "claim c: table 'builds' has no column 'snr_db'"),
    (dict(rows="dec_mask=True"), "has no column 'dec_mask'"),
    (dict(rows="target=rk3399"), "no row of 'builds' matches"),
    (dict(rows=""), "2 rows of 'builds' match"),
    (dict(summary="mean"), "summary 'mean'"),
    (dict(rows="target"), "row selector 'target' is not column=value"),
    (dict(figure="a figure nobody wrote"), "claim c: no reference figure 'a figure nobody wrote'"),
    (dict(figure=W93_LINES), "claim c: 2 (add ' @<target>') reference figure"),
    (dict(rule="differs", comparison="differs: x", low=""), "claim c: a `differs` verdict needs its cause"),
    (dict(rule="differs", cause="other latents", table=""), "claim c: a `differs` verdict needs a table of ours"),
    (dict(rule="differs", cause="other latents", low=""), "the same quantity is held to a band (`tolerance`)"),
    (dict(rule="differs", comparison="differs: x", cause="y"), "a band (low/high) is read only by a `tolerance`"),
    (dict(low=""), "claim c: a `tolerance` verdict needs its band"),
    (dict(comparison="differs: another width"), "a `tolerance` claim on a different quantity needs the cause"),
    (dict(rule="not measured", low="", cause="nothing"), "`not measured` names table 'builds'"),
    (dict(rule="board only", low=""), "`board only`, but theirs was measured on 'fp32', not a board"),
    (dict(rule="elsewhere", table="piper_decoder", low=""), "`elsewhere` needs table=<study>/<claim>"),
    (dict(rule="elsewhere", table="toolchain/lines-piper-w93-rk3588", low=""),
     "toolchain/lines-piper-w93-rk3588 is itself `elsewhere`"),
    (dict(cause="ours is 73.2 dB, far below"), "claim c: its cause types 73.2; render a measured value"),
    (dict(cause="see {claim:piper_decoder/no-such-claim}"), "points at piper_decoder/no-such-claim, which is no claim"),
    (dict(cause="{window_sweep[window=91].min_snr_db}", rule="differs", comparison="differs: x", low=""),
     "its cause cites window_sweep[window=91], which selects 0 rows"),
    (dict(comparison="similar"), "claim c: comparison 'similar' must say"),
    (dict(quick="sometimes"), "claim c: quick 'sometimes' must be"),
])
def test_a_spec_row_that_cannot_be_read_fails_naming_the_claim(tmp_path, row, message):
    path = spec_file(tmp_path, claim("c", figure=INTERIOR_93, table="builds", column="regtask", rows="target=rk3588",
                                     summary="value", comparison="same", rule="tolerance", low="98") | row)
    with pytest.raises(claims.ClaimError) as err:
        claims.evaluate(STUDY, tables(), quick=False, path=path)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_quick_mode_skips_only_the_claims_marked_so(tmp_path):
    row = claim("tails", figure=INTERIOR_93, table="tail_windows", column="snr_db", summary="value",
                comparison="same", rule="tolerance", low="98")
    skipped = spec_file(tmp_path, row | {"quick": "skipped"})
    assert claims.evaluate(STUDY, tables(), quick=True, path=skipped)[0]["verdict"] == "not measured here: quick mode"
    with pytest.raises(claims.ClaimError, match="table 'tail_windows' was not written"):
        claims.evaluate(STUDY, tables(), quick=False, path=skipped)  # full mode must have it
    with pytest.raises(claims.ClaimError, match="table 'tail_windows' was not written"):
        claims.evaluate(STUDY, tables(), quick=True, path=spec_file(tmp_path, row))  # `same`: quick mode too


def test_a_row_without_a_value_is_not_measured_and_says_why(tmp_path):
    path = spec_file(tmp_path, claim("w512", figure=INTERIOR_93, table="builds", column="regtask", rows="target=rk3588",
                                     summary="value", comparison="same", rule="tolerance", low="98"))
    rows = {"builds": [{"target": "rk3588", "regtask": "", "status": "not built: BUILDS = False"}]}
    verdict = claims.evaluate(STUDY, rows, quick=False, path=path)[0]["verdict"]
    assert verdict == "not measured here: no value in builds.regtask (not built: BUILDS = False)"


def test_the_study_records_its_claims_table_from_the_tables_it_wrote(tmp_path, monkeypatch):
    monkeypatch.setattr(claims, "CLAIMS", spec_file(tmp_path, claim(
        "interior-93", figure=INTERIOR_93, table="window_sweep", column="min_snr_db", rows="window=93",
        summary="value", comparison="same", rule="tolerance", low="70")))
    study = Study(STUDY, quick=True)
    study.root = tmp_path
    study.table("window_sweep", tables()["window_sweep"], "sweep", by=Origin("fp32"), show=False)
    rows = study.reference_claims()
    assert [r["verdict"] for r in rows] == ["reproduced"] and rows[0]["ours"] == "73.2 dB"
    # stamped where the row it read was measured (the sweep is fp32), not as a host computation
    assert rows[0]["where"] == "fp32" and rows[0]["commit"] == results.commit()
    study.finish()
    written = results.read_table(tmp_path / STUDY / "reference_claims.csv")
    assert written[0]["claim"] == "interior-93" and written[0]["theirs_where"] == "fp32, none"
    # a table left out of this run is not read from an earlier run's files
    fresh = Study(STUDY, quick=False)
    fresh.root = tmp_path
    with pytest.raises(claims.ClaimError, match="table 'window_sweep' was not written by this notebook"):
        fresh.reference_claims()


def test_a_study_the_documents_say_nothing_about_records_no_table(tmp_path, monkeypatch):
    monkeypatch.setattr(claims, "CLAIMS", spec_file(tmp_path))
    study = Study("benchmarks", quick=True)
    assert study.reference_claims() == [] and "reference_claims" not in study.tables


def committed(study):
    return {p.stem: results.read_table(p) for p in (RESULTS / study).glob("*.csv") if p.stem != "reference_claims"}


def test_the_committed_spec_reads_the_committed_tables():
    """Every claim evaluates against the tables `make reproduce` committed: a renamed table, column or
    row fails here before a full run does."""
    studies = sorted({r["study"] for r in results.read_table(claims.CLAIMS)})
    assert len(studies) >= 9
    for study in studies:
        rows = claims.evaluate(study, committed(study), quick=False)
        assert rows and all(r["verdict"] for r in rows)
    encoder = {r["claim"]: r for r in claims.evaluate("piper_encoder", committed("piper_encoder"), quick=False)}
    assert encoder["raw-nodes"]["verdict"] == "reproduced" and encoder["raw-nodes"]["ours"] == "992 nodes"


def test_every_claim_keeps_the_rules_whatever_the_tables_say():
    """Fast: the whole spec against the rules that need no table (a `same` comparison held to a band,
    a `board only` figure measured on a board, `elsewhere` naming a claim that measures, no number
    typed into a cause, every pointer and figure resolving)."""
    rows = claims.check_spec()
    assert len(rows) >= 190 and {r["rule"] for r in rows} == set(claims.RULES)


def test_committed_verdicts_are_what_their_rows_give():
    """Every committed reference_claims row is the verdict its committed rows give today: a verdict its
    row contradicts (typed, or left from an earlier run) fails here."""
    stale = []
    for study in sorted({r["study"] for r in results.read_table(claims.CLAIMS)}):
        committed_claims = {r["claim"]: r for r in results.read_table(RESULTS / study / "reference_claims.csv")}
        for row in claims.evaluate(study, committed(study), quick=False):
            old = committed_claims.get(row["claim"], {})
            if old.get("verdict") != row["verdict"]:
                stale.append(f"{study}/{row['claim']}: committed {old.get('verdict')!r}, "
                             f"its rows give {row['verdict']!r}")
    assert stale == []


def test_every_reference_figure_has_a_claim():
    """No reference figure is left silent: each row of data/reference/figures.csv (study, figure,
    target) is named by at least one claim of its study."""
    named = set()
    for r in results.read_table(claims.CLAIMS):
        ref = claims._figure(r["study"], r["figure"], r["claim"])
        named.add((r["study"], ref["figure"], ref["target"]))
    silent = [(r["study"], r["figure"]) for r in results.read_table(results.REFERENCE_FIGURES)
              if (r["study"], r["figure"], r["target"]) not in named]
    assert silent == []


def test_numbers_read_as_a_reader_writes_them():
    assert claims._show(62031.0) == "62,031" and claims._show(0.30727) == "0.3073"
    assert claims._show(1168460.5) == "1,168,460.5" and claims._show(math.inf) == "inf"


def code_cells(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def test_every_notebook_headline_beside_a_reference_figure_says_whether_they_compare():
    """Read from the notebooks' sources, so a headline that would be refused at the end of a full run
    fails here first."""
    checked = 0
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        for source in code_cells(path):
            lines = [ln for ln in source.splitlines() if not ln.lstrip().startswith(("%", "!"))]
            for node in ast.walk(ast.parse("\n".join(lines))):
                if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "headline":
                    keywords = {k.arg for k in node.keywords}
                    if "reference" in keywords:
                        checked += 1
                        assert "comparable" in keywords, f"{path.name}: {ast.unparse(node)[:120]}"
    assert checked >= 40


def test_every_notebook_records_its_claims_before_it_finishes():
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        last = code_cells(path)[-1]
        assert "reference_claims()" in last and last.index("reference_claims()") < last.index("finish()"), path.name


def test_a_cause_names_the_toolkits_that_built_the_engine_from_the_rows(tmp_path):
    """`{toolkits:table[selector]}` renders the toolkit versions in the selected rows' stamps: a cause suspecting
    the toolkit says which versions this run tried, and says otherwise by itself once another one builds it."""
    path = spec_file(tmp_path, claim(
        "w93-rk3588", figure=W93_LINES + " @rk3588", table="builds", column="regtask", rows="target=rk3588",
        summary="max", comparison="same", rule="tolerance", low="0", high="0",
        cause="an open question: the toolkit version is the first suspect; built here with "
              "{toolkits:builds[target=rk3588]}"))

    def built(*versions):
        rows = [results.stamp({"window": 93, "target": "rk3588", "regtask": 18,
                               "where": "host", "built_with": f"rknn-toolkit2 {v}"}) for v in versions]
        return {"builds": results.as_written(rows)}

    got = claims.evaluate(STUDY, built("2.5.0"), quick=False, path=path)[0]["verdict"]
    assert got.endswith("the toolkit version is the first suspect; built here with rknn-toolkit2 2.5.0 only")
    got = claims.evaluate(STUDY, built("2.5.0", "2.3.2"), quick=False, path=path)[0]["verdict"]
    assert got.endswith("built here with rknn-toolkit2 2.3.2 and 2.5.0")
    assert claims.versions(["rknn-toolkit2 2.10.0", "rknn-toolkit2 2.3.2"]) == "rknn-toolkit2 2.3.2 and 2.10.0"


def test_no_cause_calls_the_toolkit_untested_in_words():
    """Whether a toolkit version was tried is what the rows say ({toolkits:...}), never prose: four causes said
    "untested" while a second toolkit environment built engines."""
    typed = [f"{r['study']}/{r['claim']}" for r in results.read_table(claims.CLAIMS)
             if "toolkit" in r["cause"] and "untested" in r["cause"]]
    assert typed == []
    rendered = [r for r in results.read_table(claims.CLAIMS) if "{toolkits:" in r["cause"]]
    assert len(rendered) >= 4
