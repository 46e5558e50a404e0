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
  graph, one thread; `fastest_of`: the fastest call over rounds spread across seconds, each op and shape
  timed once per process), times the CPU factor (calibrated: the board's CPU time per ms of this host's).
* io: the graph's inputs and outputs, which the runtime converts on the CPU (fp32 <-> fp16 and the NPU's
  channel-blocked layout), timed here as a cast and a transposing copy, times the same CPU factor.

The NPU's memory rate is the SoC's DRAM bandwidth times a share (calibrated): the DRAM figure is a CPU
STREAM ceiling, and what the NPU's own layers reach of it is what the board figures say. The per-SoC
figures (NPU clock, cores, DRAM bandwidth) are fields of the SoC's record in rkstudy.targets, each with its
source. The free constants (the DRAM share, dispatch, CPU factor) are fitted by rkstudy.levers.npu_cost on a
third of the reference documents' board figures and held to the rest (notebook 09); CALIBRATED is that fit
of the inputs recorded in data/npu_cost/fitted_inputs.json, and every prediction here uses it. Where the
model cannot speak (a SoC with no DRAM figure, a table without the cost columns, a build that made no
engine) the prediction says why and has no value; layers with neither cycles nor bytes are counted and
named in the row.
"""

from __future__ import annotations

import math
import platform
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..paths import DATA
from .log import IO_OPS, Layer

TERMS = ("conv", "dram", "elementwise", "dispatch", "cpu", "io")
PREDICTED_BY = "a prediction of rkstudy.toolkit.cost from the compiler's layer table (not a board number)"


# --- the SoCs ---------------------------------------------------------------------------------------
COST_FIELDS = ("npu_cores", "npu_clock_mhz", "dram_gbps")   # what the model reads of a SoC's record
MASK_CORES = {"0_1_2": 3, "0_1": 2, "0": 1, "auto": 1}  # the runner's masks (rkstudy.board.runner.CORE_MASKS)


def soc_record(name: str):
    """The SoC record (rkstudy.targets.Target) the model reads `npu_cores`, `npu_clock_mhz` and `dram_gbps`
    from; a name the toolkit does not build for is a usage error."""
    from ..errors import UsageError
    from ..targets import TARGETS, record

    found = record(name)
    if found is None:
        raise UsageError(f"no NPU cost figures for {name!r}; SoCs: {', '.join(TARGETS)}")
    return found


def soc_rows() -> list[dict]:
    """One row per SoC: the figures the model reads and their sources, for a reader to check."""
    from ..targets import RECORDS

    return [{"soc": t.name, **{k: getattr(t, k) for k in COST_FIELDS},
             **{f"{k}_source": t.source(k) for k in COST_FIELDS}} for t in RECORDS]


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


# What the committed constants were fitted from (rkstudy.levers.npu_cost.record_fitted: the fitted engines'
# layer-table sums and the calibration host's CPU timings, the fitted figures' board CPU time, and the constants
# of the reruns that measured how far the timings move them), with the constants that fit gives. notebook 09
# fits them again from this file and shows them; tests/test_cost.py does the same.
FITTED_INPUTS = DATA / "npu_cost" / "fitted_inputs.json"


def calibrated(path: Path | str = FITTED_INPUTS) -> Constants | None:
    """The constants a record of rkstudy.levers.npu_cost.record_fitted holds (None when there is none)."""
    import json

    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    return Constants(**record["constants"], fitted_on=record["fitted_on"])


# Every prediction's constants unless a caller passes others. The dispatch cost sits at the fit's lower edge: the
# fitted figures need no time per layer beyond the other terms.
CALIBRATED = calibrated()


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


def unpredicted_row(why: str) -> dict:
    """The columns of Prediction.row() with no values, and why: a row with no engine behind it keeps the
    columns of its table's other rows."""
    return {**{k: "" for k in Prediction("", "", 0, None, None).row()}, "npu_cost_note": f"cannot speak: {why}"}


def _round(x: float) -> float:
    return round(x, 3) if abs(x) < 100 else round(x, 1)


def effective_cores(record, mask: str) -> int | None:
    """The cores a mask gives on the SoC of `record` (a multi-core mask on a single-core SoC falls back to one,
    as the runner does); None where the SoC's core count is not known."""
    if mask not in MASK_CORES:
        from ..errors import UsageError

        raise UsageError(f"core mask {mask!r}: choose one of {', '.join(MASK_CORES)}")
    if MASK_CORES[mask] == 1:
        return 1
    return None if record.npu_cores is None else min(MASK_CORES[mask], record.npu_cores)


