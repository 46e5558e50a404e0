"""What an engine would take on the NPU, before a board: a prediction from the compiler's own layer table
(host). No number here is a board number: each is a model's prediction, and it carries its terms.

A verbose build prints, for every compiled layer, the compiler's Cycles(DDR/NPU/Total) and RW(KB)
(rkstudy.toolkit.log.Layer). Convolutions and matrix products carry cycles; elementwise layers print 0
cycles and their bytes; CPU layers print zeros. The model adds six terms, each a column of the row:

    npu_ms_predicted = conv + dram + elementwise + dispatch + cpu + io      (milliseconds per call)

* conv: the NPU cycles of every layer that prints cycles, at the SoC's NPU clock, on one core. A
  multi-core mask is recorded and does not shorten the prediction: the RKNN decoder-path document saw
  the driver run these engines on one core under the AUTO mask and measured 1.8 % from the 0_1_2 mask
  on the Qwen3 vocoder stage, so the model does not assume the compiler splits a layer over cores.
* dram: what those layers wait for their bytes beyond their compute, per layer max(0, bytes at the NPU's
  memory rate - compute): a layer cannot finish before its reads and writes have moved.
* elementwise: NPU layers that print bytes but no cycles: their bytes at the NPU's memory rate.
* dispatch: a fixed cost per compute layer, NPU or CPU (calibrated): the runtime starts each layer.
* cpu: the CPU-fallback layers, each timed on this host's CPU at its shapes (onnxruntime on a one-node
  graph, one thread, the fastest of several runs), times the CPU factor (calibrated: the board's CPU time
  per ms of this host's).
* io: the graph's inputs and outputs, which the runtime converts on the CPU (fp32 <-> fp16 and the NPU's
  channel-blocked layout), timed here as a cast and a transposing copy, times the same CPU factor.

The NPU's memory rate is the SoC's DRAM bandwidth times a share (calibrated): the DRAM figure is a CPU
STREAM ceiling, and what the NPU's own layers reach of it is what the board figures say. The per-SoC
figures (NPU clock, cores, DRAM bandwidth) are in SOCS, each with its source. The free constants (the
DRAM share, dispatch, CPU factor) are fitted by rkstudy.levers.npu_cost on a third of the reference
documents' board figures and held to the rest (notebook 09). Where the model cannot speak (a SoC with no
DRAM figure, a table without the cost columns) the prediction says why and has no value; layers with
neither cycles nor bytes are counted and named in the row.
"""

from __future__ import annotations

import math
import platform
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from .log import IO_OPS, Layer

TERMS = ("conv", "dram", "elementwise", "dispatch", "cpu", "io")
PREDICTED_BY = "a prediction of rkstudy.toolkit.cost from the compiler's layer table (not a board number)"


# --- the SoCs ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Soc:
    """What the model needs of one SoC, each figure with where it comes from (None: not known here)."""

    name: str
    npu_cores: int | None
    npu_clock_mhz: float | None
    dram_gbps: float | None
    sources: Mapping[str, str] = field(default_factory=dict)


_ZOO_CLOCK = ("airockchip/rknn_model_zoo scaling_frequency.sh: the NPU frequency Rockchip's benchmarks fix "
              "for this chip")
_ONE_CORE = "a single-core NPU: set_core_mask is refused there (rkstudy.board.dmesg; librknnrt's -13)"
_NO_DRAM = "no DRAM figure for this SoC here: measure one with `rkstudy board dram` on a board"
SOCS = {
    "rk3588": Soc("rk3588", 3, 1000.0, 27.9, {
        "npu_cores": "the RKNN decoder-path document (Core0/Core1/Core2 in /sys/kernel/debug/rknpu/load)",
        "npu_clock_mhz": "the RKNN decoder-path document (every board figure at the 1000 MHz OPP under "
                         "rknpu_ondemand); " + _ZOO_CLOCK,
        "dram_gbps": "the RKNN decoder-path document: a DRAM read ceiling of 26.4-29.4 GB/s (STREAM triad, "
                     "4 A76 threads, 804 MB working set); the model takes the middle"}),
    "rk3576": Soc("rk3576", 2, 1000.0, None, {
        "npu_cores": "two cores: rknn-toolkit2 2.3.2's changelog gives RK3576 multi-core ops, and its core "
                     "masks run to RKNN_NPU_CORE_0_1", "npu_clock_mhz": _ZOO_CLOCK, "dram_gbps": _NO_DRAM}),
    "rk3566": Soc("rk3566", 1, 1000.0, None, {"npu_cores": _ONE_CORE, "npu_clock_mhz": _ZOO_CLOCK,
                                              "dram_gbps": _NO_DRAM}),
    "rk3568": Soc("rk3568", 1, 1000.0, None, {"npu_cores": _ONE_CORE, "npu_clock_mhz": _ZOO_CLOCK,
                                              "dram_gbps": _NO_DRAM}),
    "rk3562": Soc("rk3562", 1, 1000.0, None, {"npu_cores": _ONE_CORE, "npu_clock_mhz": _ZOO_CLOCK,
                                              "dram_gbps": _NO_DRAM}),
}
MASK_CORES = {"0_1_2": 3, "0_1": 2, "0": 1, "auto": 1}  # the runner's masks (rkstudy.board.runner.CORE_MASKS)


