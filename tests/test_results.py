import datetime
import json
import re
import stat

import pytest

from rkstudy import __version__
from rkstudy.tables import results
from rkstudy.tables.results import HOST, Origin


def rows():
    return [results.stamp({"window": 93, "snr_db": 98.25}, Origin("simulator", "rk3588")),
            results.stamp({"window": 55, "snr_db": float("inf"), "where": "fp32"})]


def test_stamp_carries_provenance():
    row = rows()[0]
    assert row["rkstudy_version"] == __version__
    assert re.fullmatch(r"[0-9a-f]{12}(-dirty)?|unknown \(.+\)", row["commit"])
    assert row["toolkit_version"].startswith("rknn-toolkit2 ")
    assert (row["target"], row["where"]) == ("rk3588", "simulator")
    assert row["date"] == datetime.date.today().isoformat()
    assert list(row)[-10:] == [*results.STAMP, *results.MACHINE]  # provenance last, in one order
    assert row["machine_isa"] in ("avx512", "avx2", "avx", "sse4.2", "sse2") or row["machine_isa"].startswith("asimd")
    assert row["machine_cpu"] not in ("", "unknown") and row["machine_threads"] >= 1
    assert rows()[1]["where"] == "fp32" and rows()[1]["target"] == "none"  # read from the row itself


def test_where_comes_from_the_producer_never_a_literal():
    class FakeRunner:
        where, target = "replay", "rk3566"

    assert results.stamp({"x": 1}, FakeRunner())["where"] == "replay"
    assert results.stamp({"x": 1}, HOST)["where"] == "host"
    with pytest.raises(ValueError, match="pass the runner, BuildReport or rkstudy.tables.results.HOST"):
        results.stamp({"x": 1})  # nothing says where it ran
    with pytest.raises(ValueError, match="fp32, simulator, board"):
        results.stamp({"x": 1}, Origin("npu", "rk3588"))
    with pytest.raises(ValueError, match="use 'none'"):
        results.stamp({"x": 1}, Origin("fp32", "rk3399"))


def earlier_row():
    """A row as read back from a committed table (strings), stamped by an earlier run."""
    return {"frames": "256", "engine_bytes": "901928284", "rkstudy_version": "0.0.9", "commit": "4ba221b0c0de",
            "toolkit_version": "rknn-toolkit2 2.3.2", "target": "rk3588", "where": "host", "date": "2026-11-30"}


def test_a_carried_row_keeps_the_stamp_of_the_run_that_measured_it():
    old = earlier_row()
    row = {"frames": 256, "engine_bytes": 901928284, **results.carried(old, "results/s/sizes.csv"), "status": "ok"}
    got = results.stamp(row, Origin("simulator", "rk3566"))  # this run's runner does not overwrite it
    assert list(got) == ["frames", "engine_bytes", "carried_from", "status", *results.STAMP, *results.MACHINE]
    assert [got[k] for k in results.MACHINE] == ["", "", "", ""]  # the run that measured it named no machine
    assert got["carried_from"] == "results/s/sizes.csv"
    assert [got[k] for k in results.STAMP] == ["0.0.9", "4ba221b0c0de", "rknn-toolkit2 2.3.2", "rk3588", "host",
                                               "2026-11-30"]
    fresh = results.stamp({"frames": 64, "engine_bytes": 1, "carried_from": "", "status": "ok"}, HOST)
    assert fresh["commit"] == results.commit() and fresh["date"] == datetime.date.today().isoformat()


def test_carried_twice_still_names_the_first_table():
    once = {**earlier_row(), "carried_from": "results/s/sizes.csv"}
    assert results.carried(once, "results/s/growth.csv")["carried_from"] == "results/s/sizes.csv"
    assert results.carried(once, "results/s/growth.csv")["commit"] == "4ba221b0c0de"


def test_a_carried_row_without_its_stamp_is_refused():
    old = {k: v for k, v in earlier_row().items() if k != "commit"}
    with pytest.raises(ValueError, match="has no commit, so no one knows which run measured it"):
        results.carried(old, "results/s/sizes.csv")
    with pytest.raises(ValueError, match="a row carried from results/s/sizes.csv has no rkstudy_version, commit"):
        results.stamp({"frames": 256, "carried_from": "results/s/sizes.csv", "where": "host", "target": "none"})
    with pytest.raises(ValueError, match="where='npu'"):
        results.stamp({**earlier_row(), "where": "npu", "carried_from": "results/s/sizes.csv"})


