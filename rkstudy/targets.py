"""The RKNPU2 targets: one record per SoC rknn-toolkit2 builds for, holding every fact this project knows
about it, so that a new SoC is one record and every list of targets (the contract's check, the board's
device-tree names, `--target all`, the probes' target lists) is computed from the records.

Board side: standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Target:
    """One SoC as the toolkit, the board and the studies see it.

    `register_field_bits` is the REGTASK register field in bits, as rknn-toolkit2 2.5.0 prints it ("REGTASK:
    The bit width of field value exceeds the limit, ..., limit: 0x3fff, value: 0x4000") for one 64-channel
    k=7 Conv1d at 16384 frames (rkstudy.toolkit.probes.long_axis_probe(16384, channels=64); fp16, int8 w8a8
    on the quantized-only parts). rk3576 logs 14 such lines: a 14-bit field. The other targets log none
    for that conv up to 131072 frames (and rk3588, rk3566, rk3562 none in the [1, C, 1, T] form at 16384):
    no field limit a long conv axis meets, recorded as None (the 13-bit 0x1fff of
    rkstudy.graph.REGISTER_FIELD_MAX is met by other ops' fields, not by this probe).
    tests/test_board_targets.py rebuilds the probe for every target and checks its entry.

    `npu_cores`, `npu_clock_mhz` and `dram_gbps` are what the NPU cost model (rkstudy.toolkit.cost) reads of
    the SoC, each None until it is measured or read from a source, and `npu_sources` says where each comes
    from (or, for a None, how to measure it).
    """

    name: str                    # the toolkit's target_platform, the contract's target, the engine file's SoC
    chips: tuple[str, ...]       # device-tree chips (`rockchip,<chip>`) that are this target
    npu: str                     # its NPU: targets with the same NPU run one another's engines
    fp16: bool                   # the toolkit builds an fp16 engine for it (False: quantized builds only)
    register_field_bits: int | None
    npu_devfreq: str | None      # its NPU's devfreq node under /sys/class/devfreq (None: not recorded)
    all_order: int | None        # its place in `--target all` (0 first); None: `all` leaves it out
    studied: bool = False        # the family notebooks build and simulate every stage for it
    npu_cores: int | None = None
    npu_clock_mhz: float | None = None
    dram_gbps: float | None = None
    npu_sources: tuple[tuple[str, str], ...] = field(default=())   # (field, where its value comes from)

    def source(self, name: str) -> str:
        """Where the record's `name` (npu_cores, npu_clock_mhz, dram_gbps) comes from."""
        return dict(self.npu_sources).get(name, "")

    @property
    def in_all(self) -> bool:
        """`--target all` builds for it: one engine for every NPU a board run serves."""
        return self.all_order is not None


# The devfreq nodes are named by the NPU's unit address in the vendor kernel's device tree (rk3588.dtsi,
# rk3568.dtsi, rk3576.dtsi, rk3562.dtsi). rk3588 and rk3566 are the NPUs the RKNN decoder-path document
# moved its stages onto, so the family notebooks build for both; rk3568 carries rk3566's NPU, so `all`
# builds one engine for the two.
# The RV110x parts are MCU-class NPUs: the toolkit refuses an fp16 build for them ("not support
# do_quantization = False"), and rknn-toolkit-lite2 does not run on them, so no board run serves them
# (no device-tree chip is mapped to them, and `all` leaves them out).
_ZOO_CLOCK = ("airockchip/rknn_model_zoo scaling_frequency.sh: the NPU frequency Rockchip's benchmarks fix "
              "for this chip")
_ONE_CORE = "a single-core NPU: set_core_mask is refused there (rkstudy.board.dmesg; librknnrt's -13)"
_NO_DRAM = "no DRAM figure for this SoC here: measure one with `rkstudy board dram` on a board"
_NO_CLOCK = "no NPU clock figure for this SoC here (rknn_model_zoo fixes none for it)"
_NO_CORES = "no NPU core count for this SoC here"
_SINGLE = (("npu_cores", _ONE_CORE), ("npu_clock_mhz", _ZOO_CLOCK), ("dram_gbps", _NO_DRAM))
_MCU = (("npu_cores", _NO_CORES), ("npu_clock_mhz", _NO_CLOCK), ("dram_gbps", _NO_DRAM))
RK3588 = Target("rk3588", chips=("rk3588", "rk3588s"), npu="rk3588", fp16=True, register_field_bits=None,
                npu_devfreq="fdab0000.npu", all_order=0, studied=True,  # rk3588s: an rk3588 in a smaller package
                npu_cores=3, npu_clock_mhz=1000.0, dram_gbps=27.9, npu_sources=(
                    ("npu_cores", "the RKNN decoder-path document (Core0/Core1/Core2 in /sys/kernel/debug/rknpu/load)"),
                    ("npu_clock_mhz", "the RKNN decoder-path document (every board figure at the 1000 MHz OPP under "
                                      "rknpu_ondemand); " + _ZOO_CLOCK),
                    ("dram_gbps", "the RKNN decoder-path document: a DRAM read ceiling of 26.4-29.4 GB/s (STREAM "
                                  "triad, 4 A76 threads, 804 MB working set); the model takes the middle")))
RK3566 = Target("rk3566", chips=("rk3566",), npu="rk356x", fp16=True, register_field_bits=None,
                npu_devfreq="fde40000.npu", all_order=2, studied=True, npu_cores=1, npu_clock_mhz=1000.0,
                npu_sources=_SINGLE)
RK3568 = Target("rk3568", chips=("rk3568",), npu="rk356x", fp16=True, register_field_bits=None,
                npu_devfreq="fde40000.npu", all_order=None, npu_cores=1, npu_clock_mhz=1000.0, npu_sources=_SINGLE)
RK3576 = Target("rk3576", chips=("rk3576",), npu="rk3576", fp16=True, register_field_bits=14,
                npu_devfreq="27700000.npu", all_order=1, npu_cores=2, npu_clock_mhz=1000.0, npu_sources=(
                    ("npu_cores", "two cores: rknn-toolkit2 2.3.2's changelog gives RK3576 multi-core ops, and its "
                                  "core masks run to RKNN_NPU_CORE_0_1"),
                    ("npu_clock_mhz", _ZOO_CLOCK), ("dram_gbps", _NO_DRAM)))
RK3562 = Target("rk3562", chips=("rk3562",), npu="rk3562", fp16=True, register_field_bits=None,
                npu_devfreq="ff300000.npu", all_order=3, npu_cores=1, npu_clock_mhz=1000.0, npu_sources=_SINGLE)
RV1103 = Target("rv1103", chips=(), npu="rv1103", fp16=False, register_field_bits=None, npu_devfreq=None,
                all_order=None, npu_sources=_MCU)
RV1106 = Target("rv1106", chips=(), npu="rv1106", fp16=False, register_field_bits=None, npu_devfreq=None,
                all_order=None, npu_sources=_MCU)

RECORDS = (RK3588, RK3566, RK3568, RK3576, RK3562, RV1103, RV1106)
BY_NAME = {t.name: t for t in RECORDS}

# The names every list of targets is computed from the records as.
TARGETS = tuple(t.name for t in RECORDS)                              # every target the toolkit builds for
FP16_TARGETS = tuple(t.name for t in RECORDS if t.fp16)
QUANTIZED_ONLY = tuple(t.name for t in RECORDS if not t.fp16)
ALL_TARGETS = tuple(t.name for t in sorted((t for t in RECORDS if t.in_all), key=lambda t: t.all_order))
STUDIED_TARGETS = tuple(t.name for t in RECORDS if t.studied)
CHIP_TARGETS = {chip: t.name for t in RECORDS for chip in t.chips}   # device-tree chip -> target
# The boards a board run serves, as a message names them: one entry per NPU, in `--target all`'s order
# ("RK3588, RK3576, RK3566/RK3568, RK3562").
BOARD_SOCS = ", ".join("/".join(t.name.upper() for t in RECORDS if t.npu == BY_NAME[first].npu and t.chips)
                       for first in ALL_TARGETS)


def record(name: str | None) -> Target | None:
    """The record of target `name`, or None for a name the toolkit does not build for."""
    return BY_NAME.get(name or "")


def runs_engine_for(soc_name: str, target: str) -> bool:
    """Whether a board with this SoC runs an engine compiled for `target` (same chip, or same NPU)."""
    if soc_name == target:
        return True
    soc, built = record(soc_name), record(target)
    return soc is not None and built is not None and soc.npu == built.npu
