"""`rkstudy board check`: what this board is, and whether its figures can be compared with the reference documents'.

The RKNN decoder-path document's board figures ("Conditions on the board numbers") were taken on
an RK3588 with the vendor rknpu_ondemand governor ramping the NPU to its 1000 MHz OPP; "a board
running the mainline rocket driver's performance-less default can sit at a fraction of that
clock and every figure here scales with it". So the check reads, from the board's own files:

* the NPU devfreq node (RK3588: /sys/class/devfreq/fdab0000.npu): governor, cur_freq, the OPP table;
* the rknpu driver version (/sys/kernel/debug/rknpu/version, else /sys/module/rknpu/version);
* the librknnrt version compiled into /usr/lib/librknnrt.so ("librknnrt version: ...", what
  `strings` shows), so the runtime is named without initializing a context;
* the SoC from /proc/device-tree/compatible and the board model;
* the CPU clusters (cpufreq max, cpu_capacity, governor, the core type from /proc/cpuinfo);

and gives one verdict. Every path is read through rkstudy.board.sysfs, under rkstudy.paths.sysroot()
($RKSTUDY_SYSROOT, default /), so the tests run it against recorded trees.

Board side: standard library only.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ..paths import on_board
from ..process import CPU_PARTS
from . import sysfs

REFERENCE_SOC = "rk3588"
LIBRKNNRT_ENV = "LIBRKNNRT_PATH"
# Where RKNNLite 2.5.0's runtime extension loads librknnrt: $LIBRKNNRT_PATH when it is set, else this file
# (the two names its rknn_runtime extension carries; the replay double looks the same way). sudo drops
# $LIBRKNNRT_PATH from the environment, so a runtime found only through it is gone under sudo.
LIBRKNNRT_DEFAULT = "/usr/lib/librknnrt.so"
# Other places an SDK install or a distribution package may have put it, where RKNNLite does not look:
# a copy found there is named in the fix, never taken for the runtime RKNNLite would load.
LIBRKNNRT_ELSEWHERE = ("/usr/lib64/librknnrt.so", "/usr/local/lib/librknnrt.so",
                       "/usr/lib/aarch64-linux-gnu/librknnrt.so")
LIBRKNNRT_PATHS = (LIBRKNNRT_DEFAULT, *LIBRKNNRT_ELSEWHERE)
_LIBRKNNRT = re.compile(rb"librknnrt version: ([^\x00\n]+)")


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


@dataclass
class NpuClock:
    node: str
    governor: str | None
    cur_hz: int | None
    available_hz: list[int]

    @property
    def top_hz(self) -> int | None:
        return max(self.available_hz) if self.available_hz else None


def npu_clock() -> NpuClock | None:
    """The NPU's devfreq node (fdab0000.npu on RK3588, fde40000.npu on RK356x), or None."""
    c = sysfs.npu_clock()
    if c["node"] is None:
        return None
    return NpuClock(c["node"].rsplit("/", 1)[-1], c["governor"], _int(c["cur_freq"]), c["available"])


def librknnrt_candidates() -> list[str]:
    """Where RKNNLite loads librknnrt from: $LIBRKNNRT_PATH when it is set, else /usr/lib/librknnrt.so."""
    env = os.environ.get(LIBRKNNRT_ENV)
    return [env] if env else [LIBRKNNRT_DEFAULT]


def library_version(path: str) -> str | None:
    """The version compiled into the library at `path` (a board path), as `strings` shows it ("unknown"
    for a file without one), or None when there is no readable file there."""
    try:
        data = on_board(path).read_bytes()
    except OSError:
        return None
    m = _LIBRKNNRT.search(data)
    return m.group(1).decode("ascii", errors="replace").strip() if m else "unknown"


def librknnrt() -> tuple[str | None, str | None]:
    """(version, path) of the runtime library RKNNLite would load, read out of the binary as `strings`
    would; (None, None) when there is none where it looks."""
    for path in librknnrt_candidates():
        version = library_version(path)
        if version is not None:
            return version, path
    return None, None