def test_carried_and_fresh_rows_share_a_table(tmp_path):
    fresh = results.stamp({"frames": 64, "carried_from": ""}, HOST)
    kept = results.stamp({"frames": 256, **results.carried(earlier_row(), "results/s/sizes.csv")})
    back = results.read_table(results.write_table("s", "sizes", [fresh, kept], root=tmp_path))
    assert [(r["frames"], r["commit"], r["carried_from"]) for r in back] == [
        ("64", results.commit(), ""), ("256", "4ba221b0c0de", "results/s/sizes.csv")]


def test_write_table_writes_csv_and_markdown(tmp_path):
    path = results.write_table("study", "sweep", rows(), root=tmp_path, title="Sweep")
    back = results.read_table(path)
    assert [r["window"] for r in back] == ["93", "55"]
    assert back[0]["snr_db"] == "98.25" and back[1]["snr_db"] == "inf"
    md = (tmp_path / "study" / "sweep.md").read_text()
    assert md.startswith("# Sweep\n\n| window | snr_db |")
    assert md.count("\n| ") == 3  # header + two rows
    assert sorted(p.name for p in (tmp_path / "study").iterdir()) == ["sweep.csv", "sweep.md"]


def test_bad_table_writes_nothing_and_keeps_the_old_one(tmp_path):
    results.write_table("study", "sweep", rows(), root=tmp_path)
    before = (tmp_path / "study" / "sweep.csv").read_text()
    unstamped = rows() + [{"window": 45, "snr_db": 8.0}]
    with pytest.raises(ValueError, match="row 2 has no rkstudy_version"):
        results.write_table("study", "sweep", unstamped, root=tmp_path)
    ragged = rows()
    ragged[1]["extra"] = 1
    with pytest.raises(ValueError, match="same columns"):
        results.write_table("study", "sweep", ragged, root=tmp_path)
    with pytest.raises(ValueError, match="no rows"):
        results.write_table("study", "sweep", [], root=tmp_path)
    assert (tmp_path / "study" / "sweep.csv").read_text() == before
    assert sorted(p.name for p in (tmp_path / "study").iterdir()) == ["sweep.csv", "sweep.md"]


def test_quick_mode_never_targets_the_committed_results(monkeypatch):
    from rkstudy.paths import RESULTS, results_root

    monkeypatch.delenv("RKSTUDY_RESULTS", raising=False)
    assert results_root(quick=False) == RESULTS
    assert results_root(quick=True) != RESULTS


def test_tables_are_ordinary_files(tmp_path):
    path = results.write_table("study", "sweep", rows(), root=tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) & 0o044 == 0o044  # group/other may read, as with open()


def test_headlines_name_real_reference_figures(tmp_path):
    path = results.record_headlines("piper_decoder", {
        "interior SNR at 93": {"value": 73.2, "unit": "dB", "comparable": "same",
                               "reference": "interior window SNR vs full-length decode at 93 (45+24+24)"},
        "exact": {"value": float("inf"), "unit": "dB"}}, root=tmp_path)
    got = json.loads(path.read_text())
    assert got["headlines"]["exact"]["value"] == "inf" and got["commit"] == results.commit()
    with pytest.raises(KeyError, match="no reference figure"):
        results.record_headlines("piper_decoder", {"x": {"value": 1, "reference": "a figure nobody wrote"}},
                                 root=tmp_path)


@pytest.mark.parametrize("comparable", ["", "differs:", "differs: ", "similar"])
def test_a_headline_beside_a_reference_figure_says_whether_they_compare(tmp_path, comparable):
    figure = "interior window SNR vs full-length decode at 93 (45+24+24)"
    with pytest.raises(ValueError, match="needs comparable='same' or comparable='differs: <what differs>'"):
        results.record_headlines("piper_decoder", {"x": {"value": 1, "reference": figure, "comparable": comparable}},
                                 root=tmp_path)
    path = results.record_headlines("piper_decoder", {
        "x": {"value": 1, "reference": figure, "comparable": "differs: other latents"}}, root=tmp_path)
    assert json.loads(path.read_text())["headlines"]["x"]["comparable"] == "differs: other latents"
    with pytest.raises(ValueError, match="without a reference figure"):
        results.record_headlines("piper_decoder", {"x": {"value": 1, "comparable": "same"}}, root=tmp_path)


def test_reference_numbers_read_ranges_without_retyping():
    drift = "latent frames drift {} chunks (fp16 engine vs fp32)"
    assert results.reference_numbers("piper_encoder", drift.format("n128")) == [7, 8, -6]
    assert results.reference_numbers("piper_encoder", drift.format("n384")) == [-21, -23]
    assert results.reference_numbers("piper_encoder", "SNR vs fp32 n128 (stats / cond)") == [45.5, 48.6, 40.1, 44.8]


