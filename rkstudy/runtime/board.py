"""RKNNLite on a board. Real code, exercised only where a board is present.

Two behaviours the seeds measured and this runner keeps:
* The driver's AUTO core mask puts every one of these engines on one core, so the runner asks
  for cores 0_1_2 and falls back to AUTO when the driver refuses (single-core SoCs such as the
  RK3566 do).
* A failure code names what was refused, not who refused it. Once any context in this process
  has initialized, every later error carries the runtime (API) and driver versions it reported,
  which is the half of a version comparison the board can state.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from .base import Runner

NPU_VERSION_FILES = ("/sys/kernel/debug/rknpu/version", "/sys/module/rknpu/version")
NPU_DEVFREQ = "/sys/class/devfreq/fdab0000.npu"  # RK3588's NPU; its governor decides the clock

_versions: str | None = None  # "api ..., driver ..." from the first context that initialized


class BoardUnavailable(RuntimeError):
    """No RKNNLite runtime or no NPU driver here."""


class RknnError(RuntimeError):
    """An RKNNLite call failed; the message carries the versions once they are known."""


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def npu_driver_version() -> str | None:
    """The kernel NPU driver's own version line, if this machine has one."""
    for path in NPU_VERSION_FILES:
        text = _read(path)
        if text:
            return text
    return None


def board_available() -> tuple[bool, str]:
    """(present, why): RKNNLite importable and an NPU driver visible."""
    if importlib.util.find_spec("rknnlite") is None:
        return False, "rknn-toolkit-lite2 is not installed (pip install -e '.[board]' on the board)"
    driver = npu_driver_version()
    if driver is None and not Path("/dev/rknpu").exists():
        return False, "no RKNPU driver (no /sys/kernel/debug/rknpu/version, no /dev/rknpu)"
    return True, driver or "/dev/rknpu present"


def npu_clock() -> dict[str, str | None]:
    """The NPU's governor and current frequency: board figures scale with the clock."""
    return {"governor": _read(f"{NPU_DEVFREQ}/governor"), "cur_freq": _read(f"{NPU_DEVFREQ}/cur_freq")}


def _fail(what: str, rc) -> RknnError:
    suffix = f" ({_versions})" if _versions else ""
    return RknnError(f"{what} failed with code {rc}{suffix}")


class BoardRunner(Runner):
    """One RKNNLite context over one .rknn engine."""

    where = "board"

    def __init__(self, rknn_path, input_names: list[str], *, cores: str = "0_1_2"):
        global _versions
        present, why = board_available()
        if not present:
            raise BoardUnavailable(f"cannot run {Path(rknn_path).name} on a board: {why}")
        from rknnlite.api import RKNNLite

        self.input_names = list(input_names)
        self.engine = Path(rknn_path)
        self._lite = RKNNLite(verbose=False)
        rc = self._lite.load_rknn(str(self.engine))
        if rc != 0:
            raise _fail(f"load_rknn({self.engine.name})", rc)
        mask = {"0_1_2": RKNNLite.NPU_CORE_0_1_2, "0": RKNNLite.NPU_CORE_0,
                "auto": RKNNLite.NPU_CORE_AUTO}[cores]
        rc = self._lite.init_runtime(core_mask=mask)
        self.cores = cores
        if rc != 0 and mask != RKNNLite.NPU_CORE_AUTO:
            rc = self._lite.init_runtime(core_mask=RKNNLite.NPU_CORE_AUTO)
            self.cores = "auto"
        if rc != 0:
            raise _fail(f"init_runtime({self.engine.name})", rc)
        if _versions is None:
            sdk = self._lite.get_sdk_version()
            _versions = " ".join(str(sdk).split()) if sdk else None

    def run(self, inputs) -> list[np.ndarray]:
        arrays = self._ordered(inputs)
        fmt = ["nchw" if x.ndim == 4 else None for x in arrays]
        outs = self._lite.inference(inputs=arrays, data_format=fmt if any(fmt) else None)
        if outs is None:
            raise _fail(f"inference({self.engine.name})", "None")
        return [np.asarray(o, dtype=np.float32) for o in outs]

    def close(self) -> None:
        self._lite.release()
