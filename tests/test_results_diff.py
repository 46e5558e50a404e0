"""`rkstudy results diff A B` on synthetic result trees: the tolerance each kind of column gets,
how rows are matched, and what the report and the exit code say."""

import json

import pytest

from rkstudy.tables import diff as results_diff
from rkstudy.tables import results, tolerances
from rkstudy.tables.diff import column_rule, name_rule

ONE_HOST = {"machine_cpu": "AMD EPYC", "machine_isa": "avx512", "machine_threads": 1, "numerics_pinned": "avx2"}


def stamped(commit="aaaaaaaaaaaa", target="rk3588", where="simulator", machine=None, **values):
    return {**values, "rkstudy_version": "0.1.0", "commit": commit, "toolkit_version": "rknn-toolkit2 2.5.0",
            "target": target, "where": where, "date": "2026-12-01", **(machine or ONE_HOST)}


OTHER_HOST = {**ONE_HOST, "machine_cpu": "AMD EPYC 7R13", "machine_isa": "avx2"}
# what the tests hold each kind to: reruns on one machine moved nothing; another machine (an AVX2-only host)
# moved simulator dB by up to 1.12, fp32 dB by up to 1.57, PESQ-WB by 0.0096 and DNSMOS by 0.098
MEASURED = """kind,machines,largest_change,cells,moved,largest_at,runs
exact,same machine,0,10,0,,one host twice
simulator dB,same machine,0,10,0,,one host twice
simulator dB,other machine,1.12487,10,3,,two hosts
fp32 dB,other machine,1.571,10,3,,two hosts
PESQ-WB,other machine,0.00960422,10,3,,two hosts
DNSMOS,other machine,0.09821,10,3,,two hosts
"""


@pytest.fixture(autouse=True)
def measured(tmp_path, monkeypatch):
    path = tmp_path / "tolerances.csv"
    path.write_text(MEASURED)
    monkeypatch.setattr(tolerances, "TOLERANCES", path)
    return path


def sweep(changes=None, machine=None):
    """Two targets x two widths; `changes` maps (target, frames) to the columns that differ."""
    changes = changes or {}
    rows = []
    for target in ("rk3588", "rk3566"):
        for frames in (64, 128):
            r = {"frames": frames, "status": "ok", "regtask": 100 * frames, "engine_bytes": 1000 * frames,
                 "snr_db": 60.0 + frames / 64, "build_s": 10.0, "rms_ratio": 1.23456e10}
            r.update(changes.get((target, frames), {}))
            rows.append(stamped(target=target, machine=machine, **r))
    return rows


def tree(root, tables, headlines=None, machine=None):
    for name, rows in tables.items():
        study, table = name.split("/")
        results.write_table(study, table, rows, root=root)
    for study, h in (headlines or {}).items():
        (root / study).mkdir(parents=True, exist_ok=True)
        (root / study / "headlines.json").write_text(json.dumps({"study": study, "commit": "x",
                                                                "machine": machine or ONE_HOST, "headlines": h}))
    return root


def run(tmp_path, a_tables, b_tables, **kw):
    a = tree(tmp_path / "a", a_tables, kw.get("a_headlines"))
    b = tree(tmp_path / "b", b_tables, kw.get("b_headlines"), kw.get("b_machine"))
    text, failed = results_diff.report(a, b)
    return text, failed


def test_identical_trees_pass_and_stamps_are_ignored(tmp_path):
    b_rows = [{**r, "commit": "bbbbbbbbbbbb", "date": "2026-12-02"} for r in sweep()]
    text, failed = run(tmp_path, {"s/sweep": sweep()}, {"s/sweep": b_rows})
    assert not failed
    assert "1 tables compared; 0 cells in 0 tables moved past their tolerance." in text
    assert "## `s/sweep`" not in text  # nothing moved, nothing to say


