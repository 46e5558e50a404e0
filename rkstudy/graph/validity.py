"""Validity masks: every conv that reaches across time reads zeros outside the real frames.

Why: a full-length decode of N frames pads every Conv / ConvTranspose input with zeros outside
[0, N x rate); everything pointwise between its convs is computed on real positions only. A
stateful step (or a window padded past a short latent) computes every tensor on positions before
frame 0 and past the last frame as well, and there the values are conv biases and nonlinearities
of them, not zeros: the next conv reads them where the full decode reads its zero padding, and an
unmasked HiFi-GAN-style generator comes out ~20 dB off over its first and last frames while its
interior is exact. Multiplying each such conv input by a 0/1 signal that says which of its
positions are real restores the full decode's padding exactly, for any graph the delay map
accepts: only convs reach across time there, so once their inputs are right everything is.

The signal is one new graph input (a frame mask at one sample per frame: 1 on real frames, 0 on
padding or flush frames, as the walkers already make for a mask input), brought to each conv
input's rate by all-ones ConvTransposes (exact nearest-neighbour repeat, the operator
rkstudy.graph.decmask already runs on the NPU) and multiplied in. Its delay is the data's: the
delay map puts the Mul at the conv input's delay and reads the mask through a delay line, so the
step carries the mask's recent past in its state like any other history, and a zero state is
"nothing real yet". On real positions every Mul is x 1.0, an exact identity in fp32.

A conv input that is already zero wherever its frames are not real needs no mask: a walked input
(the walkers feed zeros outside the utterance), a product with such a tensor (a graph masked after
every conv, VITS's flows and rkstudy.graph.decmask's decoder), and what zero-preserving pointwise
ops and channel moves make of those. Such inputs are left alone, so a graph that masks itself comes
out unchanged, node for node. A conv that does not reach across time (kernel 1, or a transposed
conv whose kernel is its stride) reads only its own position, so it needs no mask either.

The masking is multiplicative, so it assumes the values outside the real frames are finite (they
are conv biases and functions of them; a Log of a padded zero would be -inf, and -inf x 0 is NaN).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .delays import NotStreamable, delay_map, name_nodes
from .index import Index

VALID = "valid"
# f(0) = 0: an input zero outside the real frames stays zero there.
ZERO_AT_ZERO = frozenset(("Abs", "Erf", "Identity", "LeakyRelu", "Neg", "Relu", "Sin", "Sqrt", "Tanh"))
# Element moves (channel splits and slices, axis moves): zeros go where the elements go.
MOVES = frozenset(("Gather", "Slice", "Split", "Squeeze", "Transpose", "Unsqueeze"))


@dataclass(frozen=True)
class Validity:
    """A graph whose reaching convs read zeros outside the real frames, and what was added."""

    model: onnx.ModelProto
    mask: str | None          # the frame-mask input the walker makes; None when nothing needed one
    masked: tuple[str, ...]   # the conv nodes whose data input is now multiplied by the mask


def _zero_outside(model: onnx.ModelProto, time_inputs: Sequence[str], plans: dict) -> set[str]:
    """The tensors that are zero on every position outside the real frames, whatever the weights:
    the walked inputs, and what products with them and zero-preserving ops make of those."""
    consts = Index(model).constants
    zero = set(time_inputs)
    for n in model.graph.node:
        ins = [t for t in n.input if t]
        op = n.op_type
        if op == "Mul":
            hit = any(t in zero for t in ins)
        elif op == "Div":
            hit = ins[0] in zero
        elif op == "Pow":
            exponent = consts.get(ins[1])
            hit = ins[0] in zero and exponent is not None and bool(np.all(exponent > 0))
        elif op in ("Add", "Sub", "Sum", "Concat"):
            hit = all(t in zero for t in ins)
        elif op in ZERO_AT_ZERO or op in MOVES:
            hit = ins[0] in zero
        elif n.name in plans:   # a bias-free conv that does not reach across time
            hit = ins[0] in zero and len(ins) == 2 and plans[n.name].history == 0
        else:
            hit = False
        if hit:
            zero.update(o for o in n.output if o)
    return zero


def mask_conv_inputs(model: onnx.ModelProto, time_inputs: Sequence[str], name: str = VALID) -> Validity:
    """`model` (folded, pinned, topologically sorted) with every reaching conv's data input multiplied
    by the frame mask `name` at that input's rate, unless the input is already zero outside the real
    frames (a walked input, a product with one, a zero-preserving op of those). The mask input is
    added only when some conv needs it: a graph that masks itself comes back unchanged. Time inputs
    as for rkstudy.graph.stateful.make_step."""
    model = name_nodes(model)
    g = model.graph
    plans = {c.node: c for c in delay_map(model, time_inputs).convs}
    zero = _zero_outside(model, time_inputs, plans)
    need = [n for n in g.node if n.name in plans and plans[n.name].history > 0 and n.input[0] not in zero]
    if not need:
        return Validity(model, None, ())
    taken = {i.name for i in g.input} | {t for n in g.node for t in n.output} | {i.name for i in g.initializer}
    if name in taken:
        raise NotStreamable(f"the graph already has a tensor named {name!r}; pass another name for the frame mask")
    frames = next(i for i in g.input if i.name == time_inputs[0]).type.tensor_type.shape.dim[-1]
    if not frames.HasField("dim_value"):
        raise NotStreamable(f"input {time_inputs[0]!r} has no fixed frame count; pin the graph before masking it")
    g.input.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [1, 1, frames.dim_value]))

    mask_at, head = {1: name}, []   # the mask at each rate, made once at the top of the graph
    for rate in sorted({plans[n.name].rate_in for n in need}):
        if rate in mask_at:
            continue
        base = max(q for q in mask_at if rate % q == 0)
        s, out = rate // base, f"{name}_x{rate}"
        g.initializer.append(numpy_helper.from_array(np.ones((1, 1, s), np.float32), f"{out}.ones"))
        head.append(helper.make_node("ConvTranspose", [mask_at[base], f"{out}.ones"], [out], name=f"/{out}",
                                     kernel_shape=[s], strides=[s]))
        mask_at[rate] = out
    # Each masked tensor is multiplied once, where it is made, and every reader takes the product:
    # on real positions it is the same value (x 1.0), and one buffer holds its history, not two.
    rate_of = {n.input[0]: plans[n.name].rate_in for n in need}
    masked_of = {t: f"{t}_valid" for t in rate_of}

    def mul(t: str) -> onnx.NodeProto:
        return helper.make_node("Mul", [t, mask_at[rate_of[t]]], [masked_of[t]], name=f"/{masked_of[t]}")

    nodes = head + [mul(i.name) for i in g.input if i.name in rate_of]
    for n in g.node:
        n.input[:] = [masked_of.get(t, t) for t in n.input]
        nodes.append(n)
        nodes.extend(mul(o) for o in n.output if o in rate_of)
    del g.node[:]
    g.node.extend(nodes)
    return Validity(model, name, tuple(n.name for n in need))
