"""Graph surgery: a folded convolutional slice -> one fixed-shape stateful step.

The step takes E new input frames and the state, and returns E x rate output samples (delayed by
the graph's lookahead, see delays.py) and the next state. Nothing is recomputed:

* every tensor some reader needs from earlier steps keeps its last H samples in the state and is
  read as B = Concat(history, chunk) on the time axis;
* a Conv reads its whole receptive field from B and runs with pads 0 (its output is exactly the
  chunk at its own delay);
* a ConvTranspose reads its last `history` input samples from B, runs with pads 0 and keeps the
  part of its full overlap-add output that is complete (the input-side form of keeping the
  overlap-add tail: the bias is added once, it stores fewer floats, and it is one op);
* a pointwise / channel op whose inputs arrive at different delays reads the less delayed ones
  through the same buffers (a delay line is a window of B shifted by `back`);
* a crop or a zero pad of time passes its input on (the step computes those samples anyway);
* the next history is B's last H samples.

Each op's part is its streaming rule's (rkstudy.graph.streaming): this module only places the
buffers and the windows, along each tensor's own time axis.

Why graph surgery and not a torch re-trace: the rules need only the ONNX ops, so the same function
turns the Piper slice, the Inflect v2 decode.onnx (head included), a Vocos backbone or a BigVGAN
generator as their packages export them into a step without touching their weights or their Python
source, and nothing is re-exported (a new torch/onnx export decomposes ops into build hazards). A graph
it cannot stream is refused with the node that breaks it (delays.NotStreamable).

How the state crosses the graph I/O (`layout`): "grouped" is one tensor per leading shape
(channel count), state_in_k [1, C_k, L_k] with its buffers one after another along time, so the
only plumbing is time-axis Slice/Concat, the kind the windows already use (a tensor that carries time
on another axis, [1, T, C], gets a group of its own along that axis); "flat" is one
state_in [1, S] cut by Slice + Reshape per buffer. Both are exact; rknn-toolkit2 2.5.0 compiles the
grouped form in about a minute and did not finish the flat one (killed after 30 min), hence the
default. A walker keeps one flat vector either way: the state inputs flattened, in order.

Exactness at the ends needs every read past a tensor's ends to see what the full-length decode sees
there (zeros for a conv's padding, the first or last frame for an edge pad): the state starts at zero,
a walker flushes with zero frames and mask 0, and the boundary pass (rkstudy.graph.validity) masks
what the graph does not already zero and rewrites its edge and reflect pads from the same frame mask
(a graph masked after every conv, as the --dec-mask slice is, gets nothing and is cut exactly as
before).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, shape_inference

from .delays import DelayMap, NotStreamable, delay_map, name_nodes
from .streaming import Builder, StepContext, rule_for
from .validity import mask_boundaries

LAYOUTS = ("grouped", "flat")
STATE_IN, STATE_OUT = "state_in", "state_out"


@dataclass(frozen=True)
class Buffer:
    """One tensor's history: `history` samples of a tensor of shape `shape` (its time dim is the
    history) at `rate` samples per frame, time on `axis`, kept in state group `group` from `start`
    (grouped: along that axis; flat: along the vector)."""

    tensor: str
    shape: tuple[int, ...]
    axis: int
    history: int
    rate: int
    group: int
    start: int

    @property
    def floats(self) -> int:
        return int(np.prod(self.shape))


@dataclass(frozen=True)
class StateGroup:
    """One state tensor of the graph I/O, `input` fed back from `output`, both of `shape`."""

    input: str
    output: str
    shape: tuple[int, ...]
    buffers: int

    @property
    def floats(self) -> int:
        return int(np.prod(self.shape))


@dataclass
class StepGraph:
    """A stateful step graph and what its walker needs to know about it."""

    model: onnx.ModelProto
    delays: DelayMap
    emit: int                        # input frames per step
    time_inputs: tuple[str, ...]     # at `emit` frames each (x their rate 1)
    static_inputs: tuple[str, ...]   # fed unchanged every step (a speaker embedding, a noise scale)
    outputs: tuple[str, ...]         # the original outputs, at `emit x output_rate` samples
    output_rate: int                 # output samples per input frame (the hop)
    delay: int                       # output samples the stream lags its input: the lookahead
    layout: str
    groups: tuple[StateGroup, ...]   # in graph input order, and output order after `outputs`
    buffers: tuple[Buffer, ...]
    masks: tuple[str, ...] = ()      # time inputs the surgery added: frame masks the walker makes (validity.py)
    rewritten: tuple[str, ...] = ()  # the graph's pads the boundary pass rewrote (validity.py)
    masked: tuple[str, ...] = ()     # the nodes whose input the boundary pass multiplied by a length mask
    # each output's length over a whole utterance past rate x frames (an odd-stride upsampler without
    # output_padding ends short): the step emits rate x emit every step, the walker keeps this many more
    # (or fewer) samples at the end
    extents: dict[str, int] = field(default_factory=dict)

    @property
    def state_floats(self) -> int:
        return sum(g.floats for g in self.groups)

    @property
    def lookahead_frames(self) -> float:
        return self.delay / self.output_rate


def _layout(dm: DelayMap, layout: str) -> tuple[tuple[StateGroup, ...], tuple[Buffer, ...]]:
    """Place every history in the state: grouped by the tensor's other dims and time axis (one tensor
    per channel count, largest first, buffers one after another along time), or one after another in
    one vector."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: choose one of {', '.join(LAYOUTS)}")
    keys = {}
    for tensor in dm.history():
        shape = dm.shapes.get(tensor)
        if shape is None or any(d in (None, 0) for d in shape):
            raise NotStreamable(f"tensor {tensor!r} keeps history but its shape is unknown ({shape}); pin every "
                                "input shape (batch 1) before make_step")
        axis = dm.axis(tensor)
        keys[tensor] = (tuple(int(d) if k != axis else 0 for k, d in enumerate(shape)), axis)
    if not keys:
        raise NotStreamable("nothing in this graph reaches back in time; it needs no state")

    def sized(key, history):
        lead, axis = key
        return tuple(history if k == axis else d for k, d in enumerate(lead))

    buffers, fill, count = [], {}, {}
    if layout == "flat":
        for tensor, history in dm.history().items():
            key = keys[tensor]
            start = fill.get(0, 0)
            buffers.append(Buffer(tensor, sized(key, history), key[1], history, dm.timing[tensor].rate, 0, start))
            fill[0] = start + buffers[-1].floats
        return (StateGroup(STATE_IN, STATE_OUT, (1, fill[0]), len(buffers)),), tuple(buffers)
    order = sorted(set(keys.values()), key=lambda k: (-int(np.prod([d for d in k[0] if d])), k[1]))
    for tensor, history in dm.history().items():
        g = order.index(keys[tensor])
        start = fill.get(g, 0)
        buffers.append(Buffer(tensor, sized(keys[tensor], history), keys[tensor][1], history,
                              dm.timing[tensor].rate, g, start))
        fill[g], count[g] = start + history, count.get(g, 0) + 1
    groups = tuple(StateGroup(f"{STATE_IN}_{g}", f"{STATE_OUT}_{g}", sized(key, fill[g]), count[g])
                   for g, key in enumerate(order))
    return groups, tuple(buffers)