@pytest.mark.parametrize(("column", "b_value", "fails"), [
    ("regtask", 6401, True),          # REGTASK lines: exact
    ("engine_bytes", 64001, True),    # bytes: exact
    ("snr_db", 61.0 + 0.001, True),   # simulator dB on one machine: reruns there moved nothing
    ("snr_db", float("inf"), True),
    ("build_s", 95.0, False),         # times: reported, never failed
    ("rms_ratio", 1.23457e10, True),  # other floats: relative, by the six digits a table keeps (8e-6 here)
    ("status", "failed", True),       # strings: exact
])
def test_tolerance_by_kind_on_one_machine(tmp_path, column, b_value, fails):
    text, failed = run(tmp_path, {"s/sweep": sweep()}, {"s/sweep": sweep({("rk3588", 64): {column: b_value}})})
    assert failed is fails
    if fails:
        assert f"| target=rk3588, where=simulator, frames=64 | `{column}` |" in text
    else:
        assert f"- `{column}` (" in text and "1 row changed" in text


@pytest.mark.parametrize(("column", "b_value", "fails"), [
    ("snr_db", 61.0 + 1.12, False),   # within what another machine moved a simulator score
    ("snr_db", 61.0 - 1.13, True),
    ("regtask", 6401, True),          # no host moves a count
    ("engine_bytes", 64001, True),
])
def test_another_machine_moves_what_it_was_measured_to_move_and_no_more(tmp_path, column, b_value, fails):
    """The issue's case: tables made on an AVX2-only host, rerun on one with AVX-512."""
    text, failed = run(tmp_path, {"s/sweep": sweep()},
                       {"s/sweep": sweep({("rk3588", 64): {column: b_value}}, machine=OTHER_HOST)})
    assert failed is fails
    assert "Machines: other machine (CPU AMD EPYC -> AMD EPYC 7R13; vector ISA avx512 -> avx2)." in text
    if not fails:
        assert "1 cells moved within what another machine moves them (host differs)" in text


def test_the_same_move_on_one_machine_is_unexplained(tmp_path):
    a, b = sweep(), sweep({("rk3588", 64): {"snr_db": 61.5}})
    assert run(tmp_path / "one", {"s/sweep": a}, {"s/sweep": b})[1]
    b_other = sweep({("rk3588", 64): {"snr_db": 61.5}}, machine=OTHER_HOST)
    assert not run(tmp_path / "two", {"s/sweep": a}, {"s/sweep": b_other})[1]


def test_rows_without_a_machine_are_held_to_another_machines_tolerance(tmp_path):
    old = [{k: v for k, v in r.items() if k not in results.MACHINE} for r in sweep()]
    a = tmp_path / "a" / "s"
    a.mkdir(parents=True)
    lines = [",".join(old[0]), *(",".join(map(str, r.values())) for r in old)]
    (a / "sweep.csv").write_text("\n".join(lines) + "\n")
    b = tree(tmp_path / "b", {"s/sweep": sweep({("rk3588", 64): {"snr_db": 61.5}})})
    text, failed = results_diff.report(tmp_path / "a", b)
    assert not failed and "the machine is not recorded in A (made before rows named it)" in text


def test_listener_scores_have_tolerances_of_their_own(tmp_path):
    def scores(pesq, dnsmos, stoi, machine=None):
        return [stamped(render="int8", pesq_wb=pesq, dnsmos_ovrl=dnsmos, stoi=stoi, machine=machine)]

    text, failed = run(tmp_path, {"s/cal": scores(1.9751, 2.976, 0.9744)},
                       {"s/cal": scores(1.9847, 2.881, 0.9744, machine=OTHER_HOST)})
    assert not failed, text
    assert "`pesq_wb` (PESQ-WB, its own (by name))" in text and "`dnsmos_ovrl` (DNSMOS, its own (by name))" in text
    text, failed = run(tmp_path / "2", {"s/cal": scores(1.9751, 2.976, 0.9744)},
                       {"s/cal": scores(1.9751, 2.976, 0.9716, machine=OTHER_HOST)})
    assert failed  # STOI was never measured to move here: exact
    assert "| (the one row) | `stoi` | STOI, its own (by name), STOI | 0.9744 | 0.9716 |" in text


