"""The driver's refusal lines, recorded (tests/fixtures/dmesg), and the one failure formatter that
names -4, -6 and -13 and stamps the driver and runtime versions; BoardRunner recovering the code
RKNNLite 2.5.0's init_runtime hides, through the replay double."""

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from rkstudy.board import dmesg
from rkstudy.board import runner as runner_module
from rkstudy.board.dmesg import InitRefused, Versions, format_failure
from rkstudy.paths import REPO

FIXTURES = Path(__file__).parent / "fixtures"
REFERENCE_API = "2.3.2 (429f97ae6b@2025-04-09T09:09:27)"


@pytest.fixture(autouse=True)
def fresh_versions(monkeypatch):
    monkeypatch.setattr(dmesg, "_seen", None)


def test_parses_the_reference_lines():
    text = (FIXTURES / "dmesg" / "reference_verbatim.txt").read_text()
    refusals = dmesg.parse(text)
    assert [(r.kind, r.nbytes, r.errno, r.flags) for r in refusals] == [
        ("iova", None, -12, None), ("dma-map", 4710850560, None, None),
        ("malloc", 6189218496, None, "0x2")]
    assert dmesg.refused_bytes(text) == [4710850560, 6189218496]


def test_parses_kernel_prefixed_lines_and_skips_the_rest():
    lines = (FIXTURES / "dmesg" / "kernel_prefixed.txt").read_text().splitlines()
    refusals = dmesg.parse(lines)
    assert [r.kind for r in refusals] == ["iova", "dma-map", "malloc", "iova", "dma-map"]
    assert dmesg.refused_bytes(lines) == [4710850560, 6189218496, 4660000768]
    assert refusals[1].line.startswith("[ 8123.456803] RKNPU fdab0000.npu")
    assert refusals[1].short() == "dma map of 4710850560 B (4.71 GB) refused"


# What RKNNLite 2.5.0 writes when librknnrt refuses an init: rknn_lite.py's log line, then the traceback
# of the runtime's exception, which names the code (the form the 2.5.0 wheel prints under qemu-aarch64
# for its other init failures; the line number is rknn_lite.py's build_graph call).
NAMED_INIT_FAILURE = """W rknn-toolkit-lite2 version: 2.5.0
E RKNN: [12:01:02.345] failed to allocate memory
E Catch exception when init runtime!
E Traceback (most recent call last):
  File "/usr/lib/python3/dist-packages/rknnlite/api/rknn_lite.py", line 177, in init_runtime
    self.rknn_runtime.build_graph(self.rknn_data, self.load_model_in_npu, self.rknn_user_key)
  File "rknnlite/api/rknn_runtime.py", line ..., in rknnlite.api.rknn_runtime.RKNNRuntime.build_graph
Exception: RKNN init failed. error code: RKNN_ERR_MALLOC_FAIL
"""


def test_lite_failures_read_names_and_numbers():
    assert dmesg.lite_failures(NAMED_INIT_FAILURE) == [dmesg.LiteFailure("init", -4, "RKNN_ERR_MALLOC_FAIL")]
    assert dmesg.lite_failures("E RKNN init failed. error code: -6\n") == [
        dmesg.LiteFailure("init", -6, "RKNN_ERR_MODEL_INVALID")]  # a runtime that prints the number
    assert dmesg.lite_failures("E RKNN set core mask failed. error code: RKNN_ERR_TARGET_PLATFORM_UNMATCH") == [
        dmesg.LiteFailure("set core mask", -13, "RKNN_ERR_TARGET_PLATFORM_UNMATCH")]
    # a name 2.5.0 added and rknn_api.h 2.3.2 does not number: kept by name
    assert dmesg.lite_failures("RKNN init failed. error code: RKNN_ERR_SOC_BIND_FAILED") == [
        dmesg.LiteFailure("init", None, "RKNN_ERR_SOC_BIND_FAILED")]
    assert dmesg.lite_failures("nothing here") == []


