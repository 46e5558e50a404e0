"""An engine's NPU memory through librknnrt (ctypes), against a fake librknnrt compiled here with gcc
from tests/fixtures/rknnrt/fake_librknnrt.c (struct layouts from rknn_api.h, every size checked), and
`rkstudy board memory` end to end."""

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

from rkstudy.board import dmesg, rknnrt
from rkstudy.board.dmesg import InitRefused
from rkstudy.board.memory import Budget, EngineCost, check_set
from rkstudy.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
ENGINES = FIXTURES / "rknnrt" / "engines"
REFERENCE_LOG = (FIXTURES / "dmesg" / "reference_verbatim.txt").read_text().splitlines()

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to build the fake librknnrt")


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    out = tmp_path_factory.mktemp("fake") / "libfake_rknnrt.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o", str(out),
                    str(FIXTURES / "rknnrt" / "fake_librknnrt.c")], check=True)
    lib = rknnrt.load_library(out)
    lib.fake_live_contexts.restype = ctypes.c_int
    lib.fake_last_flag.restype = ctypes.c_uint32
    lib.fake_last_size.restype = ctypes.c_uint32
    return lib


@pytest.fixture(autouse=True)
def fresh_versions(monkeypatch):
    monkeypatch.setattr(dmesg, "_seen", None)


def test_struct_layouts_match_the_header():
    assert ctypes.sizeof(rknnrt.RknnMemSize) == 64
    assert rknnrt.RknnMemSize.total_dma_allocated_size.offset == 8
    assert rknnrt.RknnMemSize.reserved.offset == 24
    assert ctypes.sizeof(rknnrt.RknnSdkVersion) == 512
    assert rknnrt.context_type() is ctypes.c_uint64  # this host is 64-bit, like an aarch64 board


@pytest.mark.parametrize("s,mib", [(110, 786), (200, 1129), (250, 1426), (400, 2615), (500, 3752), (900, 1039)])
def test_engine_memory_reads_the_recorded_values(lib, s, mib):
    assert rknnrt.engine_memory(ENGINES / f"reference_s{s}.rknn", lib).context_mib == mib
    assert lib.fake_last_flag() == rknnrt.RKNN_FLAG_COLLECT_MODEL_INFO_ONLY == 0x100
    assert lib.fake_last_size() == 0  # the path is passed, the 700 MB image is not read into Python
    assert lib.fake_live_contexts() == 0  # every context destroyed


def test_engine_memory_fields_and_versions(lib):
    mem = rknnrt.engine_memory(ENGINES / "reference_s900.rknn", lib)
    assert (mem.weight_bytes, mem.internal_bytes, mem.dma_allocated_bytes) == (673587200, 415883264, 0)
    assert mem.versions == dmesg.Versions(api="2.3.2 (429f97ae6b@2025-04-09T09:09:27)", driver="0.9.8")
    assert mem.seconds >= 0
    assert dmesg.known_versions() == mem.versions  # remembered for the failures that follow


def test_a_failing_sdk_query_leaves_versions_empty(lib):
    mem = rknnrt.engine_memory(ENGINES / "no_sdk_version.rknn", lib)
    assert mem.context_mib == 3 and mem.versions == dmesg.Versions()
    assert dmesg.known_versions() is None


@pytest.mark.parametrize("name,code,meaning", [
    ("rk3566_engine_on_rk3588.rknn", -13, "RKNN_ERR_TARGET_PLATFORM_UNMATCH"),
    ("not_an_engine.rknn", -6, "RKNN_ERR_MODEL_INVALID")])
def test_refused_init_raises_with_the_code(lib, name, code, meaning):
    with pytest.raises(InitRefused) as err:
        rknnrt.engine_memory(ENGINES / name, lib)
    assert err.value.code == code and meaning in str(err.value)
    assert lib.fake_live_contexts() == 0


def test_versions_from_one_engine_stamp_a_later_failure(lib):
    rknnrt.engine_memory(ENGINES / "reference_s110.rknn", lib)
    with pytest.raises(InitRefused, match=r"\(driver 0\.9\.8, api 2\.3\.2 \(429f97ae6b@2025-04-09T09:09:27\)\)$"):
        rknnrt.engine_memory(ENGINES / "rk3566_engine_on_rk3588.rknn", lib)


