"""What every streaming rule speaks: a time-carrying tensor's timing, a node's reads, and the context a
rule reads the graph through.

A tensor of the full graph (pinned at N frames) carries time on one axis (`Timing.axis`, tracked per
tensor: a Transpose moves it, a Reshape may move it) at `rate` samples per frame and is
`rate x N + extent` samples long there (a Pad makes it longer, a crop or a valid conv shorter). A
stateful step over E frames produces, at step k, the samples [kEr - delay, (k+1)Er - delay) of it
(positions of the full tensor, so a negative position lies before its first sample): `delay` is
how far the step lags, in the tensor's own samples and coordinates.

A node reads a time-carrying input through a `Read`: the window that starts `back` samples before
the input's current chunk and is `extra` samples longer than it (a conv reads its receptive field, a
delay line a shifted chunk). The history a tensor keeps between steps is the largest `back` of its
readers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

from ...errors import InputError


class NotStreamable(InputError):
    """The graph has an op that mixes time steps in a way a causal cache cannot reproduce (the
    message names the node and why)."""


@dataclass(frozen=True)
class Timing:
    """A time-carrying tensor: `rate` samples per frame on `axis`, `extent` samples longer than
    rate x frames, produced `delay` samples late by a step; its first `zeros` samples are zero in the
    full graph whatever the input (a zero pad's), so a step may run that far ahead of its first frame."""

    rate: int
    delay: int
    axis: int = -1
    extent: int = 0
    zeros: int = 0


@dataclass(frozen=True)
class Read:
    """One node input reading a time-carrying tensor through the window [-back, chunk + extra - back)
    around its current chunk."""

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
    output_padding: int = 0
    reaches_outside: bool = True   # the full graph reads implicit zeros past its input's ends


@dataclass
class Timed:
    """What a rule says about one node: its outputs' timings, how it reads its time-carrying inputs, and
    the conv plan where it is a conv."""

    outputs: dict[str, Timing]
    reads: list[Read] = field(default_factory=list)
    plan: ConvPlan | None = None


def attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def where(node: onnx.NodeProto) -> str:
    return f"{node.op_type} {node.name!r}"


class Context:
    """The graph facts a rule reads: inferred shapes, constants, the timings so far, the pinned frame
    count, and the opset."""

    def __init__(self, shapes: Mapping[str, tuple], constants: Mapping[str, np.ndarray], timing: dict[str, Timing],
                 frames: int, opset: int):
        self.shapes, self.constants, self.timing, self.frames, self.opset = shapes, constants, timing, frames, opset

    def time_ins(self, node: onnx.NodeProto) -> list[str]:
        return [t for t in node.input if t and t in self.timing]

    def rank(self, name: str, node: onnx.NodeProto) -> int:
        if self.shapes.get(name) is None:
            raise NotStreamable(f"{where(node)}: no shape for {name!r}; pin the graph's input shapes "
                                "(rkstudy.graph.pin_shapes) before streaming it")
        return len(self.shapes[name])

    def shape(self, name: str, node: onnx.NodeProto) -> tuple:
        self.rank(name, node)
        return self.shapes[name]

    def const(self, name: str, node: onnx.NodeProto, what: str) -> np.ndarray:
        if name not in self.constants:
            raise NotStreamable(f"{where(node)} has a computed {what}; fold the graph first (rkstudy.graph.fold)")
        return self.constants[name]

    def length(self, name: str) -> int:
        """Samples of a time-carrying tensor at the pinned frame count."""
        t = self.timing[name]
        return t.rate * self.frames + t.extent

    def ints(self, node: onnx.NodeProto, attr: str, index: int, what: str) -> list[int] | None:
        """An int list given as attribute `attr` (older opsets) or as constant input `index`."""
        a = attrs(node)
        if attr in a:
            return [int(v) for v in a[attr]]
        if len(node.input) > index and node.input[index]:
            return [int(v) for v in np.asarray(self.const(node.input[index], node, what)).ravel()]
        return None


def torch_ops():
    """(torch, torch.nn.functional), imported when a float64 evaluation first runs: the rules themselves
    load without torch (lint and the surgery never evaluate)."""
    import torch
    import torch.nn.functional as F

    return torch, F


def ints(t) -> list[int]:
    """A constant int input of a float64 evaluation (a torch tensor) as a list."""
    return [int(v) for v in t.reshape(-1).tolist()]


def text(value, default: str) -> str:
    """A string attribute (onnx gives bytes) or its default."""
    value = default if value is None else value
    return value.decode() if isinstance(value, bytes) else value


def norm_axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def data_time(node: onnx.NodeProto, ctx: Context) -> tuple[Timing, int, int]:
    """(timing, time axis, rank) of a node whose only time-carrying input is its first (its data): a
    norm's or a pad's other inputs (scales, pads) must not carry time."""
    if ctx.time_ins(node) != [node.input[0]]:
        raise NotStreamable(f"{where(node)}: only its data input may carry time")
    t = ctx.timing[node.input[0]]
    rank = ctx.rank(node.input[0], node)
    return t, norm_axis(t.axis, rank), rank


def same_time(node: onnx.NodeProto, ctx: Context, names: Sequence[str]) -> Timing:
    """The one rate and extent of `names` (refused when they differ): the inputs of a time-local op."""
    ts = [ctx.timing[t] for t in names]
    if len({(t.rate, t.extent) for t in ts}) != 1:
        desc = ", ".join(f"{n} ({t.rate} per frame{f', {t.extent:+d}' if t.extent else ''})" for n, t in zip(names, ts))
        raise NotStreamable(f"{where(node)} joins tensors at different rates or lengths ({desc}); bring them to one "
                            "rate first")
    return ts[0]


def aligned(node: onnx.NodeProto, ctx: Context, names: Sequence[str], out: str, axes: Sequence[int]) -> Timed:
    """The timing of a time-local op whose time-carrying inputs `names` have their time axes at `axes`
    and whose output is `out`: the largest input delay, the others read through delay lines."""
    base = same_time(node, ctx, names)
    delay = max(ctx.timing[t].delay for t in names)
    reads = [Read(node.name, i, t, delay - ctx.timing[t].delay, 0) for i, t in enumerate(node.input) if t in names]
    axis = axes[0]
    zeros = min(ctx.timing[t].zeros for t in names)
    return Timed({o: Timing(base.rate, delay, axis, base.extent, zeros)
                  for o in ([out] if isinstance(out, str) else out) if o}, reads)


class Builder:
    """The new nodes and constants of a rewritten graph (a step, or the boundary masks), named under
    one prefix so they never clash with the graph's own."""

    def __init__(self, prefix: str = "/stateful"):
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.prefix = prefix
        self._n = 0

    def name(self, base: str) -> str:
        self._n += 1
        return f"{self.prefix}/{base.strip('/').replace('/', '_')}_{self._n}"

    def const(self, values, base: str, dtype=np.int64) -> str:
        from onnx import numpy_helper

        name = self.name(base)
        self.inits.append(numpy_helper.from_array(np.asarray(values, dtype=dtype), name))
        return name

    def slice(self, x: str, start: int, stop: int, axis: int, base: str, out: str | None = None) -> str:
        out = out or self.name(base)
        self.nodes.append(helper.make_node(
            "Slice", [x, self.const([start], base + "_s"), self.const([stop], base + "_e"),
                      self.const([axis], base + "_a")], [out], name=self.name(base + "_Slice")))
        return out

    def node(self, op: str, inputs: Sequence[str], base: str, out: str | None = None, **attributes) -> str:
        out = out or self.name(base)
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=self.name(base + "_" + op), **attributes))
        return out


@dataclass
class StepContext:
    """What a rule's `step` sees: the builder the step graph grows in, the full graph's Context (its
    shapes, constants and timings), each time-carrying tensor's samples per step, the node's conv plan,
    and the alias table (a node the step does not need, a crop or a pad of a tensor already zero outside
    its length, passes its input on under its output's name)."""

    b: Builder
    ctx: Context
    chunk: dict[str, int]
    plan: ConvPlan | None = None
    aliases: dict[str, str] = field(default_factory=dict)

    def alias(self, output: str, source: str) -> None:
        self.aliases[output] = self.aliases.get(source, source)

    def emit(self, node: onnx.NodeProto, inputs: Sequence[str], **changed) -> onnx.NodeProto:
        """A copy of `node` reading `inputs`, with the attributes in `changed` replaced (None drops one),
        appended to the step."""
        new = onnx.NodeProto()
        new.CopyFrom(node)
        new.input[:] = list(inputs)
        for name, value in changed.items():
            set_attr(new, name, value)
        self.b.nodes.append(new)
        return new


def set_attr(node: onnx.NodeProto, name: str, value) -> None:
    """Replace (or add) one attribute of `node`."""
    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend(kept + ([helper.make_attribute(name, value)] if value is not None else []))