def test_a_named_driver_refusal_is_never_a_core_mask_problem():
    from rkstudy.board.runner import mask_refused

    assert not mask_refused(-1, NAMED_INIT_FAILURE)
    assert not mask_refused(-1, NAMED_INIT_FAILURE.replace("MALLOC_FAIL", "MODEL_INVALID"))
    assert not mask_refused(-1, "E Catch exception when init runtime!\nException: RKNN init failed. error code: "
                                "RKNN_ERR_TARGET_PLATFORM_UNMATCH\n")  # a wrong-SoC init, not a mask
    assert mask_refused(-13, "E The core_mask is only supported by RK3576 / RK3588. Please do not set this "
                             "parameter on other platforms.\n")
    assert not mask_refused(-1, "")  # init_runtime's -1 with nothing logged: nothing says the mask


def test_cores_granted_reads_what_the_runtime_did_with_the_mask():
    assert dmesg.cores_granted("", "0_1_2") == "0_1_2"
    assert dmesg.cores_granted('W The RK3576 platform has only two NPU cores. "NPU_CORE_0_1_2" is not supported '
                               'and will be automatically replaced with "NPU_CORE_0_1".', "0_1_2") == "0_1"
    assert dmesg.cores_granted("W The core_mask is only supported by RK3576 / RK3588. Please do not set this "
                               "parameter on other platforms.", "0_1_2") == "auto"


@pytest.mark.parametrize("code,name,meaning", [
    (-4, "RKNN_ERR_MALLOC_FAIL", "IOVA ceiling"),
    (-6, "RKNN_ERR_MODEL_INVALID", "aperture overrun"),
    (-13, "RKNN_ERR_TARGET_PLATFORM_UNMATCH", "compiled for another SoC"),
    (-7, "RKNN_ERR_CTX_INVALID", "context is invalid"),
    (-99, "unknown code", "not in rknn_api.h"),
])
def test_codes_are_named(code, name, meaning):
    line = format_failure("rknn_init(x.rknn)", code, versions=Versions())
    assert line.startswith(f"rknn_init(x.rknn) failed with code {code} ({name}: ")
    assert meaning in line


def test_format_matches_the_reference_version_stamp():
    line = format_failure("CosyVoice3 flow estimator RKNN: rknn_init", -6,
                          versions=Versions(api=REFERENCE_API, driver="0.9.8"))
    assert line.endswith(f"(driver 0.9.8, api {REFERENCE_API})")
    assert "\n" not in line


def test_format_carries_the_bytes_dmesg_names():
    refusals = dmesg.parse((FIXTURES / "dmesg" / "reference_verbatim.txt").read_text())
    line = format_failure("rknn_init(S900.rknn)", -4, versions=Versions(driver="0.9.8"), refusals=refusals)
    assert "dmesg: IOVA allocation failed (-12); dma map of 4710850560 B (4.71 GB) refused; " \
           "npu malloc of 6189218496 B (6.19 GB) refused" in line
    assert line.endswith("(driver 0.9.8)")


def test_a_call_without_a_code():
    assert format_failure("inference(x.rknn)", None, versions=Versions(), note="no outputs") == \
        "inference(x.rknn) failed (no outputs)"


def test_first_context_versions_are_cached_for_later_failures():
    assert dmesg.format_failure("rknn_init(a)", -4).endswith("per-process budget; dmesg names the bytes)")
    dmesg.remember_versions(Versions())  # an empty report does not count
    assert dmesg.known_versions() is None
    dmesg.remember_versions(Versions(api=REFERENCE_API, driver="0.9.8"))
    dmesg.remember_versions(Versions(api="other", driver="other"))  # the first one stays
    assert str(InitRefused("rknn_init(b)", -6)).endswith(f"(driver 0.9.8, api {REFERENCE_API})")


def test_parse_lite_sdk_version():
    text = f"RKNN VERSION:\n  API: {REFERENCE_API}\n  DRV: 0.9.8\n"
    assert dmesg.parse_lite_sdk_version(text) == Versions(api=REFERENCE_API, driver="0.9.8")
    assert dmesg.parse_lite_sdk_version(None) == Versions()


