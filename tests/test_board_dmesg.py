"""The driver's refusal lines, recorded (tests/fixtures/dmesg), and the one failure formatter that
names -4, -6 and -13 and stamps the driver and runtime versions; BoardRunner recovering the code
RKNNLite 2.5.0's init_runtime hides, through the replay double."""

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from rkstudy.board import dmesg
from rkstudy.board.dmesg import InitRefused, Versions, format_failure
from rkstudy.paths import REPO

FIXTURES = Path(__file__).parent / "fixtures"
SEEDS_API = "2.3.2 (429f97ae6b@2025-04-09T09:09:27)"


@pytest.fixture(autouse=True)
def fresh_versions(monkeypatch):
    monkeypatch.setattr(dmesg, "_seen", None)


def test_parses_the_seeds_lines():
    text = (FIXTURES / "dmesg" / "seeds_verbatim.txt").read_text()
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


def test_lite_init_code_recovers_what_init_runtime_hides():
    log = ("W rknn-toolkit-lite2 version: 2.5.0\n"
           "E RKNN: [12:01:02.345] failed to allocate memory\n"
           "E RKNN init failed. error code: -4\n"
           "E Catch exception when init runtime!\n")
    assert dmesg.lite_init_code(log) == -4
    assert dmesg.lite_init_code("nothing here") is None


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


def test_format_matches_the_seeds_version_stamp():
    line = format_failure("CosyVoice3 flow estimator RKNN: rknn_init", -6,
                          versions=Versions(api=SEEDS_API, driver="0.9.8"))
    assert line.endswith(f"(driver 0.9.8, api {SEEDS_API})")
    assert "\n" not in line


def test_format_carries_the_bytes_dmesg_names():
    refusals = dmesg.parse((FIXTURES / "dmesg" / "seeds_verbatim.txt").read_text())
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
    dmesg.remember_versions(Versions(api=SEEDS_API, driver="0.9.8"))
    dmesg.remember_versions(Versions(api="other", driver="other"))  # the first one stays
    assert str(InitRefused("rknn_init(b)", -6)).endswith(f"(driver 0.9.8, api {SEEDS_API})")


def test_parse_lite_sdk_version():
    text = f"RKNN VERSION:\n  API: {SEEDS_API}\n  DRV: 0.9.8\n"
    assert dmesg.parse_lite_sdk_version(text) == Versions(api=SEEDS_API, driver="0.9.8")
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
    """A kernel log that gains the seeds' refusal lines after the first read (an init in between)."""

    def __init__(self):
        self.lines = ["[    2.905872] [drm] Initialized rknpu 0.9.8 20240828 for fdab0000.npu on minor 1"]
        self.reads = 0

    def __call__(self):
        self.reads += 1
        if self.reads == 2:
            self.lines += (FIXTURES / "dmesg" / "kernel_prefixed.txt").read_text().splitlines()[3:6]
        return list(self.lines)


@pytest.fixture
def board(monkeypatch, tmp_path):
    """An engine the replay double loads (a contract naming a tiny ONNX beside it), on the recorded
    RK3588 tree."""
    import onnx
    from onnx import TensorProto, helper

    monkeypatch.syspath_prepend(str(REPO / "tests" / "doubles"))
    monkeypatch.setenv("RKSTUDY_SYSROOT", str(FIXTURES / "boards" / "rk3588"))
    g = helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "neg.onnx"))
    digest = hashlib.sha256((tmp_path / "neg.onnx").read_bytes()).hexdigest()
    (tmp_path / "S900.rknn").write_bytes(b"engine")
    (tmp_path / "S900.contract.json").write_text(json.dumps({"onnx": {"file": "neg.onnx", "sha256": digest}}))
    return tmp_path / "S900.rknn"


def test_board_runner_names_the_code_init_runtime_hides(board, monkeypatch, capfd):
    from rkstudy.runtime.board import BoardRunner

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
    assert "RKNN init failed. error code: -4" in capfd.readouterr().err  # the runtime's log is passed on


def test_board_runner_stamps_later_failures_with_the_first_contexts_versions(board, monkeypatch):
    from rkstudy.runtime.board import BoardRunner, runtime_versions

    monkeypatch.setattr(dmesg, "read_dmesg", lambda: [])
    runner = BoardRunner(board, ["x"])
    assert runner.where == "replay" and runner.cores == "0_1_2"
    assert runtime_versions().startswith("driver none, api replay double (onnxruntime ")
    runner.close()
    monkeypatch.setenv("RKNNLITE_REPLAY_INIT_CODE", "-6")
    with pytest.raises(InitRefused, match=r"code -6 \(RKNN_ERR_MODEL_INVALID: the driver refused the init: an "
                                          r"aperture overrun.*\(driver none, api replay double"):
        BoardRunner(board, ["x"])


def test_a_runtime_that_names_no_code_is_reported_as_rknnlites_minus_one(board, monkeypatch):
    from rkstudy.runtime.board import BoardRunner

    monkeypatch.setattr(dmesg, "read_dmesg", lambda: [])
    monkeypatch.setenv("RKNNLITE_REPLAY_CORES", "1")  # refuses 0_1_2 with a bare -1, accepts AUTO
    assert BoardRunner(board, ["x"]).cores == "auto"
    from rknnlite.api import RKNNLite

    monkeypatch.setattr(RKNNLite, "init_runtime", lambda self, core_mask=0: -1)  # silent, both masks
    with pytest.raises(InitRefused, match=r"init_runtime\(S900.rknn\) failed with code -1 \(RKNN_ERR_FAIL: "
                                          r"execute failed; RKNNLite returns -1 for every init failure"):
        BoardRunner(board, ["x"])


def test_a_load_failure_is_not_a_refusal(board, monkeypatch):
    from rkstudy.runtime.board import BoardRunner

    (board.parent / "neg.onnx").write_bytes(b"changed")  # the double now cannot find its ONNX
    with pytest.raises(dmesg.RknnError, match=r"load_rknn\(S900.rknn\) failed with code -1") as err:
        BoardRunner(board, ["x"])
    assert not isinstance(err.value, InitRefused)  # the ladder does not evict for a missing file