def test_a_code_change_explains_a_move_and_says_so(tmp_path):
    """Where the producing code changed between the two stamps (git tells), a moved cell is the code's doing:
    listed apart, not failed."""
    import subprocess

    repo = tmp_path / "repo"
    (repo / "rkstudy" / "families" / "s").mkdir(parents=True)
    (repo / "rkstudy" / "__init__.py").write_text("")
    (repo / "rkstudy" / "families" / "__init__.py").write_text("")
    (repo / "rkstudy" / "families" / "s" / "study.py").write_text("X = 1\n")

    def git(*args):
        return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q", "-b", "main")
    git("-c", "user.email=t@e", "-c", "user.name=t", "commit", "-q", "--allow-empty", "-m", "a")
    first = git("rev-parse", "--short=12", "HEAD")
    git("add", ".")
    git("-c", "user.email=t@e", "-c", "user.name=t", "commit", "-q", "-m", "b")
    second = git("rev-parse", "--short=12", "HEAD")
    a = tree(tmp_path / "a", {"s/sweep": [{**r, "commit": first} for r in sweep()]})
    b = tree(tmp_path / "b", {"s/sweep": [{**r, "commit": second} for r in sweep({("rk3588", 64): {"regtask": 1}})]})
    text, failed = results_diff.report(a, b, repo=repo)
    assert not failed
    assert (f"Code: differs (3 producing files changed between {first} and {second}: rkstudy/__init__.py, "
            "rkstudy/families/__init__.py, rkstudy/families/s/study.py)") in text
    assert "0 cells moved within what another machine moves them (host differs), 1 where the producing code" in text
    assert "| target=rk3588, where=simulator, frames=64 | `regtask` | exact (by name), exact | 6400 | 1 |" in text
    assert results_diff.report(a, b)[1]  # without the repository nothing tells: unexplained


def test_the_measured_tolerances_hold_what_an_avx512_rerun_moved(measured, monkeypatch):
    """The committed tolerances, as `python -m rkstudy.tables.tolerances` recorded them from real reruns: every
    kind a rerun moved was measured on one machine and across vector ISAs, each row names its runs, and the
    largest simulator move (the int8 engine's 4.73 -> 5.85 dB on the toolchain study) is within them."""
    monkeypatch.setattr(tolerances, "TOLERANCES", tolerances.Path(tolerances.__file__).with_name("tolerances.csv"))
    rows = tolerances.read()
    assert rows and all(r["runs"] for r in rows)
    got = tolerances.load()
    for kind in ("exact", "simulator dB", "fp32 dB", "PESQ-WB", "STOI", "DNSMOS", "float"):
        assert (kind, "same machine") in got and (kind, "other machine") in got, kind
        assert got[(kind, "same machine")].largest == 0, kind  # one machine's reruns are bit-identical
    assert got[("exact", "other machine")].largest == 0
    assert tolerances.within(abs(5.85082 - 4.72595), tolerances.allowed(got, "simulator dB", "other machine"))
    assert tolerances.within(abs(126.236 - 127.173), tolerances.allowed(got, "fp32 dB", "other machine"))
    assert not tolerances.within(0.5, tolerances.allowed(got, "simulator dB", "same machine"))


def test_measuring_two_runs_records_the_largest_change_per_kind(tmp_path):
    a = tree(tmp_path / "a", {"s/sweep": sweep()})
    b = tree(tmp_path / "b", {"s/sweep": sweep({("rk3588", 64): {"snr_db": 61.3}, ("rk3566", 128): {"snr_db": 62.1}},
                                               machine=OTHER_HOST)})
    rows = {r["kind"]: r for r in tolerances.measure(a, b, "other machine", "a and b")}
    assert rows["simulator dB"]["largest_change"] == "0.3" and rows["simulator dB"]["moved"] == 2
    assert rows["simulator dB"]["cells"] == 4 and "snr_db: 61 -> 61.3" in rows["simulator dB"]["largest_at"]
    assert rows["exact"]["largest_change"] == "0" and rows["exact"]["cells"] == 12
    path = tmp_path / "t.csv"
    tolerances.record(rows.values(), path)
    tolerances.record(rows.values(), path)  # the same runs again: replaced, not added
    assert len(tolerances.read(path)) == len(rows)