def test_dmesg_watch_reports_only_new_lines():
    lines = (FIXTURES / "dmesg" / "kernel_prefixed.txt").read_text().splitlines()
    log = lines[:6]  # up to and including the first refusal burst
    with dmesg.DmesgWatch(lambda: list(log)) as watch:
        log.extend(lines[6:])
    assert [r.nbytes for r in watch.refusals] == [None, 4660000768]
    with dmesg.DmesgWatch(lambda: None) as unreadable:
        pass
    assert unreadable.refusals == []


def test_read_dmesg_when_restricted():
    def denied(*a, **k):
        return subprocess.CompletedProcess(a, 1, "", "dmesg: read kernel buffer failed: Operation not permitted")

    assert dmesg.read_dmesg(denied) is None


# --- BoardRunner: the hidden code, the kernel's bytes, the versions ------------------------------
class GrowingLog:
    """A kernel log that gains the reference documents' refusal lines after the first read (an init in between)."""

    def __init__(self):
        self.lines = ["[    2.905872] [drm] Initialized rknpu 0.9.8 20240828 for fdab0000.npu on minor 1"]
        self.reads = 0

    def __call__(self):
        self.reads += 1
        if self.reads == 2:
            self.lines += (FIXTURES / "dmesg" / "kernel_prefixed.txt").read_text().splitlines()[3:6]
        return list(self.lines)


def forget_rknnlite():
    """Drop the double from sys.modules, so a later test sees this host's own rknnlite (or none)."""
    for name in [m for m in sys.modules if m == "rknnlite" or m.startswith("rknnlite.")]:
        del sys.modules[name]


@pytest.fixture
def board(monkeypatch, tmp_path):
    """An engine the replay double loads (a contract naming a tiny ONNX beside it), on the recorded
    RK3588 tree."""
    monkeypatch.syspath_prepend(str(REPO / "tests" / "doubles"))
    forget_rknnlite()
    monkeypatch.setenv("RKSTUDY_SYSROOT", str(FIXTURES / "boards" / "rk3588"))
    monkeypatch.setattr(runner_module, "_resident", [0])  # contexts earlier tests left open are not this one's
    g = helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "neg.onnx"))
    digest = hashlib.sha256((tmp_path / "neg.onnx").read_bytes()).hexdigest()
    (tmp_path / "S900.rknn").write_bytes(b"engine")
    (tmp_path / "S900.contract.json").write_text(json.dumps({"onnx": {"file": "neg.onnx", "sha256": digest}}))
    yield tmp_path / "S900.rknn"
    forget_rknnlite()


def test_board_runner_names_the_code_init_runtime_hides(board, monkeypatch, capfd):
    """The named-code form, as 2.5.0 writes it: -4 reported as -4, and no AUTO retry."""
    from rkstudy.board.runner import BoardRunner

    monkeypatch.setenv("RKNNLITE_REPLAY_INIT_CODE", "-4")
    monkeypatch.setattr(dmesg, "read_dmesg", GrowingLog())
    with pytest.raises(InitRefused) as err:
        BoardRunner(board, ["x"])
    e = err.value
    assert e.code == -4  # not init_runtime's -1
    assert str(e).startswith("init_runtime(S900.rknn) failed with code -4 (RKNN_ERR_MALLOC_FAIL: the driver "
                             "refused the init: on RK3588 the IOVA ceiling")
    assert [r.nbytes for r in e.refusals] == [None, 4710850560, 6189218496]
    assert "dma map of 4710850560 B (4.71 GB) refused" in str(e)
    assert "Exception: RKNN init failed. error code: RKNN_ERR_MALLOC_FAIL" in e.log and "Traceback" in e.log
    assert e.log.count("E Catch exception when init runtime!") == 1  # one init: no retry with AUTO
    assert capfd.readouterr().err == ""  # the runtime's log, traceback and all, is not passed on


