"""`rkstudy results diff A B` on synthetic result trees: the tolerance each kind of column gets,
how rows are matched, and what the report and the exit code say."""

import json

import pytest

from rkstudy.tables import diff as results_diff
from rkstudy.tables import results
from rkstudy.tables.diff import column_rule, name_rule


def stamped(commit="aaaaaaaaaaaa", target="rk3588", where="simulator", **values):
    return {**values, "rkstudy_version": "0.1.0", "commit": commit, "toolkit_version": "rknn-toolkit2 2.5.0",
            "target": target, "where": where, "date": "2026-12-01"}


def sweep(changes=None):
    """Two targets x two widths; `changes` maps (target, frames) to the columns that differ."""
    changes = changes or {}
    rows = []
    for target in ("rk3588", "rk3566"):
        for frames in (64, 128):
            r = {"frames": frames, "status": "ok", "regtask": 100 * frames, "engine_bytes": 1000 * frames,
                 "snr_db": 60.0 + frames / 64, "build_s": 10.0, "rms_ratio": 1.23456e10}
            r.update(changes.get((target, frames), {}))
            rows.append(stamped(target=target, **r))
    return rows


def tree(root, tables, headlines=None):
    for name, rows in tables.items():
        study, table = name.split("/")
        results.write_table(study, table, rows, root=root)
    for study, h in (headlines or {}).items():
        (root / study).mkdir(parents=True, exist_ok=True)
        (root / study / "headlines.json").write_text(json.dumps({"study": study, "commit": "x", "headlines": h}))
    return root


def run(tmp_path, a_tables, b_tables, **kw):
    a = tree(tmp_path / "a", a_tables, kw.get("a_headlines"))
    b = tree(tmp_path / "b", b_tables, kw.get("b_headlines"))
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
    ("snr_db", 61.0 + 0.49, False),   # dB: within 0.5
    ("snr_db", 61.0 - 0.51, True),
    ("snr_db", float("inf"), True),
    ("build_s", 95.0, False),         # times: reported, never failed
    ("rms_ratio", 1.23457e10, True),  # other floats: relative 1e-6 (tables keep 6 digits: 8e-6 here)
    ("status", "failed", True),       # strings: exact
])
def test_tolerance_by_kind(tmp_path, column, b_value, fails):
    text, failed = run(tmp_path, {"s/sweep": sweep()}, {"s/sweep": sweep({("rk3588", 64): {column: b_value}})})
    assert failed is fails
    if fails:
        assert f"| target=rk3588, where=simulator, frames=64 | `{column}` |" in text
    else:
        assert f"- `{column}` (" in text and "1 row changed" in text


def test_relative_tolerance_on_cells_written_with_more_digits():
    rule = results_diff.Tolerance("relative", "float values")
    assert results_diff.moved(rule, "1.0000001", "1.0000009") == (False, pytest.approx(8e-7))
    assert results_diff.moved(rule, "1.0000001", "1.0000021")[0]
    assert results_diff.moved(rule, "inf", "inf") == (False, 0.0)
    assert results_diff.moved(results_diff.Tolerance("dB", "name"), "inf", "120.5") == (True, float("inf"))


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
    b_rows = [{**{k: v for k, v in r.items() if k not in results.STAMP}, "new_column": 1,
               **{k: r[k] for k in results.STAMP}} for r in sweep() if r["frames"] == 64]
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
    def gates(snr, seconds):
        return [stamped(gate="g", measured=snr, threshold=30, unit="dB", passed=True),
                stamped(gate="t", measured=seconds, threshold=30, unit="ms/window", passed=True)]

    text, failed = run(tmp_path, {"s/gate": gates(60.0, 0.02)}, {"s/gate": gates(60.4, 0.05)})
    assert not failed
    assert "- `measured` (dB, within 0.5 (by unit)): 1 row changed, change +0.4 to +0.4" in text
    assert "- `measured` (time, reported (by unit)): 1 row changed, change +0.03 to +0.03, B/A median 2.5" in text
    text, failed = run(tmp_path / "2", {"s/gate": gates(60.0, 0.02)}, {"s/gate": gates(59.0, 0.02)})
    assert failed and "| target=rk3588, where=simulator, gate=g | `measured` | dB, within 0.5 (by unit) |" in text


def test_headlines_are_compared_too(tmp_path):
    h = {"interior SNR": {"value": 73.2, "unit": "dB", "reference": ""}, "lines": {"value": 62031, "unit": "lines"}}
    moved = {"interior SNR": {"value": 73.5, "unit": "dB"}, "lines": {"value": 62032, "unit": "lines"}}
    text, failed = run(tmp_path, {}, {}, a_headlines={"s": h}, b_headlines={"s": moved})
    assert failed
    assert "| headline=lines | `value` | relative 1e-06 (by float values) | 62031 | 62032 | +1 (+0.00%) |" in text
    assert "interior SNR | `value`" not in text


@pytest.mark.parametrize(("column", "kind"), [
    ("regtask", "exact"), ("regtask_max_value", "exact"), ("folded_nodes", "exact"), ("engine_bytes", "exact"),
    ("nonfinite", "exact"), ("sim_counts", "exact"), ("snr_db", "dB"), ("snr_target_db", "dB"),
    ("build_s", "time"), ("first_audio_ms", "time"), ("seconds", "time"), ("rtf", "time"), ("minutes", "time"),
    ("sim_s_per_window", "time"), ("converter_peak_mb", "machine"), ("child_maxrss_gib", "machine"),
    ("loadavg_1m", "machine"),
])
def test_rule_by_name(column, kind):
    assert name_rule(column).kind == kind


def test_rule_by_values_when_the_name_says_nothing():
    assert name_rule("S") is None and name_rule("frames") is None  # S is a length, not seconds
    assert column_rule("S", ["64", "110"]).describe() == "exact (by integer values)"
    assert column_rule("rms_ratio", ["1.0001", "1"]).describe() == "relative 1e-06 (by float values)"
    assert column_rule("status", ["ok", ""]).describe() == "exact (by string values)"
    assert column_rule("peak_from", ["dedicated build child"]).kind == "exact"  # a text despite its name


def test_the_command_writes_the_report_and_exits_1_when_something_moved(tmp_path, capsys):
    a = tree(tmp_path / "a", {"s/sweep": sweep()})
    b = tree(tmp_path / "b", {"s/sweep": sweep({("rk3566", 128): {"regtask": 1}})})
    from rkstudy.cli import main

    assert main(["results", "diff", str(a), str(b), "--out", str(tmp_path / "diff.md")]) == 1
    assert capsys.readouterr().out.strip() == (f"1 tables compared; 1 cells in 1 tables moved past their tolerance "
                                               f"(exit 1). -> {tmp_path / 'diff.md'}")
    assert "| target=rk3566, where=simulator, frames=128 | `regtask` | exact (by name) | 12800 | 1 |" in (
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
    assert failed and "| headline=raw slice nodes | `value` |" in text


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
    text, failed = run(tmp_path, {"s/reference_claims": a}, {"s/reference_claims": b})
    assert not failed, text
    moved_a = [dict(r) for r in a]
    moved_b = [dict(r) for r in a]
    moved_b[2] = claim("lines", "0 lines", "builds.regtask[target=rk3588] value", "reproduced")
    text, failed = run(tmp_path / "k", {"s/reference_claims": moved_a}, {"s/reference_claims": moved_b})
    assert failed
    assert "| target=none, where=host, claim=lines | `ours` | exact (by ours_from) | 18 lines | 0 lines |" in text
    assert "| target=none, where=host, claim=lines | `verdict` | exact (by verdict kind) |" in text
