"""The delay map of a convolutional graph: every tensor's rate and delay, every read's history.

Why: a graph built from 1-D convolutions, transposed convolutions and time-local ops (pointwise
maths, channel splits and concats) can be run step by step on chunks of its input with no
recomputed context, if every tensor is produced late enough that the samples it needs from its
inputs already exist. Walking the graph in topological order gives each tensor T

* a rate r(T): samples per input frame (1 for the graph's time inputs, x stride after a
  transposed conv),
* a delay d(T): how many of its own samples it lags the input, so that a step over input
  frames [kE, (k+1)E) produces T at positions [kE r - d, (k+1)E r - d).

A Conv emits with the delay of its input plus its right half-kernel (right pad): the last
output it can finish needs `pad_right` input samples past it. A ConvTranspose with stride s and
begin pad p emits at s x d_in + p. A multi-input time-local op emits at the largest delay of
its inputs; the less delayed inputs are read through a delay line. Every read of a tensor is
therefore a window over [history, chunk] that reaches `back` samples before the current chunk;
the history a tensor must keep between steps is the largest `back` of its readers. The delay of
the graph output is the lookahead of the whole step.

This is the minimal (as-soon-as-possible) schedule: no tensor is delayed more than its inputs
force, so the output delay equals the reach of the graph's right receptive field.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from math import ceil

import numpy as np
import onnx
from onnx import helper

from ..errors import InputError
from .index import Index


class NotStreamable(InputError):
    """The graph has an op that mixes time steps in a way a causal cache cannot reproduce (the
    message names the node)."""


# Ops that compute each time step from the same time step of their inputs (numpy broadcasting).
POINTWISE = frozenset((
    "Abs", "Add", "And", "Cast", "Ceil", "Clip", "Cos", "Div", "Elu", "Equal", "Erf", "Exp",
    "Floor", "Gelu", "Greater", "HardSigmoid", "HardSwish", "Identity", "LeakyRelu", "Less", "Log",
    "Max", "Mean", "Min", "Mish", "Mul", "Neg", "Not", "Or", "Pow", "PRelu", "Reciprocal", "Relu",
    "Round", "Selu", "Sigmoid", "Sign", "Sin", "Softplus", "Softsign", "Sqrt", "Sub", "Sum", "Tanh",
    "Where",
))
# Ops that are time-local as long as the axis they act on is not the time axis (the last one).
AXIS_ATTR_OPS = {"Concat": None, "Split": 0, "Softmax": -1, "LogSoftmax": -1, "Gather": 0}
REDUCE_OPS = frozenset(("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2"))
CONV_OPS = frozenset(("Conv", "ConvTranspose"))
# Ops that read the whole time axis whatever their attributes, and what they do with it.
GLOBAL_OVER_TIME = {"InstanceNormalization": "normalises each channel by its mean and variance over all frames",
                    "GlobalAveragePool": "averages over all frames",
                    "GlobalMaxPool": "takes the maximum over all frames"}


@dataclass(frozen=True)
class Timing:
    """A time-carrying tensor: `rate` samples per input frame, `delay` in its own samples."""

    rate: int
    delay: int


@dataclass(frozen=True)
class Read:
    """One node input reading a time-carrying tensor.

    The node reads the window that starts `back` samples before the tensor's current chunk and
    is `extra` samples longer than the chunk: a Conv reads its whole receptive field
    (back = extra = kernel span - 1), a delay line reads a chunk shifted by `back` (extra 0).
    """

    node: str
    index: int
    tensor: str
    back: int
    extra: int


@dataclass(frozen=True)
class ConvPlan:
    """A Conv or ConvTranspose of the graph, as the stepwise schedule runs it."""

    node: str
    op: str
    rate_in: int
    rate_out: int
    delay_in: int
    delay_out: int
    kernel: int          # taps
    dilation: int
    stride: int
    pad_left: int        # Conv: pads; ConvTranspose: begin pad / end pad of its full output
    pad_right: int
    channels_in: int
    channels_out: int
    group: int
    history: int         # input samples this op needs from earlier steps


@dataclass
class DelayMap:
    """Rates and delays of a graph's time-carrying tensors, and how each node reads them."""

    time_inputs: tuple[str, ...]
    timing: dict[str, Timing]
    reads: list[Read]
    convs: list[ConvPlan]
    outputs: dict[str, Timing]
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # leading dims / static shapes

    def history(self) -> dict[str, int]:
        """Samples each tensor keeps between steps: the furthest any reader reaches back."""
        out: dict[str, int] = {}
        for r in self.reads:
            out[r.tensor] = max(out.get(r.tensor, 0), r.back)
        return {t: h for t, h in out.items() if h > 0}

    @property
    def output_delay(self) -> int:
        """Delay of the (aligned) graph outputs in output samples."""
        return max(t.delay for t in self.outputs.values())

    @property
    def output_rate(self) -> int:
        rates = {t.rate for t in self.outputs.values()}
        if len(rates) != 1:
            raise NotStreamable(f"graph outputs run at different rates {sorted(rates)}")
        return rates.pop()

    @property
    def lookahead_frames(self) -> float:
        return self.output_delay / self.output_rate


