"""Layout moves: ops that move elements without computing across time, with the time axis tracked
through them.

Transpose moves the time axis to wherever its permutation sends it; Unsqueeze, Squeeze and a Reshape
that keeps the time dim whole (merging or splitting only other dims, as a [1, T, C] -> [T, C] before a
Gemm does) move it with the dims around it; Split, Gather and Slice over another axis, and Concat of
channels, leave it alone. A Slice of the time axis is a crop: the step computes every sample anyway,
so it passes its input on and only the tensor's length and delay change. What really mixes time is
refused with the node: a Reshape that folds time into another dim, a Concat or Split along time.
"""

from __future__ import annotations

import numpy as np
import onnx

from .core import NotStreamable, Timed, Timing, aligned, attrs, ints, norm_axis, torch_ops, where
from .registry import Rule, register

INT64_MAX = np.iinfo(np.int64).max


def _one_input(node, ctx) -> tuple[str, Timing, int]:
    time_ins = ctx.time_ins(node)
    if time_ins != [node.input[0]]:
        raise NotStreamable(f"{where(node)}: only its data input may carry time")
    t = ctx.timing[node.input[0]]
    return node.input[0], t, norm_axis(t.axis, ctx.rank(node.input[0], node))


@register
class Transpose(Rule):
    family = "layout"
    ops = ("Transpose",)

    def timing(self, node, ctx):
        x, t, axis = _one_input(node, ctx)
        rank = ctx.rank(x, node)
        perm = attrs(node).get("perm") or list(range(rank))[::-1]
        return Timed({node.output[0]: Timing(t.rate, t.delay, list(perm).index(axis), t.extent, t.zeros)})

    def zero_outside(self, node, ctx, zero):
        return node.input[0] in zero

    def f64(self, node, x, a):
        return [x[0].permute(*(a.get("perm") or list(range(x[0].dim()))[::-1]))]


def _axes(node, ctx, what: str) -> list[int] | None:
    return ctx.ints(node, "axes", 1, what)


@register
class Unsqueeze(Rule):
    family = "layout"
    ops = ("Unsqueeze",)

    def timing(self, node, ctx):
        x, t, axis = _one_input(node, ctx)
        rank = ctx.rank(x, node)
        axes = _axes(node, ctx, "axes")
        out_rank = rank + len(axes)
        new = sorted(norm_axis(a, out_rank) for a in axes)
        kept = [k for k in range(out_rank) if k not in new]
        return Timed({node.output[0]: Timing(t.rate, t.delay, kept[axis], t.extent, t.zeros)})

    def zero_outside(self, node, ctx, zero):
        return node.input[0] in zero

    def f64(self, node, x, a):
        axes = ints(x[1]) if len(x) > 1 and x[1] is not None else list(a["axes"])
        rank = x[0].dim() + len(axes)
        t = x[0]
        for ax in sorted(norm_axis(k, rank) for k in axes):
            t = t.unsqueeze(ax)
        return [t]


@register
class Squeeze(Rule):
    family = "layout"
    ops = ("Squeeze",)

    def _squeezed(self, node, ctx) -> list[int]:
        x = node.input[0]
        shape = ctx.shape(x, node)
        axes = _axes(node, ctx, "axes")
        if axes is None:
            return [k for k, d in enumerate(shape) if d == 1]
        return sorted(norm_axis(a, len(shape)) for a in axes)

    def timing(self, node, ctx):
        x, t, axis = _one_input(node, ctx)
        gone = self._squeezed(node, ctx)
        if axis in gone:
            raise NotStreamable(f"{where(node)} squeezes the time axis away")
        return Timed({node.output[0]: Timing(t.rate, t.delay, axis - sum(a < axis for a in gone), t.extent, t.zeros)})

    def step(self, node, inputs, sc):
        if _axes(node, sc.ctx, "axes") is None:   # squeeze-all would drop a time axis of one sample: name them
            sc.b.nodes.append(onnx.helper.make_node("Squeeze", [inputs[0], sc.b.const(self._squeezed(node, sc.ctx),
                                                                                      "squeeze_axes")],
                                                    list(node.output), name=node.name))
            return
        sc.emit(node, inputs)

    def zero_outside(self, node, ctx, zero):
        return node.input[0] in zero

    def f64(self, node, x, a):
        axes = ints(x[1]) if len(x) > 1 and x[1] is not None else a.get("axes")
        if axes is None:
            return [x[0].squeeze()]
        t = x[0]
        for ax in sorted((norm_axis(k, t.dim()) for k in axes), reverse=True):
            t = t.squeeze(ax)
        return [t]


