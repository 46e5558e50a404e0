"""Norms, reductions, softmaxes and matrix products over channels: time-local as long as the axis they
mix is not the time axis, which each rule checks on the tensor's own tracked time axis (a LayerNorm
over the last axis of a [B, T, C] tensor, a Linear as MatMul or Gemm over C).

What mixes time is refused with the node: a reduction or a softmax over the time axis, a matrix
product that contracts it or multiplies two time-carrying tensors (attention over time), and the
norms that are global over time whatever their attributes (instance norm, global pools).
"""

from __future__ import annotations

import numpy as np

from .core import NotStreamable, Timed, Timing, attrs, data_time, ints, norm_axis, torch_ops, where
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

    def f64(self, node, x, a):
        dims = list(range(norm_axis(a.get("axis", -1), x[0].dim()), x[0].dim()))
        y = _normalised(x[0], dims, a.get("epsilon", 1e-5)) * x[1]
        return [y + x[2] if len(x) > 2 and x[2] is not None else y]


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

    def f64(self, node, x, a):
        torch, _ = torch_ops()
        t = x[0]
        axes = list(a["axes"]) if "axes" in a else ints(x[1]) if len(x) > 1 and x[1] is not None else []
        if not axes:
            if a.get("noop_with_empty_axes", 0):
                return [t]
            axes = list(range(t.dim()))
        dims, keep = sorted(norm_axis(k, t.dim()) for k in axes), bool(a.get("keepdims", 1))
        op = node.op_type
        if op in ("ReduceMax", "ReduceMin"):
            return [t.amax(dim=dims, keepdim=keep) if op == "ReduceMax" else t.amin(dim=dims, keepdim=keep)]
        if op == "ReduceProd":
            for d in reversed(dims):
                t = t.prod(dim=d, keepdim=keep)
            return [t]
        if op == "ReduceLogSumExp":
            return [torch.logsumexp(t, dim=dims, keepdim=keep)]
        summed = {"ReduceMean": t, "ReduceSum": t, "ReduceL1": t.abs(), "ReduceL2": t * t, "ReduceSumSquare": t * t,
                  "ReduceLogSum": t}[op].sum(dim=dims, keepdim=keep)
        if op == "ReduceMean":
            return [summed / int(np.prod([t.shape[d] for d in dims]))]
        return [summed.sqrt() if op == "ReduceL2" else summed.log() if op == "ReduceLogSum" else summed]


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

    def f64(self, node, x, a):
        torch, F = torch_ops()
        op = node.op_type
        axis = norm_axis(a.get("axis", -1), x[0].dim())
        if op == "Softmax":
            return [torch.softmax(x[0], dim=axis)]
        if op == "LogSoftmax":
            return [torch.log_softmax(x[0], dim=axis)]
        if op == "Hardmax":
            return [F.one_hot(x[0].argmax(dim=axis), x[0].shape[axis]).movedim(-1, axis).to(x[0].dtype)]
        p = a.get("p", 2)
        return [x[0] / x[0].abs().pow(p).sum(dim=axis, keepdim=True).pow(1.0 / p)]


@register
class BatchNorm(Rule):
    family = "norm"
    ops = ("BatchNormalization",)

    def timing(self, node, ctx):
        t, axis, rank = data_time(node, ctx)
        if axis == 1:
            raise NotStreamable(f"{where(node)} uses the time axis as its channel axis")
        return Timed({node.output[0]: Timing(t.rate, t.delay, axis, t.extent)})

    def f64(self, node, x, a):
        data, scale, bias, mean, var = x[:5]
        shape = (1, -1) + (1,) * (data.dim() - 2)
        y = (data - mean.reshape(shape)) / (var.reshape(shape) + a.get("epsilon", 1e-5)).sqrt()
        return [y * scale.reshape(shape) + bias.reshape(shape)]


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

    def f64(self, node, x, a):
        return [x[0] @ x[1]]


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

    def f64(self, node, x, a):
        left = x[0].T if a.get("transA", 0) else x[0]
        right = x[1].T if a.get("transB", 0) else x[1]
        y = a.get("alpha", 1.0) * (left @ right)
        return [y + a.get("beta", 1.0) * x[2] if len(x) > 2 and x[2] is not None else y]


@register
class GlobalOverTime(Rule):
    family = "norm"
    ops = tuple(GLOBAL_OVER_TIME)

    def timing(self, node, ctx):
        raise NotStreamable(f"{where(node)} {GLOBAL_OVER_TIME[node.op_type]} (a global reduction over time); no step "
                            "can stream it, every output frame waits for the whole utterance")

    def f64(self, node, x, a):
        torch, _ = torch_ops()
        op, t = node.op_type, x[0]
        spatial = list(range(2, t.dim()))
        shape = (1, -1) + (1,) * len(spatial)
        if op == "InstanceNormalization":
            return [_normalised(t, spatial, a.get("epsilon", 1e-5)) * x[1].reshape(shape) + x[2].reshape(shape)]
        if op == "GroupNormalization":
            groups = a["num_groups"]
            y = _normalised(t.reshape(t.shape[0], groups, -1), [2], a.get("epsilon", 1e-5)).reshape(t.shape)
            scale, bias = (v if v.numel() == t.shape[1] else v.repeat_interleave(t.shape[1] // groups) for v in x[1:3])
            return [y * scale.reshape(shape) + bias.reshape(shape)]
        if op == "GlobalAveragePool":
            return [t.mean(dim=spatial, keepdim=True)]
        if op == "GlobalMaxPool":
            return [t.amax(dim=spatial, keepdim=True)]
        if op == "GlobalLpPool":
            p = a.get("p", 2)
            return [t.abs().pow(p).sum(dim=spatial, keepdim=True).pow(1.0 / p)]
        if op == "CumSum":
            axis = norm_axis(int(x[1].item()), t.dim())
            t = t.flip(axis) if a.get("reverse", 0) else t
            y = t.cumsum(dim=axis)
            y = y - t if a.get("exclusive", 0) else y
            return [y.flip(axis) if a.get("reverse", 0) else y]
        if op == "TopK":
            values, index = torch.topk(t, int(x[1].item()), dim=a.get("axis", -1), largest=bool(a.get("largest", 1)),
                                       sorted=bool(a.get("sorted", 1)))
            return [values, index]
        raise NotImplementedError(f"{where(node)}: no float64 evaluation for {op}")


def _normalised(t, dims: list[int], epsilon: float):
    """(t - mean) / sqrt(var + epsilon) over `dims` (the biased variance, as every ONNX norm takes it)."""
    mean = t.mean(dim=dims, keepdim=True)
    return (t - mean) / (((t - mean) ** 2).mean(dim=dims, keepdim=True) + epsilon).sqrt()
