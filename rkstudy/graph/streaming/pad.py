"""Pad on the time axis, in the three modes exporters write: constant, edge (PyTorch's replicate) and
reflect.

A zero Pad of a tensor that is already zero past its ends is a shift: the step computes those zeros
anyway, so it passes its input on and the tensor is `before` samples ahead (delay - before) and
before + after samples longer. Every other Pad is rewritten once, on the full graph, into that form
plus the boundary signals of rkstudy.graph.streaming.masks (`rewrite`), which on the full graph compute
exactly what the Pad computes and in a step reproduce the full decode's own boundary wherever the
frame mask says the frames end:

* constant c: Pad0((x - c) x m) + c;
* edge: Pad0(x x m) + the first sample (x x first) summed over the `before` samples ahead of it (a
  depthwise ones conv) + the last sample (x x last) over the `after` samples behind it;
* reflect: the same with each padded sample taken from its mirror, one shifted product per sample.

Pads of other axes only are time-local (run as they are).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from .core import (
    Builder,
    Context,
    NotStreamable,
    Timed,
    Timing,
    attrs,
    data_time,
    ints,
    norm_axis,
    text,
    torch_ops,
    where,
)
from .masks import Masks, pad_node
from .registry import Rule, register


def pad_spec(node: onnx.NodeProto, ctx: Context) -> tuple[str, dict[int, tuple[int, int]], float]:
    """(mode, {axis: (before, after)} of the padded axes, constant value)."""
    a = attrs(node)
    mode = a.get("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    rank = ctx.rank(node.input[0], node)
    if "pads" in a:
        pads, value = [int(p) for p in a["pads"]], float(a.get("value", 0.0))
        axes = list(range(rank))
    else:
        pads = [int(p) for p in np.asarray(ctx.const(node.input[1], node, "pads")).ravel()]
        value = float(np.asarray(ctx.const(node.input[2], node, "constant value")).ravel()[0]) \
            if len(node.input) > 2 and node.input[2] else 0.0
        axes = ([norm_axis(int(x), rank) for x in np.asarray(ctx.const(node.input[3], node, "axes")).ravel()]
                if len(node.input) > 3 and node.input[3] else list(range(rank)))
    n = len(axes)
    spec = {ax: (pads[k], pads[n + k]) for k, ax in enumerate(axes) if pads[k] or pads[n + k]}
    return mode, spec, value



@register
class Pad(Rule):
    family = "pad"
    ops = ("Pad",)

    def timing(self, node, ctx):
        t, axis, _ = data_time(node, ctx)
        mode, spec, value = pad_spec(node, ctx)
        if mode not in ("constant", "edge", "reflect"):
            raise NotStreamable(f"{where(node)}: {mode} padding has no streaming rule (constant, edge and reflect do)")
        before, after = spec.get(axis, (0, 0))
        zeros = before + t.zeros if mode == "constant" and value == 0.0 else 0
        return Timed({node.output[0]: Timing(t.rate, t.delay - before, axis, t.extent + before + after, zeros)})

    def needs_rewrite(self, node, ctx) -> bool:
        _, axis, _ = data_time(node, ctx)
        mode, spec, value = pad_spec(node, ctx)
        return axis in spec and (mode != "constant" or value != 0.0)

    def step(self, node, inputs, sc):
        t, axis, rank = data_time(node, sc.ctx)
        mode, spec, value = pad_spec(node, sc.ctx)
        if axis not in spec:
            sc.emit(node, inputs)
            return
        if mode != "constant" or value != 0.0:
            raise NotStreamable(f"{where(node)}: a {mode} pad reached the step unrewritten; pass the graph through "
                                "rkstudy.graph.validity.mask_boundaries first")
        rest = {ax: p for ax, p in spec.items() if ax != axis}
        if not rest:
            sc.alias(node.output[0], inputs[0])
            return
        pads = [0] * (2 * rank)
        for ax, (lo, hi) in rest.items():
            pads[ax], pads[rank + ax] = lo, hi
        sc.emit(node, [inputs[0], sc.b.const(pads, "pads")] + list(inputs[2:3]))

    def reads_outside(self, node, ctx):
        _, axis, _ = data_time(node, ctx)
        mode, spec, _ = pad_spec(node, ctx)
        lo, hi = spec.get(axis, (0, 0))
        return [0] if mode == "constant" and (lo > 0 or hi > 0) else []

    def zero_outside(self, node, ctx, zero):
        mode, _, value = pad_spec(node, ctx)
        return node.input[0] in zero and mode == "constant" and value == 0.0

    def rewrite(self, node: onnx.NodeProto, ctx: Context, masks: Masks, b: Builder) -> list[onnx.NodeProto]:
        """The nodes that replace this Pad (constant c != 0, edge or reflect on the time axis), writing its
        output (appended to `b`; the boundary signals they read go to `masks`): exact on the full graph,
        and the full decode's boundary in a step (see the module)."""
        t, axis, rank = data_time(node, ctx)
        mode, spec, value = pad_spec(node, ctx)
        lo, hi = spec[axis]
        if lo < 0 or hi < 0:
            raise NotStreamable(f"{where(node)}: a negative {mode} pad (a crop) of the time axis has no rule")
        if len(spec) > 1:
            raise NotStreamable(f"{where(node)} pads the time axis and another in {mode} mode; split it in two")
        x, out = node.input[0], node.output[0]
        start = len(b.nodes)
        m = masks.shaped(masks.length(t.rate, t.extent), rank, axis)
        if mode == "constant":
            shifted = b.node("Sub", [x, self._weight(b, np.float32(value), "pad_value")], "pad_less_value")
            core = pad_node(b, b.node("Mul", [shifted, m], "pad_masked"), rank, axis, lo, hi, masks.opset, "pad_core")
            b.node("Add", [core, self._weight(b, np.float32(value), "pad_value")], "pad_out", out=out)
            return b.nodes[start:]
        if axis != 2 or rank != 3:
            raise NotStreamable(f"{where(node)}: {mode} padding streams on [batch, channels, time] tensors; this one "
                                f"has time on axis {axis} of {rank}")
        channels = ctx.shape(x, node)[1]
        core = pad_node(b, b.node("Mul", [x, m], "pad_masked"), rank, axis, lo, hi, masks.opset, "pad_core")
        terms = [core]
        if mode == "edge":
            if lo:
                first = pad_node(b, b.node("Mul", [x, masks.first(t.rate, t.extent)], "pad_first"), rank, axis, lo, hi,
                                 masks.opset, "pad_first_at")
                w = np.ones((channels, 1, lo + 1), np.float32)
                w[..., 0] = 0.0
                terms.append(b.node("Conv", [first, self._weight(b, w, "pad_before")], "pad_before",
                                    kernel_shape=[lo + 1], pads=[0, lo], group=channels))
            if hi:
                last = pad_node(b, b.node("Mul", [x, masks.last(t.rate, t.extent)], "pad_last"), rank, axis, lo, hi,
                                masks.opset, "pad_last_at")
                w = np.ones((channels, 1, hi + 1), np.float32)
                w[..., -1] = 0.0
                terms.append(b.node("Conv", [last, self._weight(b, w, "pad_after")], "pad_after",
                                    kernel_shape=[hi + 1], pads=[hi, 0], group=channels))
        else:   # reflect: padded sample j - d takes sample d (before), L - 1 + d takes L - 1 - d (after)
            if lo:
                first = pad_node(b, masks.first(t.rate, t.extent), rank, axis, lo, hi, masks.opset, "pad_first_at")
                for d in range(1, lo + 1):
                    terms.append(b.node("Mul", [masks.shifted(first, -d, f"pad_first_ahead{d}", b),
                                                masks.shifted(core, -2 * d, f"pad_data_ahead{2 * d}", b)],
                                        f"pad_mirror{d}"))
            if hi:
                last = pad_node(b, masks.last(t.rate, t.extent), rank, axis, lo, hi, masks.opset, "pad_last_at")
                for d in range(1, hi + 1):
                    terms.append(b.node("Mul", [masks.shifted(last, d, f"pad_last_behind{d}", b),
                                                masks.shifted(core, 2 * d, f"pad_data_behind{2 * d}", b)],
                                        f"pad_mirror_end{d}"))
        total = terms[0]
        for k, term in enumerate(terms[1:], 1):
            total = b.node("Add", [total, term], "pad_sum", out=out if k == len(terms) - 1 else None)
        if len(terms) == 1:
            b.node("Identity", [total], "pad_out", out=out)
        return b.nodes[start:]

    def f64(self, node, x, a):
        if "pads" in a:
            pads, value, axes = a["pads"], float(a.get("value", 0.0)), None
        else:
            pads = ints(x[1])
            value = float(x[2].item()) if len(x) > 2 and x[2] is not None else 0.0
            axes = ints(x[3]) if len(x) > 3 and x[3] is not None else None
        return [padded(x[0], pads, text(a.get("mode"), "constant"), value, axes)]

    def note(self, node):
        return [text(attrs(node).get("mode"), "constant")]

    @staticmethod
    def _weight(b: Builder, w: np.ndarray, base: str) -> str:
        name = b.name(base + "_w")
        b.inits.append(numpy_helper.from_array(w, name))
        return name


def padded(x, pads, mode: str, value: float, axes):
    """ONNX Pad of a torch tensor on any axes (negative pads crop), in constant, edge or reflect mode."""
    _, F = torch_ops()
    axes = list(range(x.dim())) if axes is None else [k % x.dim() for k in axes]
    n = len(axes)
    for k, ax in enumerate(axes):
        lo, hi = int(pads[k]), int(pads[n + k])
        if lo < 0:
            x = x.narrow(ax, -lo, x.shape[ax] + lo)
            lo = 0
        if hi < 0:
            x = x.narrow(ax, 0, x.shape[ax] + hi)
            hi = 0
        if not lo and not hi:
            continue
        moved = x.movedim(ax, -1)
        shape = moved.shape
        flat = moved.reshape(1, -1, shape[-1])
        if mode == "constant":
            flat = F.pad(flat, (lo, hi), value=value)
        else:
            flat = F.pad(flat, (lo, hi), mode={"edge": "replicate", "reflect": "reflect"}[mode])
        x = flat.reshape(*shape[:-1], flat.shape[-1]).movedim(-1, ax)
    return x