@register
class Reshape(Rule):
    family = "layout"
    ops = ("Reshape",)

    @staticmethod
    def _out_axis(node, in_shape, out_shape, axis) -> int:
        before, after = int(np.prod(in_shape[:axis])), int(np.prod(in_shape[axis + 1:]))
        for b, d in enumerate(out_shape):
            if (d == in_shape[axis] and int(np.prod(out_shape[:b])) == before
                    and int(np.prod(out_shape[b + 1:])) == after):
                return b
        raise NotStreamable(f"{where(node)} folds the time axis into another dim ({tuple(in_shape)} -> "
                            f"{tuple(out_shape)}); the time axis must stay a dim of its own")

    def timing(self, node, ctx):
        x, t, axis = _one_input(node, ctx)
        ctx.const(node.input[1], node, "target shape")
        out_shape = ctx.shapes.get(node.output[0])
        if not out_shape or any(d is None for d in out_shape):
            raise NotStreamable(f"{where(node)}: its output shape is not inferred; pin the graph first")
        b = self._out_axis(node, ctx.shape(x, node), out_shape, axis)
        return Timed({node.output[0]: Timing(t.rate, t.delay, b, t.extent, t.zeros)})

    def step(self, node, inputs, sc):
        out = sc.ctx.timing[node.output[0]]
        shape = list(sc.ctx.shapes[node.output[0]])
        shape[out.axis] = sc.chunk[node.output[0]]
        sc.emit(node, [inputs[0], sc.b.const(shape, "reshape_shape")])

    def zero_outside(self, node, ctx, zero):
        return node.input[0] in zero

    def f64(self, node, x, a):
        keep = not a.get("allowzero", 0)
        return [x[0].reshape([x[0].shape[k] if d == 0 and keep else d for k, d in enumerate(ints(x[1]))])]


@register
class Flatten(Rule):
    family = "layout"
    ops = ("Flatten",)

    def timing(self, node, ctx):
        x, t, axis = _one_input(node, ctx)
        rank = ctx.rank(x, node)
        split = norm_axis(attrs(node).get("axis", 1), rank)
        shape = ctx.shape(x, node)
        if axis < split and int(np.prod(shape[:split])) == shape[axis]:
            return Timed({node.output[0]: Timing(t.rate, t.delay, 0, t.extent, t.zeros)})
        if axis >= split and int(np.prod(shape[split:])) == shape[axis]:
            return Timed({node.output[0]: Timing(t.rate, t.delay, 1, t.extent, t.zeros)})
        raise NotStreamable(f"{where(node)} folds the time axis into another dim")

    def zero_outside(self, node, ctx, zero):
        return node.input[0] in zero

    def f64(self, node, x, a):
        split = norm_axis(a.get("axis", 1), x[0].dim())
        return [x[0].reshape(int(np.prod(x[0].shape[:split])), -1)]


def slice_spec(node, ctx) -> list[tuple[int, int, int, int]]:
    """(axis, start, end, step) per sliced axis, normalised to the input's pinned shape."""
    shape = ctx.shape(node.input[0], node)
    ins = list(node.input) + [""] * (5 - len(node.input))
    a = attrs(node)
    if "starts" in a:   # opset < 10
        starts, ends, axes, steps = a["starts"], a["ends"], a.get("axes"), None
    else:
        starts = ctx.const(ins[1], node, "starts").ravel().tolist()
        ends = ctx.const(ins[2], node, "ends").ravel().tolist()
        axes = ctx.const(ins[3], node, "axes").ravel().tolist() if ins[3] else None
        steps = ctx.const(ins[4], node, "steps").ravel().tolist() if ins[4] else None
    axes = list(range(len(starts))) if axes is None else [norm_axis(int(x), len(shape)) for x in axes]
    steps = [1] * len(starts) if steps is None else steps
    out = []
    for ax, s, e, st in zip(axes, starts, ends, steps):
        n = shape[ax]
        out.append((ax, *slice(int(s), int(min(e, INT64_MAX)), int(st)).indices(n)))
    return out