def test_a_row_keeps_the_toolkit_that_built_it():
    """A build in a second toolkit environment runs in another interpreter: its row says that toolkit,
    not the one of the process that stamps it."""
    built = results.stamp({"snr_db": 40.0, "where": "simulator", "target": "rk3588",
                           "built_with": "rknn-toolkit2 2.3.2"})
    assert built["toolkit_version"] == "rknn-toolkit2 2.3.2" and "built_with" not in built
    assert results.stamp({"snr_db": 40.0}, results.HOST)["toolkit_version"] == results.toolkit_version()


AVX512_HOST = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9R14
flags\t\t: fpu sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma avx512f avx512bw avx512vl avx512_vnni
"""
AVX2_HOST = AVX512_HOST.replace("AMD EPYC 9R14", "AMD EPYC 7R13").replace(" avx512f avx512bw avx512vl avx512_vnni", "")


def test_the_machine_columns_name_the_cpu_its_vector_isa_and_the_threads(tmp_path, monkeypatch):
    from rkstudy import process

    assert (process.cpu_model(AVX512_HOST), process.vector_isa(AVX512_HOST)) == ("AMD EPYC 9R14", "avx512")
    assert (process.cpu_model(AVX2_HOST), process.vector_isa(AVX2_HOST)) == ("AMD EPYC 7R13", "avx2")
    assert process.vector_isa("") == process.cpu_model("") == "unknown"
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert process.threads() == 1
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert process.threads() >= 1
    for name in process.PINNED_NUMERICS:
        monkeypatch.delenv(name, raising=False)
    assert process.numerics_pinned() == "none"
    for name, value in process.PINNED_NUMERICS.items():
        monkeypatch.setenv(name, value)
    assert process.numerics_pinned() == "avx2"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE")
    assert "ONEDNN_MAX_CPU_ISA=AVX512_CORE" in process.numerics_pinned()


def test_a_board_row_names_the_boards_cpu_not_the_hosts(monkeypatch):
    """A board's numbers were computed by its own cores: RK3588's four A55s and four A76s with NEON, dot product
    and fp16 arithmetic, read from the board's /proc (the recorded tree under $RKSTUDY_SYSROOT in tests)."""
    from rkstudy.paths import REPO

    monkeypatch.setenv("RKSTUDY_SYSROOT", str(REPO / "tests" / "fixtures" / "boards" / "rk3588"))
    row = results.stamp({"rtf": 0.2}, Origin("board", "rk3588"))
    assert (row["machine_cpu"], row["machine_isa"]) == ("4x Cortex-A55 + 4x Cortex-A76", "asimd+dotprod+fp16")
    host = results.stamp({"x": 1}, HOST)
    assert host["machine_cpu"] != row["machine_cpu"]


def test_a_figure_carries_the_stamp_of_the_run_that_drew_it(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    path = results.save_figure(fig, "s", "line", root=tmp_path)
    plt.close(fig)
    got = results.figure_stamp(path)
    assert (got["study"], got["figure"], got["commit"]) == ("s", "line", results.commit())
    assert got["machine_isa"] == results.machine("host")["machine_isa"]
    (tmp_path / "plain.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0\0\0\0IEND\xaeB`\x82")
    assert results.figure_stamp(tmp_path / "plain.png") == {}
    headlines = results.record_headlines("s", {}, root=tmp_path, figures={"line": results.file_digest(path)})
    recorded = json.loads(headlines.read_text())
    assert recorded["figures"] == {"line": results.file_digest(path)}
    assert recorded["machine"]["machine_cpu"] == results.machine("host")["machine_cpu"]


def test_a_listener_score_has_one_unit_in_every_study(tmp_path):
    """PESQ-WB and DNSMOS are mean opinion scores wherever a headline names them (one study wrote MOS, the
    others nothing); STOI has no unit; another unit is refused."""
    path = results.record_headlines("toolchain", {
        "perceptual: PESQ-WB, fp16 engine vs fp32": {"value": 4.64},
        "quantization, fp16: PESQ-WB vs fp32": {"value": 4.64, "unit": "MOS"},
        "perceptual: DNSMOS OVRL, fp32 reference": {"value": 3.3},
        "perceptual: STOI, white noise 10 dB": {"value": 0.92},
        "perceptual: log-mel distance": {"value": 0.09, "unit": "dB"}}, root=tmp_path)
    units = {n: h["unit"] for n, h in json.loads(path.read_text())["headlines"].items()}
    assert list(units.values()) == ["MOS", "MOS", "MOS", "", "dB"]
    with pytest.raises(ValueError, match="a listener score's unit is 'MOS'"):
        results.record_headlines("toolchain", {"PESQ-WB": {"value": 4.6, "unit": "dB"}}, root=tmp_path)
