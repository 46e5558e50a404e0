"""Rate up: ConvTranspose at any stride, dilation, pads, output_padding and grouping (the grouped
low-pass upsampler of an anti-aliased activation, a HiFi-GAN upsampler, an odd stride with
output_padding).

Input sample i adds its kernel to output samples [s i, s i + span) of the full overlap-add
(span = (kernel - 1) x dilation + 1); the graph keeps that sum from `pads[0]` on, output_padding samples
longer at the end (they get only the bias). An overlap-add sample is complete once every input that
reaches it has arrived, so a step runs the op with pads 0 on its input's last `history` =
ceil(span / s) - 1 samples and the chunk, and keeps the complete new part of the sum: the chunk x s
samples after the history's. Its delay is s x delay_in + pads[0].
"""

from __future__ import annotations

from math import ceil

from .conv import conv_geometry
from .core import ConvPlan, NotStreamable, Read, Timed, Timing, attrs, torch_ops, where
from .registry import Rule, register


@register
class ConvTranspose(Rule):
    family = "resample"
    ops = ("ConvTranspose",)

    def timing(self, node, ctx):
        if "output_shape" in attrs(node):
            raise NotStreamable(f"{where(node)}: output_shape; export with explicit pads")
        g = conv_geometry(node, ctx)
        t, s, k, dil, pb, pe, op = g["t"], g["stride"], g["k"], g["dil"], g["pl"], g["pr"], g["op"]
        span = (k - 1) * dil + 1
        history = ceil(span / s) - 1
        extent = s * (t.extent - 1) + op + span - pb - pe
        length_in = t.rate * ctx.frames + t.extent
        length_out = t.rate * s * ctx.frames + extent
        # the full graph's outputs read (as zeros) inputs before the first or past the last one
        first_in = -(-(pb - span + 1) // s)
        last_in = (pb + length_out - 1) // s
        outside = first_in < 0 or last_in > length_in - 1
        plan = ConvPlan(node.name, "ConvTranspose", t.rate, t.rate * s, t.delay, s * t.delay + pb, k, dil, s, pb, pe,
                        int(g["w"].shape[0]), int(g["w"].shape[1]) * g["group"], g["group"], history, op,
                        reaches_outside=outside)
        return Timed({node.output[0]: Timing(t.rate * s, s * t.delay + pb, 2, extent)},
                     [Read(node.name, 0, node.input[0], history, history)], plan)

    def step(self, node, inputs, sc):
        plan = sc.plan
        out = node.output[0]
        span = (plan.kernel - 1) * plan.dilation + 1
        # a kernel shorter than its stride leaves each input's last stride - span samples to the bias alone
        tail = [max(0, plan.stride - span)] if span < plan.stride else None
        if plan.history == 0 and span <= plan.stride:
            sc.emit(node, inputs, pads=[0, 0], output_padding=tail)
            return
        full = sc.b.name(out + "_full")
        new = sc.emit(node, inputs, pads=[0, 0], output_padding=tail)
        new.output[0] = full
        lo = plan.history * plan.stride
        sc.b.slice(full, lo, lo + sc.chunk[out], -1, "ct", out=out)

    def reads_outside(self, node, ctx):
        return [0] if self.timing(node, ctx).plan.reaches_outside else []

    def zero_outside(self, node, ctx, zero):
        g = conv_geometry(node, ctx)
        bias = len(node.input) > 2 and node.input[2]
        span = (g["k"] - 1) * g["dil"] + 1
        return (node.input[0] in zero and not bias and span == g["stride"] and g["op"] == 0
                and g["pl"] == g["pr"] == 0)

    def f64(self, node, x, a):
        _, F = torch_ops()
        pads = a.get("pads", [0, 0])
        y = F.conv_transpose1d(x[0], x[1], x[2] if len(x) > 2 else None, stride=a.get("strides", [1])[0],
                               groups=a.get("group", 1), dilation=a.get("dilations", [1])[0],
                               output_padding=a.get("output_padding", [0])[0])
        return [y[..., pads[0]: y.shape[-1] - pads[1]]]

    def note(self, node):
        a = attrs(node)
        return (["grouped"] if a.get("group", 1) > 1 else []) + \
            (["output_padding"] if any(a.get("output_padding", [0])) else [])
