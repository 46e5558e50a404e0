"""The measured child of `rkstudy board run`: whatever fails in it reaches the user as one line that
names the fix (the traceback only under --debug), and a child that hangs (a wedged NPU) is killed at
its timeout instead of hanging the command."""

import os
import time

import pytest

from rkstudy.board import child
from rkstudy.board.dmesg import RknnError
from rkstudy.contract import Contract, Digest, Tensor
from rkstudy.errors import InputError

JOBS = '''
import time


def broken(**kw):
    raise ValueError("an output of rank 2 where the walker wants 3")


def missing(**kw):
    import rknnlite_helper_that_is_not_installed  # noqa: F401


def hangs(**kw):
    time.sleep(60)


def hangs_holding_a_temp_file(**kw):
    import tempfile
    tempfile.mkstemp(suffix=".pcm")
    time.sleep(60)


def refuses(**kw):
    from rkstudy.errors import InputError
    raise InputError("--latents x.npz is not a latents file; make one with `rkstudy piper latents`")


def works(**kw):
    return {"seconds": 0.5, "audio_s": 1.0, "audio": [0.0, 0.5], "sample_rate": 22050, "cores": kw["cores"]}
'''


@pytest.fixture
def spec(tmp_path, monkeypatch):
    """An engine with a stage-2 contract, and a jobs module the child can import."""
    (tmp_path / "board_jobs.py").write_text(JOBS)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.delenv("RKSTUDY_DEBUG", raising=False)
    monkeypatch.setenv("RKSTUDY_SYSROOT", str(tmp_path / "no-board"))  # no load file, no clock: none sampled
    slice_ = tmp_path / "slice.onnx"
    slice_.write_bytes(b"the slice")
    engine = tmp_path / "e.rknn"
    engine.write_bytes(b"engine")
    c = Contract(family="piper_decoder", stage="decoder", inputs=(Tensor("z", (1, 192, 93), role="walked", axis=2),),
                 outputs=(Tensor("audio", (1, 1, 93 * 256), role="walked", axis=2, rate=256),),
                 source=Digest("v.onnx", "a" * 64), producer="rkstudy piper decoder --skip-rknn")
    c = c.compiled(target="rk3588", toolkit="rknn-toolkit2 2.5.0", onnx_path=slice_, engine_path=engine)
    c.write_beside(engine)

    def make(job):
        return {"job": f"board_jobs:{job}", "engine": str(engine), "cores": "0_1_2", "payload": {}}
    return make


def run_child(spec, **kw):
    """The board run's child, as `rkstudy board run` starts it."""
    return child.run_child("rkstudy.board.run", spec, label="the board run of e.rknn", prefix="rkstudy-board-", **kw)


def test_a_child_that_works_hands_back_its_result(spec):
    make = spec
    result, arrays = run_child(make("works"))
    assert result["cores"] == "0_1_2" and result["npu_load"]["npu_load_samples"] == 0
    assert result["npu_clock"] == {"npu_governor": "", "npu_freq_hz": ""}  # no init ran, nothing sampled
    assert arrays["audio"].tolist() == [0.0, 0.5]


def test_an_unexpected_child_error_is_one_line(spec, capfd):
    make = spec
    with pytest.raises(RknnError) as err:
        run_child(make("broken"))
    assert str(err.value) == ("unexpected ValueError in the board child: an output of rank 2 where the walker wants "
                              "3 (rerun with --debug for the traceback, and please report it)")
    assert "Traceback" not in capfd.readouterr().err


def test_debug_shows_the_childs_traceback(spec, capfd, monkeypatch):
    make = spec
    monkeypatch.setenv("RKSTUDY_DEBUG", "1")
    with pytest.raises(RknnError):
        run_child(make("broken"))
    err = capfd.readouterr().err
    assert "Traceback" in err and "ValueError: an output of rank 2" in err


def test_an_import_error_names_the_board_environment(spec):
    make = spec
    with pytest.raises(InputError, match=r"cannot import rknnlite_helper_that_is_not_installed .*make board-env"):
        run_child(make("missing"))


def test_an_input_error_keeps_its_message_and_exit_code(spec):
    make = spec
    with pytest.raises(InputError, match=r"^--latents x.npz is not a latents file; make one with") as err:
        run_child(make("refuses"))
    assert err.value.exit_code == 2


def test_a_hung_child_is_killed_at_its_timeout(spec):
    make = spec
    t0 = time.monotonic()
    with pytest.raises(RknnError, match=r"did not finish in 2 s and was killed .*RKSTUDY_BOARD_TIMEOUT"):
        run_child(make("hangs"), timeout=2)
    assert time.monotonic() - t0 < 20


def test_a_child_killed_mid_run_leaves_no_temporary_file(spec, tmp_path, monkeypatch):
    """A child stopped at any instant cannot clean up after itself: its temporary files live in the parent's
    folder, which the parent removes however the run ends."""
    make = spec
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr("tempfile.tempdir", None)  # the parent reads TMPDIR again
    with pytest.raises(RknnError, match="did not finish in 3 s"):
        run_child(make("hangs_holding_a_temp_file"), timeout=3)
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_child_that_ignores_sigterm_is_killed_past_the_grace():
    """stop_child (what Ctrl-C in the parent does): SIGTERM to the child's group, SIGKILL past the grace (a
    child held in the driver by a wedged NPU does not end on the first)."""
    import subprocess
    import sys

    code = "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); " \
           "time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"
    t0 = time.monotonic()
    assert child.stop_child(proc, grace=1) == ("its child process was killed, as it did not stop (a wedged NPU? "
                                             "dmesg | tail says)")
    assert proc.returncode == -9 and time.monotonic() - t0 < 20
    quick = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    assert child.stop_child(quick, grace=10) == "its child process stopped with it" and quick.returncode == -15
