"""`rkstudy doctor` on the host, and `--board`, holding on a board and off it."""

import sys
from pathlib import Path

import pytest

from rkstudy import doctor
from rkstudy.board.runner import board_available
from rkstudy.cli import main
from rkstudy.contract import Contract, Digest, Tensor

BOARDS = Path(__file__).parent / "fixtures" / "boards"


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
        assert code == 1 and "fix: make board-env" in out and why in out
        assert out.rstrip().endswith("rerun `rkstudy doctor --board`.")


def forget_rknnlite():
    for name in [m for m in sys.modules if m == "rknnlite" or m.startswith("rknnlite.")]:
        del sys.modules[name]


@pytest.fixture
def board(monkeypatch):
    """Point the board side at a recorded tree, with the replay double of RKNNLite importable (and
    forgotten after, so later tests see this host as it is)."""
    monkeypatch.syspath_prepend(str(BOARDS.parent.parent / "doubles"))
    forget_rknnlite()

    def at(tree):
        monkeypatch.setenv("RKSTUDY_SYSROOT", str(BOARDS / tree))
    yield at
    forget_rknnlite()


def engine_for(tmp_path, target, toolkit="rknn-toolkit2 2.5.0"):
    """Engine bytes with a stage-2 contract beside them, as the conversion stage writes it."""
    slice_ = tmp_path / "decoder_z.onnx"
    slice_.write_bytes(b"the slice")
    path = tmp_path / f"decoder-{target}.rknn"
    path.write_bytes(b"the engine bytes")
    c = Contract(family="piper_decoder", stage="decoder", inputs=(Tensor("z", (1, 192, 93), role="walked", axis=2),),
                 outputs=(Tensor("audio", (1, 1, 93 * 256), role="walked", axis=2, rate=256),),
                 source=Digest("v.onnx", "a" * 64), producer="rkstudy piper decoder --skip-rknn")
    c.compiled(target=target, toolkit=toolkit, onnx_path=slice_, engine_path=path).write_beside(path)
    return path


@pytest.mark.parametrize("tree,code,lines", [
    ("rk3588", 0, ["[ok] librknnrt 2.3.2 (429f97ae6b@2025-04-09T09:09:27) (/usr/lib/librknnrt.so",
                   "[ok] rknpu driver 0.9.8 (/sys/kernel/debug/rknpu/version)",
                   "[ok] NPU device /dev/dri/renderD129 readable and writable by this user"]),
    ("rk3588-npu-powersave", 0, ["[ok] librknnrt 2.3.2", "[ok] rknpu driver 0.9.8"]),
    ("rk3566-orangepi-3b", 0, ["[ok] librknnrt 2.3.0 (c949ad889d@2024-11-07T11:35:33)",
                               "[ok] rknpu driver 0.9.6 (/sys/module/rknpu/version)"]),
    ("rk3576", 0, ["[ok] librknnrt 2.5.0 (5d2a7c5e3b@2025-10-20T10:00:00) (/usr/lib/librknnrt.so)",
                   "SoC rk3576; NPU governor rknpu_ondemand, cur_freq 950000000"]),
    ("rk3566", 1, ["[FAIL] librknnrt.so is not where RKNNLite loads it (/usr/lib/librknnrt.so)",
                   "fix: install the RKNPU2 runtime (rknn-toolkit2's rknpu2/runtime/Linux/librknn_api/aarch64/",
                   "[ok] rknpu driver 0.9.6", "[FAIL] no NPU device node"]),
    ("rk3562", 0, ["[ok] librknnrt 2.3.0 (c949ad889d@2024-11-07T11:35:33) (/usr/lib/librknnrt.so)",
                   "[ok] rknpu driver 0.9.8 (/sys/kernel/debug/rknpu/version)",
                   "SoC rk3562; NPU governor rknpu_ondemand, cur_freq 300000000"]),
])
def test_board_side_on_each_recorded_board(board, capsys, tree, code, lines):
    board(tree)
    assert main(["doctor", "--board"]) == code
    out = capsys.readouterr().out
    assert "[ok] rknnlite imports" in out
    for line in lines:
        assert line in out
    assert out.rstrip().endswith("OK" if code == 0 else "then rerun `rkstudy doctor --board`.")


