"""The board's own files, read under rkstudy.paths.sysroot() so tests can point at a recorded tree.

Board side: standard library only.
"""

from __future__ import annotations

import re

from ..paths import on_board
from ..targets import CHIP_TARGETS, record

COMPATIBLE = "/proc/device-tree/compatible"
MODEL = "/proc/device-tree/model"
NPU_VERSION_FILES = ("/sys/kernel/debug/rknpu/version", "/sys/module/rknpu/version")
NPU_DEVICE = "/dev/rknpu"  # the misc device of older vendor drivers; DRM kernels give a render node
DRM = "/sys/class/drm"
DEVFREQ = "/sys/class/devfreq"
# The driver's per-core load (rknpu_debugger.c, rknpu_load_show); debugfs, so root only.
NPU_LOAD = "/sys/kernel/debug/rknpu/load"
_CHIP = re.compile(r"^(r[kv]\d{4}[a-z]?)$")
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
    """The SoC this board reports in its device tree (`rockchip,rk3588`) as the toolkit's target name
    (rk3588s gives rk3588); a Rockchip chip this project does not build for gives its own name
    (`rk3399`), so an engine check can name it; None on a machine that is not a Rockchip board."""
    chips = [chip for vendor, _, chip in (e.strip().partition(",") for e in compatible())
             if vendor == "rockchip" and _CHIP.match(chip)]
    for chip in chips:
        if chip in CHIP_TARGETS:
            return CHIP_TARGETS[chip]
    return chips[0] if chips else None


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


def expected_npu_devfreq(soc_name: str | None) -> str | None:
    """Where this SoC's NPU devfreq node should be (rkstudy.targets.Target.npu_devfreq), or None for an SoC
    whose node is not recorded. npu_devfreq() still takes whatever *.npu node the board has: this only names
    the one that is missing."""
    target = record(soc_name)
    node = target.npu_devfreq if target else None
    return f"{DEVFREQ}/{node}" if node else None


def npu_device_nodes() -> list[str]:
    """The NPU's device nodes: each /dev/dri/renderD* whose DRM device is the rknpu driver's (vendor
    5.10 and 6.1 kernels), and /dev/rknpu where an older driver made a misc device."""
    nodes = [f"/dev/dri/{d.name}" for d in sorted(on_board(DRM).glob("renderD*"))
             if "rknpu" in (read(f"{DRM}/{d.name}/device/uevent") or "").lower()]
    return nodes + ([NPU_DEVICE] if exists(NPU_DEVICE) else [])


def npu_clock() -> dict:
    """The NPU's devfreq node, governor, current frequency and OPP table (Hz): board figures scale
    with the clock, and the governor decides it."""
    node = npu_devfreq()
    if node is None:
        return {"node": None, "governor": None, "cur_freq": None, "available": []}
    opps = (read(f"{node}/available_frequencies") or "").split()
    return {"node": node, "governor": read(f"{node}/governor"), "cur_freq": read(f"{node}/cur_freq"),
            "available": sorted(int(f) for f in opps if f.isdigit())}
