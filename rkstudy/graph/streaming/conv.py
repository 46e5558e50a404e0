"""Convolutions over time: Conv at any stride, pads and dilation (a stride s > 1 divides the rate).

The full graph's Conv at stride s, pads (pl, pr), reach R = (kernel - 1) x dilation makes output j
from input samples [s j - pl, s j - pl + R], zeros past the input's ends. The step runs it with pads
0 on a window of its input's buffer: the window starts `back` = s x delay_out + pl - delay_in samples
before the current chunk and is R + 1 - s samples longer, so each step makes exactly chunk / s
outputs, the earliest whose receptive field is complete (delay_out = ceil((delay_in - pl + R + 1 - s) / s)).
"""

from __future__ import annotations

from math import ceil

from .core import ConvPlan, NotStreamable, Read, Timed, Timing, attrs, norm_axis, torch_ops, where
from .registry import Rule, register


def conv_geometry(node, ctx) -> dict:
    """Kernel taps, dilation, stride, pads, group and the weight shape of a 1-D conv (refused otherwise)."""
    w = ctx.constants.get(node.input[1]) if node.input[1] in ctx.constants else None
    if w is None:
        raise NotStreamable(f"{where(node)}: weights are computed; fold the graph first")
    if w.ndim != 3:
        raise NotStreamable(f"{where(node)}: only 1-D convolutions stream (weights {tuple(w.shape)})")
    a = attrs(node)
    if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        raise NotStreamable(f"{where(node)}: auto_pad; export with explicit pads")
    time_ins = ctx.time_ins(node)
    if time_ins != [node.input[0]]:
        raise NotStreamable(f"{where(node)}: only the data input may carry time")
    t = ctx.timing[node.input[0]]
    if norm_axis(t.axis, ctx.rank(node.input[0], node)) != 2:
        raise NotStreamable(f"{where(node)}: time must be the conv's spatial axis")
    pads = [int(p) for p in a.get("pads", [0, 0])]
    return {"w": w, "k": int(w.shape[2]), "dil": int(a.get("dilations", [1])[0]),
            "stride": int(a.get("strides", [1])[0]), "pl": pads[0], "pr": pads[1], "group": int(a.get("group", 1)),
            "op": [int(v) for v in a.get("output_padding", [0])][0], "t": t}


@register
class Conv(Rule):
    family = "conv"
    ops = ("Conv",)

    def timing(self, node, ctx):
        g = conv_geometry(node, ctx)
        t, s, k, dil, pl, pr = g["t"], g["stride"], g["k"], g["dil"], g["pl"], g["pr"]
        if t.rate % s:
            raise NotStreamable(f"{where(node)}: stride {s} at {t.rate} samples per frame leaves a fraction of a "
                                "sample per frame; a strided conv streams where the rate divides by its stride")
        reach = (k - 1) * dil
        delay = ceil((t.delay - pl + reach + 1 - s) / s)
        back = s * delay + pl - t.delay
        extent = (t.extent + pl + pr - reach - 1) // s + 1
        length_in = t.rate * ctx.frames + t.extent
        length_out = t.rate // s * ctx.frames + extent
        outside = -pl < 0 or s * (length_out - 1) - pl + reach > length_in - 1
        plan = ConvPlan(node.name, "Conv", t.rate, t.rate // s, t.delay, delay, k, dil, s, pl, pr,
                        int(g["w"].shape[1]) * g["group"], int(g["w"].shape[0]), g["group"], max(back, 0),
                        reaches_outside=outside)
        return Timed({node.output[0]: Timing(t.rate // s, delay, 2, extent)},
                     [Read(node.name, 0, node.input[0], back, reach + 1 - s)], plan)

    def step(self, node, inputs, sc):
        sc.emit(node, inputs, pads=[0, 0])

    def reads_outside(self, node, ctx):
        return [0] if self.timing(node, ctx).plan.reaches_outside else []

    def zero_outside(self, node, ctx, zero):
        g = conv_geometry(node, ctx)
        bias = len(node.input) > 2 and node.input[2]
        return node.input[0] in zero and not bias and g["k"] == 1 and g["stride"] == 1 and g["pl"] == g["pr"] == 0

    def f64(self, node, x, a):
        torch, F = torch_ops()
        pads = a.get("pads", [0, 0])
        y = F.pad(x[0], (pads[0], pads[1]))
        return [F.conv1d(y, x[1], x[2] if len(x) > 2 else None, stride=a.get("strides", [1])[0],
                         dilation=a.get("dilations", [1])[0], groups=a.get("group", 1))]

    def note(self, node):
        a = attrs(node)
        return (["strided"] if a.get("strides", [1])[0] > 1 else []) + (["grouped"] if a.get("group", 1) > 1 else [])
