"""Pointwise maths: every output sample from the same sample of each input (numpy broadcasting).

Time-carrying inputs may reach the node at different delays: the node runs at the largest and reads
the others through delay lines. A constant operand must not extend along time (a tensor folded at one
pinned length is refused: it would not fit a step). Inputs of different ranks are aligned from the
right, as broadcasting aligns them, so the time axis is tracked through a rank change.
"""

from __future__ import annotations

import numpy as np
import onnx

from .core import Context, NotStreamable, Read, Timed, Timing, attrs, same_time, torch_ops, where
from .registry import Rule, register

# f(0) = 0: an input that is zero outside its length stays zero there.
ZERO_AT_ZERO = frozenset(("Abs", "Erf", "Identity", "LeakyRelu", "Neg", "Relu", "Sin", "Sqrt", "Tanh", "Cast",
                          "Elu", "Selu", "Softsign", "Sign", "Round", "Ceil", "Floor", "Gelu", "Mish", "Dropout"))
# zero when every input is zero there
ALL_ZERO = frozenset(("Add", "Sub", "Sum", "Max", "Min", "Mean"))


# ONNX's defaults for the activations with parameters
SELU_ALPHA, SELU_GAMMA = 1.67326319217681884765625, 1.05070102214813232421875
# TensorProto element types a Cast may name: the float ones stay float64 here, bool stays bool, the rest are ints
FLOAT_TYPES, BOOL = frozenset((1, 10, 11, 16)), 9


def _unary(torch, F) -> dict:
    """op -> f(x, attributes) for the ops of one input."""
    return {
        "Abs": lambda x, a: x.abs(), "Acos": lambda x, a: x.acos(), "Asin": lambda x, a: x.asin(),
        "Atan": lambda x, a: x.atan(), "Ceil": lambda x, a: x.ceil(), "Cos": lambda x, a: x.cos(),
        "Cosh": lambda x, a: x.cosh(), "Erf": lambda x, a: torch.erf(x), "Exp": lambda x, a: x.exp(),
        "Floor": lambda x, a: x.floor(), "Identity": lambda x, a: x, "IsInf": lambda x, a: x.isinf(),
        "IsNaN": lambda x, a: x.isnan(), "Log": lambda x, a: x.log(), "Neg": lambda x, a: -x,
        "Not": lambda x, a: ~x.bool(), "Reciprocal": lambda x, a: x.reciprocal(), "Relu": lambda x, a: x.relu(),
        "Round": lambda x, a: x.round(), "Sigmoid": lambda x, a: x.sigmoid(), "Sign": lambda x, a: x.sign(),
        "Sin": lambda x, a: x.sin(), "Sinh": lambda x, a: x.sinh(), "Softplus": lambda x, a: F.softplus(x),
        "Softsign": lambda x, a: x / (1 + x.abs()), "Sqrt": lambda x, a: x.sqrt(), "Tan": lambda x, a: x.tan(),
        "Tanh": lambda x, a: x.tanh(), "Mish": lambda x, a: x * torch.tanh(F.softplus(x)),
        "Elu": lambda x, a: F.elu(x, a.get("alpha", 1.0)),
        "Selu": lambda x, a: a.get("gamma", SELU_GAMMA) * torch.where(
            x > 0, x, a.get("alpha", SELU_ALPHA) * (x.exp() - 1)),
        "LeakyRelu": lambda x, a: F.leaky_relu(x, a.get("alpha", 0.01)),
        "HardSigmoid": lambda x, a: (a.get("alpha", 0.2) * x + a.get("beta", 0.5)).clamp(0, 1),
        "HardSwish": lambda x, a: x * (x / 6 + 0.5).clamp(0, 1),
        "Gelu": lambda x, a: F.gelu(x, approximate="tanh" if a.get("approximate") in (b"tanh", "tanh") else "none"),
        "Dropout": lambda x, a: x,   # inference: the random ops check refuses a training-mode Dropout first
    }


def _binary(torch) -> dict:
    """op -> f(x, y, attributes) for the ops of two inputs (the variadic ones fold left)."""
    def div(x, y, a):
        return torch.div(x, y, rounding_mode="trunc") if not x.is_floating_point() else x / y

    def mod(x, y, a):
        return torch.fmod(x, y) if a.get("fmod", 0) else torch.remainder(x, y)

    return {"Add": lambda x, y, a: x + y, "Sub": lambda x, y, a: x - y, "Mul": lambda x, y, a: x * y, "Div": div,
            "Pow": lambda x, y, a: torch.pow(x, y), "Min": lambda x, y, a: torch.minimum(x, y),
            "Max": lambda x, y, a: torch.maximum(x, y), "Sum": lambda x, y, a: x + y, "Mod": mod,
            "Equal": lambda x, y, a: x == y, "Greater": lambda x, y, a: x > y, "Less": lambda x, y, a: x < y,
            "GreaterOrEqual": lambda x, y, a: x >= y, "LessOrEqual": lambda x, y, a: x <= y,
            "And": lambda x, y, a: x.bool() & y.bool(), "Or": lambda x, y, a: x.bool() | y.bool(),
            "Xor": lambda x, y, a: x.bool() ^ y.bool(),
            "PRelu": lambda x, y, a: torch.where(x < 0, x * y, x)}


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

    def f64(self, node, x, a):
        torch, F = torch_ops()
        op = node.op_type
        unary, binary = _unary(torch, F), _binary(torch)
        if op in unary:
            return [unary[op](x[0], a)] + ([torch.ones_like(x[0], dtype=torch.bool)] if len(node.output) > 1 else [])
        if op == "Mean":
            return [sum(x[1:], x[0]) / len(x)]
        if op in binary:
            acc = x[0]
            for other in x[1:]:
                acc = binary[op](acc, other, a)
            return [acc]
        if op == "Clip":
            lo = x[1].item() if len(x) > 1 and x[1] is not None else a.get("min")
            hi = x[2].item() if len(x) > 2 and x[2] is not None else a.get("max")
            return [torch.clamp(x[0], lo, hi)]
        if op == "Where":
            return [torch.where(x[0].bool(), x[1], x[2])]
        if op == "Cast":
            to = a["to"]
            return [x[0].to(torch.float64 if to in FLOAT_TYPES else torch.bool if to == BOOL else torch.int64)]
        raise NotImplementedError(f"{where(node)}: no float64 evaluation for {op}")