def test_missing_file_and_library(tmp_path, monkeypatch):
    from rkstudy.errors import BoardUnavailable

    with pytest.raises(FileNotFoundError):
        rknnrt.engine_memory(tmp_path / "none.rknn", lib=object())
    monkeypatch.setenv(rknnrt.LIBRKNNRT_ENV, str(tmp_path / "nope.so"))
    monkeypatch.setattr(rknnrt, "LIBRKNNRT_PATHS", ())
    monkeypatch.setattr(rknnrt.ctypes.util, "find_library", lambda name: None)
    with pytest.raises(BoardUnavailable, match="LIBRKNNRT_PATH=/path/to/librknnrt.so"):
        rknnrt.load_library()


def test_wrap_suspect_flags_the_reference_s900(lib):
    mem = rknnrt.engine_memory(ENGINES / "reference_s900.rknn", lib)
    refused = dmesg.refused_bytes(REFERENCE_LOG)
    assert rknnrt.internal_wrap_suspect(mem, refused) == 4710850560
    small = rknnrt.engine_memory(ENGINES / "reference_s500.rknn", lib)
    assert rknnrt.internal_wrap_suspect(small, refused) is None


def test_measured_costs_feed_the_budget(lib):
    costs = [EngineCost(f"S{s}", rknnrt.engine_memory(ENGINES / f"reference_s{s}.rknn", lib).context_mib)
             for s in (110, 200, 250)]
    v = check_set(costs, Budget.reference())
    assert v.admit and v.total_mib == 3341


def test_memory_report_counts_a_wrapped_size_as_its_own_mapping(lib):
    """S900 reports 1039 MiB, and beside S110 the budget would admit it; with the kernel's refusal
    line in the log, its internal size is seen to have wrapped and the set is refused for its mapping."""
    paths = [ENGINES / "reference_s900.rknn", ENGINES / "reference_s110.rknn"]
    lines, v = rknnrt.memory_report(paths, Budget.reference(), lib, kernel_log=[])
    assert v.admit and lines[-1].startswith("ADMIT reference_s900+reference_s110: 1825 MiB")
    lines, v = rknnrt.memory_report(paths, Budget.reference(), lib, kernel_log=REFERENCE_LOG)
    assert not v.admit and "RKNN_QUERY_MEM_SIZE wrapped its uint32" in lines[1]
    assert lines[-1].startswith("REFUSE reference_s900: its own mapping 4710850560 B (4.71 GB) exceeds")


def test_the_fake_catches_a_context_truncated_to_32_bits(lib):
    """Why the fake's handles have high bits: binding rknn_context as uint32 on a 64-bit board is
    the plumbing bug this layer must not have, and the fake makes it fail loudly."""
    ctx = ctypes.c_uint64(0)
    path = ctypes.create_string_buffer(str(ENGINES / "reference_s110.rknn").encode())
    assert lib.rknn_init(ctypes.byref(ctx), path, 0, 0x100, None) == 0
    mem = rknnrt.RknnMemSize()
    query32 = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint32, ctypes.c_int, ctypes.c_void_p,
                               ctypes.c_uint32)(("rknn_query", lib))
    assert query32(ctx.value & 0xFFFFFFFF, 6, ctypes.byref(mem), 64) == -7
    assert lib.rknn_query(ctx, 6, ctypes.byref(mem), 63) == -5  # a wrong struct size is refused too
    assert lib.rknn_destroy(ctx) == 0


def test_memory_command(lib, capsys, monkeypatch):
    monkeypatch.setattr(dmesg, "read_dmesg", lambda: None)  # dmesg restricted: no refusal lines
    path = lib._name
    assert main(["board", "memory", str(ENGINES / "reference_s250.rknn"), str(ENGINES / "reference_s400.rknn"),
                 "--library", path]) == 1
    out = capsys.readouterr().out
    assert "reference_s250.rknn: 1426.0 MiB" in out and "REFUSE reference_s250+reference_s400: 4041 MiB" in out
    assert "(budget 3900 MiB: the RKNN decoder-path document, The IOVA ceiling" in out
    assert main(["board", "memory", str(ENGINES / "reference_s250.rknn"), str(ENGINES / "reference_s400.rknn"),
                 "--library", path, "--budget-mib", "4100"]) == 0
    assert "ADMIT reference_s250+reference_s400: 4041 MiB of contexts fits the 4100 MiB" in capsys.readouterr().out
    assert main(["board", "memory", str(ENGINES / "rk3566_engine_on_rk3588.rknn"), "--library", path]) == 1
    assert "code -13 (RKNN_ERR_TARGET_PLATFORM_UNMATCH" in capsys.readouterr().err
