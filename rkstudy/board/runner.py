"""RKNNLite on a board. Real code, exercised on a board, and in CI through the replay double of
RKNNLite (tests/doubles/rknnlite), whose rows say `replay`, never `board`.

Three behaviours the reference documents measured (or that RKNNLite hides) and this runner keeps:
* The driver's AUTO core mask puts every one of these engines on one core, so the runner asks
  for cores 0_1_2 and falls back to AUTO only when the mask itself is refused (set_core_mask's
  code, which init_runtime returns: -13 on single-core SoCs such as the RK3566). An init that
  failed (the runtime raised: -4, -6, a wrong SoC, an old runtime) is never retried with another
  mask: the reference documents saw masks 1 and 7 fail identically at the IOVA ceiling. The row records the mask
  the runtime granted (0_1 where RK3576 swaps 0_1_2 for its two cores).
* A failure code names what was refused, not who refused it. Every failure goes through
  rkstudy.board.dmesg.format_failure, the one formatter: the code's name and meaning, the bytes
  the kernel log names, and, once any context in this process has initialized, the driver and
  runtime (API) versions it reported.
* RKNNLite 2.5.0's init_runtime returns -1 for a failed init and logs librknnrt's code by name
  inside a traceback, beside librknnrt's own lines (its version, "Invalid RKNN model version 6"); its
  inference returns None after logging the same way. The runner captures fds 1 and 2 around the
  constructor, init_runtime and every inference to read both back (dmesg.lite_failures, dmesg.runtime_said)
  and says what they mean in its one line: the log itself, traceback and all, reaches stderr only under
  --debug (RKSTUDY_DEBUG=1).
* -6 means an aperture overrun only when other contexts of this process are resident; the runner counts
  them, and with none the line says the runtime refused the file itself.

Inputs go to RKNNLite with their own dtypes, as rknn_lite.py hands them to its runtime (the tensor
type comes from the array): integer inputs (token ids, codes) stay int64 as the contract declares
them, floating ones become float32.

Board side: numpy and rknnlite (at call time) only.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..contract import refuse_unlisted
from ..errors import BoardUnavailable
from ..runtime.base import Runner
from . import dmesg, sysfs
from .compat import missing_runtime
from .dmesg import InitRefused, RknnError, Versions  # noqa: F401  (RknnError re-exported)

CORE_MASKS = ("0_1_2", "0", "auto")
DRIVER_REFUSALS = (-4, -6)  # the driver said no: another core mask cannot help


def rknnlite_problem() -> str | None:
    """Why RKNNLite cannot be used here (not installed, or installed but its import fails: a
    dependency it pulls unpinned, a wheel for another Python), or None when it imports."""
    if importlib.util.find_spec("rknnlite") is None:
        return "rknn-toolkit-lite2 is not installed (on the board: make board-env, or pip install -e '.[board]')"
    try:
        from rknnlite.api import RKNNLite  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - whatever its import raised is the finding
        import traceback

        fix = ("pip install 'ruamel.yaml==0.19.1' (the import failed inside ruamel.yaml, which the lite2 wheel "
               "pulls unpinned; 2.5.0 was checked with 0.19.1)"
               if "ruamel" in traceback.format_exc() else "pip install --force-reinstall rknn-toolkit-lite2==2.5.0")
        return f"rknnlite does not import ({type(exc).__name__}: {' '.join(str(exc).split())}): {fix}"
    return None


def board_available() -> tuple[bool, str]:
    """(present, why): RKNNLite imports and an NPU driver is visible."""
    problem = rknnlite_problem()
    if problem:
        return False, problem
    driver = sysfs.npu_driver_version()
    if driver is None and not sysfs.npu_device_nodes():
        return False, ("no RKNPU driver (no /sys/kernel/debug/rknpu/version or /sys/module/rknpu/version, no NPU "
                       "device node in /dev/dri or /dev/rknpu)")
    return True, driver or f"{sysfs.npu_device_nodes()[0]} present"


def mask_refused(rc: int, log_text: str) -> bool:
    """Whether a failed init_runtime failed on the core mask (so AUTO may work) rather than on the init:
    the runtime initialized and set_core_mask returned the code (not -1), or the log says the mask was
    refused. A failed init (its log says "RKNN init failed") and a driver refusal never are."""
    failures = dmesg.lite_failures(log_text)
    if any(f.step == "init" for f in failures) or any(f.code in DRIVER_REFUSALS for f in failures):
        return False
    return rc not in (-1, *DRIVER_REFUSALS) or any(f.step == "set core mask" for f in failures) \
        or dmesg.CORE_MASK_ONLY in log_text


_after_init: list[Callable[[], None]] = []


def after_init(callback: Callable[[], None]) -> None:
    """Run `callback` once, right after the next context of this process initializes: a board run's
    child starts its NPU sampler there, so the init's own load is not averaged into the decode's."""
    _after_init.append(callback)


def runtime_versions() -> str | None:
    """"driver X, api Y" as the first initialized context reported them (for results rows), or None."""
    known = dmesg.known_versions()
    return known.describe() if known else None


def resident_contexts() -> int:
    """Contexts this process has initialized and not yet released."""
    return _resident[0]


_resident = [0]


def capturing_fds(fn: Callable[[], Any]) -> tuple[Any, str]:
    """fn()'s result and everything written to fds 1 and 2 while it ran (C code writes there
    directly, so redirecting sys.stdout would miss it). The text is passed on to stderr only under
    --debug (RKSTUDY_DEBUG=1): what it means is said in rkstudy's own line, the traceback is not."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        # Python-level writers too: sys.stderr need not be fd 2 (an embedding or capturing host)
        writer = open(log.fileno(), "w", encoding="utf-8", closefd=False)
        try:
            with contextlib.redirect_stdout(writer), contextlib.redirect_stderr(writer):
                result = fn()
        finally:
            writer.close()
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
        log.seek(0)
        text = log.read().decode("utf-8", errors="replace")
    if text and os.environ.get("RKSTUDY_DEBUG") == "1":
        sys.stderr.write(text)
        sys.stderr.flush()
    return result, text


