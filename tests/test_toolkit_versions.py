"""The toolkit-version table side by side: each version's build keeps its own board-risk verdict beside
its simulator SNR (the same SNR can sit beside a clean 2.3.2 build and an at-risk 2.5.0 one)."""

from rkstudy.levers import versions


def row(version, regtask, value, snr):
    return {"engine": "Piper decoder 93-frame window", "toolkit": version, "status": "ok", "target": "rk3588",
            "dtype": "fp16", "regtask": regtask, "regtask_max_value": value, "engine_bytes": 21_000_000,
            "simulator_snr_db": snr, "nonfinite": 0, "build_s": 8.0}


def test_each_version_has_its_board_risk_beside_its_snr():
    (side,) = versions.side_by_side([row("2.5.0", 18, 16352, 42.22), row("2.3.2", 0, 0, 42.31)], ["2.5.0", "2.3.2"])
    assert side["board_risk_2.3.2"] == "clean"
    assert side["board_risk_2.5.0"].startswith("at risk: 18 REGTASK lines, largest field value 16,352")
    assert side["regtask_2.3.2_minus_2.5.0"] == -18 and side["snr_db_2.3.2_minus_2.5.0"] == 0.09
    assert side["reference_regtask"] == "0"
