"""What a graph holds that no fixed-shape engine or stateful step can reproduce, found from its nodes
alone, so a refusal names the real cause instead of the first rule it happens to break:

* random ops: RandomNormal, RandomUniform, their -Like forms, Bernoulli, Multinomial, and a Dropout in
  training mode draw new numbers on every run. Constant folding freezes one draw into the graph (a
  codec's noise block then adds the same noise to every utterance), and a compiler cannot run them;
* attention over time: a MatMul -> Softmax -> MatMul chain (scaling, masking and layout moves between
  them), named with the span its softmax normalises over: a window of frames (windowed local
  attention) or every frame. Every output frame of it reads a whole window, so no causal step with a
  fixed lookahead reproduces it at a window's edges.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from .index import Index

RANDOM_OPS = ("RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Bernoulli", "Multinomial")
# ops an attention's scores pass through between the two products
SCORE_PATH = frozenset(("Mul", "Div", "Add", "Sub", "Where", "Cast", "Transpose", "Reshape", "Identity", "Dropout",
                        "Unsqueeze", "Squeeze"))


@dataclass(frozen=True)
class Attention:
    """A MatMul -> Softmax -> MatMul chain: its nodes and the length of the softmax's axis (the span each
    query attends over), with the tensor's other dims."""

    scores: str
    softmax: str
    values: str
    span: int
    shape: tuple[int, ...]
    tensor: str = ""   # the softmax's input
    axis: int = -1     # the axis it normalises over


def random_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Every node that draws random numbers when the graph runs (a Dropout only when its training_mode
    input is a constant true, the one way an exported graph turns it on)."""
    consts = {i.name: i for i in model.graph.initializer}
    consts.update({n.output[0]: n.attribute[0].t for n in model.graph.node if n.op_type == "Constant" and n.attribute})
    out = []
    for n in model.graph.node:
        if n.op_type in RANDOM_OPS:
            out.append(n)
        elif n.op_type == "Dropout" and len(n.input) > 2 and n.input[2] in consts:
            if bool(np.asarray(onnx.numpy_helper.to_array(consts[n.input[2]])).ravel()[0]):
                out.append(n)
    return out


def attention(model: onnx.ModelProto) -> list[Attention]:
    """Every MatMul -> Softmax -> MatMul chain of `model` (shapes inferred; pin it for the spans)."""
    idx = Index.inferred(model)
    producer = {o: n for n in model.graph.node for o in n.output if o}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for t in n.input:
            readers.setdefault(t, []).append(n)

    def back(t: str) -> onnx.NodeProto | None:
        for _ in range(8):
            n = producer.get(t)
            if n is None or n.op_type in ("MatMul", "Einsum"):
                return n
            if n.op_type not in SCORE_PATH:
                return None
            t = n.input[0]
        return None

    def forward(t: str) -> onnx.NodeProto | None:
        for _ in range(8):
            nxt = readers.get(t, [])
            if len(nxt) != 1:
                return None
            n = nxt[0]
            if n.op_type in ("MatMul", "Einsum"):
                return n
            if n.op_type not in SCORE_PATH:
                return None
            t = n.output[0]
        return None

    found = []
    for n in model.graph.node:
        if n.op_type != "Softmax":
            continue
        scores, values = back(n.input[0]), forward(n.output[0])
        if scores is None or values is None:
            continue
        shape = tuple(idx.shapes.get(n.input[0]) or ())
        axis = next((a.i for a in n.attribute if a.name == "axis"), -1)
        span = shape[axis] if shape else 0
        found.append(Attention(scores.name, n.name, values.name, int(span or 0), shape, n.input[0], axis))
    return found
