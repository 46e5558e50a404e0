"""The board's own files, read under rkstudy.paths.sysroot() so tests can point at a recorded tree.

Board side: standard library only.
"""

from __future__ import annotations

import re

from ..paths import on_board

COMPATIBLE = "/proc/device-tree/compatible"
MODEL = "/proc/device-tree/model"
NPU_VERSION_FILES = ("/sys/kernel/debug/rknpu/version", "/sys/module/rknpu/version")
NPU_DEVICE = "/dev/rknpu"
DEVFREQ = "/sys/class/devfreq"  # the NPU's node is <unit address>.npu: fdab0000 on RK3588, fde40000 on RK356x
# The driver's per-core load (rknpu_debugger.c, rknpu_load_show); debugfs, so root only.
NPU_LOAD = "/sys/kernel/debug/rknpu/load"
# The toolkit's target names: a chip of the same NPU generation runs the same engine.
SOC_TARGETS = {"rk3588": "rk3588", "rk3588s": "rk3588", "rk3566": "rk3566", "rk3568": "rk3566"}
_VERSION = re.compile(r"v?(\d+\.\d+\.\d+)")


def read(path: str) -> str | None:
    """A board file's text (NULs kept), or None when it is not there or not readable."""
    try:
        return on_board(path).read_bytes().decode("utf-8", errors="replace").strip()
    except OSError:
        return None


def exists(path: str) -> bool:
    return on_board(path).exists()


def compatible() -> list[str]:
    """The device tree's compatible strings, most specific first (`rockchip,rk3588-orangepi-5-plus`)."""
    return [c for c in (read(COMPATIBLE) or "").split("\0") if c.strip()]


def model() -> str | None:
    """The board's model string from the device tree (`Orange Pi 5 Plus`)."""
    return (read(MODEL) or "").rstrip("\0") or None


def soc() -> str | None:
    """The SoC this board reports in its device tree (`rockchip,rk3588`), as the toolkit's target
    name (rk3588 / rk3566), or None on a machine that is not a supported Rockchip board."""
    for entry in compatible():
        vendor, _, chip = entry.strip().partition(",")
        if vendor == "rockchip" and chip in SOC_TARGETS:
            return SOC_TARGETS[chip]
    return None


def npu_driver_version() -> str | None:
    """The kernel NPU driver's own version line, if this machine has one."""
    return npu_driver()[2]


def npu_driver() -> tuple[str | None, str | None, str | None]:
    """(version such as 0.9.8, the file it came from, the file's line): the debugfs file on a vendor
    kernel, else the module's own version file (RK356x images without debugfs)."""
    for path in NPU_VERSION_FILES:
        text = read(path)
        if text:
            m = _VERSION.search(text)
            return (m.group(1) if m else text), path, text
    return None, None, None


def npu_devfreq() -> str | None:
    """The NPU's devfreq node (`/sys/class/devfreq/fdab0000.npu` on RK3588), or None."""
    nodes = sorted(on_board(DEVFREQ).glob("*.npu"))
    return f"{DEVFREQ}/{nodes[0].name}" if nodes else None


def npu_clock() -> dict:
    """The NPU's devfreq node, governor, current frequency and OPP table (Hz): board figures scale
    with the clock, and the governor decides it."""
    node = npu_devfreq()
    if node is None:
        return {"node": None, "governor": None, "cur_freq": None, "available": []}
    opps = (read(f"{node}/available_frequencies") or "").split()
    return {"node": node, "governor": read(f"{node}/governor"), "cur_freq": read(f"{node}/cur_freq"),
            "available": sorted(int(f) for f in opps if f.isdigit())}
