"""An engine's NPU memory, measured on the board through librknnrt (ctypes), with no network built.

RKNNLite 2.5.0 exposes no memory query (its API is load_rknn / init_runtime / inference /
get_sdk_version / release), so this goes to the C runtime directly, the way the reference documents' sidecar did
(the RKNN decoder-path document, "The IOVA ceiling": "a RKNN_FLAG_COLLECT_MODEL_INFO_ONLY init plus
RKNN_QUERY_MEM_SIZE, ~0.5 s per engine, no network built"):

    rknn_init(&ctx, "<path>", 0, RKNN_FLAG_COLLECT_MODEL_INFO_ONLY, NULL)   # size 0: model is a path
    rknn_query(ctx, RKNN_QUERY_MEM_SIZE, &mem, sizeof(rknn_mem_size))
    rknn_destroy(ctx)

Every constant and layout below is from rknn_api.h of the RKNPU2 SDK V2.3.2:
airockchip/rknn-toolkit2 @ 59a913d172e7f5ff03c9076e2ec7b1b1288ffd08,
rknpu2/runtime/Linux/librknn_api/include/rknn_api.h
  line 60   #define RKNN_FLAG_COLLECT_MODEL_INFO_ONLY 0x00000100
            ("dummy init flag: could only get total_weight_size and total_internal_size by rknn_query")
  l.125-129 rknn_context is uint32_t under __arm__ (32-bit ARM), uint64_t otherwise
  line 144  RKNN_QUERY_SDK_VERSION = 5;  line 146  RKNN_QUERY_MEM_SIZE = 6
  l.341-344 rknn_sdk_version { char api_version[256]; char drv_version[256]; }
  l.349-356 rknn_mem_size { uint32 total_weight_size; uint32 total_internal_size;
            uint64 total_dma_allocated_size; uint32 total_sram_size; uint32 free_sram_size;
            uint32 reserved[10]; }   (64 bytes)
  line 489  int rknn_init(rknn_context*, void* model, uint32_t size, uint32_t flag, rknn_init_extend*)
  line 512  int rknn_destroy(rknn_context);  line 527  int rknn_query(rknn_context, rknn_query_cmd, void*, uint32_t)
The library is found the way RKNNLite finds it: $LIBRKNNRT_PATH (the variable its runtime reads),
then /usr/lib/librknnrt.so. RKNNLite 2.5.0 itself has no memory query (its API is load_rknn /
init_runtime / inference / get_sdk_version / release), hence ctypes.

A context's cost is total_weight_size + total_internal_size. Both are uint32: a size of 4 GiB or
more cannot be represented and comes back modulo 2**32 (see internal_wrap_suspect).

Board side: standard library only (ctypes).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..errors import BoardUnavailable
from .check import LIBRKNNRT_ENV, LIBRKNNRT_PATHS
from .dmesg import InitRefused, Versions, read_dmesg, refused_bytes, remember_versions
from .memory import Admission, Budget, EngineCost, check_set, fmt_bytes

RKNN_FLAG_COLLECT_MODEL_INFO_ONLY = 0x00000100
RKNN_QUERY_SDK_VERSION = 5
RKNN_QUERY_MEM_SIZE = 6
MIB = 1 << 20
UINT32_SPAN = 1 << 32


class RknnMemSize(ctypes.Structure):
    _fields_ = [("total_weight_size", ctypes.c_uint32),
                ("total_internal_size", ctypes.c_uint32),
                ("total_dma_allocated_size", ctypes.c_uint64),
                ("total_sram_size", ctypes.c_uint32),
                ("free_sram_size", ctypes.c_uint32),
                ("reserved", ctypes.c_uint32 * 10)]


class RknnSdkVersion(ctypes.Structure):
    _fields_ = [("api_version", ctypes.c_char * 256), ("drv_version", ctypes.c_char * 256)]


def context_type():
    """rknn_context: uint32 on 32-bit ARM (armhf), uint64 on aarch64."""
    return ctypes.c_uint32 if ctypes.sizeof(ctypes.c_void_p) == 4 else ctypes.c_uint64


def load_library(path=None) -> ctypes.CDLL:
    """librknnrt, from `path`, $LIBRKNNRT_PATH, the usual places, or the loader's search path."""
    env = os.environ.get(LIBRKNNRT_ENV)
    candidates = ([str(path)] if path else []) + ([env] if env else [])
    candidates += [p for p in LIBRKNNRT_PATHS if Path(p).exists()]
    found = ctypes.util.find_library("rknnrt")
    if found:
        candidates.append(found)
    errors = []
    for candidate in candidates:
        try:
            return _bind(ctypes.CDLL(candidate))
        except OSError as exc:
            errors.append(f"{candidate}: {exc}")
    raise BoardUnavailable("librknnrt.so not found (" + ("; ".join(errors) or "no candidate") + "): install "
                           "the RKNPU2 runtime into /usr/lib (the SDK's install.sh does) or set "
                           f"{LIBRKNNRT_ENV}=/path/to/librknnrt.so")


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    ctx = context_type()
    lib.rknn_init.argtypes = [ctypes.POINTER(ctx), ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint32,
                              ctypes.c_void_p]
    lib.rknn_init.restype = ctypes.c_int
    lib.rknn_query.argtypes = [ctx, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint32]
    lib.rknn_query.restype = ctypes.c_int
    lib.rknn_destroy.argtypes = [ctx]
    lib.rknn_destroy.restype = ctypes.c_int
    return lib