# --- graph facts ------------------------------------------------------------------------------

def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _norm(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def _rank(shapes, name: str, node: onnx.NodeProto) -> int:
    if name not in shapes:
        raise NotStreamable(f"{node.op_type} {node.name!r}: no shape for {name!r}; pin the graph's input "
                            "shapes (rkstudy.graph.pin_shapes) before building its delay map")
    return len(shapes[name])


def _check_time_local(node: onnx.NodeProto, shapes, consts, time_ins: list[str]) -> None:
    """Raise unless `node` treats every time step on its own (the time axis is the last one)."""
    op, a = node.op_type, _attrs(node)
    rank = _rank(shapes, time_ins[0], node)
    where = f"{op} {node.name!r}"
    if op in POINTWISE:
        return
    if op in AXIS_ATTR_OPS:
        axis = a.get("axis", AXIS_ATTR_OPS[op])
        if axis is None:
            raise NotStreamable(f"{where} has no axis")
        if _norm(axis, rank) == rank - 1:
            raise NotStreamable(f"{where} acts on the time axis (axis {axis}); only channel-axis "
                                f"{op} can be streamed")
        if op == "Gather" and node.input[0] not in time_ins:
            raise NotStreamable(f"{where} gathers a constant by time-carrying indices")
        return
    if op == "Slice":
        starts = consts.get(node.input[1])
        axes = consts.get(node.input[3]) if len(node.input) > 3 and node.input[3] else None
        if starts is None or (len(node.input) > 3 and node.input[3] and axes is None):
            raise NotStreamable(f"{where} has computed starts/axes; fold the graph first")
        axes = list(range(len(starts))) if axes is None else axes.tolist()
        if rank - 1 in {_norm(x, rank) for x in axes}:
            raise NotStreamable(f"{where} slices the time axis; a stepwise graph cannot crop time")
        return
    if op in ("Unsqueeze", "Squeeze"):
        axes = a.get("axes")
        if axes is None and len(node.input) > 1:
            axes = consts.get(node.input[1])
            if axes is None:
                raise NotStreamable(f"{where} has computed axes; fold the graph first")
            axes = axes.tolist()
        if axes is None:  # Squeeze of every 1-dim: fine unless time has length 1 somewhere, refuse
            raise NotStreamable(f"{where} squeezes every unit axis; give it explicit axes")
        out_rank = rank + len(axes) if op == "Unsqueeze" else rank - len(axes)
        last = out_rank - 1 if op == "Unsqueeze" else rank - 1
        if last in {_norm(x, out_rank if op == "Unsqueeze" else rank) for x in axes}:
            raise NotStreamable(f"{where} moves the time axis off the last position")
        return
    if op == "Transpose":
        perm = a.get("perm")
        if perm is None or perm[-1] != rank - 1:
            raise NotStreamable(f"{where} moves the time axis; the delay map assumes time is the last axis")
        return
    if op in REDUCE_OPS:
        axes = a.get("axes")
        if axes is None and len(node.input) > 1 and node.input[1]:
            axes = consts.get(node.input[1])
            axes = None if axes is None else axes.tolist()
        if not axes or rank - 1 in {_norm(x, rank) for x in axes} or not a.get("keepdims", 1):
            raise NotStreamable(f"{where} reduces over time (a global reduction); it has no stepwise form")
        return
    if op in GLOBAL_OVER_TIME:
        raise NotStreamable(f"{where} {GLOBAL_OVER_TIME[op]} (a global reduction over time); no step can "
                            "stream it, every output frame waits for the whole utterance")
    raise NotStreamable(f"{where}: no streaming rule for this op; it is not a conv, a pointwise op or a "
                        "channel split/concat (add a rule in delays.py if it is time-local)")


def _check_static_broadcast(node: onnx.NodeProto, shapes, static_ins: list[str]) -> None:
    """A constant that meets a time-carrying tensor must not have a time extent of its own: that
    is what a graph folded at one pinned length leaves behind (a zeros tensor of that length)."""
    for name in static_ins:
        shape = shapes.get(name)
        if shape and shape[-1] not in (1, None):
            raise NotStreamable(f"{node.op_type} {node.name!r}: constant {name!r} of shape {shape} "
                                "broadcasts along time; it was probably folded at one pinned length. "
                                "Rewrite it as a per-step constant (last dim 1)")
        if shape and shape[-1] is None:
            raise NotStreamable(f"{node.op_type} {node.name!r}: {name!r} has an unknown last dim")


def _conv_plan(node, a, consts, timing_in: Timing) -> ConvPlan:
    w = consts.get(node.input[1])
    if w is None:
        raise NotStreamable(f"{node.op_type} {node.name!r}: weights are computed; fold the graph first")
    if w.ndim != 3:
        raise NotStreamable(f"{node.op_type} {node.name!r}: only 1-D convolutions stream (weights {w.shape})")
    if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        raise NotStreamable(f"{node.op_type} {node.name!r}: auto_pad; export with explicit pads")
    k = int(w.shape[2])
    dil = int(a.get("dilations", [1])[0])
    stride = int(a.get("strides", [1])[0])
    pl, pr = (int(p) for p in a.get("pads", [0, 0]))
    group = int(a.get("group", 1))
    if node.op_type == "Conv":
        if stride != 1:
            raise NotStreamable(f"Conv {node.name!r} has stride {stride}; a strided conv changes rate "
                                "and has no rule here yet")
        span = (k - 1) * dil
        if pl + pr != span:
            raise NotStreamable(f"Conv {node.name!r}: pads {pl}+{pr} != kernel span {span}, so its output "
                                "is not as long as its input")
        return ConvPlan(node.name, "Conv", timing_in.rate, timing_in.rate, timing_in.delay,
                        timing_in.delay + pr, k, dil, 1, pl, pr, int(w.shape[1]) * group, int(w.shape[0]),
                        group, span)
    if dil != 1 or any(a.get("output_padding", [0])) or "output_shape" in a:
        raise NotStreamable(f"ConvTranspose {node.name!r}: dilation/output_padding/output_shape are not handled")
    if k - stride != pl + pr:
        raise NotStreamable(f"ConvTranspose {node.name!r}: kernel {k} - stride {stride} != pads {pl}+{pr}, so "
                            "its output is not stride x input long")
    history = ceil((k - stride) / stride)  # input samples whose overlap-add reaches the current chunk
    return ConvPlan(node.name, "ConvTranspose", timing_in.rate, timing_in.rate * stride, timing_in.delay,
                    stride * timing_in.delay + pl, k, 1, stride, pl, pr, int(w.shape[0]),
                    int(w.shape[1]) * group, group, history)


# --- the map ----------------------------------------------------------------------------------

def name_nodes(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose nodes all have unique names (reads are keyed by node name)."""
    model = copy.deepcopy(model)
    seen: set[str] = set()
    for k, n in enumerate(model.graph.node):
        if not n.name or n.name in seen:
            n.name = f"{n.name or n.op_type}#{k}"
        seen.add(n.name)
    return model


def delay_map(model: onnx.ModelProto, time_inputs: Sequence[str]) -> DelayMap:
    """Rates, delays and reads for `model` (topologically sorted, input shapes pinned).

    `time_inputs` are the graph inputs that carry time on their last axis at one sample per
    frame (z, y_mask); every other input is static (a speaker embedding) and is fed as is.
    """
    g = model.graph
    node_names = [n.name for n in g.node]
    if len(set(node_names)) != len(node_names) or not all(node_names):
        raise NotStreamable("node names are empty or repeated; pass the graph through delays.name_nodes first")
    names = {i.name for i in g.input}
    missing = [t for t in time_inputs if t not in names]
    if missing:
        raise NotStreamable(f"no graph input named {', '.join(missing)}; inputs are {', '.join(sorted(names))}")
    idx = Index.inferred(model)
    shapes, consts = idx.shapes, idx.constants
    timing: dict[str, Timing] = {t: Timing(1, 0) for t in time_inputs}
    reads: list[Read] = []
    convs: list[ConvPlan] = []
    for node in g.node:
        time_ins = [t for t in node.input if t in timing]
        if not time_ins:
            continue
        if node.op_type in CONV_OPS:
            if node.input[0] not in timing or len(time_ins) != 1:
                raise NotStreamable(f"{node.op_type} {node.name!r}: only the data input may carry time")
            plan = _conv_plan(node, _attrs(node), consts, timing[node.input[0]])
            convs.append(plan)
            reads.append(Read(node.name, 0, node.input[0], plan.history, plan.history))
            timing[node.output[0]] = Timing(plan.rate_out, plan.delay_out)
            continue
        _check_time_local(node, shapes, consts, time_ins)
        static_ins = [t for t in node.input if t and t not in timing]
        if node.op_type in POINTWISE:
            _check_static_broadcast(node, shapes, static_ins)
        elif node.op_type == "Concat" and static_ins:
            raise NotStreamable(f"Concat {node.name!r} joins a constant to a time-carrying tensor")
        rates = {timing[t].rate for t in time_ins}
        if len(rates) != 1:
            raise NotStreamable(f"{node.op_type} {node.name!r} joins tensors at rates {sorted(rates)} "
                                f"({', '.join(time_ins)}); they must be upsampled to one rate first")
        rate, delay = rates.pop(), max(timing[t].delay for t in time_ins)
        for i, t in enumerate(node.input):
            if t in timing:
                reads.append(Read(node.name, i, t, delay - timing[t].delay, 0))
        for o in node.output:
            if o:
                timing[o] = Timing(rate, delay)
    outs = [o.name for o in g.output]
    untimed = [o for o in outs if o not in timing]
    if untimed:
        raise NotStreamable(f"graph output(s) {', '.join(untimed)} do not depend on the time inputs")
    top = max(timing[o].delay for o in outs)
    outputs = {}
    for o in outs:
        reads.append(Read("<output>", outs.index(o), o, top - timing[o].delay, 0))
        outputs[o] = Timing(timing[o].rate, top)
    lead = {t: tuple(shapes[t][:-1]) for t in timing if t in shapes}
    return DelayMap(tuple(time_inputs), timing, reads, convs, outputs, lead)


def delay_table(dm: DelayMap) -> list[dict]:
    """One row per conv: rate, kernel, dilation, pads, delay in and out (samples and frames)."""
    return [{"node": c.node, "op": c.op, "rate_in": c.rate_in, "rate_out": c.rate_out, "kernel": c.kernel,
             "dilation": c.dilation, "stride": c.stride, "pad_left": c.pad_left, "pad_right": c.pad_right,
             "channels_in": c.channels_in, "channels_out": c.channels_out, "history": c.history,
             "delay_in": c.delay_in, "delay_out": c.delay_out,
             "delay_out_frames": c.delay_out / c.rate_out} for c in dm.convs]


def conv_macs(model: onnx.ModelProto) -> int:
    """Multiply-accumulates of every Conv / ConvTranspose of a graph with pinned input shapes
    (conv_macs_by_node, summed). Why: the compute a decode path spends is counted from the graph
    itself, not from a timing on a loaded machine."""
    return sum(conv_macs_by_node(model).values())


def conv_macs_by_node(model: onnx.ModelProto) -> dict[str, int]:
    """{node name: multiply-accumulates} of every Conv / ConvTranspose, from the shapes onnx infers:
    Conv = output elements x C_in/group x K; ConvTranspose = input elements x C_out/group x K (every
    input sample meets every tap once). Per node, so a compiled engine's layer table can say which
    share of them runs in which dtype."""
    idx = Index.inferred(model)
    macs = {}
    for n in idx.nodes:
        if n.op_type not in CONV_OPS:
            continue
        w = idx.initializers[n.input[1]].dims if n.input[1] in idx.initializers else None
        io = n.output[0] if n.op_type == "Conv" else n.input[0]
        dims = idx.shapes.get(io)
        if w is None or not dims or not all(dims):
            raise InputError(f"{n.op_type} {n.name!r}: no static weights or shape; pin the inputs first")
        macs[n.name] = int(np.prod(dims)) * int(w[1]) * int(np.prod(w[2:]))
    return macs
