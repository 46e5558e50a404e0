import datetime
import json
import re
import stat

import pytest

from rkstudy import __version__, results
from rkstudy.results import HOST, Origin


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
    assert list(row)[-6:] == list(results.STAMP)  # provenance last, in one order
    assert rows()[1]["where"] == "fp32" and rows()[1]["target"] == "none"  # read from the row itself


def test_where_comes_from_the_producer_never_a_literal():
    class FakeRunner:
        where, target = "replay", "rk3566"

    assert results.stamp({"x": 1}, FakeRunner())["where"] == "replay"
    assert results.stamp({"x": 1}, HOST)["where"] == "host"
    with pytest.raises(ValueError, match="pass the runner, BuildReport or rkstudy.results.HOST"):
        results.stamp({"x": 1})  # nothing says where it ran
    with pytest.raises(ValueError, match="fp32, simulator, board"):
        results.stamp({"x": 1}, Origin("npu", "rk3588"))
    with pytest.raises(ValueError, match="use 'none'"):
        results.stamp({"x": 1}, Origin("fp32", "rk3399"))


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


def test_headlines_name_real_seed_figures(tmp_path):
    path = results.record_headlines("piper_decoder", {
        "interior SNR at 93": {"value": 73.2, "unit": "dB",
                               "seeds": "interior window SNR vs full-length decode at 93 (45+24+24)"},
        "exact": {"value": float("inf"), "unit": "dB"}}, root=tmp_path)
    got = json.loads(path.read_text())
    assert got["headlines"]["exact"]["value"] == "inf" and got["commit"] == results.commit()
    with pytest.raises(KeyError, match="no seeds' figure"):
        results.record_headlines("piper_decoder", {"x": {"value": 1, "seeds": "a figure nobody wrote"}}, root=tmp_path)


def test_seed_numbers_read_ranges_without_retyping():
    assert results.seed_numbers("piper_encoder", "latent frames drift n128 chunks (fp16 engine vs fp32)") == [7, 8, -6]
    assert results.seed_numbers("piper_encoder", "latent frames drift n384 chunks (fp16 engine vs fp32)") == [-21, -23]
    assert results.seed_numbers("piper_encoder", "SNR vs fp32 n128 (stats / cond)") == [45.5, 48.6, 40.1, 44.8]