@dataclass(frozen=True)
class EngineMemory:
    """What librknnrt reports a context of this engine occupies (bytes), and how long it took."""

    weight_bytes: int
    internal_bytes: int
    dma_allocated_bytes: int
    sram_total_bytes: int
    sram_free_bytes: int
    seconds: float
    versions: Versions

    @property
    def context_mib(self) -> float:
        return (self.weight_bytes + self.internal_bytes) / MIB


def engine_memory(path, lib: ctypes.CDLL | None = None) -> EngineMemory:
    """Init `path` with RKNN_FLAG_COLLECT_MODEL_INFO_ONLY, query its memory, destroy the context.

    Raises dmesg.InitRefused with the runtime's code when rknn_init refuses the file (-13: compiled
    for another SoC; -6: not an engine this runtime reads).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no engine at {path}")
    lib = lib or load_library()
    ctx = context_type()(0)
    name = ctypes.create_string_buffer(str(path).encode())
    t0 = time.monotonic()
    rc = lib.rknn_init(ctypes.byref(ctx), name, 0, RKNN_FLAG_COLLECT_MODEL_INFO_ONLY, None)
    if rc != 0:  # an info-only context maps nothing: a refusal here is about the file, never an overrun
        raise InitRefused(f"rknn_init({path.name}, COLLECT_MODEL_INFO_ONLY)", rc, resident=0)
    try:
        mem = RknnMemSize()
        rc = lib.rknn_query(ctx, RKNN_QUERY_MEM_SIZE, ctypes.byref(mem), ctypes.sizeof(mem))
        if rc != 0:
            raise InitRefused(f"rknn_query({path.name}, RKNN_QUERY_MEM_SIZE)", rc)
        sdk = RknnSdkVersion()
        versions = Versions()
        if lib.rknn_query(ctx, RKNN_QUERY_SDK_VERSION, ctypes.byref(sdk), ctypes.sizeof(sdk)) == 0:
            versions = Versions(sdk.api_version.decode(errors="replace") or None,
                                sdk.drv_version.decode(errors="replace") or None)
            remember_versions(versions)
    finally:
        lib.rknn_destroy(ctx)
    return EngineMemory(mem.total_weight_size, mem.total_internal_size, mem.total_dma_allocated_size,
                        mem.total_sram_size, mem.free_sram_size, time.monotonic() - t0, versions)


def internal_wrap_suspect(mem: EngineMemory, refused_bytes: Iterable[int]) -> int | None:
    """A refused byte count (from dmesg) that equals total_internal_size modulo 2**32 while being
    larger: the uint32 field wrapped, and the true internal size is that count. None otherwise.

    Why it matters: the reference documents' S=900 engine reports 1039 MiB but asked for 4710850560 B, which is
    415883264 B past 4 GiB; if its internal size came back as 415883264, the query under-reports by
    exactly 4 GiB and a budget built on it admits what the driver refuses."""
    for n in refused_bytes:
        if n >= UINT32_SPAN and n % UINT32_SPAN == mem.internal_bytes:
            return n
    return None


def memory_report(engines: list[Path], budget: Budget, lib: ctypes.CDLL | None = None,
                  kernel_log: list[str] | None = None) -> tuple[list[str], Admission]:
    """`rkstudy board memory`: one line per engine (its context cost, ~0.5 s each, no network built),
    then whether the set fits `budget`.

    The kernel log (`dmesg`, when readable) is searched for refused byte counts: an engine whose
    reported internal size is a refused count modulo 2**32 gets that count as its own mapping, so a
    wrapped uint32 cannot make the budget admit what the driver refused.
    """
    lib = lib or load_library()
    refused = refused_bytes(kernel_log if kernel_log is not None else (read_dmesg() or []))
    lines, costs = [], []
    for path in engines:
        mem = engine_memory(path, lib)
        wrapped = internal_wrap_suspect(mem, refused)
        lines.append(f"{Path(path).name}: {mem.context_mib:.1f} MiB (weights {mem.weight_bytes} B, internal "
                     f"{mem.internal_bytes} B; {mem.seconds:.2f} s)")
        if wrapped:
            lines.append(f"  the kernel log refused {fmt_bytes(wrapped)}, which is this engine's internal size "
                         "plus a multiple of 4 GiB: RKNN_QUERY_MEM_SIZE wrapped its uint32; counted as its "
                         "own mapping")
        costs.append(EngineCost(Path(path).stem, mem.context_mib, wrapped,
                                source="librknnrt RKNN_QUERY_MEM_SIZE"))
    verdict = check_set(costs, budget)
    lines.append(("ADMIT " if verdict.admit else "REFUSE ") + verdict.reason)
    return lines, verdict