@register
class Slice(Rule):
    family = "layout"
    ops = ("Slice",)

    def timing(self, node, ctx):
        x, t, axis = _one_input(node, ctx)
        spec = slice_spec(node, ctx)
        on_time = [s for s in spec if s[0] == axis]
        if not on_time:
            return Timed({node.output[0]: Timing(t.rate, t.delay, axis, t.extent, t.zeros)})
        _, start, end, step = on_time[0]
        if step != 1:
            raise NotStreamable(f"{where(node)} takes every {step}th time sample; only a crop (step 1) streams")
        length = ctx.length(x)
        crop_start, crop_end = start, length - end
        return Timed({node.output[0]: Timing(t.rate, t.delay + crop_start, axis, t.extent - crop_start - crop_end,
                                             max(0, t.zeros - crop_start))})

    def step(self, node, inputs, sc):
        t = sc.ctx.timing[node.input[0]]
        axis = norm_axis(t.axis, sc.ctx.rank(node.input[0], node))
        spec = slice_spec(node, sc.ctx)
        rest = [s for s in spec if s[0] != axis]
        if not rest:   # a crop of time alone: the step computes the samples anyway
            sc.alias(node.output[0], inputs[0])
            return
        if len(rest) != len(spec):
            ax, st, en, sp = zip(*rest)
            inputs = [inputs[0], sc.b.const(list(st), "slice_s"), sc.b.const(list(en), "slice_e"),
                      sc.b.const(list(ax), "slice_a"), sc.b.const(list(sp), "slice_p")]
        sc.emit(node, inputs)

    def zero_outside(self, node, ctx, zero):
        if node.input[0] not in zero:
            return False
        t = ctx.timing[node.input[0]]
        axis = norm_axis(t.axis, ctx.rank(node.input[0], node))
        on_time = [s for s in slice_spec(node, ctx) if s[0] == axis]
        return not on_time or (on_time[0][1] == 0 and on_time[0][2] == ctx.length(node.input[0]))

    def f64(self, node, x, a):
        """Python's slice.indices clamps exactly as ONNX does, for either step sign."""
        torch, _ = torch_ops()
        if "starts" in a:   # opset < 10
            starts, ends, axes, steps = a["starts"], a["ends"], a.get("axes"), None
        else:
            starts, ends = ints(x[1]), ints(x[2])
            axes = ints(x[3]) if len(x) > 3 and x[3] is not None else None
            steps = ints(x[4]) if len(x) > 4 and x[4] is not None else None
        axes = list(range(len(starts))) if axes is None else axes
        steps = [1] * len(starts) if steps is None else steps
        t = x[0]
        for start, end, ax, step in zip(starts, ends, axes, steps):
            ax = int(ax) % t.dim()
            t = t.index_select(ax, torch.arange(*slice(start, min(end, INT64_MAX), step).indices(t.shape[ax])))
        return [t]


@register
class Split(Rule):
    family = "layout"
    ops = ("Split",)

    def timing(self, node, ctx):
        x, t, axis = _one_input(node, ctx)
        if norm_axis(attrs(node).get("axis", 0), ctx.rank(x, node)) == axis:
            raise NotStreamable(f"{where(node)} splits the time axis; only a channel split streams")
        return Timed({o: Timing(t.rate, t.delay, axis, t.extent, t.zeros) for o in node.output if o})

    def zero_outside(self, node, ctx, zero):
        return node.input[0] in zero

    def f64(self, node, x, a):
        torch, _ = torch_ops()
        axis = norm_axis(a.get("axis", 0), x[0].dim())
        if len(x) > 1 and x[1] is not None:
            sizes = ints(x[1])
        elif "split" in a:
            sizes = list(a["split"])
        else:   # num_outputs (opset 18): equal parts, the last one smaller
            size = -(-x[0].shape[axis] // a.get("num_outputs", len(node.output)))
            sizes = [min(size, x[0].shape[axis] - k * size) for k in range(len(node.output))]
        return list(torch.split(x[0], sizes, dim=axis))


@register
class Gather(Rule):
    family = "layout"
    ops = ("Gather",)

    def timing(self, node, ctx):
        if node.input[0] not in ctx.timing:
            raise NotStreamable(f"{where(node)} gathers a constant by time-carrying indices")
        x, t, axis = _one_input(node, ctx)
        gaxis = norm_axis(attrs(node).get("axis", 0), ctx.rank(x, node))
        if gaxis == axis:
            raise NotStreamable(f"{where(node)} gathers along the time axis; only channel gathers stream")
        idx_rank = len(ctx.shapes.get(node.input[1]) or ())
        out_axis = axis if axis < gaxis else axis + idx_rank - 1
        return Timed({node.output[0]: Timing(t.rate, t.delay, out_axis, t.extent, t.zeros)})

    def zero_outside(self, node, ctx, zero):
        return node.input[0] in zero

    def f64(self, node, x, a):
        torch, _ = torch_ops()
        axis = norm_axis(a.get("axis", 0), x[0].dim())
        index = x[1].long()
        index = torch.where(index < 0, index + x[0].shape[axis], index)
        picked = torch.index_select(x[0], axis, index.reshape(-1))
        return [picked.reshape(*x[0].shape[:axis], *x[1].shape, *x[0].shape[axis + 1:])]


@register
class Concat(Rule):
    family = "layout"
    ops = ("Concat",)

    def timing(self, node, ctx):
        time_ins = ctx.time_ins(node)
        static = [t for t in node.input if t and t not in ctx.timing]
        if static:
            raise NotStreamable(f"{where(node)} joins a constant ({static[0]!r}) to a time-carrying tensor; "
                                "it would have to extend along time")
        rank = ctx.rank(time_ins[0], node)
        axes = {norm_axis(ctx.timing[t].axis, rank) for t in time_ins}
        if len(axes) != 1:
            raise NotStreamable(f"{where(node)} joins tensors whose time axes differ")
        axis = axes.pop()
        if norm_axis(attrs(node)["axis"], rank) == axis:
            raise NotStreamable(f"{where(node)} joins along the time axis; a stepwise graph cannot append time")
        return aligned(node, ctx, time_ins, node.output[0], [axis])

    def zero_outside(self, node, ctx, zero):
        return all(t in zero for t in node.input if t)

    def f64(self, node, x, a):
        torch, _ = torch_ops()
        return [torch.cat([t for t in x if t is not None], dim=a["axis"])]
