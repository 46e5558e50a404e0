"""A float64 interpreter for the ops of streamable vocoder graphs and their stateful steps (host): VITS
decoder slices, HiFi-GAN and MelGAN generators, a Vocos backbone as its package exports it (Transpose,
LayerNormalization, MatMul or Gemm, GELU, a spectrum head), BigVGAN's anti-aliased activations (edge
Pads, grouped ConvTranspose, strided Conv, Snake), and what the boundary pass adds (Min, Reshape).

Why: onnxruntime's CPU convolutions round differently depending on the output length (a conv
whose output is at most 64 samples long is summed in another order than the same conv over a
whole utterance, and less accurately). A stateful step at E < 65 runs its rate-1 convs on such
chunks, so its fp32 output differs from a full-length fp32 decode at the rounding level,
amplified by ~60 layers, and the full fp32 decode is itself only about 95-111 dB from the exact
result (the kernels onnxruntime picks differ by CPU: an AVX2-only host lands at the low end). Running both graphs in float64 separates the method's error (none: they agree to float64
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
         "Sin": torch.sin, "Cos": torch.cos, "Sqrt": torch.sqrt, "Erf": torch.erf, "Relu": torch.relu,
         "Reciprocal": torch.reciprocal, "Abs": torch.abs, "Log": torch.log, "Softplus": F.softplus}
BINARY = {"Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Div": torch.div, "Pow": torch.pow,
          "Min": torch.minimum, "Max": torch.maximum}


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
    d, p, g, s = a.get("dilations", [1])[0], a.get("pads", [0, 0]), a.get("group", 1), a.get("strides", [1])[0]
    x = F.pad(x, (p[0], p[1]))
    return F.conv1d(x, w, b, stride=s, dilation=d, groups=g)


def _conv_t(x, w, b, a):
    s, p, g = a.get("strides", [1])[0], a.get("pads", [0, 0]), a.get("group", 1)
    d, op = a.get("dilations", [1])[0], a.get("output_padding", [0])[0]
    y = F.conv_transpose1d(x, w, b, stride=s, groups=g, dilation=d, output_padding=op)
    return y[..., p[0]: y.shape[-1] - p[1]]


def _pad(x, pads, mode, value, axes):
    """ONNX Pad on any axes (negative pads crop), in constant, edge or reflect mode."""
    axes = list(range(x.dim())) if axes is None else [a % x.dim() for a in axes]
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


class F64Runner:
    """The interpreter behind the Runner surface the walkers use (`run(dict) -> list of arrays`)."""

    where, target = "host", "none"   # float64 on the host CPU: neither onnxruntime fp32 nor an engine

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        init = {i.name for i in model.graph.initializer}
        self.input_names = [i.name for i in model.graph.input if i.name not in init]

    def run(self, feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        return run_f64(self.model, feed)


def run_f64(model: onnx.ModelProto, feed: Mapping[str, np.ndarray], store: str = "float64") -> list[np.ndarray]:
    """Outputs of `model` evaluated in float64 (torch, CPU), in graph output order. With `store="float16"`
    every weight and every node output is rounded to float16 before it is used (the arithmetic stays
    float64): what storing activations in fp16, as an fp16 engine does, costs this graph, with no
    compiler in the way."""
    rounding = store == "float16"

    def stored(t):
        return t.to(torch.float16).to(torch.float64) if rounding and t.is_floating_point() else t

    env: dict[str, torch.Tensor] = {}
    for init in model.graph.initializer:
        arr = numpy_helper.to_array(init)
        env[init.name] = stored(torch.from_numpy(arr.astype(np.float64) if arr.dtype.kind == "f" else arr.copy()))
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
            elif op in BINARY:
                acc = i[0]
                for other in i[1:]:
                    acc = BINARY[op](acc, other)
                out = [acc]
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
                axis = a.get("axis", 0)
                if len(n.input) > 1 and n.input[1]:
                    sizes = ints(n.input[1])
                elif "split" in a:
                    sizes = a["split"]
                else:   # num_outputs (opset 18): equal parts, the last one smaller
                    size = -(-i[0].shape[axis] // a.get("num_outputs", len(n.output)))
                    sizes = [min(size, i[0].shape[axis] - k * size) for k in range(len(n.output))]
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
                shape = [d if d != 0 else i[0].shape[k] for k, d in enumerate(ints(n.input[1]))]
                out = [i[0].reshape(shape)]
            elif op == "Transpose":
                out = [i[0].permute(*a.get("perm", list(range(i[0].dim()))[::-1]))]
            elif op == "Squeeze":
                axes = ints(n.input[1]) if len(n.input) > 1 and n.input[1] else a.get("axes")
                t = i[0]
                for ax in sorted((x % t.dim() for x in axes), reverse=True) if axes is not None else []:
                    t = t.squeeze(ax)
                out = [t if axes is not None else i[0].squeeze()]
            elif op == "Pad":
                mode = a.get("mode", b"constant")
                mode = mode.decode() if isinstance(mode, bytes) else mode
                if "pads" in a:
                    pads, value, axes = a["pads"], float(a.get("value", 0.0)), None
                else:
                    pads = ints(n.input[1])
                    value = float(i[2].item()) if len(i) > 2 and i[2] is not None else 0.0
                    axes = ints(n.input[3]) if len(n.input) > 3 and n.input[3] else None
                out = [_pad(i[0], pads, mode, value, axes)]
            elif op == "LayerNormalization":
                axis = a.get("axis", -1) % i[0].dim()
                dims = list(range(axis, i[0].dim()))
                mean = i[0].mean(dim=dims, keepdim=True)
                var = ((i[0] - mean) ** 2).mean(dim=dims, keepdim=True)
                y = (i[0] - mean) / torch.sqrt(var + a.get("epsilon", 1e-5)) * i[1]
                out = [y + i[2] if len(i) > 2 and i[2] is not None else y]
            elif op == "InstanceNormalization":
                dims = list(range(2, i[0].dim()))
                mean = i[0].mean(dim=dims, keepdim=True)
                var = ((i[0] - mean) ** 2).mean(dim=dims, keepdim=True)
                shape = (1, -1) + (1,) * len(dims)
                out = [(i[0] - mean) / torch.sqrt(var + a.get("epsilon", 1e-5)) * i[1].reshape(shape)
                       + i[2].reshape(shape)]
            elif op == "MatMul":
                out = [torch.matmul(i[0], i[1])]
            elif op == "Gemm":
                x, w = i[0], i[1]
                x = x.T if a.get("transA", 0) else x
                w = w.T if a.get("transB", 0) else w
                y = a.get("alpha", 1.0) * (x @ w)
                out = [y + a.get("beta", 1.0) * i[2] if len(i) > 2 and i[2] is not None else y]
            elif op == "Gelu":
                tanh = a.get("approximate", b"none") in (b"tanh", "tanh")
                out = [F.gelu(i[0], approximate="tanh" if tanh else "none")]
            elif op == "Softmax":
                out = [torch.softmax(i[0], dim=a.get("axis", -1))]
            elif op == "Where":
                out = [torch.where(i[0].bool(), i[1], i[2])]
            elif op == "Cast":
                out = [i[0]]
            elif op == "Gather":
                out = [torch.index_select(i[0], a.get("axis", 0) % i[0].dim(), i[1].reshape(-1).long()).reshape(
                    *i[0].shape[:a.get("axis", 0) % i[0].dim()], *i[1].shape,
                    *i[0].shape[a.get("axis", 0) % i[0].dim() + 1:])]
            else:
                raise NotImplementedError(f"f64 interpreter: no rule for {op} ({n.name})")
            for name, t in zip(n.output, out):
                env[name] = stored(t)
    return [env[o.name].numpy() for o in model.graph.output]
