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
* the next history is B's last H samples.

Why graph surgery and not a torch re-trace: the rules need only the ONNX ops (Conv,
ConvTranspose, pointwise, channel Slice/Split/Concat), so the same function turns the Piper slice,
the Inflect v2 decode.onnx (head included) or any other VITS-like export into a step without
touching its weights or its Python source, and nothing is re-exported (a new torch/onnx export
decomposes ops into build hazards). A graph it cannot stream is refused with the node that breaks
it (delays.NotStreamable).

How the state crosses the graph I/O (`layout`): "grouped" is one tensor per leading shape
(channel count), state_in_k [1, C_k, L_k] with its buffers one after another along time, so the
only plumbing is time-axis Slice/Concat, the kind the windows already use; "flat" is one
state_in [1, S] cut by Slice + Reshape per buffer. Both are exact; rknn-toolkit2 2.5.0 compiles the
grouped form in about a minute and did not finish the flat one (killed after 30 min), hence the
default. A walker keeps one flat vector either way: the state inputs flattened, in order.

Exactness at the ends needs every conv input to be zero outside the utterance, as the full-length
decode's zero padding is: the state starts at zero, a walker flushes with zero frames and mask 0,
and every conv input that the graph does not already zero there is multiplied by a frame mask the
surgery adds (rkstudy.graph.validity; a graph masked after every conv, as the --dec-mask slice is,
gets none and is cut exactly as before).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from .delays import DelayMap, NotStreamable, delay_map, name_nodes
from .validity import mask_conv_inputs

LAYOUTS = ("grouped", "flat")
STATE_IN, STATE_OUT = "state_in", "state_out"


@dataclass(frozen=True)
class Buffer:
    """One tensor's history: `history` samples of a [*lead, T] tensor at `rate` samples per frame,
    kept in state group `group` from `start` (grouped: along time; flat: along the vector)."""

    tensor: str
    lead: tuple[int, ...]   # the tensor's leading dims (batch, channels)
    history: int
    rate: int
    group: int
    start: int

    @property
    def floats(self) -> int:
        return int(np.prod(self.lead)) * self.history


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
class Step:
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

    @property
    def state_floats(self) -> int:
        return sum(g.floats for g in self.groups)

    @property
    def lookahead_frames(self) -> float:
        return self.delay / self.output_rate


class _Builder:
    """Collects the new nodes and constants of the step graph."""

    def __init__(self):
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0

    def name(self, base: str) -> str:
        self._n += 1
        return f"/stateful/{base.strip('/').replace('/', '_')}_{self._n}"

    def const(self, values, base: str) -> str:
        name = self.name(base)
        self.inits.append(numpy_helper.from_array(np.asarray(values, dtype=np.int64), name))
        return name

    def slice(self, x: str, start: int, stop: int, axis: int, base: str, out: str | None = None) -> str:
        out = out or self.name(base)
        self.nodes.append(helper.make_node(
            "Slice", [x, self.const([start], base + "_s"), self.const([stop], base + "_e"),
                      self.const([axis], base + "_a")], [out], name=self.name(base + "_Slice")))
        return out

    def node(self, op: str, inputs: Sequence[str], base: str, **attrs) -> str:
        out = self.name(base)
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=self.name(base + "_" + op), **attrs))
        return out


