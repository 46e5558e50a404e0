"""Norms, reductions, softmaxes and matrix products over channels: time-local as long as the axis they
mix is not the time axis, which each rule checks on the tensor's own tracked time axis (a LayerNorm
over the last axis of a [B, T, C] tensor, a Linear as MatMul or Gemm over C).

What mixes time is refused with the node: a reduction or a softmax over the time axis, a matrix
product that contracts it or multiplies two time-carrying tensors (attention over time), and the
norms that are global over time whatever their attributes (instance norm, global pools).
"""

from __future__ import annotations

from .core import NotStreamable, Timed, Timing, attrs, data_time, norm_axis, where
from .registry import Rule, register

GLOBAL_OVER_TIME = {"InstanceNormalization": "normalises each channel by its mean and variance over all frames",
                    "GlobalAveragePool": "averages over all frames",
                    "GlobalMaxPool": "takes the maximum over all frames",
                    "GlobalLpPool": "pools over all frames",
                    "GroupNormalization": "normalises over groups of channels and all frames",
                    "CumSum": "sums over everything before each sample",
                    "TopK": "ranks over an axis"}



@register
class LayerNorm(Rule):
    family = "norm"
    ops = ("LayerNormalization",)

    def timing(self, node, ctx):
        t, axis, rank = data_time(node, ctx)
        first = norm_axis(attrs(node).get("axis", -1), rank)
        if axis >= first:
            raise NotStreamable(f"{where(node)} normalises over axes {first}..{rank - 1}, which hold the time axis "
                                f"({axis}); it is a norm over time")
        return Timed({o: Timing(t.rate, t.delay, axis, t.extent) for o in node.output[:1] if o})


@register
class Reduce(Rule):
    family = "norm"
    ops = ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
           "ReduceSumSquare", "ReduceLogSumExp", "ReduceLogSum")

    def timing(self, node, ctx):
        t, axis, rank = data_time(node, ctx)
        a = attrs(node)
        axes = ctx.ints(node, "axes", 1, "axes")
        if not axes:
            if a.get("noop_with_empty_axes", 0):
                return Timed({node.output[0]: Timing(t.rate, t.delay, axis, t.extent)})
            axes = list(range(rank))
        axes = sorted(norm_axis(x, rank) for x in axes)
        if axis in axes:
            raise NotStreamable(f"{where(node)} reduces over the time axis (a global reduction over time); no step "
                                "can stream it, every output frame waits for the whole utterance")
        out_axis = axis if a.get("keepdims", 1) else axis - sum(x < axis for x in axes)
        return Timed({node.output[0]: Timing(t.rate, t.delay, out_axis, t.extent)})

    def zero_outside(self, node, ctx, zero):
        return node.input[0] in zero and node.op_type in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin")


@register
class Softmax(Rule):
    family = "norm"
    ops = ("Softmax", "LogSoftmax", "Hardmax", "LpNormalization")

    def timing(self, node, ctx):
        t, axis, rank = data_time(node, ctx)
        default = 1 if node.op_type != "LpNormalization" and ctx.opset < 13 else -1
        over = norm_axis(attrs(node).get("axis", default), rank)
        # before opset 13 a softmax flattens every axis from `axis` on into one
        mixed = range(over, rank) if node.op_type != "LpNormalization" and ctx.opset < 13 else [over]
        if axis in mixed:
            raise NotStreamable(f"{where(node)} normalises over the time axis (attention over time); only a softmax "
                                "over channels streams")
        return Timed({node.output[0]: Timing(t.rate, t.delay, axis, t.extent)})


@register
class BatchNorm(Rule):
    family = "norm"
    ops = ("BatchNormalization",)

    def timing(self, node, ctx):
        t, axis, rank = data_time(node, ctx)
        if axis == 1:
            raise NotStreamable(f"{where(node)} uses the time axis as its channel axis")
        return Timed({node.output[0]: Timing(t.rate, t.delay, axis, t.extent)})


@register
class MatMul(Rule):
    family = "norm"
    ops = ("MatMul",)

    def timing(self, node, ctx):
        time_ins = ctx.time_ins(node)
        if len(time_ins) == 2:
            raise NotStreamable(f"{where(node)} multiplies two time-carrying tensors (attention over time); no step "
                                "can stream it")
        x = time_ins[0]
        t = ctx.timing[x]
        rank = ctx.rank(x, node)
        axis = norm_axis(t.axis, rank)
        other = node.input[1] if x == node.input[0] else node.input[0]
        out_rank = max(rank, ctx.rank(other, node), 2)
        if x == node.input[0]:
            if rank == 1 or axis == rank - 1:
                raise NotStreamable(f"{where(node)} contracts over the time axis; only a product over channels streams")
        elif rank == 1 or axis == rank - 2:
            raise NotStreamable(f"{where(node)} contracts over the time axis; only a product over channels streams")
        return Timed({node.output[0]: Timing(t.rate, t.delay, out_rank - (rank - axis), t.extent)})


@register
class Gemm(Rule):
    family = "norm"
    ops = ("Gemm",)

    def timing(self, node, ctx):
        time_ins = ctx.time_ins(node)
        if len(time_ins) != 1 or time_ins[0] != node.input[0]:
            raise NotStreamable(f"{where(node)}: only its first operand may carry time")
        t = ctx.timing[node.input[0]]
        trans = attrs(node).get("transA", 0)
        rows = 1 if trans else 0
        if norm_axis(t.axis, 2) != rows:
            raise NotStreamable(f"{where(node)} contracts over the time axis; only a product over channels streams")
        if len(node.input) > 2 and node.input[2]:
            bias = ctx.shapes.get(node.input[2]) or ()
            if len(bias) == 2 and bias[0] not in (1, None):
                raise NotStreamable(f"{where(node)}: its bias extends along time; it was folded at one pinned length")
        return Timed({node.output[0]: Timing(t.rate, t.delay, 0, t.extent)})

    def zero_outside(self, node, ctx, zero):
        return node.input[0] in zero and not (len(node.input) > 2 and node.input[2])


@register
class GlobalOverTime(Rule):
    family = "norm"
    ops = tuple(GLOBAL_OVER_TIME)

    def timing(self, node, ctx):
        raise NotStreamable(f"{where(node)} {GLOBAL_OVER_TIME[node.op_type]} (a global reduction over time); no step "
                            "can stream it, every output frame waits for the whole utterance")



