from rkstudy import doctor
from rkstudy.cli import main


def failing(v):
    return {f.what.split()[0]: f.fix for f in doctor.converter_findings(v) if not f.ok}


def test_this_environment_is_healthy(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "rknn-toolkit2        2.5.0" in out and "onnx                 1.18.0" in out
    assert "board runtime: absent" in out  # no board on the machines this runs on
    assert out.rstrip().endswith("OK")


def test_broken_pins_name_their_fix():
    good = doctor.versions()
    assert failing(good) == {}
    assert failing({**good, "onnx": "1.19.0"}) == {"onnx": "pip install onnx==1.18.0"}
    assert failing({**good, "setuptools": "81.0.0"}) == {"setuptools": "pip install 'setuptools<81'"}
    assert "numpy" in failing({**good, "numpy": "2.1.0"})
    assert failing({**good, "rknn-toolkit2": None}) == {
        "rknn-toolkit2": "pip install --no-deps rknn-toolkit2==2.5.0 (after the converter extra)"}


def test_broken_environment_exits_nonzero(monkeypatch, capsys):
    real = doctor.versions()
    monkeypatch.setattr(doctor, "versions", lambda: {**real, "onnx": "1.19.1"})
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "[FAIL] onnx 1.19.1 removed onnx.mapping" in out
    assert "fix: pip install onnx==1.18.0" in out
    assert "BROKEN" in out


def test_board_side_reports_absence(capsys):
    assert main(["doctor", "--board"]) == 1
    assert "fix: on the board" in capsys.readouterr().out