def _layout(dm: DelayMap, layout: str) -> tuple[tuple[StateGroup, ...], tuple[Buffer, ...]]:
    """Place every history in the state: grouped by leading dims (one tensor per channel count,
    largest first, buffers one after another along time), or one after another in one vector."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: choose one of {', '.join(LAYOUTS)}")
    leads = {}
    for tensor in dm.history():
        lead = dm.shapes.get(tensor)
        if lead is None or any(d in (None, 0) for d in lead):
            raise NotStreamable(f"tensor {tensor!r} keeps history but its leading dims are unknown "
                                f"({lead}); pin every input shape (batch 1) before make_step")
        leads[tensor] = tuple(int(d) for d in lead)
    if not leads:
        raise NotStreamable("nothing in this graph reaches back in time; it needs no state")
    buffers, fill, count = [], {}, {}
    if layout == "flat":
        for tensor, history in dm.history().items():
            start = fill.get(0, 0)
            buffers.append(Buffer(tensor, leads[tensor], history, dm.timing[tensor].rate, 0, start))
            fill[0] = start + buffers[-1].floats
        return (StateGroup(STATE_IN, STATE_OUT, (1, fill[0]), len(buffers)),), tuple(buffers)
    order = sorted(set(leads.values()), key=lambda ld: -int(np.prod(ld)))
    for tensor, history in dm.history().items():
        k = order.index(leads[tensor])
        start = fill.get(k, 0)
        buffers.append(Buffer(tensor, leads[tensor], history, dm.timing[tensor].rate, k, start))
        fill[k], count[k] = start + history, count.get(k, 0) + 1
    groups = tuple(StateGroup(f"{STATE_IN}_{k}", f"{STATE_OUT}_{k}", ld + (fill[k],), count[k])
                   for k, ld in enumerate(order))
    return groups, tuple(buffers)


def make_step(model: onnx.ModelProto, time_inputs: Sequence[str], emit: int, layout: str = "grouped",
              mask_ends: bool = True) -> Step:
    """The stateful step of `model` for `emit` input frames per step.

    `model` must be folded (no Shape plumbing), topologically sorted and pinned at any length;
    `time_inputs` are the inputs carrying time on their last axis at one sample per frame (z and
    y_mask for a VITS decoder slice); every other input is static. The step ONNX takes the time
    inputs at `emit` frames, the static inputs and the state tensors, and returns the original
    outputs at `emit x rate` samples and then the next state tensors (in group order).
    With `mask_ends` (the default) every conv input that is not already zero outside the real
    frames is multiplied by a frame mask (rkstudy.graph.validity), added as a time input listed in
    `Step.masks`; a graph that masks itself gets none.
    """
    if emit <= 0:
        raise ValueError(f"emit must be a positive number of frames, got {emit}")
    masks: tuple[str, ...] = ()
    if mask_ends:
        valid = mask_conv_inputs(model, time_inputs)
        if valid.mask is not None:
            model, masks = valid.model, (valid.mask,)
    time_inputs = tuple(time_inputs) + masks
    model = name_nodes(model)
    dm = delay_map(model, time_inputs)
    groups, buffers = _layout(dm, layout)
    by_tensor = {b.tensor: b for b in buffers}
    reads = {(r.node, r.index): r for r in dm.reads}
    convs = {c.node: c for c in dm.convs}
    g = model.graph
    b = _Builder()
    chunk = {t: emit * tm.rate for t, tm in dm.timing.items()}   # samples per step of each tensor
    concat_of: dict[str, str] = {}   # tensor -> B = Concat(history, chunk)
    new_hist: dict[str, str] = {}    # tensor -> its next history

    def open_buffer(tensor: str) -> None:
        buf = by_tensor.get(tensor)
        if buf is None:
            return
        group = groups[buf.group]
        if layout == "flat":
            hist = b.slice(group.input, buf.start, buf.start + buf.floats, 1, "hist")
            hist = b.node("Reshape", [hist, b.const(list(buf.lead) + [buf.history], "shape")], "hist")
        else:
            hist = b.slice(group.input, buf.start, buf.start + buf.history, -1, "hist")
        concat_of[tensor] = b.node("Concat", [hist, tensor], "B", axis=-1)
        n = chunk[tensor]
        nxt = b.slice(concat_of[tensor], n, n + buf.history, -1, "next")
        if layout == "flat":
            nxt = b.node("Reshape", [nxt, b.const([1, buf.floats], "flat")], "next")
        new_hist[tensor] = nxt

    def window(r) -> str:
        """The tensor a reader sees: the chunk itself, or a window of B."""
        if r.back == 0 and r.extra == 0:
            return r.tensor
        buf = by_tensor[r.tensor]
        start, stop = buf.history - r.back, buf.history + chunk[r.tensor] + r.extra - r.back
        if start == 0 and stop == buf.history + chunk[r.tensor]:
            return concat_of[r.tensor]
        return b.slice(concat_of[r.tensor], start, stop, -1, "win")

    for t in time_inputs:
        open_buffer(t)
    for node in g.node:
        for i in range(len(node.input)):
            r = reads.get((node.name, i))
            if r is not None:
                node.input[i] = window(r)
        plan = convs.get(node.name)
        if plan is not None:
            _unpad(node)
        produced = list(node.output)
        if plan is not None and plan.op == "ConvTranspose" and plan.kernel != plan.stride:
            # the full overlap-add output of (history + chunk) inputs; keep its complete, new part
            full = b.name(node.output[0] + "_full")
            node.output[0] = full
            b.nodes.append(node)
            lo = plan.history * plan.stride
            b.slice(full, lo, lo + chunk[produced[0]], -1, "ct", out=produced[0])
        else:
            b.nodes.append(node)
        for o in produced:
            open_buffer(o)

    out_names = [o.name for o in g.output]
    for k, o in enumerate(out_names):
        r = reads[("<output>", k)]
        if r.back:   # an output less delayed than the others goes through a delay line too
            _rename(b.nodes, o, o + "_undelayed")
            buf = by_tensor[o]
            b.slice(concat_of[o], buf.history - r.back, buf.history - r.back + chunk[o], -1, "align", out=o)
    for k, group in enumerate(groups):
        members = [new_hist[x.tensor] for x in buffers if x.group == k]   # in `start` order
        b.nodes.append(helper.make_node("Concat", members, [group.output], name=b.name(group.output),
                                        axis=1 if layout == "flat" else -1))

    static = tuple(i.name for i in g.input if i.name not in time_inputs)
    lead = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim][:-1] for i in g.input}
    inputs = [helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, lead[t] + [emit]) for t in time_inputs]
    inputs += [i for i in g.input if i.name in static]
    inputs += [helper.make_tensor_value_info(x.input, onnx.TensorProto.FLOAT, list(x.shape)) for x in groups]
    outputs = [helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for o in out_names]
    outputs += [helper.make_tensor_value_info(x.output, onnx.TensorProto.FLOAT, list(x.shape)) for x in groups]
    graph = helper.make_graph(b.nodes, f"{g.name}_step{emit}", inputs, outputs, list(g.initializer) + b.inits)
    step = helper.make_model(graph, opset_imports=list(model.opset_import))
    step.ir_version = model.ir_version
    step = shape_inference.infer_shapes(step, strict_mode=True)
    _check_output_lengths(step, out_names, emit * dm.output_rate)
    return Step(model=step, delays=dm, emit=emit, time_inputs=tuple(time_inputs), static_inputs=static,
                outputs=tuple(out_names), output_rate=dm.output_rate, delay=dm.output_delay, layout=layout,
                groups=groups, buffers=buffers, masks=masks)


def _rename(nodes: list[onnx.NodeProto], old: str, new: str) -> None:
    for n in nodes:
        n.input[:] = [new if t == old else t for t in n.input]
        n.output[:] = [new if t == old else t for t in n.output]


def _unpad(node: onnx.NodeProto) -> None:
    """Set a conv's pads to 0: the window it reads from B already holds its receptive field."""
    kept = [a for a in node.attribute if a.name != "pads"]
    del node.attribute[:]
    node.attribute.extend(kept + [helper.make_attribute("pads", [0, 0])])


def _check_output_lengths(step: onnx.ModelProto, outputs: Sequence[str], want: int) -> None:
    shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in step.graph.output}
    for o in outputs:
        got = shapes.get(o, [None])[-1]
        if got != want:
            raise NotStreamable(f"step output {o!r} infers {got} samples, expected {want}; the graph's rates are off")