def test_the_runtime_log_reaches_stderr_only_under_debug(board, monkeypatch, capfd):
    from rkstudy.board.runner import BoardRunner

    monkeypatch.setenv("RKNNLITE_REPLAY_INIT_CODE", "-4")
    monkeypatch.setattr(dmesg, "read_dmesg", lambda: [])
    monkeypatch.setenv("RKSTUDY_DEBUG", "1")
    with pytest.raises(InitRefused):
        BoardRunner(board, ["x"])
    assert "E Traceback (most recent call last)" in capfd.readouterr().err


def test_board_runner_stamps_later_failures_with_the_first_contexts_versions(board, monkeypatch):
    from rkstudy.board.runner import BoardRunner, runtime_versions

    monkeypatch.setattr(dmesg, "read_dmesg", lambda: [])
    runner = BoardRunner(board, ["x"])
    assert runner.where == "replay" and runner.cores == "0_1_2"
    assert runtime_versions().startswith("driver none, api replay double (onnxruntime ")
    monkeypatch.setenv("RKNNLITE_REPLAY_INIT_CODE", "-6")
    with pytest.raises(InitRefused, match=r"code -6 \(RKNN_ERR_MODEL_INVALID: the driver refused the init: an "
                                          r"aperture overrun.*\(driver none, api replay double"):
        BoardRunner(board, ["x"])  # a second context while the first is resident


def test_minus_6_with_no_other_context_resident_is_not_an_aperture_overrun(board, monkeypatch):
    from rkstudy.board.runner import BoardRunner, resident_contexts

    monkeypatch.setattr(dmesg, "read_dmesg", lambda: [])
    runner = BoardRunner(board, ["x"])
    assert resident_contexts() == 1
    runner.close()
    runner.close()  # twice: still counted once
    assert resident_contexts() == 0
    monkeypatch.setenv("RKNNLITE_REPLAY_INIT_CODE", "-6")
    with pytest.raises(InitRefused) as err:
        BoardRunner(board, ["x"])
    assert ("RKNN_ERR_MODEL_INVALID: the runtime refused the engine file itself (no other context resident: no "
            "aperture overrun): an engine of a newer rknn-toolkit2 than this librknnrt, or a damaged copy") \
        in str(err.value)
    assert "aperture overrun (too many" not in str(err.value)


def _tree_with_runtime(tmp_path, tree: str, runtime: str) -> Path:
    """A copy of a recorded tree whose librknnrt is `runtime`."""
    import shutil
    import sys as _sys

    root = tmp_path / f"{tree}-{runtime.split()[0]}"
    shutil.copytree(FIXTURES / "boards" / tree, root)
    _sys.path.insert(0, str(FIXTURES / "boards"))
    try:
        from make_trees import fake_library
    finally:
        _sys.path.remove(str(FIXTURES / "boards"))
    (root / "usr" / "lib" / "librknnrt.so").write_bytes(fake_library(runtime))
    return root


@pytest.mark.parametrize("tree,runtime,code,name", [
    ("rk3588", "1.4.0 (a10f100eb@2022-09-09T09:07:14)", -1, "RKNN_ERR_FAIL"),            # airockchip/rknn-toolkit2#281
    ("rk3566-orangepi-3b", "1.5.0 (e6fe0c678@2023-05-25T08:09:20)", -6, "RKNN_ERR_MODEL_INVALID")])  # rockchip #316