def test_times_are_reported_with_their_ratio(tmp_path):
    b = sweep({(t, f): {"build_s": 20.0} for t in ("rk3588", "rk3566") for f in (64, 128)})
    text, failed = run(tmp_path, {"s/sweep": sweep()}, {"s/sweep": b})
    assert not failed
    assert "- `build_s` (time, reported (by name)): 4 rows changed, change +10 to +10, B/A median 2" in text


def test_rows_are_matched_by_target_and_keys_not_by_order(tmp_path):
    text, failed = run(tmp_path, {"s/sweep": sweep()}, {"s/sweep": list(reversed(sweep()))})
    assert not failed and "Rows matched" not in text
    diffs, _, _ = results_diff.diff_trees(tmp_path / "a", tmp_path / "b")
    assert diffs[0].keys == ["target", "where", "frames"] and not diffs[0].by_order


def test_order_decides_only_when_no_key_tells_rows_apart(tmp_path):
    rows = [stamped(kind="x", snr_db=60.0), stamped(kind="x", snr_db=70.0)]
    moved = [stamped(kind="x", snr_db=60.0), stamped(kind="x", snr_db=71.0)]
    text, failed = run(tmp_path, {"s/t": rows}, {"s/t": moved})
    assert failed and "Rows matched by `target`, `where`, `kind` and their order." in text
    assert "| target=rk3588, where=simulator, kind=x, #2 | `snr_db` |" in text


def test_tables_rows_and_columns_on_one_side(tmp_path):
    a = {"s/sweep": sweep(), "s/gone": [stamped(x=1)]}
    stamp = (*results.STAMP, *results.MACHINE)
    b_rows = [{**{k: v for k, v in r.items() if k not in stamp}, "new_column": 1,
               **{k: r[k] for k in stamp}} for r in sweep() if r["frames"] == 64]
    b_rows.append(stamped(target="rk3588", frames=256, status="ok", regtask=1, engine_bytes=1, snr_db=1.0,
                          build_s=1.0, rms_ratio=1.0, new_column=1))
    text, failed = run(tmp_path, a, {"s/sweep": b_rows, "t/new": [stamped(x=1)]})
    assert not failed  # reported, not failed: only a moved value fails
    assert "Tables only in A (1): `s/gone`" in text and "Tables only in B (1): `t/new`" in text
    assert "- columns only in B: `new_column`" in text
    assert ("- rows only in A (2): target=rk3588, where=simulator, frames=128; "
            "target=rk3566, where=simulator, frames=128") in text
    assert "- rows only in B (1): target=rk3588, where=simulator, frames=256" in text


def test_value_and_measured_take_the_rule_of_their_unit(tmp_path):
    def gates(snr, seconds, machine=None):
        return [stamped(gate="g", measured=snr, threshold=30, unit="dB", passed=True, machine=machine),
                stamped(gate="t", measured=seconds, threshold=30, unit="ms/window", passed=True, machine=machine)]

    text, failed = run(tmp_path, {"s/gate": gates(60.0, 0.02)}, {"s/gate": gates(60.4, 0.05, OTHER_HOST)})
    assert not failed
    assert "- `measured` (dB, by what computed it (by unit)): 1 row changed, change +0.4 to +0.4" in text
    assert "- `measured` (time, reported (by unit)): 1 row changed, change +0.03 to +0.03, B/A median 2.5" in text
    text, failed = run(tmp_path / "2", {"s/gate": gates(60.0, 0.02)}, {"s/gate": gates(59.0, 0.02)})
    assert failed and ("| target=rk3588, where=simulator, gate=g | `measured` | dB, by what computed it (by unit), "
                       "simulator dB |") in text