def test_a_runtime_older_than_the_engines_compiler_is_refused(board, capsys, tmp_path):
    board("rk3588")
    engine = engine_for(tmp_path, "rk3588")
    assert main(["doctor", "--board", "--engine", str(engine)]) == 1
    out = capsys.readouterr().out
    assert "[ok] engine decoder-rk3588.rknn: compiled for rk3588 by rknn-toolkit2 2.5.0" in out
    assert ("[FAIL] decoder-rk3588.rknn is from rknn-toolkit2 2.5.0 and this board's librknnrt 2.3.2 is older: "
            "Rockchip upgrades librknnrt with the toolkit, release for release (older engines keep running), and "
            "nothing recorded says what 2.3.2 does with a newer engine.") in out
    assert ("fix: put librknnrt 2.5.0 in /usr/lib (rknn-toolkit2's rknpu2/runtime/Linux/librknn_api/aarch64/), or "
            "build for 2.3.2: `make toolkit-venv TOOLKIT=2.3.2`, then `rkstudy piper decoder --onnx "
            "<decoder_z.onnx> --target rk3588 --toolkit 2.3.2`, or try it anyway: `rkstudy board run ... "
            "--allow-older-runtime`") in out
    assert out.rstrip().endswith("then rerun `rkstudy doctor --board`.")


def test_a_runtime_no_converter_environment_matches_names_only_the_newer_runtime(board, capsys, tmp_path):
    board("rk3562")  # librknnrt 2.3.0: [tool.rkstudy] toolkits has 2.5.0 and 2.3.2, both newer
    assert main(["doctor", "--board", "--engine", str(engine_for(tmp_path, "rk3562"))]) == 1
    out = capsys.readouterr().out
    assert ("or build with rknn-toolkit2 2.3.0 or older, a version no converter environment here makes "
            "([tool.rkstudy] toolkits: 2.5.0, 2.3.2)") in out