def test_a_runtime_older_than_the_engine_format_fails_at_init_as_the_real_one_does(board, monkeypatch, capfd, tmp_path,
                                                                                   tree, runtime, code, name):
    """The double with librknnrt 1.4.0 and 1.5.0 and an engine of rknn-toolkit2 2.5.0 (the format 1.5.2 introduced):
    librknnrt's own lines, then the wheel's traceback; the runner's one line says what that means and no traceback
    reaches stderr."""
    from rkstudy.board.runner import BoardRunner

    monkeypatch.setattr(dmesg, "read_dmesg", lambda: [])
    monkeypatch.setenv("RKSTUDY_SYSROOT", str(_tree_with_runtime(tmp_path, tree, runtime)))
    contract = json.loads(board.with_suffix(".contract.json").read_text())
    board.with_suffix(".contract.json").write_text(json.dumps({**contract, "toolkit": "rknn-toolkit2 2.5.0"}))
    with pytest.raises(InitRefused) as err:
        BoardRunner(board, ["x"])
    e = err.value
    version = runtime.split()[0]
    assert e.code == code and f"librknnrt {version} said \"Invalid RKNN model version 6\"" in str(e)
    assert f"({name}: the engine is from a newer rknn-toolkit2 than this librknnrt: install that toolkit's " \
           "librknnrt into /usr/lib" in str(e)
    assert re.search(rf"I RKNN: \[[\d:.]+\] RKNN Runtime Information: librknnrt version: {version} ", e.log)
    assert "E RKNN:" in e.log and f"Exception: RKNN init failed. error code: {name}" in e.log
    assert capfd.readouterr().err == ""


def test_a_2x_runtime_older_than_the_engines_toolkit_is_not_refused_by_the_double(board, monkeypatch):
    """librknnrt 2.3.2 (the rk3588 tree's) with an engine of rknn-toolkit2 2.5.0: no log shows what a 2.x runtime does
    with a newer 2.x engine, so the double runs it (rkstudy refuses that pairing itself, rkstudy.board.compat)."""
    from rkstudy.board.runner import BoardRunner

    monkeypatch.setattr(dmesg, "read_dmesg", lambda: [])
    contract = json.loads(board.with_suffix(".contract.json").read_text())
    board.with_suffix(".contract.json").write_text(json.dumps({**contract, "toolkit": "rknn-toolkit2 2.5.0"}))
    runner = BoardRunner(board, ["x"])
    assert np.array_equal(runner.run({"x": np.ones((1, 4), np.float32)})[0], -np.ones((1, 4)))
    runner.close()


def test_a_single_core_soc_refuses_the_mask_with_minus_13_and_runs_on_auto(board, monkeypatch, capfd):
    from rkstudy.board.runner import BoardRunner

    monkeypatch.setattr(dmesg, "read_dmesg", lambda: [])
    monkeypatch.setenv("RKSTUDY_SYSROOT", str(FIXTURES / "boards" / "rk3566-orangepi-3b"))
    runner = BoardRunner(board, ["x"])
    assert runner.cores == "auto"
    assert np.array_equal(runner.run({"x": np.arange(4, dtype=np.float32)[None]})[0], -np.arange(4)[None])
    assert "The core_mask is only supported by" in runner.log and "set core mask failed" in runner.log
    assert capfd.readouterr().err == ""  # rkstudy records the mask it got; the runtime's E lines stay in the log


def test_a_board_without_librknnrt_fails_once_and_names_the_fix(board, monkeypatch, capfd):
    from rkstudy.board.runner import BoardRunner

    monkeypatch.setattr(dmesg, "read_dmesg", lambda: [])
    monkeypatch.setenv("RKSTUDY_SYSROOT", str(FIXTURES / "boards" / "rk3566"))  # the tree with no librknnrt
    with pytest.raises(InitRefused, match=r"init_runtime\(S900.rknn\) failed with code -1 \(RKNN_ERR_FAIL: "
                                          r"execute failed; librknnrt.so is not where RKNNLite loads it "
                                          r"\(/usr/lib/librknnrt.so\): install the RKNPU2 runtime") as err:
        BoardRunner(board, ["x"])
    assert err.value.log.count("Exception: Can not find dynamic library on RK3566!") == 1  # not retried


def test_rk3576_records_the_two_cores_it_granted(board, monkeypatch):
    from rkstudy.board.runner import BoardRunner

    monkeypatch.setattr(dmesg, "read_dmesg", lambda: [])
    monkeypatch.setenv("RKSTUDY_SYSROOT", str(FIXTURES / "boards" / "rk3576"))
    assert BoardRunner(board, ["x"]).cores == "0_1"


