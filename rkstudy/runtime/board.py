"""RKNNLite on a board. Real code, exercised on a board, and in CI through the replay double of
RKNNLite (tests/doubles/rknnlite), whose rows say `replay`, never `board`.

Two behaviours the seeds measured and this runner keeps:
* The driver's AUTO core mask puts every one of these engines on one core, so the runner asks
  for cores 0_1_2 and falls back to AUTO when the driver refuses (single-core SoCs such as the
  RK3566 do).
* A failure code names what was refused, not who refused it. Once any context in this process
  has initialized, every later error carries the runtime (API) and driver versions it reported,
  which is the half of a version comparison the board can state.

Board side: numpy and rknnlite (at call time) only.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from ..board import sysfs
from .base import Runner

CORE_MASKS = ("0_1_2", "0", "auto")
# What a runtime code means, as the seeds met them on an RK3588 (rknn_init / init_runtime).
RUNTIME_CODES = {-4: "the driver refused the init (the engine's mapping does not fit the NPU's 32-bit "
                     "address space: see dmesg for 'failed to allocate IOVA')",
                 -6: "the driver refused the init (an aperture overrun: too many contexts resident)",
                 -13: "the engine was compiled for another target platform"}

_versions: str | None = None  # "api ..., driver ..." from the first context that initialized


class BoardUnavailable(RuntimeError):
    """No RKNNLite runtime or no NPU driver here."""


class RknnError(RuntimeError):
    """An RKNNLite call failed; the message carries the versions once they are known."""


def board_available() -> tuple[bool, str]:
    """(present, why): RKNNLite importable and an NPU driver visible."""
    if importlib.util.find_spec("rknnlite") is None:
        return False, "rknn-toolkit-lite2 is not installed (on the board: make board-env, or pip install -e '.[board]')"
    driver = sysfs.npu_driver_version()
    if driver is None and not sysfs.exists(sysfs.NPU_DEVICE):
        return False, "no RKNPU driver (no /sys/kernel/debug/rknpu/version, no /dev/rknpu)"
    return True, driver or "/dev/rknpu present"


def runtime_versions() -> str | None:
    """The runtime (API) and driver versions the first initialized context reported, or None."""
    return _versions


def _fail(what: str, rc) -> RknnError:
    meaning = f": {RUNTIME_CODES[rc]}" if rc in RUNTIME_CODES else ""
    suffix = f" ({_versions})" if _versions else ""
    return RknnError(f"{what} failed with code {rc}{meaning}{suffix}")


def _one_line_sdk(sdk) -> str | None:
    return " ".join(str(sdk).split()) if sdk else None


class BoardRunner(Runner):
    """One RKNNLite context over one .rknn engine."""

    def __init__(self, rknn_path, input_names: list[str], *, cores: str = "0_1_2"):
        global _versions
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
        self.engine = Path(rknn_path)
        self._lite = RKNNLite(verbose=False)
        rc = self._lite.load_rknn(str(self.engine))
        if rc != 0:
            raise _fail(f"load_rknn({self.engine.name})", rc)
        mask = {"0_1_2": RKNNLite.NPU_CORE_0_1_2, "0": RKNNLite.NPU_CORE_0, "auto": RKNNLite.NPU_CORE_AUTO}[cores]
        rc = self._lite.init_runtime(core_mask=mask)
        self.cores = cores
        if rc != 0 and mask != RKNNLite.NPU_CORE_AUTO:
            rc = self._lite.init_runtime(core_mask=RKNNLite.NPU_CORE_AUTO)
            self.cores = "auto"
        if rc != 0:
            raise _fail(f"init_runtime({self.engine.name})", rc)
        if _versions is None:
            driver = sysfs.npu_driver_version()
            sdk = _one_line_sdk(self._lite.get_sdk_version())
            _versions = ", ".join(v for v in (sdk, f"driver {driver}" if driver else None) if v) or None

    def run(self, inputs) -> list[np.ndarray]:
        arrays = self._ordered(inputs)
        fmt = ["nchw" if x.ndim == 4 else None for x in arrays]
        outs = self._lite.inference(inputs=arrays, data_format=fmt if any(fmt) else None)
        if outs is None:
            raise _fail(f"inference({self.engine.name})", "None")
        return [np.asarray(o, dtype=np.float32) for o in outs]

    def close(self) -> None:
        self._lite.release()