def test_headlines_are_compared_too(tmp_path):
    h = {"interior SNR": {"value": 73.2, "unit": "dB", "reference": ""}, "lines": {"value": 62031, "unit": "lines"}}
    moved = {"interior SNR": {"value": 73.5, "unit": "dB"}, "lines": {"value": 62032, "unit": "lines"}}
    text, failed = run(tmp_path, {}, {}, a_headlines={"s": h}, b_headlines={"s": moved})
    assert failed
    assert ("| where=fp32, headline=lines | `value` | relative (by float values), float | 62031 | 62032 | +1 (+0.00%) |"
            in text)
    assert "| where=fp32, headline=interior SNR | `value` | dB, by what computed it (by unit), fp32 dB |" in text
    # the cost model's error against a board figure moves with its host-timed terms (two runs on one host: 39.6 and
    # 39.8 % per Piper slice); a count of held-out figures beside it still fails
    err = {"Piper: error per emitted slice against the board": {"value": 39.6, "unit": "%"},
           "held-out figures within +-25 %": {"value": 2, "unit": ""}}
    text, failed = run(tmp_path / "cost", {}, {}, a_headlines={"s": err}, b_headlines={"s": {
        "Piper: error per emitted slice against the board": {"value": 39.8, "unit": "%"},
        "held-out figures within +-25 %": {"value": 2, "unit": ""}}})
    assert not failed and "- `value` (time, reported (by row label)): 1 row changed" in text, text
    err["held-out figures within +-25 %"]["value"] = 3
    moved = {**err, "held-out figures within +-25 %": {"value": 5, "unit": ""}}
    text, failed = run(tmp_path / "count", {}, {}, a_headlines={"s": err}, b_headlines={"s": moved})
    assert failed
    # another CPU times the predictions' CPU and I/O terms: there the count moves with the host (an AVX2-only
    # host's 3 of 6 and an AVX-512 host's 5 of 6, at one commit's cost-model code)
    text, failed = run(tmp_path / "other", {}, {}, a_headlines={"s": err}, b_headlines={"s": moved},
                       b_machine=OTHER_HOST)
    assert not failed and "a count of verdicts on host-timed figures, on another machine" in text, text


def test_a_verdict_on_a_host_timed_figure_moves_with_the_host_only(tmp_path):
    def calibration(verdict, term, within, machine=None):
        return [stamped(where="host", figure="qwen3-step-ms", unit="ms", board=3420.0, predicted=4400.0,
                        term=term, within_25_pct=within, verdict=verdict, machine=machine)]

    a = calibration("misses by +29.2 %: the cpu term carries 2359.4 of the 3993.0", "cpu", "False")
    b = ("within +-25 % (+16.7 %)", "", "True")
    text, failed = run(tmp_path, {"npu_cost/calibration": a}, {"npu_cost/calibration": calibration(*b)})
    assert failed and "| `verdict` | exact (by string values), exact |" in text  # one host: exact
    text, failed = run(tmp_path / "2", {"npu_cost/calibration": a},
                       {"npu_cost/calibration": calibration(*b, machine=OTHER_HOST)})
    assert not failed, text
    assert "- `verdict` (time, reported (by row label, a verdict on a host-timed figure, on another machine))" in text
    # what is no verdict on the figure stays exact across machines too
    moved = [{**calibration(*b, machine=OTHER_HOST)[0], "status": "failed"}]
    text, failed = run(tmp_path / "3", {"npu_cost/calibration": [{**a[0], "status": "ok"}]},
                       {"npu_cost/calibration": moved})
    assert failed and "| `status` | exact (by string values), exact | ok | failed |" in text, text