HostTimes = Callable[[Layer], float]


def predict(layers: Sequence[Layer], soc: str = "rk3588", cores: str = "0_1_2", *,
            constants: Constants | None = None, cpu_ms: HostTimes | Mapping[int, float] | None = None,
            io_ms: HostTimes | Mapping[int, float] | None = None, model=None) -> Prediction:
    """The predicted NPU time per call of the engine whose verbose build printed `layers`, on `soc` under the
    core mask `cores` ("0_1_2", "0_1", "0", "auto"), with `constants` (default: the calibrated ones).

    CPU layers and the I/O rows are timed on this host (`host_times`, reading CPU layers' nodes from
    `model`, the engine's ONNX (a path or a ModelProto), when given) unless `cpu_ms` / `io_ms` give their host
    times ({layer id: ms} or a function of the layer). A SoC with no clock or no DRAM figure, or a table
    without the cost columns, gives a prediction with no value that says why."""
    s = soc_record(soc)
    constants = constants or CALIBRATED
    n = effective_cores(s, cores)
    missing = [what for what, v in (("NPU clock", s.npu_clock_mhz), ("DRAM bandwidth", s.dram_gbps),
                                    ("core count", n)) if v is None]
    costed = [x for x in layers if x.op not in IO_OPS]
    if not costed or any(x.cycles is None for x in costed):
        missing.append("Cycles and RW columns in the layer table (a verbose build prints them)")
    if missing:
        how = f" ({s.source('dram_gbps')})" if s.dram_gbps is None else ""
        return Prediction(soc, cores, n or 0, None, constants,
                          cannot=f"cannot speak for {soc}: no {', no '.join(missing)}{how}")
    cpu, io = host_layers(layers)
    timed = host_times((cpu if cpu_ms is None else []) + (io if io_ms is None else []), model)
    cpu_time = _times(cpu_ms, lambda x: timed[x.id][0])
    io_time = _times(io_ms, lambda x: timed[x.id][0])
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
    io_host = sum(io_time(x) for x in io)
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
    for, from the layer table in its log; its CPU layers' nodes are read from `model`, default the graph the
    build compiled (report.onnx, when it is still there). A build that made no engine, or was not verbose (no
    table), gives a prediction that says so."""
    from pathlib import Path

    from .log import layer_table, strip_ansi

    if getattr(report, "status", "ok") != "ok":
        return Prediction(report.target, cores, 0, None, constants or CALIBRATED,
                          cannot=f"cannot speak: the build {report.status} and made no engine")
    path = Path(report.log) if report.log else None
    text = path.read_text(encoding="utf-8", errors="replace") if path and path.is_file() else ""
    layers = layer_table(strip_ansi(text))
    if model is None and getattr(report, "onnx", None) and Path(report.onnx).is_file():
        model = report.onnx
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
# How this host is timed (`fastest_of`). This shared host has slow spells: under other tenants' load the same
# Sin call runs ~1.45x slower for about a second, every few seconds, and a burst of calls that falls inside one
# gives a slow fastest call (the CPU factor fitted from such timings ranged 3.9 to 5.7). So every op is timed
# in ROUNDS short rounds interleaved with the others', spread over at least SPAN_S seconds, and the fastest
# call over all rounds is kept.
ROUNDS = 9
SPAN_S = 3.0
ROUND_CALLS, ROUND_S = 3, 0.01   # each round calls each op at least this many times and this long


def shapes(column: str) -> list[tuple[int, ...]]:
    """The shapes of a layer-table shape column, '(1,16,1,64),(16,16,1,7),(16)' -> three tuples ('\\' and
    '...' give none)."""
    import re

    return [tuple(int(d) for d in m.split(",") if d) for m in re.findall(r"\(([0-9,]*)\)", column)]


def fastest_of(runs: Mapping, rounds: int = ROUNDS, span_s: float = SPAN_S) -> dict:
    """The fastest wall time in ms of each of `runs` ({key: a call}): each is called once to warm up, then
    `rounds` rounds call every one in turn (at least ROUND_CALLS calls and ROUND_S seconds each), the rounds
    spread over at least `span_s` seconds (sleeping between them when they are quicker). On a shared host
    other work only ever adds time, and it comes in spells: the fastest call of bursts spread across seconds
    is the one nearest the op's own cost."""
    best = {k: math.inf for k in runs}
    if not runs:
        return {}
    for run in runs.values():
        run()
    start = time.perf_counter()
    for r in range(rounds):
        for k, run in runs.items():
            calls, began = 0, time.perf_counter()
            while calls < ROUND_CALLS or time.perf_counter() - began < ROUND_S:
                t = time.perf_counter()
                run()
                best[k] = min(best[k], time.perf_counter() - t)
                calls += 1
        due = start + span_s * (r + 1) / rounds   # the next round starts no earlier than its share of the span
        if r + 1 < rounds and time.perf_counter() < due:
            time.sleep(due - time.perf_counter())
    return {k: v * 1e3 for k, v in best.items()}