def librknnrt_elsewhere() -> list[str]:
    """Copies of librknnrt in places RKNNLite does not look (with $LIBRKNNRT_PATH set, /usr/lib is one)."""
    looked = set(librknnrt_candidates())
    return [p for p in LIBRKNNRT_PATHS if p not in looked and library_version(p) is not None]


@dataclass
class Cluster:
    cpus: list[int]
    core: str | None
    max_khz: int | None
    capacity: int | None
    governor: str | None


def _cpu_parts() -> dict[int, str]:
    """CPU number -> core type: the ARM part name, or the model name where there is no part (x86)."""
    parts, cpu = {}, None
    for line in (sysfs.read("/proc/cpuinfo") or "").splitlines():
        key, _, value = (s.strip() for s in line.partition(":"))
        if key == "processor":
            cpu = _int(value)
        elif key == "CPU part" and cpu is not None:
            parts[cpu] = CPU_PARTS.get(value.lower(), value)
        elif key == "model name" and cpu is not None:
            parts.setdefault(cpu, value)
    return parts


def cpu_clusters() -> list[Cluster]:
    """CPUs grouped by (core type, max frequency, capacity): RK3588 gives 4x A55 + 4x A76."""
    parts = _cpu_parts()
    cpus = sorted(int(p.name[3:]) for p in on_board("/sys/devices/system/cpu").glob("cpu[0-9]*"))
    groups: dict[tuple, Cluster] = {}
    for n in cpus:
        base = f"/sys/devices/system/cpu/cpu{n}"
        key = (parts.get(n), _int(sysfs.read(f"{base}/cpufreq/cpuinfo_max_freq")),
               _int(sysfs.read(f"{base}/cpu_capacity")))
        cluster = groups.setdefault(key, Cluster([], *key, sysfs.read(f"{base}/cpufreq/scaling_governor")))
        cluster.cpus.append(n)
    return sorted(groups.values(), key=lambda c: c.cpus[0])


@dataclass
class Comparability:
    comparable: bool | None  # None: cannot tell from a snapshot (read the clock during a run)
    why: str
    fix: str = ""
    other_soc: bool = False  # another SoC than the reference documents': a fact about the board, nothing to fix

    @property
    def word(self) -> str:
        return {True: "COMPARABLE", False: "NOT COMPARABLE", None: "CHECK UNDER LOAD"}[self.comparable]

    @property
    def exit_code(self) -> int:
        """`rkstudy board check`'s code: 0 when the figures compare, or when this is another SoC (it runs
        every engine built for it; its figures are its own); 1 when this RK3588 (or this machine) has
        something that keeps them from comparing."""
        return 0 if self.comparable or self.other_soc else 1


def _mhz(hz: int | None) -> str:
    return f"{hz / 1e6:.0f} MHz" if hz else "unknown"


def reference_npu_hz() -> int:
    """The NPU clock the reference documents' figures were taken at (data/reference/figures.csv)."""
    from ..tables.results import reference_figure

    return int(reference_figure("flow_estimator", "NPU clock under load (cur_freq)")["value"])


def verdict(soc_name: str | None, clock: NpuClock | None) -> Comparability:
    """Can this board's NPU figures be set beside the reference documents' (RK3588, NPU at its top OPP, the
    clock reference_npu_hz() names)?"""
    if soc_name is None:
        return Comparability(False, "not a Rockchip board (no rockchip,rkXXXX in the device tree)")
    if soc_name != REFERENCE_SOC:
        return Comparability(False, f"this is an {soc_name}; the reference documents' board figures are RK3588 "
                             "(another NPU, another clock): compare ratios, not absolute figures", other_soc=True)
    if clock is None:
        return Comparability(None, f"the NPU clock cannot be read ({missing_devfreq(soc_name)})",
                       "check that the rknpu driver is loaded (dmesg | grep -i rknpu)")
    reference_hz = reference_npu_hz()
    if clock.top_hz is not None and clock.top_hz < reference_hz:
        return Comparability(False, f"the NPU's OPP table tops out at {_mhz(clock.top_hz)}; the reference "
                             f"documents ran at {_mhz(reference_hz)}")
    if clock.cur_hz == clock.top_hz == reference_hz:
        return Comparability(True, f"NPU at its top OPP, {_mhz(clock.cur_hz)}, governor {clock.governor}")
    node = f"{sysfs.DEVFREQ}/{clock.node}"
    if clock.governor == "rknpu_ondemand":
        return Comparability(None, f"NPU at {_mhz(clock.cur_hz)} now under rknpu_ondemand (the reference documents' "
                             "governor), "
                       f"which ramps to {_mhz(clock.top_hz)} under load",
                       f"read {node}/cur_freq during a run; it must show {reference_hz}")
    return Comparability(False, f"NPU at {_mhz(clock.cur_hz)} under governor {clock.governor}, not at its top OPP "
                   f"{_mhz(clock.top_hz)}: every NPU figure scales with this clock",
                   f"echo performance | sudo tee {node}/governor")