def soc_rows() -> list[dict]:
    """One row per SoC: its figures and their sources, for a reader to check."""
    return [{"soc": s.name, "npu_cores": s.npu_cores, "npu_clock_mhz": s.npu_clock_mhz, "dram_gbps": s.dram_gbps,
             **{f"{k}_source": v for k, v in s.sources.items()}} for s in SOCS.values()]


# --- the free constants -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Constants:
    """The model's free constants. `dram_share`: the share of the SoC's DRAM bandwidth at which the NPU's
    layers move their bytes; `dispatch_us`: microseconds per compute layer; `cpu_factor`: the board's CPU
    milliseconds per millisecond of this host's (one thread). `fitted_on` names the host and the figures
    they were fitted on."""

    dram_share: float
    dispatch_us: float
    cpu_factor: float
    fitted_on: str = ""

    def row(self) -> dict:
        return {"dram_share": self.dram_share, "dispatch_us": self.dispatch_us, "cpu_factor": self.cpu_factor}


# The constants rkstudy.levers.npu_cost fitted (notebook 09, full mode) on the host it names; what they were
# fitted from is recorded in tests/fixtures/npu_cost/fitted_inputs.json, and tests/test_cost.py fits it again.
# The dispatch cost sits at the fit's lower edge: the fitted figures need no time per layer beyond the terms.
CALIBRATED = Constants(dram_share=0.12798559299740675, dispatch_us=1.3252891798113608e-07,
                       cpu_factor=3.947569370811767,
                       fitted_on='AMD EPYC: kokoro-sin-cpu-ms, kokoro-clipped-generator-ms, encoder-n128-ms')