def host_session(model):
    """An onnxruntime session of `model` (a ModelProto or its bytes) on one thread of this host: the board
    runs a CPU layer on one core."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    data = model if isinstance(model, bytes) else model.SerializeToString()
    return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])


_timed: dict[tuple, tuple[float, str]] = {}   # one timing per op, shapes and attributes per process


def host_times(layers: Sequence[Layer], model=None) -> dict[int, tuple[float, str]]:
    """{layer id: (ms on this host, how it was timed)} for CPU layers and I/O rows of one table. Layers that
    do the same work (op, attributes, input shapes and constants) are timed once per process: the engines of
    one study share most of them. What is not timed yet is timed together (`fastest_of`)."""
    index = _index(model) if model is not None and any(x.op not in IO_OPS for x in layers) else None
    nodes = {n.name: n for n in index.nodes} if index is not None else {}
    jobs, keys = {}, {}
    for x in layers:
        key, how, make = _job(x, index, nodes)
        keys[x.id] = key
        if key not in _timed and key not in jobs:
            jobs[key] = (how, make)
    if jobs:
        runs = {k: make() for k, (_, make) in jobs.items()}
        for k, ms in fastest_of(runs).items():
            _timed[k] = (ms, jobs[k][0])
    return {i: _timed[k] for i, k in keys.items()}


def host_layers(layers: Sequence[Layer]) -> tuple[list[Layer], list[Layer]]:
    """The rows of a layer table that are timed on this host: its CPU layers and its I/O rows."""
    return ([x for x in layers if x.op not in IO_OPS and x.target == "CPU"], [x for x in layers if x.op in IO_OPS])


def time_together(tables: Sequence[tuple[Sequence[Layer], object]], timings: int = 1
                  ) -> tuple[dict[tuple, tuple[float, str]], dict[tuple, float]]:
    """Time the host rows (host_layers) of several engines' tables ((layers, model) as `predict` takes them) in
    one interleaved run, `timings` times over. Engines whose figures are compared (a difference of two windows'
    calls) are then timed under the same load, op beside op, rather than one engine's ops in one spell of this
    shared host and the other's in the next; two runs of notebook 09 that timed each engine apart moved the CPU
    term of the W = 136 saving from -350 to +76 ms. Returns each work's fastest time over the timings (with how
    it was timed), which it leaves in use for the process's predictions, and its slowest: the spread a verdict
    resting on these times must survive (rkstudy.levers.npu_cost.rows)."""
    jobs = {}
    for layers, model in tables:
        cpu, io = host_layers(layers)
        index = _index(model) if model is not None and cpu else None
        nodes = {n.name: n for n in index.nodes} if index is not None else {}
        for x in cpu + io:
            key, how, make = _job(x, index, nodes)
            jobs.setdefault(key, (how, make))
    runs = {k: make() for k, (_, make) in jobs.items()}
    fastest, slowest = {}, {}
    for _ in range(timings):
        for k, ms in fastest_of(runs).items():
            fastest[k] = min(fastest.get(k, math.inf), ms)
            slowest[k] = max(slowest.get(k, 0.0), ms)
    use_timings({k: (ms, jobs[k][0]) for k, ms in fastest.items()})
    return dict(_timed), slowest


def layer_timing(layer: Layer, model=None) -> tuple[float, str]:
    """(ms on this host, how it was timed) for one CPU layer or I/O row (`host_times`)."""
    return host_times([layer], model)[layer.id]


def forget_timings() -> None:
    """Forget this process's host timings: the next prediction times its CPU layers and I/O again."""
    _timed.clear()


def timings() -> dict[tuple, tuple[float, str]]:
    """This process's host timings so far, by the work's key (host_times)."""
    return dict(_timed)


