"""The boundary pass: a graph whose every read past a tensor's ends sees what the full-length decode
sees there, whichever samples a step or a padded window computes.

Why: a full-length decode of N frames pads every conv input with zeros outside its length (a Conv's
pads, a ConvTranspose's implicit zeros, an explicit zero Pad), replicates or mirrors its ends where an
exporter wrote an edge or reflect Pad (BigVGAN's anti-aliased activations pad in `replicate` mode), and
computes everything pointwise on real positions only. A stateful step (or a window padded past a short
input) computes every tensor on positions before frame 0 and past the last frame as well, and there
the values are conv biases and nonlinearities of them, not what the full decode reads: an unmasked
HiFi-GAN-style generator comes out ~20 dB off over its first and last frames while its interior is
exact. Two rewrites restore the full decode's boundary exactly, for any graph the streaming rules
accept:

* every input the full graph reads past its ends as zeros (the rule's `reads_outside`) is multiplied
  by its length mask (1 on its samples, 0 elsewhere), unless it is already zero there;
* every node whose rule asks for it (`needs_rewrite`) is replaced by the rule's `rewrite`: a Pad that
  is not a zero pad (edge, reflect, a constant other than 0) becomes a zero pad plus the first / last
  sample (or its mirror) placed by the first- and last-sample indicators (rkstudy.graph.streaming.pad),
  so the step replicates the first frame before the start and the last real frame past the end, as
  the full decode does.

All the signals come from one new graph input, a frame mask at one sample per frame (1 on real frames,
0 on padding or flush frames, as the walkers already make for a mask input), brought to each
tensor's rate and length by ops the rules stream themselves (rkstudy.graph.streaming.masks). On real
positions every Mul is x 1.0 and every added term 0, an exact identity in fp32: with a mask of ones the
rewritten graph computes what the original does.

A tensor that is already zero outside its length needs no mask: a walked input (the walkers feed
zeros outside the utterance), a product with such a tensor (a graph masked after every conv, VITS's
flows and rkstudy.graph.decmask's decoder), and what zero-preserving ops make of those (the rules'
`zero_outside`). Such inputs are left alone, so a graph that masks itself comes out unchanged, node
for node.

The masking is multiplicative, so it assumes the values outside the real frames are finite (they are
conv biases and functions of them; a Log of a padded zero would be -inf, and -inf x 0 is NaN).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import onnx
from onnx import helper

from .delays import delay_map, name_nodes
from .streaming import Builder, NotStreamable, rule_for
from .streaming.masks import Masks

VALID = "valid"


@dataclass(frozen=True)
class Validity:
    """A graph whose reads past a tensor's ends see the full decode's boundary, and what was added."""

    model: onnx.ModelProto
    mask: str | None          # the frame-mask input the walker makes; None when nothing needed one
    masked: tuple[str, ...]   # the nodes whose input is now multiplied by a length mask
    rewritten: tuple[str, ...] = ()   # the Pads rewritten into zero pads and boundary terms


def mask_boundaries(model: onnx.ModelProto, time_inputs: Sequence[str], name: str = VALID) -> Validity:
    """`model` (folded, pinned, topologically sorted) with its non-zero Pads of the time axis rewritten and
    every input the full graph reads past its ends multiplied by its length mask, unless it is already
    zero there; all made from the frame mask `name`, added as an input only when something needs it (a
    graph that masks itself comes back unchanged). Time inputs as for rkstudy.graph.stateful.make_step."""
    model = name_nodes(model)
    g = model.graph
    dm = delay_map(model, time_inputs)
    frames = dm.context.frames
    opset = dm.context.opset
    masks = Masks(name, opset)

    # 1. rewrite what the rules say cannot read the boundary as it is (pads that are not zero pads of time)
    b = Builder("/boundary")
    nodes, rewritten = [], []
    placed = 0   # the mask constants already in the graph
    for n in g.node:
        rule = rule_for(n) if dm.context.time_ins(n) else None
        if rule is not None and rule.needs_rewrite(n, dm.context):
            nodes += rule.rewrite(n, dm.context, masks, b)
            rewritten.append(n.name)
        else:
            nodes.append(n)
    if rewritten:
        _taken(model, name)
        g.input.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [1, 1, frames]))
        del g.node[:]
        g.node.extend(masks.b.nodes + nodes)
        g.initializer.extend(masks.b.inits + b.inits)
        placed = len(masks.b.inits)
        model = name_nodes(model)
        g = model.graph
        dm = delay_map(model, list(time_inputs) + [name])

    # 2. mask what the full graph reads past its ends, where it is not zero there already
    ctx = dm.context
    zero = set(time_inputs) | ({name} if rewritten else set())
    mask_of: dict[str, str] = {}   # tensor -> its masked product (made once, every reader takes it)
    masked = []
    for n in g.node:
        if not ctx.time_ins(n):
            continue
        rule = rule_for(n)
        need = [n.input[i] for i in rule.reads_outside(n, ctx) if n.input[i] not in zero or n.input[i] in mask_of]
        for t in need:
            if t not in mask_of:
                tm = ctx.timing[t]
                rank = len(ctx.shapes[t])
                m = masks.shaped(masks.length(tm.rate, tm.extent), rank, dm.axis(t))
                mask_of[t] = (f"{t}_valid", m)
            zero.add(t)
        if need:
            masked.append(n.name)
        if rule.zero_outside(n, ctx, zero):
            zero.update(o for o in n.output if o)
    if not mask_of and not rewritten:
        return Validity(model, None, ())
    if not rewritten:
        _taken(model, name)
        g.input.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [1, 1, frames]))

    def mul(t: str) -> onnx.NodeProto:
        out, m = mask_of[t]
        return helper.make_node("Mul", [t, m], [out], name=f"/{out}")

    head = {n.name for n in masks.b.nodes}   # made once at the top: they read the frame mask only
    new = list(masks.b.nodes) + [mul(i.name) for i in g.input if i.name in mask_of]
    for n in g.node:
        if n.name in head:
            continue
        n.input[:] = [mask_of[t][0] if t in mask_of else t for t in n.input]
        new.append(n)
        new.extend(mul(o) for o in n.output if o in mask_of)
    del g.node[:]
    g.node.extend(new)
    g.initializer.extend(masks.b.inits[placed:])
    return Validity(model, name, tuple(masked), tuple(rewritten))


def _taken(model: onnx.ModelProto, name: str) -> None:
    g = model.graph
    taken = {i.name for i in g.input} | {t for n in g.node for t in n.output} | {i.name for i in g.initializer}
    if name in taken:
        raise NotStreamable(f"the graph already has a tensor named {name!r}; pass another name for the frame mask")