def test_a_folder_of_engines_checks_the_ones_this_soc_runs(board, capsys, tmp_path):
    for target in ("rk3588", "rk3576", "rk3566"):
        (tmp_path / target).mkdir()
        engine = engine_for(tmp_path / target, target)
        engine.rename(tmp_path / engine.name)
        engine.with_suffix(".contract.json").rename(tmp_path / engine.with_suffix(".contract.json").name)
    board("rk3576")
    assert main(["doctor", "--board", "--engine", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "[ok] engine decoder-rk3576.rknn: compiled for rk3576" in out and "decoder-rk3588" not in out
    board("rk3562")
    assert main(["doctor", "--board", "--engine", str(tmp_path)]) == 1
    assert ("[FAIL] none of the 3 piper_decoder engines given runs on this rk3562 board (compiled for rk3566, "
            "rk3576, rk3588); convert the graph for it with `rkstudy piper decoder --onnx <decoder_z.onnx> --target "
            "rk3562` (or --target all)") in capsys.readouterr().out


def test_a_runtime_found_through_librknnrt_path_says_what_sudo_does(board, capsys, tmp_path, monkeypatch):
    """sudo drops LIBRKNNRT_PATH: doctor says so where it finds the runtime only through it."""
    import shutil

    tree = tmp_path / "rk3566"
    shutil.copytree(BOARDS / "rk3566-orangepi-3b", tree)
    (tree / "opt" / "rknpu2").mkdir(parents=True)
    (tree / "usr" / "lib" / "librknnrt.so").rename(tree / "opt" / "rknpu2" / "librknnrt.so")
    monkeypatch.setenv("RKSTUDY_SYSROOT", str(tree))
    monkeypatch.setenv("LIBRKNNRT_PATH", "/opt/rknpu2/librknnrt.so")
    assert main(["doctor", "--board"]) == 0
    out = capsys.readouterr().out
    assert "[ok] librknnrt 2.3.0 (c949ad889d@2024-11-07T11:35:33) (/opt/rknpu2/librknnrt.so, through LIBRKNNRT_PATH)" \
        in out
    assert ("fix: sudo drops LIBRKNNRT_PATH (and the NPU load needs root): run `sudo env "
            "LIBRKNNRT_PATH=/opt/rknpu2/librknnrt.so rkstudy ...`, or copy it to /usr/lib/librknnrt.so") in out


def test_a_runtime_where_rknnlite_does_not_look_is_a_failure(board, capsys, tmp_path, monkeypatch):
    import shutil

    tree = tmp_path / "rk3566"
    shutil.copytree(BOARDS / "rk3566-orangepi-3b", tree)
    (tree / "usr" / "local" / "lib").mkdir(parents=True)
    (tree / "usr" / "lib" / "librknnrt.so").rename(tree / "usr" / "local" / "lib" / "librknnrt.so")
    monkeypatch.setenv("RKSTUDY_SYSROOT", str(tree))
    monkeypatch.delenv("LIBRKNNRT_PATH", raising=False)
    assert main(["doctor", "--board"]) == 1
    out = capsys.readouterr().out
    assert ("[FAIL] librknnrt.so is not where RKNNLite loads it (/usr/lib/librknnrt.so); there is one at "
            "/usr/local/lib/librknnrt.so") in out
    assert "fix: copy it there (sudo cp /usr/local/lib/librknnrt.so /usr/lib/librknnrt.so)" in out


def test_a_matching_or_newer_runtime_passes_and_another_soc_is_refused(board, capsys, tmp_path):
    board("rk3576")
    assert main(["doctor", "--board", "--engine", str(engine_for(tmp_path, "rk3576"))]) == 0
    assert "[ok] librknnrt 2.5.0 (5d2a7c5e3b@2025-10-20T10:00:00) runs engines from rknn-toolkit2 2.5.0" in \
        capsys.readouterr().out
    (tmp_path / "old").mkdir()
    older = engine_for(tmp_path / "old", "rk3576", toolkit="rknn-toolkit2 2.3.0")
    assert main(["doctor", "--board", "--engine", str(older)]) == 0
    assert "runs engines from rknn-toolkit2 2.3.0 (newer than the compiler" in capsys.readouterr().out
    assert main(["doctor", "--board", "--engine", str(engine_for(tmp_path, "rk3588"))]) == 1
    out = capsys.readouterr().out
    assert "[FAIL] engine decoder-rk3588.rknn: this engine was compiled for rk3588 and this board is rk3576" in out


def test_an_rknnlite_that_does_not_import_is_a_failure(board, capsys, tmp_path, monkeypatch):
    board("rk3588")
    broken = tmp_path / "rknnlite"
    (broken / "api").mkdir(parents=True)
    (broken / "__init__.py").write_text("")
    (broken / "api" / "__init__.py").write_text(
        "raise AttributeError(\"'ruamel.yaml' has no attribute 'load'\")\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["doctor", "--board"]) == 1
    out = capsys.readouterr().out
    assert "board runtime: absent (rknnlite does not import (AttributeError: 'ruamel.yaml' has no attribute" in out
    assert "[FAIL] rknnlite does not import" in out and "pip install 'ruamel.yaml==0.19.1'" in out


def test_an_npu_node_this_user_cannot_open_names_its_group(board, capsys, monkeypatch):
    board("rk3588")
    monkeypatch.setattr(doctor.os, "access", lambda path, mode: False)
    assert main(["doctor", "--board"]) == 1
    out = capsys.readouterr().out
    assert "[FAIL] NPU device /dev/dri/renderD129 (group " in out and "is not readable and writable" in out
    assert "fix: sudo usermod -aG " in out


def test_engine_is_a_board_check(capsys):
    assert main(["doctor", "--engine", "e.rknn"]) == 2
    assert "--engine is a board check: rkstudy doctor --board --engine E.rknn" in capsys.readouterr().err


def test_board_side_on_a_recorded_board(board, capsys):
    """The same command against a recorded RK3588 tree with the replay double of RKNNLite."""
    board("rk3588")
    assert main(["doctor", "--board"]) == 0
    out = capsys.readouterr().out
    assert "board runtime: present (RKNPU driver: v0.9.8)" in out
    assert "SoC rk3588; NPU governor rknpu_ondemand, cur_freq 1000000000" in out