def use_timings(timed: Mapping[tuple, tuple[float, str]]) -> None:
    """Predict from these host timings (a calibration's fastest over its reruns) instead of this process's."""
    _timed.clear()
    _timed.update(timed)


def _index(model):
    """The shape-inferred index of `model` (a path, a ModelProto, or already an Index), the CPU layers' nodes
    read from it."""
    from .. import graph
    from ..graph.index import Index

    if isinstance(model, Index):
        return model
    return Index.inferred(graph.load(model) if isinstance(model, (str, Path)) else model)


def _job(layer: Layer, index, nodes: Mapping) -> tuple[tuple, str, Callable[[], Callable[[], object]]]:
    """(the work's key, how it is timed, a maker of the call to time) for one layer: an I/O row's conversion
    (`io_call`); a CPU layer's own ONNX node from the graph's `index` (`nodes`: its nodes by name) when the graph
    has it with static
    shapes, else its op at the table's printed shapes (attribute-free elementwise ops), else a copy of its
    output (a layout change: what a compiler-made Reshape or pad does)."""
    if layer.op in IO_OPS:
        dims = _io_dims(layer)
        return ("io", dims), "a cast and a transposing copy", lambda: io_call(dims)
    found = _node(index, nodes, layer) if index is not None else None
    if found:
        node, feeds, consts, opset, types = found
        sig = (node.op_type, b"".join(a.SerializeToString() for a in node.attribute),
               tuple((n in consts, _array_key(consts[n]) if n in consts else (feeds[n].shape, str(feeds[n].dtype)))
                     for n in node.input if n))

        def make():
            from ..graph import index as gindex

            m = gindex.nodes_model([node], feeds, [o for o in node.output if o], consts, opset_imports=opset,
                                   output_types=types)
            return _session_call(m, feeds)
        return ("node", sig), "its ONNX node", make
    if layer.op in UNARY | BINARY and shapes(layer.inputs):
        ins = tuple(shapes(layer.inputs)[: 1 if layer.op in UNARY else 2])

        def make():
            from onnx import helper

            from ..graph import index as gindex

            rng = np.random.default_rng(0)
            feeds = {f"x{i}": rng.uniform(0.5, 1.5, s).astype(np.float32) for i, s in enumerate(ins)}
            node = helper.make_node(layer.op, list(feeds), ["y"])
            m = gindex.nodes_model([node], feeds, ["y"], opset_imports=[helper.make_opsetid("", 17)])
            return _session_call(m, feeds)
        return ("op", layer.op, ins), "its op at the printed shapes", make
    out = (shapes(layer.output) or shapes(layer.inputs) or [(1,)])[0]

    def make():
        src = np.ones(out, np.float32)
        dst = np.empty_like(src)
        return lambda: np.copyto(dst, src)
    return ("copy", out), "a copy of its output", make


def _array_key(a: np.ndarray) -> tuple:
    """A constant input as a timing key: its shape, dtype and a digest of its values (a Slice's bounds or a
    Reshape's target change the work)."""
    import hashlib

    a = np.ascontiguousarray(a)
    return a.shape, str(a.dtype), hashlib.sha256(a.tobytes()).hexdigest()[:16]


def _session_call(model, feeds) -> Callable[[], object]:
    sess = host_session(model)
    return lambda: sess.run(None, feeds)


def _node(index, nodes: Mapping, layer: Layer):
    """(node, feeds, constants, opset, output types) to time `layer`'s own node (`nodes`: the index's nodes by
    name), or None."""
    node = nodes.get(layer.node)
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


def _io_dims(layer: Layer) -> tuple[int, ...]:
    shape = shapes(layer.output) if layer.op == "InputOperator" else shapes(layer.inputs)
    return shape[0] if shape else ()


def io_call(dims: Sequence[int]) -> Callable[[], object]:
    """What the runtime does on the CPU to one graph input or output of shape `dims`: a cast between fp32 and
    fp16 and a transposing copy of the tensor (NCHW <-> channel-blocked)."""
    n = int(np.prod(dims)) if dims else 0
    if n == 0:
        return lambda: None
    x = np.ones(n, np.float32)
    c = dims[1] if len(dims) >= 3 else 1
    rest = n // c
    return lambda: np.ascontiguousarray(x.astype(np.float16).reshape(c, rest).T)


def host_io_ms(layer: Layer) -> float:
    """This host's time to convert one graph input or output as the runtime does on the CPU (`io_call`)."""
    return layer_timing(layer)[0]


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
