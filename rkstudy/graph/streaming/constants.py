"""Constants and shape plumbing: Constant, Shape and ConstantOfShape.

A folded graph has none of them on its time path (rkstudy.graph.fold computes them at the pinned
length), so each is refused where time reaches it: a Shape of a time-carrying tensor reads its length,
which a step of a few frames does not have. They still run in the float64 interpreter, on graphs the
boundary pass or a user left them in, away from time.
"""

from __future__ import annotations

import numpy as np
from onnx import numpy_helper

from .core import NotStreamable, torch_ops, where
from .registry import Rule, register


@register
class Constants(Rule):
    family = "constant"
    ops = ("Constant", "ConstantOfShape", "Shape")

    def timing(self, node, ctx):
        raise NotStreamable(f"{where(node)} computes from the length of a time-carrying tensor; fold the graph at its "
                            "pinned length first (rkstudy.graph.fold), so no length is computed at run time")

    def f64(self, node, x, a):
        torch, _ = torch_ops()
        if node.op_type == "Shape":
            dims = list(x[0].shape)[a.get("start", 0): a.get("end")]
            return [torch.tensor(dims, dtype=torch.int64)]
        if node.op_type == "ConstantOfShape":
            value = numpy_helper.to_array(a["value"]) if "value" in a else np.zeros(1, np.float32)
            dtype = torch.float64 if value.dtype.kind == "f" else torch.int64
            return [torch.full(tuple(int(d) for d in x[0].tolist()), float(value.ravel()[0]), dtype=dtype)]
        if "value" not in a:
            raise NotStreamable(f"{where(node)}: only a Constant given as a tensor `value` is evaluated")
        arr = numpy_helper.to_array(a["value"])
        return [torch.from_numpy(arr.astype(np.float64) if arr.dtype.kind == "f" else arr.copy())]