def host_cpu() -> str:
    """This host's CPU model, the one the CPU layers are timed on."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# --- the prediction ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Basis:
    """What a prediction is made of before the free constants: sums over the layer table (and this host's
    CPU timings), from which `Prediction.at` computes the terms for any constants."""

    conv_ms: float            # NPU cycles at the clock, one core
    dram_gbps: float          # the SoC's DRAM bandwidth (the memory rate is this times the DRAM share)
    elementwise_bytes: int    # NPU layers with bytes and no cycles
    compute_layers: int       # NPU and CPU layers (the I/O rows left out)
    cpu_host_ms: float        # CPU layers on this host
    io_host_ms: float         # input and output conversion on this host
    cycles: int = 0           # the compiler's Total column, summed
    npu_cycles: int = 0
    rw_bytes: int = 0
    conv_layers: int = 0      # NPU layers with cycles
    elementwise_layers: int = 0
    cpu_layers: int = 0
    cpu_host_by_op: tuple[tuple[str, float], ...] = ()   # (op, this host's ms) of the CPU layers, by op
    conv_costs: tuple[tuple[float, int], ...] = ()        # (compute ms, bytes) of each layer with cycles
    uncosted: tuple[str, ...] = ()   # NPU layers with neither cycles nor bytes, as 'Op:count'


@dataclass(frozen=True)
class Prediction:
    """A predicted NPU time per call of one engine on one SoC. `ms` is None where the model cannot speak
    (`cannot` says why); `terms` are its columns in ms; `row()` is the results-row fragment."""

    soc: str
    mask: str
    cores: int
    basis: Basis | None
    constants: Constants | None
    cannot: str = ""

    @property
    def terms(self) -> dict[str, float]:
        if self.basis is None or self.constants is None:
            return {}
        b, c = self.basis, self.constants
        per_ms = b.dram_gbps * c.dram_share * 1e6   # bytes per ms at the NPU's memory rate
        return {"conv": b.conv_ms, "dram": sum(max(0.0, n / per_ms - ms) for ms, n in b.conv_costs),
                "elementwise": b.elementwise_bytes / per_ms, "dispatch": b.compute_layers * c.dispatch_us / 1e3,
                "cpu": b.cpu_host_ms * c.cpu_factor, "io": b.io_host_ms * c.cpu_factor}

    @property
    def ms(self) -> float | None:
        return sum(self.terms.values()) if self.terms and not self.cannot else None

    @property
    def npu_ms(self) -> float | None:
        """The part the NPU itself spends (CPU layers and I/O conversion left out)."""
        t = self.terms
        return None if self.ms is None else t["conv"] + t["dram"] + t["elementwise"] + t["dispatch"]

    def at(self, constants: Constants) -> Prediction:
        """The same engine under other constants (the fit tries many without re-reading the table)."""
        return replace(self, constants=constants)

    def row(self) -> dict:
        """npu_ms_predicted and one npu_ms_<term> column per term, what the model assumed (SoC, mask, cores)
        and what it could not price; empty values and `npu_cost_note` where it cannot speak."""
        total = self.ms
        out = {"npu_ms_predicted": _round(total) if total is not None else ""}
        out.update({f"npu_ms_{k}": _round(self.terms[k]) if total is not None else "" for k in TERMS})
        b = self.basis
        out.update({"npu_soc": self.soc, "npu_mask": self.mask, "npu_cores": self.cores,
                    "npu_cycles": b.npu_cycles if b else "", "npu_rw_mb": round(b.rw_bytes / 1e6, 2) if b else "",
                    "npu_layers_uncosted": " ".join(b.uncosted) if b else "",
                    "npu_cost_note": self.cannot or PREDICTED_BY})
        return out


def _round(x: float) -> float:
    return round(x, 3) if abs(x) < 100 else round(x, 1)


def effective_cores(soc: Soc, mask: str) -> int | None:
    """The cores a mask gives on `soc` (a multi-core mask on a single-core SoC falls back to one, as the
    runner does); None where the SoC's core count is not known."""
    if mask not in MASK_CORES:
        from ..errors import UsageError

        raise UsageError(f"core mask {mask!r}: choose one of {', '.join(MASK_CORES)}")
    if MASK_CORES[mask] == 1:
        return 1
    return None if soc.npu_cores is None else min(MASK_CORES[mask], soc.npu_cores)


HostTimes = Callable[[Layer], float]


def predict(layers: Sequence[Layer], soc: str = "rk3588", cores: str = "0_1_2", *,
            constants: Constants | None = None, cpu_ms: HostTimes | Mapping[int, float] | None = None,
            io_ms: HostTimes | Mapping[int, float] | None = None, model=None) -> Prediction:
    """The predicted NPU time per call of the engine whose verbose build printed `layers`, on `soc` under the
    core mask `cores` ("0_1_2", "0_1", "0", "auto"), with `constants` (default: the calibrated ones).

    CPU layers are timed on this host (`host_layer_ms`, reading the node from `model`, the engine's ONNX,
    when given) unless `cpu_ms` gives their host times ({layer id: ms} or a function of the layer); the I/O
    rows likewise through `io_ms` (`host_io_ms`). A SoC with no clock or no DRAM figure, or a table
    without the cost columns, gives a prediction with no value that says why."""
    from ..errors import UsageError

    if soc not in SOCS:
        raise UsageError(f"no NPU cost figures for {soc!r}; SoCs: {', '.join(SOCS)}")
    s = SOCS[soc]
    constants = constants or CALIBRATED
    n = effective_cores(s, cores)
    missing = [what for what, v in (("NPU clock", s.npu_clock_mhz), ("DRAM bandwidth", s.dram_gbps),
                                    ("core count", n)) if v is None]
    costed = [x for x in layers if x.op not in IO_OPS]
    if not costed or any(x.cycles is None for x in costed):
        missing.append("Cycles and RW columns in the layer table (a verbose build prints them)")
    if missing:
        how = f" ({s.sources['dram_gbps']})" if s.dram_gbps is None else ""
        return Prediction(soc, cores, n or 0, None, constants,
                          cannot=f"cannot speak for {soc}: no {', no '.join(missing)}{how}")
    cpu_time = _times(cpu_ms, _timer(model))
    io_time = _times(io_ms, host_io_ms)
    hz = s.npu_clock_mhz * 1e3   # cycles per ms
    convs = []
    elementwise, kinds, cpu_host, uncosted = 0, Counter(), Counter(), Counter()
    for x in costed:
        if x.target == "CPU":
            cpu_host[x.op] += cpu_time(x)
            kinds["cpu"] += 1
        elif x.npu_cycles or x.cycles:
            convs.append((x.npu_cycles / hz, x.rw_bytes))
            kinds["conv"] += 1
        elif x.rw_kb:
            elementwise += x.rw_bytes
            kinds["elementwise"] += 1
        else:
            uncosted[x.op] += 1
    io_host = sum(io_time(x) for x in layers if x.op in IO_OPS)
    basis = Basis(conv_ms=sum(ms for ms, _ in convs), dram_gbps=s.dram_gbps, elementwise_bytes=elementwise,
                  compute_layers=len(costed), conv_costs=tuple(convs),
                  cpu_host_ms=sum(cpu_host.values()), io_host_ms=io_host, cycles=sum(x.cycles for x in costed),
                  npu_cycles=sum(x.npu_cycles for x in costed), rw_bytes=sum(x.rw_bytes or 0 for x in layers),
                  conv_layers=kinds["conv"], elementwise_layers=kinds["elementwise"], cpu_layers=kinds["cpu"],
                  cpu_host_by_op=tuple(sorted(cpu_host.items())),
                  uncosted=tuple(f"{op}:{k}" for op, k in sorted(uncosted.items())))
    return Prediction(soc, cores, n, basis, constants)