@pytest.mark.parametrize(("b_detail", "fails"), [
    ("node=/dec/ups.1/Conv; max_abs=117.07752227783203; limit=65504.0", False),  # fp32 on another host
    ("node=/dec/ups.1/Conv; max_abs=117.08; limit=65504.0", False),      # the same value printed to 0.01
    ("node=/dec/ups.1/Conv; max_abs=117.09; limit=65504.0", True),       # past the float tolerance and a unit
    ("node=/dec/ups.1/Conv; max_abs=117.0775375366211; limit=65505.0", True),    # one unit of 65504.0 is 0.1
    ("node=/dec/ups.1/Conv; max_abs=117.0775375366211; limit=65504.1", False),   # printed either side of a 5
    ("node=/dec/ups.2/Conv; max_abs=117.0775375366211; limit=65504.0", True),    # an integer in a text: exact
])
def test_a_text_that_quotes_floats_holds_them_to_the_float_tolerance(tmp_path, b_detail, fails):
    def finding(detail, machine=None):
        return [stamped(where="host", code="RK502", detail=detail, machine=machine)]

    a = finding("node=/dec/ups.1/Conv; max_abs=117.0775375366211; limit=65504.0")
    text, failed = run(tmp_path, {"lint/findings": a}, {"lint/findings": finding(b_detail, OTHER_HOST)})
    assert failed == fails, text
    if not fails:
        assert "- `detail` (relative (by the floats a text quotes))" in text, text


@pytest.mark.parametrize(("column", "kind"), [
    ("regtask", "exact"), ("regtask_max_value", "exact"), ("folded_nodes", "exact"), ("engine_bytes", "exact"),
    ("nonfinite", "exact"), ("sim_counts", "exact"), ("snr_db", "dB"), ("snr_target_db", "dB"),
    ("window_snr_db_min", "dB"), ("loudness_dbfs", None),
    ("build_s", "time"), ("first_audio_ms", "time"), ("seconds", "time"), ("rtf", "time"), ("minutes", "time"),
    ("sim_s_per_window", "time"), ("converter_peak_mb", "machine"), ("child_maxrss_gib", "machine"),
    ("loadavg_1m", "machine"), ("pesq_wb", "PESQ-WB"), ("stoi", "STOI"), ("dnsmos_ovrl", "DNSMOS"),
    ("dnsmos_ovrl_ref", "DNSMOS"), ("vs_raw_max_diff", "difference"), ("fp32_max_abs_err", "difference"),
    ("fp32_max_abs", None),
])
def test_rule_by_name(column, kind):
    assert (name_rule(column).kind if name_rule(column) else None) == kind


def test_rule_by_values_when_the_name_says_nothing():
    assert name_rule("S") is None and name_rule("frames") is None  # S is a length, not seconds
    assert column_rule("S", ["64", "110"]).describe() == "exact (by integer values)"
    assert column_rule("rms_ratio", ["1.0001", "1"]).describe() == "relative (by float values)"
    assert column_rule("status", ["ok", ""]).describe() == "exact (by string values)"
    assert column_rule("peak_from", ["dedicated build child"]).kind == "exact"  # a text despite its name


def test_the_command_writes_the_report_and_exits_1_when_something_moved(tmp_path, capsys):
    a = tree(tmp_path / "a", {"s/sweep": sweep()})
    b = tree(tmp_path / "b", {"s/sweep": sweep({("rk3566", 128): {"regtask": 1}})})
    from rkstudy.cli import main

    assert main(["results", "diff", str(a), str(b), "--out", str(tmp_path / "diff.md")]) == 1
    assert capsys.readouterr().out.strip() == (f"1 tables compared; 1 cells in 1 tables moved past their tolerance "
                                               f"(exit 1). -> {tmp_path / 'diff.md'}")
    assert "| target=rk3566, where=simulator, frames=128 | `regtask` | exact (by name), exact | 12800 | 1 |" in (
        tmp_path / "diff.md").read_text()
    assert main(["results", "diff", str(a), str(a)]) == 0
    assert main(["results", "diff", str(a), str(tmp_path / "nowhere")]) == 2
    assert "is not a result tree" in capsys.readouterr().err


