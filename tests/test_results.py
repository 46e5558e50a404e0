import datetime

import pytest

from rkstudy import __version__, results


def rows():
    return [results.stamp({"window": 93, "snr_db": 98.25}, where="simulator", target="rk3588"),
            results.stamp({"window": 55, "snr_db": float("inf")}, where="fp32", target="none")]


def test_stamp_carries_provenance():
    row = rows()[0]
    assert row["rkstudy_version"] == __version__
    assert row["toolkit_version"].startswith("rknn-toolkit2 ")
    assert (row["target"], row["where"]) == ("rk3588", "simulator")
    assert row["date"] == datetime.date.today().isoformat()
    with pytest.raises(ValueError, match="fp32, simulator, board"):
        results.stamp({}, where="npu", target="rk3588")
    with pytest.raises(ValueError, match="use 'none'"):
        results.stamp({}, where="fp32", target="rk3576")


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
    monkeypatch.delenv("RKSTUDY_RESULTS", raising=False)
    assert results.results_root(quick=False) == results.REPO / "results"
    assert results.results_root(quick=True) != results.REPO / "results"


def test_tables_are_ordinary_files(tmp_path):
    import stat

    path = results.write_table("study", "sweep", rows(), root=tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) & 0o044 == 0o044  # group/other may read, as with open()
