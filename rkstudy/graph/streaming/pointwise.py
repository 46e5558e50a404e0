"""Pointwise maths: every output sample from the same sample of each input (numpy broadcasting).

Time-carrying inputs may reach the node at different delays: the node runs at the largest and reads
the others through delay lines. A constant operand must not extend along time (a tensor folded at one
pinned length is refused: it would not fit a step). Inputs of different ranks are aligned from the
right, as broadcasting aligns them, so the time axis is tracked through a rank change.
"""

from __future__ import annotations

import numpy as np
import onnx

from .core import Context, NotStreamable, Read, Timed, Timing, attrs, same_time, where
from .registry import Rule, register

# f(0) = 0: an input that is zero outside its length stays zero there.
ZERO_AT_ZERO = frozenset(("Abs", "Erf", "Identity", "LeakyRelu", "Neg", "Relu", "Sin", "Sqrt", "Tanh", "Cast",
                          "Elu", "Selu", "Softsign", "Sign", "Round", "Ceil", "Floor", "Gelu", "Mish", "Dropout"))
# zero when every input is zero there
ALL_ZERO = frozenset(("Add", "Sub", "Sum", "Max", "Min", "Mean"))


@register
class Pointwise(Rule):
    family = "pointwise"
    ops = ("Abs", "Add", "And", "Cast", "Ceil", "Clip", "Cos", "Div", "Dropout", "Elu", "Equal", "Erf", "Exp",
           "Floor", "Gelu", "Greater", "GreaterOrEqual", "HardSigmoid", "HardSwish", "Identity", "IsInf", "IsNaN",
           "LeakyRelu", "Less", "LessOrEqual", "Log", "Max", "Mean", "Min", "Mish", "Mod", "Mul", "Neg", "Not", "Or",
           "Pow", "PRelu", "Reciprocal", "Relu", "Round", "Selu", "Sigmoid", "Sign", "Sin", "Softplus", "Softsign",
           "Sqrt", "Sub", "Sum", "Tan", "Tanh", "Where", "Xor", "Atan", "Asin", "Acos", "Sinh", "Cosh")

    def timing(self, node: onnx.NodeProto, ctx: Context) -> Timed:
        time_ins = ctx.time_ins(node)
        ranks = {t: ctx.rank(t, node) for t in node.input if t}
        out_rank = max(ranks.values())
        # the time axis of each time-carrying input, counted from the right (broadcasting aligns there)
        from_right = {ranks[t] - ctx.timing[t].axis % ranks[t] for t in time_ins}
        if len(from_right) != 1:
            raise NotStreamable(f"{where(node)} broadcasts time-carrying inputs whose time axes do not line up")
        k = from_right.pop()
        base = same_time(node, ctx, time_ins)
        length = base.rate * ctx.frames + base.extent
        for t in node.input:
            if not t or t in ctx.timing:
                continue
            shape = ctx.shapes.get(t)
            if shape is None:
                raise NotStreamable(f"{where(node)}: no shape for {t!r}; pin the graph before streaming it")
            if len(shape) >= k and shape[len(shape) - k] not in (1,):
                size = shape[len(shape) - k]
                raise NotStreamable(f"{where(node)}: constant {t!r} of shape {tuple(shape)} extends along time "
                                    f"({size} samples against {length}); it was probably folded at one pinned length. "
                                    "Rewrite it as a per-step constant (time dim 1)")
        delay = max(ctx.timing[t].delay for t in time_ins)
        reads = [Read(node.name, i, t, delay - ctx.timing[t].delay, 0)
                 for i, t in enumerate(node.input) if t in ctx.timing]
        zeros = self._zeros(node, ctx)
        return Timed({o: Timing(base.rate, delay, out_rank - k, base.extent, zeros) for o in node.output if o}, reads)

    def _zeros(self, node, ctx) -> int:
        """Leading samples the output holds zero wherever its inputs do (the `zero_outside` logic on
        the inputs' leading zeros)."""
        z = [ctx.timing[t].zeros if t in ctx.timing else 0 for t in node.input if t]
        if not any(z):
            return 0
        ins = [t for t in node.input if t]
        op = node.op_type
        if op == "Mul":
            return max(z)
        if op in ("Div",) or (op in ZERO_AT_ZERO and op != "Cast") or op == "Pow":
            return z[0] if op != "Pow" or self.zero_outside(node, ctx, {ins[0]}) else 0
        if op in ALL_ZERO:
            return min(z) if all(t in ctx.timing for t in ins) else 0
        return 0

    def zero_outside(self, node: onnx.NodeProto, ctx: Context, zero: set[str]) -> bool:
        ins = [t for t in node.input if t]
        op = node.op_type
        if op == "Mul":
            return any(t in zero for t in ins)
        if op == "Div":
            return ins[0] in zero
        if op == "Pow":
            exponent = ctx.constants.get(ins[1]) if ins[1] in ctx.constants else None
            return ins[0] in zero and exponent is not None and bool(np.all(np.asarray(exponent) > 0))
        if op in ALL_ZERO:
            return all(t in zero for t in ins)
        if op == "Clip":
            given = list(node.input[1:3]) + ["", ""]
            a = attrs(node)
            lo = ctx.constants[given[0]] if given[0] in ctx.constants else a.get("min", -np.inf)
            hi = ctx.constants[given[1]] if given[1] in ctx.constants else a.get("max", np.inf)
            return ins[0] in zero and float(np.min(lo)) <= 0.0 <= float(np.max(hi))
        if op in ZERO_AT_ZERO:
            return ins[0] in zero
        return False
