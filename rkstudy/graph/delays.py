"""The delay map of a streamable graph: every tensor's time axis, rate, length and delay, every read's
history. The driver of the streaming rules (rkstudy.graph.streaming): it walks the graph in
topological order and asks each node's rule how the node treats time.

Why: a graph of 1-D convolutions, transposed convolutions and time-local ops (pointwise maths,
layout moves, norms and products over channels, pads) can be run step by step on chunks of its input
with no recomputed context, if every tensor is produced late enough that the samples it needs from
its inputs already exist. Walking the graph gives each time-carrying tensor T

* its time axis (tracked: a Transpose moves it, a Reshape may),
* a rate r(T): samples per input frame (1 for the graph's time inputs, x stride after a transposed
  conv, / stride after a strided conv),
* an extent: how much longer than r x frames the full graph makes it (a Pad adds, a crop takes away),
* a delay d(T): a step over input frames [kE, (k+1)E) produces T's samples [kEr - d, (k+1)Er - d).

Each rule reads its inputs through windows that reach `back` samples before the current chunk; the
history a tensor keeps between steps is the largest `back` of its readers. The delay of the graph
output is the lookahead of the whole step. This is the minimal (as-soon-as-possible) schedule: no
tensor is delayed more than its inputs force, except that where a tensor would run ahead of the
first frame (a pad before a valid conv) every input is read a few frames late (`lead`), so that
nothing before a tensor's first step is anything but the zeros a zero state holds.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from math import ceil

import numpy as np
import onnx

from ..errors import InputError
from .index import Index
from .streaming import Context, ConvPlan, NotStreamable, Read, Timing, rule_for
from .streaming.core import norm_axis

__all__ = ["ConvPlan", "DelayMap", "NotStreamable", "Read", "Timing", "conv_macs", "conv_macs_by_node",
           "delay_map", "delay_table", "name_nodes", "time_axes"]

CONV_OPS = frozenset(("Conv", "ConvTranspose"))


@dataclass
class DelayMap:
    """Timings of a graph's time-carrying tensors, and how each node reads them."""

    time_inputs: tuple[str, ...]
    timing: dict[str, Timing]
    reads: list[Read]
    convs: list[ConvPlan]
    outputs: dict[str, Timing]
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # pinned shapes of the time-carrying tensors
    context: Context | None = None
    lead: int = 0                      # frames every time input is read late (see the module)
    refused: dict[str, str] = field(default_factory=dict)   # node -> why (time_axes only)

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

    def axis(self, tensor: str) -> int:
        """The time axis of a time-carrying tensor (non-negative)."""
        return norm_axis(self.timing[tensor].axis, len(self.shapes[tensor]))


def name_nodes(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose nodes all have unique names (reads are keyed by node name)."""
    model = copy.deepcopy(model)
    seen: set[str] = set()
    for k, n in enumerate(model.graph.node):
        if not n.name or n.name in seen:
            n.name = f"{n.name or n.op_type}#{k}"
        seen.add(n.name)
    return model


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)


def _walk(model: onnx.ModelProto, time_inputs: Sequence[str], lead: int, strict: bool) -> DelayMap:
    g = model.graph
    names = {i.name: i for i in g.input}
    missing = [t for t in time_inputs if t not in names]
    if missing:
        raise NotStreamable(f"no graph input named {', '.join(missing)}; inputs are {', '.join(sorted(names))}")
    idx = Index.inferred(model)
    dims = names[time_inputs[0]].type.tensor_type.shape.dim
    if not dims or not dims[-1].HasField("dim_value"):
        raise NotStreamable(f"input {time_inputs[0]!r} has no fixed frame count; pin the graph first")
    frames = dims[-1].dim_value
    timing: dict[str, Timing] = {}
    for t in time_inputs:
        rank = len(names[t].type.tensor_type.shape.dim)
        timing[t] = Timing(1, lead, rank - 1, 0)
    ctx = Context(idx.shapes, idx.constants, timing, frames, _opset(model))
    reads: list[Read] = []
    convs: list[ConvPlan] = []
    refused: dict[str, str] = {}
    for node in g.node:
        if not ctx.time_ins(node):
            continue
        try:
            timed = rule_for(node).timing(node, ctx)
            _check_lengths(node, timed, idx.shapes, frames)
        except NotStreamable as exc:
            if strict:
                raise
            refused[node.name] = str(exc)
            continue
        timing.update(timed.outputs)
        covered = {r.index for r in timed.reads}
        # a rule that reads an input as it comes still reads it: through a delay line where it is a graph
        # input read `lead` frames late
        reads += timed.reads + [Read(node.name, i, t, 0, 0) for i, t in enumerate(node.input)
                                if t in timing and i not in covered and t not in timed.outputs]
        if timed.plan is not None:
            convs.append(timed.plan)
    outs = [o.name for o in g.output]
    untimed = [o for o in outs if o not in timing]
    if untimed and strict:
        raise NotStreamable(f"graph output(s) {', '.join(untimed)} do not depend on the time inputs")
    timed_outs = [o for o in outs if o in timing]
    top = max((timing[o].delay for o in timed_outs), default=0)
    outputs = {}
    for o in timed_outs:
        reads.append(Read("<output>", outs.index(o), o, top - timing[o].delay, 0))
        outputs[o] = Timing(timing[o].rate, top, timing[o].axis, timing[o].extent, timing[o].zeros)
    shapes = {t: tuple(idx.shapes[t]) for t in timing if t in idx.shapes}
    # inputs are fed at delay 0: a read that assumed `lead` frames of delay reaches that much further back
    reads = [Read(r.node, r.index, r.tensor, r.back + lead, r.extra) if r.tensor in time_inputs else r for r in reads]
    return DelayMap(tuple(time_inputs), timing, reads, convs, outputs, shapes, ctx, lead, refused)


def _check_lengths(node: onnx.NodeProto, timed, shapes, frames: int) -> None:
    for o, tm in timed.outputs.items():
        shape = shapes.get(o)
        if shape and len(shape) > norm_axis(tm.axis, len(shape)) and shape[norm_axis(tm.axis, len(shape))]:
            got, want = shape[norm_axis(tm.axis, len(shape))], tm.rate * frames + tm.extent
            if got != want:
                raise NotStreamable(f"{node.op_type} {node.name!r}: {o!r} is {got} samples long at {frames} "
                                    f"frames, its rule says {want}; the rates are off")


def delay_map(model: onnx.ModelProto, time_inputs: Sequence[str]) -> DelayMap:
    """Timings and reads for `model` (topologically sorted, input shapes pinned), or NotStreamable
    naming the first node no rule streams.

    `time_inputs` are the graph inputs that carry time on their last axis at one sample per frame (z,
    y_mask, a mel); every other input is static (a speaker embedding) and is fed as is.
    """
    node_names = [n.name for n in model.graph.node]
    if len(set(node_names)) != len(node_names) or not all(node_names):
        raise NotStreamable("node names are empty or repeated; pass the graph through delays.name_nodes first")
    dm = _walk(model, time_inputs, 0, True)
    ahead = max((ceil(-(t.delay + t.zeros) / t.rate) for t in dm.timing.values() if t.delay + t.zeros < 0), default=0)
    return _walk(model, time_inputs, ahead, True) if ahead > 0 else dm


def time_axes(model: onnx.ModelProto, time_inputs: Sequence[str]) -> DelayMap:
    """The time axis, rate and length of every tensor time reaches, without refusing: a node no rule
    streams is recorded in `refused` (its outputs untracked) and the walk goes on. What lint reads."""
    return _walk(name_nodes(model), time_inputs, 0, False)


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