def test_a_silent_minus_one_is_reported_as_such_and_not_retried(board, monkeypatch):
    from rknnlite.api import RKNNLite

    from rkstudy.board.runner import BoardRunner

    monkeypatch.setattr(dmesg, "read_dmesg", lambda: [])
    calls = []
    monkeypatch.setattr(RKNNLite, "init_runtime", lambda self, core_mask=0: calls.append(core_mask) or -1)
    with pytest.raises(InitRefused, match=r"init_runtime\(S900.rknn\) failed with code -1 \(RKNN_ERR_FAIL: "
                                          r"execute failed; RKNNLite returned -1 and its log named no code"):
        BoardRunner(board, ["x"])
    assert calls == [RKNNLite.NPU_CORE_0_1_2]


def test_a_load_failure_is_not_a_refusal(board):
    from rkstudy.board.runner import BoardRunner

    with pytest.raises(dmesg.RknnError, match=r"load_rknn\(gone.rknn\) failed with code -1") as err:
        BoardRunner(board.parent / "gone.rknn", ["x"])
    assert not isinstance(err.value, InitRefused)  # the ladder does not evict for a missing file


def test_an_engine_the_runtime_cannot_read_fails_at_init(board):
    from rkstudy.board.runner import BoardRunner

    (board.parent / "neg.onnx").write_bytes(b"changed")  # the double now has no graph behind the engine
    with pytest.raises(InitRefused, match=r"code -6 \(RKNN_ERR_MODEL_INVALID"):
        BoardRunner(board, ["x"])


def _int64_engine(folder):
    """An engine whose input is int64 token ids (as the encoder's and the Qwen3 codes are)."""
    g = helper.make_graph([helper.make_node("Cast", ["ids"], ["y"], to=TensorProto.FLOAT)], "g",
                          [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(folder / "ids.onnx"))
    digest = hashlib.sha256((folder / "ids.onnx").read_bytes()).hexdigest()
    (folder / "ids.rknn").write_bytes(b"engine")
    (folder / "ids.contract.json").write_text(json.dumps({"onnx": {"file": "ids.onnx", "sha256": digest}}))
    return folder / "ids.rknn"


def test_int64_inputs_reach_the_runtime_as_int64(board, monkeypatch, capfd):
    from rknnlite.api import RKNNLite

    from rkstudy.board.runner import BoardRunner

    monkeypatch.setattr(dmesg, "read_dmesg", lambda: [])
    runner = BoardRunner(_int64_engine(board.parent), ["ids"])
    ids = np.array([[3, 141, 59, 2047]], np.int64)
    assert runner.run({"ids": ids})[0].tolist() == [[3.0, 141.0, 59.0, 2047.0]]
    assert runner.run({"ids": ids.astype(np.int32)})[0].tolist() == [[3.0, 141.0, 59.0, 2047.0]]
    # the double takes dtypes as given, as the runtime does: float ids are not this engine's input
    assert runner._lite.inference(inputs=[ids.astype(np.float32)]) is None
    assert "Catch exception when running RKNN model." in capfd.readouterr().err
    assert runner._lite.inference(inputs=[ids.astype(np.float64)]) is None
    assert "Unsupport inputs[0].dtype: float64" in capfd.readouterr().err
    assert RKNNLite.NPU_CORE_0_1_2 == 7


def test_the_sampler_hook_runs_once_after_the_first_init(board, monkeypatch):
    from rknnlite.api import RKNNLite

    from rkstudy.board import runner as runtime_board
    from rkstudy.board.runner import BoardRunner, after_init

    monkeypatch.setattr(dmesg, "read_dmesg", lambda: [])
    inits, seen = [], []
    real_init = RKNNLite.init_runtime
    monkeypatch.setattr(RKNNLite, "init_runtime", lambda self, **kw: inits.append(1) or real_init(self, **kw))
    after_init(lambda: seen.append(len(inits)))
    BoardRunner(board, ["x"])
    BoardRunner(board, ["x"])
    assert seen == [1] and len(inits) == 2 and runtime_board._after_init == []