def test_machine_figures_and_times_named_by_a_headline_or_goal_are_reported_not_failed(tmp_path):
    """A rerun from a fresh clone measures the same counts, bytes and dB and other machine figures: a
    headline read from a converter peak, a bandwidth or a ratio of times moves with the machine, and so
    does a goal row's margin over a converter peak."""
    def heads(peak, rtf, dram, nodes):
        return {"s": {"banded: converter peak at the widest width": {"value": peak, "unit": "MB"},
                      "CPU RTF, windowed / monolithic": {"value": rtf, "unit": "x"},
                      "DRAM read on this host, 1 thread, wall clock": {"value": dram, "unit": "GB/s"},
                      "raw slice nodes": {"value": nodes, "unit": "nodes"}}}

    def goals(measured):
        return [stamped(where="host", target="none", goal="converter peak at width 320", budget=3000.0,
                        measured=measured, margin=3000.0 - measured, unit="MB")]

    text, failed = run(tmp_path, {"s/targets": goals(707.9)}, {"s/targets": goals(634.9)},
                       a_headlines=heads(859.3, 2.635, 28.88, 992), b_headlines=heads(786.6, 2.951, 21.75, 992))
    assert not failed, text
    assert "`value` (machine, reported (by row label))" in text and "`value` (time, reported (by row label))" in text
    assert "`margin` (machine, reported (by row label))" in text
    text, failed = run(tmp_path / "n", {"s/targets": goals(707.9)}, {"s/targets": goals(707.9)},
                       a_headlines=heads(859.3, 2.635, 28.88, 992), b_headlines=heads(859.3, 2.635, 28.88, 993))
    assert failed and "| where=fp32, headline=raw slice nodes | `value` |" in text


def test_a_reference_claim_is_compared_by_its_source_column_and_its_verdict_by_kind(tmp_path):
    def claim(cid, ours, source, verdict):
        return stamped(where="host", target="none", claim=cid, theirs="x", ours=ours, ours_from=source,
                       verdict=verdict)

    a = [claim("dram", "28.88 GB/s", "dram.gb_per_s_best[threads=1] value", "board only"),
         claim("snr", "43.11 dB", "simulator_vs_fp32.snr_db[target=rk3588] value",
               "differs: ours 43.11 dB, theirs 24.1 dB: board"),
         claim("lines", "18 lines", "builds.regtask[target=rk3588] value", "differs: ours 18 lines, theirs 0 lines")]
    b = [claim("dram", "21.75 GB/s", "dram.gb_per_s_best[threads=1] value", "board only"),
         claim("snr", "43.31 dB", "simulator_vs_fp32.snr_db[target=rk3588] value",
               "differs: ours 43.31 dB, theirs 24.1 dB: board"),
         claim("lines", "18 lines", "builds.regtask[target=rk3588] value", "differs: ours 18 lines, theirs 0 lines")]
    text, failed = run(tmp_path, {"s/reference_claims": a},
                       {"s/reference_claims": [{**r, **OTHER_HOST} for r in b]})
    assert not failed, text  # 0.2 dB of an fp32 score on another machine; a bandwidth reported
    moved_a = [dict(r) for r in a]
    moved_b = [dict(r) for r in a]
    moved_b[2] = claim("lines", "0 lines", "builds.regtask[target=rk3588] value", "reproduced")
    text, failed = run(tmp_path / "k", {"s/reference_claims": moved_a}, {"s/reference_claims": moved_b})
    assert failed
    assert ("| target=none, where=host, claim=lines | `ours` | exact (by ours_from), exact | 18 lines | 0 lines |"
            in text)
    assert "| target=none, where=host, claim=lines | `verdict` | exact (by verdict kind), exact |" in text