class BoardRunner(Runner):
    """One RKNNLite context over one .rknn engine (also a rung of rkstudy.board.memory.LazyLadder:
    it raises InitRefused when the runtime or driver refuses the context)."""

    def __init__(self, rknn_path, input_names: list[str], *, cores: str = "0_1_2", shape_sets=None):
        present, why = board_available()
        if not present:
            raise BoardUnavailable(f"cannot run {Path(rknn_path).name} on a board: {why}")
        if cores not in CORE_MASKS:
            raise ValueError(f"cores={cores!r}: choose one of {', '.join(CORE_MASKS)}")
        from rknnlite.api import RKNNLite

        # the replay double says so, and then nothing it produces may pass for a board number
        self.where = "replay" if getattr(RKNNLite, "IS_TEST_DOUBLE", False) else "board"
        self.target = sysfs.soc() or "none"
        self.input_names = list(input_names)
        # a multi-shape engine's sets (Contract.shape_sets): a shape outside them is refused in one
        # line before librknnrt's rknn_set_input_shapes fails inside a traceback
        self.shape_sets = [tuple(tuple(x) for x in one) for one in shape_sets or ()]
        self.engine = Path(rknn_path)
        self._open = False
        self._lite, self.log = capturing_fds(lambda: RKNNLite(verbose=False))  # it logs its own version
        rc = self._lite.load_rknn(str(self.engine))
        if rc != 0:
            raise RknnError(dmesg.format_failure(f"load_rknn({self.engine.name})", rc))
        masks = {"0_1_2": RKNNLite.NPU_CORE_0_1_2, "0": RKNNLite.NPU_CORE_0, "auto": RKNNLite.NPU_CORE_AUTO}
        with dmesg.DmesgWatch() as watch:
            rc, text = self._init(masks[cores])
            self.cores = cores
            if rc != 0 and masks[cores] != RKNNLite.NPU_CORE_AUTO and mask_refused(rc, text):
                rc, text = self._init(RKNNLite.NPU_CORE_AUTO)
                self.cores = "auto"
        if rc != 0:
            self._lite.release()
            failures = dmesg.lite_failures(text)
            said = dmesg.runtime_said(text)
            code = rc if rc != -1 else (failures[-1].code if failures else None)
            if dmesg.NO_LIBRKNNRT in text:
                note = missing_runtime()
            else:
                note = "; ".join(n for n in (
                    "RKNNLite returned -1 and its log named no code" if not failures else
                    f"the runtime named {failures[-1].name}" if code is None else "", said.note()) if n)
            refused = InitRefused(f"init_runtime({self.engine.name})", code if code is not None else rc,
                                  refusals=watch.refusals, note=note, resident=resident_contexts(),
                                  meaning=said.meaning())
            refused.log = self.log
            raise refused
        self._open = True
        _resident[0] += 1
        self.cores = dmesg.cores_granted(text, self.cores)
        sdk = dmesg.parse_lite_sdk_version(self._lite.get_sdk_version())
        dmesg.remember_versions(Versions(sdk.api, sdk.driver or sysfs.npu_driver()[0]))
        while _after_init:
            _after_init.pop(0)()

    def _init(self, mask: int) -> tuple[int, str]:
        """init_runtime's code and the log it wrote (kept in self.log with every earlier one)."""
        rc, text = capturing_fds(lambda: self._lite.init_runtime(core_mask=mask))
        self.log += text
        return rc, text

    def run(self, inputs) -> list[np.ndarray]:
        arrays = [x.astype(np.float32) if x.dtype.kind == "f" else x.astype(np.int64) if x.dtype.kind in "iu"
                  else x for x in self._ordered(inputs, keep_dtype=True)]
        if len(self.shape_sets) > 1:
            refuse_unlisted(self.input_names, [x.shape for x in arrays], self.shape_sets)
        fmt = ["nchw" if x.ndim == 4 else None for x in arrays]
        outs, text = capturing_fds(lambda: self._lite.inference(inputs=arrays, data_format=fmt if any(fmt) else None))
        if outs is None:  # RKNNLite logged the runtime's exception and its traceback: one line says what it means
            self.log += text
            raise RknnError(dmesg.inference_failure(f"inference({self.engine.name})", text))
        return [np.asarray(o, dtype=np.float32) for o in outs]

    def close(self) -> None:
        self._lite.release()
        if self._open:
            self._open = False
            _resident[0] -= 1