def missing_devfreq(soc_name: str | None) -> str:
    """Why there is no NPU clock: the SoC's own devfreq node is absent, or its node is not recorded."""
    expected = sysfs.expected_npu_devfreq(soc_name)
    if expected:
        return f"no {expected}: the rknpu driver registers the NPU's devfreq there; is it loaded?"
    return (f"no {sysfs.DEVFREQ}/*.npu, and rkstudy has no NPU devfreq node recorded for "
            f"{soc_name or 'this machine'}")


@dataclass
class BoardCheck:
    root: str
    soc: str | None
    model: str | None
    compatible: list[str]
    npu: NpuClock | None
    driver: str | None
    driver_source: str | None
    librknnrt: str | None
    librknnrt_path: str | None
    clusters: list[Cluster]
    npu_load_readable: bool
    verdict: Comparability


def board_check() -> BoardCheck:
    """Everything above, read under rkstudy.paths.sysroot()."""
    soc_name, clock = sysfs.soc(), npu_clock()
    driver, driver_src, _ = sysfs.npu_driver()
    rt, rt_path = librknnrt()
    return BoardCheck(str(on_board("/")), soc_name, sysfs.model(), sysfs.compatible(), clock, driver,
                      driver_src, rt, rt_path, cpu_clusters(), sysfs.read(sysfs.NPU_LOAD) is not None,
                      verdict(soc_name, clock))


def render(check: BoardCheck) -> str:
    """The check as text for a terminal."""
    na = "-"
    lines = [f"board check (root {check.root})",
             f"  SoC            {check.soc or na}   model: {check.model or na}",
             f"  compatible     {', '.join(check.compatible) or na}"]
    if check.npu:
        n = check.npu
        lines.append(f"  NPU clock      {n.cur_hz or na} Hz, governor {n.governor or na}, "
                     f"OPPs {' '.join(str(f // 1_000_000) for f in n.available_hz) or na} MHz ({n.node})")
    else:
        lines.append(f"  NPU clock      - ({missing_devfreq(check.soc)})")
    lines.append(f"  rknpu driver   {check.driver or na}"
                 + (f"   ({check.driver_source})" if check.driver_source else ""))
    lines.append(f"  librknnrt      {check.librknnrt or na}"
                 + (f"   ({check.librknnrt_path})" if check.librknnrt_path else ""))
    for c in check.clusters:
        cpus = f"cpu{c.cpus[0]}-{c.cpus[-1]}" if len(c.cpus) > 1 else f"cpu{c.cpus[0]}"
        lines.append(f"  CPU cluster    {cpus}: {len(c.cpus)}x {c.core or '?'}, max "
                     f"{c.max_khz / 1000 if c.max_khz else na} MHz, capacity {c.capacity or na}, "
                     f"governor {c.governor or na}")
    readable = "readable" if check.npu_load_readable else "not readable (needs root and debugfs)"
    lines.append(f"  NPU load file  {readable}")
    v = check.verdict
    lines.append(f"verdict: {v.word} with the reference documents' RK3588 figures: {v.why}")
    if v.fix:
        lines.append(f"  fix: {v.fix}")
    return "\n".join(lines)
