"""`rkstudy doctor` on the host, and `--board`, holding on a board and off it."""

from rkstudy import doctor
from rkstudy.cli import main
from rkstudy.runtime import board_available


def failing(v):
    return {f.what.split()[0]: f.fix for f in doctor.converter_findings(v) if not f.ok}


def test_this_environment_is_healthy(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "rknn-toolkit2        2.5.0" in out and "onnx                 1.18.0" in out
    present, _ = board_available()
    assert f"board runtime: {'present' if present else 'absent'}" in out
    assert "piper_decoder" in out and "piper_encoder" in out  # the families, from the registry
    assert out.rstrip().endswith("OK")


def test_broken_pins_name_their_fix():
    good = doctor.versions()
    assert failing(good) == {}
    assert failing({**good, "onnx": "1.19.0"}) == {"onnx": "pip install onnx==1.18.0"}
    assert failing({**good, "setuptools": "81.0.0"}) == {"setuptools": "pip install 'setuptools<81'"}
    assert "numpy" in failing({**good, "numpy": "2.1.0"})
    assert failing({**good, "rknn-toolkit2": None})["rknn-toolkit2"].startswith("make toolkit")


def test_broken_environment_exits_nonzero(monkeypatch, capsys):
    real = doctor.versions()
    monkeypatch.setattr(doctor, "versions", lambda: {**real, "onnx": "1.19.1"})
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "[FAIL] onnx 1.19.1 removed onnx.mapping" in out
    assert "fix: pip install onnx==1.18.0" in out
    assert "BROKEN" in out


def test_board_side_reports_what_is_here(capsys):
    present, why = board_available()
    code = main(["doctor", "--board"])
    out = capsys.readouterr().out
    assert "`rkstudy board run piper_decoder`" in out
    if present:  # on a board: exit 0, the SoC and the NPU clock named
        assert code == 0 and "SoC " in out and "NPU governor" in out
    else:
        assert code == 1 and "fix: on the board, `make board-env`" in out and why in out


def test_board_side_on_a_recorded_board(monkeypatch, capsys):
    """The same command against a recorded RK3588 tree with the replay double of RKNNLite."""
    import sys

    from rkstudy.paths import REPO

    monkeypatch.setenv("RKSTUDY_SYSROOT", str(REPO / "tests" / "fixtures" / "boards" / "rk3588"))
    monkeypatch.syspath_prepend(str(REPO / "tests" / "doubles"))
    sys.modules.pop("rknnlite", None)
    assert main(["doctor", "--board"]) == 0
    out = capsys.readouterr().out
    assert "board runtime: present (RKNPU driver: v0.9.8)" in out
    assert "SoC rk3588; NPU governor rknpu_ondemand, cur_freq 1000000000" in out