def make_step(model: onnx.ModelProto, time_inputs: Sequence[str], emit: int, layout: str = "grouped",
              mask_ends: bool = True) -> StepGraph:
    """The stateful step of `model` for `emit` input frames per step.

    `model` must be folded (no Shape plumbing), topologically sorted and pinned at any length;
    `time_inputs` are the inputs carrying time on their last axis at one sample per frame (z and
    y_mask for a VITS decoder slice, a mel); every other input is static. The step ONNX takes the time
    inputs at `emit` frames, the static inputs and the state tensors, and returns the original
    outputs at `emit x rate` samples and then the next state tensors (in group order).
    With `mask_ends` (the default) the boundary pass (rkstudy.graph.validity) makes every read past a
    tensor's ends see the full decode's boundary, driven by a frame mask it adds as a time input
    listed in `StepGraph.masks`; a graph that masks itself gets none.
    """
    if emit <= 0:
        raise ValueError(f"emit must be a positive number of frames, got {emit}")
    masks, rewritten, masked = (), (), ()
    if mask_ends:
        valid = mask_boundaries(model, time_inputs)
        if valid.mask is not None:
            model, masks, rewritten, masked = valid.model, (valid.mask,), valid.rewritten, valid.masked
    time_inputs = tuple(time_inputs) + masks
    model = name_nodes(model)
    dm = delay_map(model, time_inputs)
    groups, buffers = _layout(dm, layout)
    by_tensor = {b.tensor: b for b in buffers}
    reads = {(r.node, r.index): r for r in dm.reads}
    convs = {c.node: c for c in dm.convs}
    g = model.graph
    b = Builder()
    chunk = {t: emit * tm.rate for t, tm in dm.timing.items()}   # samples per step of each tensor
    sc = StepContext(b, dm.context, chunk)
    concat_of: dict[str, str] = {}   # tensor -> B = Concat(history, chunk)
    new_hist: dict[str, str] = {}    # tensor -> its next history

    def name(t: str) -> str:
        return sc.aliases.get(t, t)

    def open_buffer(tensor: str) -> None:
        buf = by_tensor.get(tensor)
        if buf is None:
            return
        group = groups[buf.group]
        if layout == "flat":
            hist = b.slice(group.input, buf.start, buf.start + buf.floats, 1, "hist")
            hist = b.node("Reshape", [hist, b.const(list(buf.shape), "shape")], "hist")
        else:
            hist = b.slice(group.input, buf.start, buf.start + buf.history, buf.axis, "hist")
        concat_of[tensor] = b.node("Concat", [hist, name(tensor)], "B", axis=buf.axis)
        n = chunk[tensor]
        nxt = b.slice(concat_of[tensor], n, n + buf.history, buf.axis, "next")
        if layout == "flat":
            nxt = b.node("Reshape", [nxt, b.const([1, buf.floats], "flat")], "next")
        new_hist[tensor] = nxt

    def window(r) -> str:
        """The tensor a reader sees: the chunk itself, or a window of B (or of the chunk)."""
        if r.back == 0 and r.extra == 0:
            return name(r.tensor)
        buf = by_tensor.get(r.tensor)
        hist = buf.history if buf else 0
        base = concat_of[r.tensor] if buf else name(r.tensor)
        start, stop = hist - r.back, hist + chunk[r.tensor] + r.extra - r.back
        if start == 0 and stop == hist + chunk[r.tensor]:
            return base
        return b.slice(base, start, stop, dm.axis(r.tensor), "win")

    for t in time_inputs:
        open_buffer(t)
    for node in g.node:
        if not dm.context.time_ins(node):
            sc.emit(node, [name(t) for t in node.input])
        else:
            inputs = [window(reads[(node.name, i)]) if (node.name, i) in reads else name(t)
                      for i, t in enumerate(node.input)]
            sc.plan = convs.get(node.name)
            rule_for(node).step(node, inputs, sc)
        for o in node.output:
            if o:
                open_buffer(o)

    out_names = [o.name for o in g.output]
    for k, o in enumerate(out_names):
        r = reads[("<output>", k)]
        if r.back:   # an output less delayed than the others goes through a delay line too
            if name(o) == o:
                _rename(b.nodes, o, o + "_undelayed")
            buf = by_tensor[o]
            b.slice(concat_of[o], buf.history - r.back, buf.history - r.back + chunk[o], dm.axis(o), "align", out=o)
        elif name(o) != o:
            b.node("Identity", [name(o)], "out", out=o)
    for k, group in enumerate(groups):
        members = [new_hist[x.tensor] for x in buffers if x.group == k]   # in `start` order
        axis = 1 if layout == "flat" else next(x.axis for x in buffers if x.group == k)
        b.nodes.append(helper.make_node("Concat", members, [group.output], name=b.name(group.output), axis=axis))

    static = tuple(i.name for i in g.input if i.name not in time_inputs)
    inputs = []
    for t in time_inputs:
        vi = next(i for i in g.input if i.name == t)
        dims = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        dims[dm.axis(t)] = emit
        inputs.append(helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, dims))
    inputs += [i for i in g.input if i.name in static]
    inputs += [helper.make_tensor_value_info(x.input, onnx.TensorProto.FLOAT, list(x.shape)) for x in groups]
    outputs = [helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for o in out_names]
    outputs += [helper.make_tensor_value_info(x.output, onnx.TensorProto.FLOAT, list(x.shape)) for x in groups]
    graph = helper.make_graph(b.nodes, f"{g.name}_step{emit}", inputs, outputs, list(g.initializer) + b.inits)
    step = helper.make_model(graph, opset_imports=list(model.opset_import))
    step.ir_version = model.ir_version
    step = shape_inference.infer_shapes(step, strict_mode=True)
    if dm.output_delay < 0:
        raise NotStreamable(f"the graph's outputs run {-dm.output_delay} samples ahead of its inputs; "
                            "nothing to stream")
    _check_output_lengths(step, out_names, emit * dm.output_rate, {o: dm.axis(o) for o in out_names})
    return StepGraph(model=step, delays=dm, emit=emit, time_inputs=tuple(time_inputs), static_inputs=static,
                     outputs=tuple(out_names), output_rate=dm.output_rate, delay=dm.output_delay, layout=layout,
                     groups=groups, buffers=buffers, masks=masks, rewritten=rewritten, masked=masked,
                     extents={o: dm.outputs[o].extent for o in out_names})


def _rename(nodes: list[onnx.NodeProto], old: str, new: str) -> None:
    for n in nodes:
        n.input[:] = [new if t == old else t for t in n.input]
        n.output[:] = [new if t == old else t for t in n.output]


def _check_output_lengths(step: onnx.ModelProto, outputs: Sequence[str], want: int, axes: dict) -> None:
    shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in step.graph.output}
    for o in outputs:
        dims = shapes.get(o) or [None]
        got = dims[axes[o]] if len(dims) > axes[o] else None
        if got != want:
            raise NotStreamable(f"step output {o!r} infers {got} samples, expected {want}; the graph's rates are off")