def for_build(report, cores: str = "0_1_2", *, model=None, constants: Constants | None = None) -> Prediction:
    """The prediction for the engine a build made (a rkstudy.toolkit.build.BuildReport), on the SoC it was built
    for, from the layer table in its log. A build that was not verbose printed no table: the prediction then
    says so (build with verbose=True; the cache serves a verbose build's record only to a verbose request)."""
    from pathlib import Path

    from .log import layer_table, strip_ansi

    text = Path(report.log).read_text(encoding="utf-8", errors="replace") if report.log else ""
    layers = layer_table(strip_ansi(text))
    return predict(layers, report.target, cores, constants=constants, model=model)


def _times(given, default: HostTimes) -> HostTimes:
    if given is None:
        return default
    if callable(given):
        return given
    return lambda x: float(given[x.id])


# --- this host's CPU, at a layer's shapes -----------------------------------------------------------
UNARY = {"Sin", "Cos", "Floor", "Ceil", "Exp", "Log", "Sqrt", "Reciprocal", "Neg", "Abs", "Tanh", "Sigmoid", "Erf",
         "Round", "Sign", "Relu"}
BINARY = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"}


def shapes(column: str) -> list[tuple[int, ...]]:
    """The shapes of a layer-table shape column, '(1,16,1,64),(16,16,1,7),(16)' -> three tuples ('\\' and
    '...' give none)."""
    import re

    return [tuple(int(d) for d in m.split(",") if d) for m in re.findall(r"\(([0-9,]*)\)", column)]


def fastest_ms(run: Callable[[], object], budget_s: float = 0.2, least: int = 5, most: int = 200) -> float:
    """The fastest wall time of `run()` in ms, after one warm-up call, over at least `least` calls and until
    `budget_s` has passed (at most `most` calls): on a shared host other work only ever adds time, so the
    fastest call is the one nearest the op's own cost."""
    run()
    times, start = [], time.perf_counter()
    while len(times) < least or (time.perf_counter() - start < budget_s and len(times) < most):
        t = time.perf_counter()
        run()
        times.append(time.perf_counter() - t)
    return float(np.min(times)) * 1e3


def host_session(model):
    """An onnxruntime session of `model` (a ModelProto or its bytes) on one thread of this host: the board
    runs a CPU layer on one core."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    data = model if isinstance(model, bytes) else model.SerializeToString()
    return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])


_timed: dict[tuple, tuple[float, str]] = {}   # one timing per op, shapes and node: repeats cost nothing


def _timer(model) -> HostTimes:
    """This host's ms per CPU layer, reading nodes from `model` (indexed once, when a layer first needs it)."""
    index = []

    def ms(layer: Layer) -> float:
        if model is not None and not index:
            from ..graph.index import Index

            index.append(Index.inferred(model))
        return layer_timing(layer, index[0] if index else None)[0]
    return ms


