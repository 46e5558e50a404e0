"""The board's own files, read under rkstudy.paths.sysroot() so tests can point at a recorded tree.

Board side: standard library only.
"""

from __future__ import annotations

from ..paths import on_board

COMPATIBLE = "/proc/device-tree/compatible"
NPU_VERSION_FILES = ("/sys/kernel/debug/rknpu/version", "/sys/module/rknpu/version")
NPU_DEVICE = "/dev/rknpu"
NPU_DEVFREQ = "/sys/class/devfreq/fdab0000.npu"  # RK3588's NPU; its governor decides the clock
# The toolkit's target names: a chip of the same NPU generation runs the same engine.
SOC_TARGETS = {"rk3588": "rk3588", "rk3588s": "rk3588", "rk3566": "rk3566", "rk3568": "rk3566"}


def read(path: str) -> str | None:
    """A board file's text (NULs kept), or None when it is not there or not readable."""
    try:
        return on_board(path).read_bytes().decode("utf-8", errors="replace").strip()
    except OSError:
        return None


def exists(path: str) -> bool:
    return on_board(path).exists()


def soc() -> str | None:
    """The SoC this board reports in its device tree (`rockchip,rk3588`), as the toolkit's target
    name (rk3588 / rk3566), or None on a machine that is not a supported Rockchip board."""
    text = read(COMPATIBLE)
    if not text:
        return None
    for entry in text.split("\0"):
        vendor, _, chip = entry.strip().partition(",")
        if vendor == "rockchip" and chip in SOC_TARGETS:
            return SOC_TARGETS[chip]
    return None


def npu_driver_version() -> str | None:
    """The kernel NPU driver's own version line, if this machine has one."""
    for path in NPU_VERSION_FILES:
        text = read(path)
        if text:
            return text
    return None


def npu_clock() -> dict[str, str | None]:
    """The NPU's governor and current frequency: board figures scale with the clock."""
    return {"governor": read(f"{NPU_DEVFREQ}/governor"), "cur_freq": read(f"{NPU_DEVFREQ}/cur_freq")}
