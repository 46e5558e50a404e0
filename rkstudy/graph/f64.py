"""A float64 interpreter for streamable graphs and their stateful steps (host): a driver over the
streaming rules, each op evaluated by its own rule's `f64` (rkstudy.graph.streaming), so every op the
surgery streams the exactness gate can check, and an op with no rule is refused by name.

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
from onnx import numpy_helper

from .streaming import rule_for
from .streaming.core import attrs


class F64Runner:
    """The interpreter behind the Runner surface the walkers use (`run(dict) -> list of arrays`)."""

    where, target = "host", "none"   # float64 on the host CPU: neither onnxruntime fp32 nor an engine

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        init = {i.name for i in model.graph.initializer}
        self.input_names = [i.name for i in model.graph.input if i.name not in init]

    def run(self, feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        return run_f64(self.model, feed)


def _tensor(arr: np.ndarray) -> torch.Tensor:
    arr = np.asarray(arr)
    return torch.from_numpy(arr.astype(np.float64) if arr.dtype.kind == "f" else arr.copy())


def run_f64(model: onnx.ModelProto, feed: Mapping[str, np.ndarray], store: str = "float64") -> list[np.ndarray]:
    """Outputs of `model` evaluated in float64 (torch, CPU), in graph output order, each node by its
    streaming rule's `f64`. With `store="float16"` every weight and every node output is rounded to
    float16 before it is used (the arithmetic stays float64): what storing activations in fp16, as an
    fp16 engine does, costs this graph, with no compiler in the way."""
    rounding = store == "float16"

    def stored(t):
        return t.to(torch.float16).to(torch.float64) if rounding and t.is_floating_point() else t

    env: dict[str, torch.Tensor] = {i.name: stored(_tensor(numpy_helper.to_array(i))) for i in model.graph.initializer}
    env.update({k: _tensor(v) for k, v in feed.items()})
    with torch.no_grad():
        for n in model.graph.node:
            out = rule_for(n).f64(n, [env[t] if t else None for t in n.input], attrs(n))
            for name, t in zip(n.output, out):
                if name:
                    env[name] = stored(t)
    return [env[o.name].numpy() for o in model.graph.output]