def layer_timing(layer: Layer, index=None) -> tuple[float, str]:
    """(ms on this host, how it was timed) for one CPU layer: its own ONNX node from the graph's `index`
    (rkstudy.graph.index.Index) when the graph has it with static shapes, else its op at the table's printed
    shapes (attribute-free elementwise ops), else a copy of its output (a layout change: what a
    compiler-made Reshape or pad does)."""
    from ..graph import index as gindex

    found = _node(index, layer) if index is not None else None
    key = (layer.op, layer.inputs, layer.output, found[0].SerializeToString() if found else b"")
    if key in _timed:
        return _timed[key]
    rng = np.random.default_rng(0)
    if found:
        node, feeds, consts, opset, types = found
        m = gindex.nodes_model([node], feeds, [o for o in node.output if o], consts, opset_imports=opset,
                               output_types=types)
        how = "its ONNX node"
    elif layer.op in UNARY | BINARY and shapes(layer.inputs):
        ins = shapes(layer.inputs)[: 1 if layer.op in UNARY else 2]
        feeds = {f"x{i}": rng.uniform(0.5, 1.5, s).astype(np.float32) for i, s in enumerate(ins)}
        from onnx import helper

        node = helper.make_node(layer.op, list(feeds), ["y"])
        m = gindex.nodes_model([node], feeds, ["y"], opset_imports=[helper.make_opsetid("", 17)])
        how = "its op at the printed shapes"
    else:
        out = (shapes(layer.output) or shapes(layer.inputs) or [(1,)])[0]
        src = np.ones(out, np.float32)
        dst = np.empty_like(src)
        result = (fastest_ms(lambda: np.copyto(dst, src)), "a copy of its output")
        _timed[key] = result
        return result
    sess = host_session(m)
    result = (fastest_ms(lambda: sess.run(None, feeds)), how)
    _timed[key] = result
    return result


def _node(index, layer: Layer):
    """(node, feeds, constants, opset, output types) to time `layer`'s own node, or None."""
    node = next((n for n in index.nodes if n.name == layer.node), None)
    if node is None:
        return None
    feeds, consts = {}, {}
    for t in node.input:
        if not t:
            continue
        if index.is_const(t):
            consts[t] = index.constants[t]
            continue
        shape = index.static_shape(t)
        if shape is None:
            return None
        dtype = np.float32 if index.elem_types.get(t, 1) == 1 else np.int64
        feeds[t] = (np.random.default_rng(0).uniform(0.5, 1.5, shape).astype(dtype) if dtype == np.float32
                    else np.zeros(shape, dtype))
    types = {o: index.elem_types.get(o, 1) for o in node.output if o}
    return node, feeds, consts, index.model.opset_import, types


def host_io_ms(layer: Layer) -> float:
    """This host's time to convert one graph input or output as the runtime does on the CPU: a cast
    between fp32 and fp16 and a transposing copy of the tensor (NCHW <-> channel-blocked)."""
    shape = (shapes(layer.output) if layer.op == "InputOperator" else shapes(layer.inputs) or [()])
    dims = shape[0] if shape else ()
    n = int(np.prod(dims)) if dims else 0
    if n == 0:
        return 0.0
    x = np.ones(n, np.float32)
    c = dims[1] if len(dims) >= 3 else 1
    rest = n // c

    def convert():
        return np.ascontiguousarray(x.astype(np.float16).reshape(c, rest).T)

    return fastest_ms(convert)


# --- the fit ----------------------------------------------------------------------------------------
def fit(residuals: Callable[[Constants], Sequence[float]], start: Constants, fitted_on: str = "") -> Constants:
    """The constants that minimise the squared `residuals` (each a fitted figure's log error: predicted
    over theirs), all positive (fitted in log space)."""
    from scipy.optimize import least_squares

    def make(v: np.ndarray) -> Constants:
        share, d, f = np.exp(v)
        return Constants(float(share), float(d), float(f), fitted_on)

    x0 = np.log([start.dram_share, start.dispatch_us, start.cpu_factor])
    best = least_squares(lambda v: np.asarray(residuals(make(v)), float), x0)
    return make(best.x)


def relative_error(predicted: float, theirs: Iterable[float]) -> float:
    """(predicted - theirs) / theirs, against the nearer end of a range (0 inside it)."""
    values = [float(v) for v in theirs]
    lo, hi = min(values), max(values)
    if lo <= predicted <= hi:
        return 0.0
    end = lo if predicted < lo else hi
    return (predicted - end) / end if end else math.inf