def test_what_this_hosts_timings_feed_is_reported_not_failed(tmp_path):
    """A cost model's rows mix host-timed terms into predicted figures: a ratio's spread beside a ratio of
    times, a per-op time list, a figure named in ms and its verdict text, a constant whose unit is a time.
    A count beside them, or a verdict of another kind, still fails."""
    def tables(ratio, op_ms, predicted, verdict, factor, nodes=7):
        return {"s/cpu": [stamped(where="fp32", path="walk", ratio_vs_monolithic=ratio, ratio_min=ratio - 0.3,
                                  ratio_max=ratio + 0.1, cpu_host_ms_by_op=f"Slice:{op_ms} Sin:4.2")],
                "s/calibration": [stamped(where="host", figure="piper-decoder-ms", predicted=predicted,
                                          verdict=verdict, nodes=nodes)],
                "s/constants": [stamped(where="host", constant="cpu_factor", this_run=factor,
                                        unit="board ms per host ms")]}

    a = tables(2.1267, 0.0231, 1369.0, "misses by +32.9 %: the cpu term carries 7.0 of the 1369.0", 7.553)
    b = tables(1.9351, 0.0233, 1369.7, "misses by +33.0 %: the cpu term carries 7.1 of the 1369.7", 7.443)
    text, failed = run(tmp_path, a, b)
    assert not failed, text
    assert "- `ratio_min` (time, reported (by a ratio of times)): 1 row changed" in text
    assert "- `cpu_host_ms_by_op` (time, reported (by name, a text of them)): 1 row changed" in text
    assert "- `predicted` (time, reported (by row label)): 1 row changed" in text
    assert "- `verdict` (time, reported (by row label, a text of them)): 1 row changed" in text
    assert "- `this_run` (time, reported (by row label)): 1 row changed" in text
    first = [stamped(where="host", path="NPU decoder", terms_to_first_audio=f"conv 62.2 + cpu 1.7 + io {io}")
             for io in (5.7, 5.8)]
    text, failed = run(tmp_path / "terms", {"s/first": first[:1]}, {"s/first": first[1:]})
    assert not failed and "- `terms_to_first_audio` (time, reported (by name, a text of them))" in text, text
    b = tables(2.1267, 0.0231, 1369.0, "within +-25 % (-10.3 %)", 7.553, nodes=8)
    text, failed = run(tmp_path / "2", a, b)
    assert failed and "| `verdict` | exact (by string values), exact |" in text and "| `nodes` |" in text


def test_a_crash_signal_is_reported_and_the_crash_itself_still_fails(tmp_path):
    """rknn-toolkit2 building w8a16 for rk3562 died on SIGSEGV in one run and on SIGABRT in the next (same
    host, graph and toolkit): the signal is reported; a build that no longer crashes, or crashes elsewhere,
    still fails."""
    def probe(status, error):
        return {"s/dtypes": [stamped(where="host", target_soc="rk3562", dtype="w8a16", status=status, error=error)]}

    a = probe("crashed (SIGSEGV, exit 139) at build", "the toolkit died on SIGSEGV during build (a compiler abort)")
    b = probe("crashed (SIGABRT, exit 134) at build", "the toolkit died on SIGABRT during build (a compiler abort)")
    text, failed = run(tmp_path, a, b)
    assert not failed, text
    assert "- `status` (crash signal, reported (by the signal a crashed toolkit died on only" in text, text
    for k, other in enumerate((probe("ok", ""), probe("crashed (SIGABRT, exit 134) at load",
                                                      "the toolkit died on SIGABRT during load (a compiler abort)"))):
        text, failed = run(tmp_path / str(k), a, other)
        assert failed, text


def test_an_engine_digest_is_reported_and_anything_else_in_the_text_still_fails(tmp_path):
    """Two builds of one graph differ in the toolkit's uninitialized padding, so a row naming its engines by
    digest moves with every build; the engine's name, role or size moving is still a change."""
    def speak(engines, engine_bytes=54472687):
        return {"s/speak": [stamped(where="fp32", path="NPU generator", engines=engines, engine_bytes=engine_bytes)]}

    a = speak("generator.main=generator_w128-ccd1cdb2c5aeff04.rk3588.rknn:ec508a9211ca")
    b = speak("generator.main=generator_w128-ccd1cdb2c5aeff04.rk3588.rknn:06a66513d04c")
    text, failed = run(tmp_path, a, b)
    assert not failed, text
    assert "- `engines` (engine digest, reported (by engine digests only: each build's padding differs)): 1 row" in text
    for k, other in enumerate((speak("generator.window=generator_w128-ccd1cdb2c5aeff04.rk3588.rknn:06a66513d04c"),
                  speak("generator.main=generator_w136-ccd1cdb2c5aeff04.rk3588.rknn:06a66513d04c"),
                  speak("generator.main=generator_w128-ccd1cdb2c5aeff04.rk3588.rknn:06a66513d04c", 54472688))):
        text, failed = run(tmp_path / str(k), a, other)
        assert failed, text
