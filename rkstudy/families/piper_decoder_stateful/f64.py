"""A float64 interpreter for the op set of VITS decoder slices, the vocoders of rkstudy.port.architectures
(Snake, a channel LayerNorm, GELU, a spectrum head) and their stateful steps (host).

Why: onnxruntime's CPU convolutions round differently depending on the output length (a conv
whose output is at most 64 samples long is summed in another order than the same conv over a
whole utterance, and less accurately). A stateful step at E < 65 runs its rate-1 convs on such
chunks, so its fp32 output differs from a full-length fp32 decode at the rounding level,
amplified by ~60 layers, and the full fp32 decode is itself only 102-111 dB from the exact
result. Running both graphs in float64 separates the method's error (none: they agree to float64
rounding) from fp32 rounding; that is the exactness gate. onnxruntime has no double
ConvTranspose, hence this interpreter (torch on the CPU).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import helper, numpy_helper

UNARY = {"Tanh": torch.tanh, "Sigmoid": torch.sigmoid, "Exp": torch.exp, "Neg": torch.neg, "Identity": lambda t: t,
         "Sin": torch.sin, "Cos": torch.cos, "Sqrt": torch.sqrt, "Erf": torch.erf}


def _attrs(node):
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _slice(x, starts, ends, axes=None, steps=None):
    """ONNX Slice; Python's slice.indices clamps exactly as ONNX does, for either step sign."""
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = int(a) % x.dim()
        x = x.index_select(a, torch.arange(*slice(s, e, st).indices(x.shape[a])))
    return x


def _conv(x, w, b, a):
    d, p, g = a.get("dilations", [1])[0], a.get("pads", [0, 0]), a.get("group", 1)
    if a.get("strides", [1])[0] != 1:
        raise NotImplementedError("strided Conv")
    x = F.pad(x, (p[0], p[1]))
    return F.conv1d(x, w, b, dilation=d, groups=g)


def _conv_t(x, w, b, a):
    s, p, g = a.get("strides", [1])[0], a.get("pads", [0, 0]), a.get("group", 1)
    y = F.conv_transpose1d(x, w, b, stride=s, groups=g)
    return y[..., p[0]: y.shape[-1] - p[1]]


class F64Runner:
    """The interpreter behind the Runner surface the walkers use (`run(dict) -> list of arrays`)."""

    where, target = "host", "none"   # float64 on the host CPU: neither onnxruntime fp32 nor an engine

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        init = {i.name for i in model.graph.initializer}
        self.input_names = [i.name for i in model.graph.input if i.name not in init]

    def run(self, feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        return run_f64(self.model, feed)


def run_f64(model: onnx.ModelProto, feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Outputs of `model` evaluated in float64 (torch, CPU), in graph output order."""
    env: dict[str, torch.Tensor] = {}
    for init in model.graph.initializer:
        arr = numpy_helper.to_array(init)
        env[init.name] = torch.from_numpy(arr.astype(np.float64) if arr.dtype.kind == "f" else arr.copy())
    for k, v in feed.items():
        v = np.asarray(v)
        env[k] = torch.from_numpy(v.astype(np.float64) if v.dtype.kind == "f" else v)

    def ints(name):
        return [int(v) for v in env[name].tolist()]

    with torch.no_grad():
        for n in model.graph.node:
            a, i, op = _attrs(n), [env[t] if t else None for t in n.input], n.op_type
            if op == "Constant":
                arr = numpy_helper.to_array(n.attribute[0].t)
                out = [torch.from_numpy(arr.astype(np.float64) if arr.dtype.kind == "f" else arr.copy())]
            elif op == "Conv":
                out = [_conv(i[0], i[1], i[2] if len(i) > 2 else None, a)]
            elif op == "ConvTranspose":
                out = [_conv_t(i[0], i[1], i[2] if len(i) > 2 else None, a)]
            elif op in ("Add", "Sub", "Mul", "Div"):
                out = [{"Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Div": torch.div}[op](i[0], i[1])]
            elif op == "Pow":
                out = [torch.pow(i[0], i[1])]
            elif op in UNARY:
                out = [UNARY[op](i[0])]
            elif op == "Clip":
                lo, hi = (i[k].item() if len(i) > k and i[k] is not None else None for k in (1, 2))
                out = [torch.clamp(i[0], lo, hi)]
            elif op == "ReduceMean":
                axes = a["axes"] if "axes" in a else ints(n.input[1])
                out = [i[0].mean(dim=[int(x) for x in axes], keepdim=bool(a.get("keepdims", 1)))]
            elif op == "LeakyRelu":
                out = [F.leaky_relu(i[0], a.get("alpha", 0.01))]
            elif op == "Slice":
                out = [_slice(i[0], ints(n.input[1]), ints(n.input[2]),
                              ints(n.input[3]) if len(n.input) > 3 and n.input[3] else None,
                              ints(n.input[4]) if len(n.input) > 4 and n.input[4] else None)]
            elif op == "Split":
                sizes = ints(n.input[1]) if len(n.input) > 1 and n.input[1] else a["split"]
                out = list(torch.split(i[0], sizes, dim=a.get("axis", 0)))
            elif op == "Concat":
                out = [torch.cat(i, dim=a["axis"])]
            elif op == "Unsqueeze":
                axes = sorted(ints(n.input[1]) if len(n.input) > 1 else a["axes"])
                t = i[0]
                for ax in axes:
                    t = t.unsqueeze(ax)
                out = [t]
            elif op == "Shape":
                out = [torch.tensor(list(i[0].shape), dtype=torch.int64)]
            elif op == "ConstantOfShape":
                value = numpy_helper.to_array(a["value"]) if "value" in a else np.zeros(1, np.float32)
                dtype = torch.float64 if value.dtype.kind == "f" else torch.int64
                out = [torch.full(tuple(int(d) for d in i[0].tolist()), float(value.ravel()[0]), dtype=dtype)]
            elif op == "Reshape":
                out = [i[0].reshape(ints(n.input[1]))]
            else:
                raise NotImplementedError(f"f64 interpreter: no rule for {op} ({n.name})")
            for name, t in zip(n.output, out):
                env[name] = t
    return [env[o.name].numpy() for o in model.graph.output]
