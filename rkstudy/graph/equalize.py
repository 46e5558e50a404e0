"""Cross-layer equalization before quantization: per-channel scales moved across positive-homogeneous
activations into the convs on either side (host).

Why: the toolkit quantizes a conv's weights per output channel but every activation tensor with one
range (rkstudy.graph.quantsim says how), so a tensor whose channels span a wide range of magnitudes
spends most of its 8 bits on its largest channel. Data-free quantization (Nagel et al., 2019) rescales
channel c of such a tensor by 1/s_c and its readers' input channel c by s_c: the network computes
the same function and the ranges are evened out.

A **group** is a set of tensors that must carry one per-channel scale together: a conv's output, the
activations computed from it channel by channel (LeakyRelu, Relu, PRelu: f(x/s) = f(x)/s for s > 0;
a Mul or Div by a scalar or by a tensor one channel wide, such as a frame mask), and, through an Add
or Sub, every tensor summed with it. Its **writers** are the convs whose output channels it is
(their rows and biases are divided by s), its **readers** the convs reading it (their input
columns are multiplied by s); a Mul or Div by a per-channel constant is both (its constant takes
s_in / s_out), and so is a ConvTranspose (the HiFi-GAN upsamplers read one stage's stream and write
the next). A plain conv -> LeakyReLU -> conv pair is a group of two tensors, one writer and one
reader. A HiFi-GAN residual stream x + conv(lrelu(conv(lrelu(x)))) is one group: the upsampler and
every resblock conv write it, every resblock conv and the next upsampler read it, and one scale per
channel serves them all (a sum is exact under a scale only when both its terms carry the same one).
A group is **pinned** (kept at scale 1) when any of its tensors is a graph input or output, or is read
or written by an op a per-channel scale does not pass: the report names the op, e.g. gated
activations (Tanh, Sigmoid), a Split or Slice of the channels, a product of two scaled tensors, an
instance norm (scale-invariant but for its epsilon, so not exact) and the style-dependent per-channel
Mul and Add of an adaptive one.

**Snake** (x + sin^2(a x) / a, per-channel a) is not homogeneous, but it is exact under a
reparameterisation: snake_a(x) = s * snake_{a s}(x / s), i.e. with the input divided by s, the
constant inside the sine takes a * s and the one outside 1/(a s). In a graph the exporter writes it
as x + c2 * sin(c1 * x)^2 with two per-channel constants, and those two Muls are the boundaries
above (c1 <- c1 * s, c2 <- c2 / s), so Snake is handled by the same rules, not by a pattern.

**Exactness**: the rewritten graph is run in onnxruntime fp32 beside the original on real inputs,
and the original also in float64 (rkstudy.graph.f64); the rewrite is accepted when its fp32 output
is as close to the float64 result as the original's fp32 output is, within `EXACT_MARGIN_DB`
(`verify`, run by `equalize` itself; it raises NotExact otherwise). With `power_of_two` scales
every product and sum is scaled exactly, so the fp32 outputs are bit-equal.

**High biases** (`absorb_high_biases`): a channel whose pre-activation never changes sign on the
data can be shifted by a constant that the next layer's bias takes back. That is exact only where
the reader sees the constant at every output position; a reader that pads its input (every "same"
conv) or upsamples (every ConvTranspose) sees fewer taps of it at the window's borders, so those
channels are named and left alone.

**Bias correction** (`correct_biases`) changes the function on purpose: each conv's bias takes back
the mean its quantized weights add, (Q(W) - W) applied to the layer's mean input on calibration data,
and is verified by that claim (the corrected layer's mean output under Q(W) matches fp32's).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import Failed
from .index import Index, prune

CONVS = ("Conv", "ConvTranspose")
HOMOGENEOUS = ("LeakyRelu", "Relu", "PRelu", "Identity")  # f(x / s) = f(x) / s for s > 0, channel by channel
SUMS = ("Add", "Sub")
PRODUCTS = ("Mul", "Div")
METHODS = ("weights", "activations")
# the rewrite's fp32 output may sit this much further from float64 than the original's fp32 output (its rounding
# error up to ~3x the original's in amplitude: the rescaled weights are rounded to fp32 once more); a wrong scale
# on one channel, or one weight off by 0.1 %, sits 40 dB and more beyond it
EXACT_MARGIN_DB = 10.0
SCALE_LIMIT = 2.0 ** 10  # a scale is held within [1/limit, limit]: a channel that never moves gets no extreme


class NotExact(Failed):
    """A rewrite that should compute the same function in fp32 does not (exit 1)."""


# --- which tensors share a scale ---------------------------------------------------------------------
@dataclass(frozen=True)
class Group:
    """Tensors that carry one per-channel scale together (channel axis 1, `channels` wide), the nodes
    that write and read them across the scale, `residual` when a sum joins two of its tensors, and
    `pinned`: why it keeps scale 1 ('' when it can be equalized)."""

    tensors: tuple[str, ...]
    channels: int
    writers: tuple[str, ...]
    readers: tuple[str, ...]
    residual: bool
    pinned: str = ""
    pairs: tuple[tuple[str, str], ...] = ()  # (writer, reader) linked through the group's tensors

    @property
    def free(self) -> bool:
        return not self.pinned

    @property
    def kind(self) -> str:
        return "residual stream" if self.residual else "chain"

    def row(self, graph: str = "") -> dict:
        """One row of the per-graph report: what the group holds and whether it was equalized."""
        return {**({"graph": graph} if graph else {}), "first_writer": self.writers[0] if self.writers else "",
                "first_reader": self.readers[0] if self.readers else "", "kind": self.kind,
                "channels": self.channels, "tensors": len(self.tensors), "writers": len(self.writers),
                "readers": len(self.readers), "pairs": len(self.pairs), "equalized": self.free,
                "why_not": self.pinned}


class _Sets:
    """Union-find over tensor names."""

    def __init__(self):
        self.parent: dict[str, str] = {}

    def find(self, t: str) -> str:
        self.parent.setdefault(t, t)
        while self.parent[t] != t:
            self.parent[t] = self.parent[self.parent[t]]
            t = self.parent[t]
        return t

    def union(self, *ts: str) -> None:
        roots = [self.find(t) for t in ts]
        for r in roots[1:]:
            self.parent[r] = roots[0]


def _attr(node: onnx.NodeProto, name: str, default=None):
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def _channels(idx: Index, t: str) -> int | None:
    shape = idx.shapes.get(t)
    return shape[1] if shape and len(shape) >= 3 and shape[1] else None


def _const_channels(idx: Index, t: str, rank: int) -> int | None:
    """How wide a constant operand is on the channel axis of a rank-`rank` tensor it broadcasts against
    (1 for a scalar or a channel-broadcast constant)."""
    shape = tuple(idx.constants[t].shape)
    if len(shape) < rank - 1:  # right-aligned broadcasting: the channel axis is not among its dims
        return 1
    return shape[len(shape) - (rank - 1)]


def _is_conv(node: onnx.NodeProto, idx: Index) -> bool:
    """A Conv or ConvTranspose with constant weights (and bias) over a tensor with a channel axis."""
    bias = node.input[2] if len(node.input) > 2 else ""
    return (node.op_type in CONVS and node.domain in ("", "ai.onnx") and len(node.input) >= 2
            and idx.is_const(node.input[1]) and (not bias or idx.is_const(bias))
            and _channels(idx, node.input[0]) is not None and _channels(idx, node.output[0]) is not None)


def _scaling_operand(node: onnx.NodeProto, idx: Index) -> tuple[int, str] | None:
    """For a Mul or Div of a channel tensor by a per-channel constant: (index of the tensor operand,
    'boundary'); by a scalar, a channel-broadcast constant or a one-channel tensor: (that index,
    'through'); None otherwise."""
    if node.op_type not in PRODUCTS or len(node.input) != 2:
        return None
    a, b = node.input
    candidates = [0] if node.op_type == "Div" else [0, 1]  # x / c scales; c / x does not
    for k in candidates:
        x, other = node.input[k], node.input[1 - k]
        width = _channels(idx, x)
        if width is None or idx.is_const(x):
            continue
        rank = len(idx.shapes[x])
        if idx.is_const(other):
            c = _const_channels(idx, other, rank)
            if c == 1:
                return k, "through"
            if c == width and width > 1:
                return k, "boundary"
        elif _channels(idx, other) == 1 and width > 1:
            return k, "through"
    return None


def named(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` (edited) with a name of its own on every node that has none or shares one: groups name
    their writers and readers by node name."""
    seen: set[str] = set()
    for i, node in enumerate(model.graph.node):
        if not node.name or node.name in seen:
            base = node.name or f"{node.op_type}_{i}"
            name, k = base, 0
            while name in seen:
                k += 1
                name = f"{base}_{k}"
            node.name = name
        seen.add(node.name)
    return model


def find_groups(model: onnx.ModelProto) -> list[Group]:
    """Every group of `model` that a conv writes or reads (pinned ones included, with the reason), in
    graph order of their first tensor. The graph needs static shapes (a pinned, folded slice) and a
    distinct name on every node (`named`)."""
    names = [n.name for n in model.graph.node]
    if len(set(names)) != len(names) or "" in names:
        raise ValueError("find_groups names nodes by name: give every node a distinct one (equalize.named)")
    idx = Index.inferred(model)
    sets = _Sets()
    why: dict[str, str] = {}
    writers: dict[str, list[str]] = {}
    readers: dict[str, list[str]] = {}
    joined: set[str] = set()  # tensors a sum joins to another tensor of its group
    order: dict[str, int] = {}

    def pin(ts: Iterable[str], reason: str) -> None:
        for t in ts:
            if t and not idx.is_const(t):
                sets.find(t)
                why.setdefault(t, reason)

    g = model.graph
    for i, node in enumerate(idx.nodes):
        for t in list(node.input) + list(node.output):
            if t and not idx.is_const(t):
                order.setdefault(t, i)
        ins = [t for t in node.input if t and not idx.is_const(t)]
        label = f"{node.op_type} {node.name or node.output[0]}"
        if node.op_type == "Constant":
            continue
        if _is_conv(node, idx):
            readers.setdefault(node.input[0], []).append(node.name)
            writers.setdefault(node.output[0], []).append(node.name)
            sets.find(node.input[0])
            sets.find(node.output[0])
            continue
        if node.op_type in HOMOGENEOUS and len(node.output) == 1 and _channels(idx, node.input[0]) and (
                node.op_type != "PRelu" or idx.is_const(node.input[1])):
            sets.union(node.input[0], node.output[0])
            continue
        if node.op_type in SUMS and len(node.output) == 1 and _channels(idx, node.output[0]):
            wide = [t for t in ins if _channels(idx, t) == _channels(idx, node.output[0])]
            offsets = [t for t in node.input if idx.is_const(t)]
            if len(wide) == len(ins) and len(wide) + len(offsets) == 2:
                sets.union(*wide, node.output[0])
                if len(wide) == 2:
                    joined.update(wide)
                continue
        scaling = _scaling_operand(node, idx)
        if scaling is not None:
            k, role = scaling
            x, other = node.input[k], node.input[1 - k]
            if role == "through":
                sets.union(x, node.output[0])
                if not idx.is_const(other):
                    pin([other], f"multiplies {label}")
            else:
                readers.setdefault(x, []).append(node.name)
                writers.setdefault(node.output[0], []).append(node.name)
                sets.find(x)
                sets.find(node.output[0])
            continue
        pin(ins, f"read by {label}")
        pin(node.output, f"written by {label}")
    pin([i.name for i in g.input], "a graph input")
    pin([o.name for o in g.output], "a graph output")

    members: dict[str, list[str]] = {}
    for t in sets.parent:
        members.setdefault(sets.find(t), []).append(t)
    convs = {n.name for n in idx.nodes if _is_conv(n, idx)}
    out = []
    for tensors in members.values():
        tensors.sort(key=lambda t: order.get(t, -1))
        w = [n for t in tensors for n in writers.get(t, [])]
        r = [n for t in tensors for n in readers.get(t, [])]
        if not (set(w) | set(r)) & convs:
            continue
        widths = {_channels(idx, t) for t in tensors}
        reasons = [why[t] for t in tensors if t in why]
        if len(widths) != 1 or None in widths:
            reasons.append("its tensors differ in channel count")
        elif widths == {1}:
            reasons.append("one channel wide")
        if not w:
            reasons.append("no conv writes it")
        if not r:
            reasons.append("no conv reads it")
        width = next(iter(widths)) if len(widths) == 1 and None not in widths else 0
        out.append(Group(tuple(tensors), width or 0, tuple(dict.fromkeys(w)), tuple(dict.fromkeys(r)),
                         residual=any(t in joined for t in tensors), pinned="; ".join(dict.fromkeys(reasons)),
                         pairs=_pairs(idx, set(tensors), writers, readers)))
    out.sort(key=lambda grp: order.get(grp.tensors[0], -1))
    return out


def _pairs(idx: Index, tensors: set[str], writers: Mapping, readers: Mapping) -> tuple[tuple[str, str], ...]:
    """(writer, reader) pairs of a group: the reader reads a tensor the writer's output reaches through
    the group's own ops."""
    out = []
    for t in tensors:
        for w in writers.get(t, []):
            seen, stack = set(), [t]
            while stack:
                u = stack.pop()
                if u in seen:
                    continue
                seen.add(u)
                out += [(w, r) for r in readers.get(u, [])]
                for n in idx.consumers.get(u, []):
                    if n.name in readers.get(u, []):
                        continue
                    stack += [o for o in n.output if o in tensors]
    return tuple(dict.fromkeys(out))


# --- statistics from calibration feeds -----------------------------------------------------------------
@dataclass
class ChannelStats:
    """Per-channel minimum, maximum and mean of tensors over calibration feeds (batch and time pooled)."""

    lo: dict[str, np.ndarray] = field(default_factory=dict)
    hi: dict[str, np.ndarray] = field(default_factory=dict)
    mean: dict[str, np.ndarray] = field(default_factory=dict)
    feeds: int = 0

    def absmax(self, t: str) -> np.ndarray:
        return np.maximum(np.abs(self.lo[t]), np.abs(self.hi[t]))


def run_tensors(model: onnx.ModelProto, feeds: Sequence[Mapping[str, np.ndarray]], tensors: Sequence[str],
                each: Callable[[int, dict[str, np.ndarray]], None]) -> None:
    """Run `model` in onnxruntime fp32 on every feed, exposing `tensors` as outputs, and hand each run's
    {tensor: array} to `each(feed index, arrays)` (nothing is kept between feeds)."""
    import onnxruntime as ort  # heavy import, host only

    m = copy.deepcopy(model)
    del m.graph.output[:]
    idx = Index(model)
    m.graph.output.extend(helper.make_tensor_value_info(t, idx.elem_types.get(t, TensorProto.FLOAT), None)
                          for t in tensors)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    for k, feed in enumerate(feeds):
        each(k, dict(zip(tensors, sess.run(list(tensors), {n: np.asarray(feed[n]) for n in names}))))


def channel_stats(model: onnx.ModelProto, feeds: Sequence[Mapping[str, np.ndarray]],
                  tensors: Sequence[str]) -> ChannelStats:
    """Per-channel min, max and mean of `tensors` (channel axis 1) over `feeds`, from onnxruntime fp32."""
    stats = ChannelStats(feeds=len(feeds))
    sums: dict[str, np.ndarray] = {}
    counts: dict[str, int] = {}

    def each(_, arrays):
        for t, a in arrays.items():
            axes = tuple(i for i in range(a.ndim) if i != 1)
            lo, hi = a.min(axis=axes), a.max(axis=axes)
            stats.lo[t] = lo if t not in stats.lo else np.minimum(stats.lo[t], lo)
            stats.hi[t] = hi if t not in stats.hi else np.maximum(stats.hi[t], hi)
            sums[t] = sums.get(t, 0) + a.astype(np.float64).sum(axis=axes)
            counts[t] = counts.get(t, 0) + a.size // a.shape[1]

    run_tensors(model, feeds, list(dict.fromkeys(tensors)), each)
    stats.mean = {t: sums[t] / counts[t] for t in sums}
    return stats


# --- weights as the scales see them -----------------------------------------------------------------------
def _in_columns(w: np.ndarray, op: str, group: int, c: int) -> tuple:
    """The index of weight `w`'s entries that read input channel `c`."""
    if op == "ConvTranspose":  # [C_in, C_out / group, k...]
        return (c,)
    per = w.shape[1]  # Conv: [C_out, C_in / group, k...]
    outs = w.shape[0] // group
    g = c // per
    return (slice(g * outs, (g + 1) * outs), c % per)


def _out_rows(w: np.ndarray, op: str, group: int, o: int) -> tuple:
    """The index of weight `w`'s entries that write output channel `o`."""
    if op == "Conv":
        return (o,)
    per = w.shape[1]  # ConvTranspose: [C_in, C_out / group, k...]
    ins = w.shape[0] // group
    g = o // per
    return (slice(g * ins, (g + 1) * ins), o % per)


def _out_axis_view(w: np.ndarray, op: str, group: int) -> np.ndarray:
    """`w` as [C_out, everything a channel's output is computed with]."""
    if op == "Conv":
        return w.reshape(w.shape[0], -1)
    cin, per = w.shape[0], w.shape[1]
    v = w.reshape(group, cin // group, per, -1).transpose(0, 2, 1, 3)  # [group, out/group, in/group, k]
    return v.reshape(group * per, -1)


def _in_absmax(w: np.ndarray, op: str, group: int, channels: int) -> np.ndarray:
    return np.array([np.abs(w[_in_columns(w, op, group, c)]).max() for c in range(channels)])


def _out_absmax(w: np.ndarray, op: str, group: int) -> np.ndarray:
    return np.abs(_out_axis_view(w, op, group)).max(axis=1)


class _Weights:
    """The constants a rewrite changes, as float64 arrays, written back once at the end."""

    def __init__(self, model: onnx.ModelProto):
        self.idx = Index(model)
        self.nodes = {n.name: n for n in self.idx.nodes}
        self.values: dict[tuple[str, int], np.ndarray] = {}  # (node name, input index) -> new value

    def get(self, node: str, k: int) -> np.ndarray | None:
        if (node, k) not in self.values:
            n = self.nodes[node]
            if len(n.input) <= k or not n.input[k]:
                return None
            self.values[(node, k)] = np.asarray(self.idx.constants[n.input[k]], np.float64).copy()
        return self.values[(node, k)]

    def put(self, node: str, k: int, value: np.ndarray) -> None:
        self.values[(node, k)] = value

    def write(self, model: onnx.ModelProto, suffix: str) -> onnx.ModelProto:
        """`model` with every changed constant stored in its dtype: in place when this node alone reads it
        (an initializer), else under a new name `<node>/<suffix>.<input index>`."""
        g = model.graph
        inits = {i.name: i for i in g.initializer}
        readers: dict[str, int] = {}
        for n in g.node:
            for t in n.input:
                readers[t] = readers.get(t, 0) + 1
        nodes = {n.name: n for n in g.node}
        for (name, k), value in self.values.items():
            node = nodes[name]
            old = node.input[k] if len(node.input) > k else ""
            dtype = numpy_helper.to_array(inits[old]).dtype if old in inits else np.float32
            if old in inits and readers.get(old, 0) == 1 and not any(o.name == old for o in g.input):
                inits[old].CopyFrom(numpy_helper.from_array(value.astype(dtype), old))
                continue
            new = f"{name}/{suffix}.{k}"
            g.initializer.append(numpy_helper.from_array(value.astype(dtype), new))
            while len(node.input) <= k:
                node.input.append("")
            node.input[k] = new
        return model


def _bcast(s: np.ndarray, rank: int) -> np.ndarray:
    return s.reshape(1, -1, *([1] * (rank - 2)))


def _along_channels(s: np.ndarray, ndim: int, rank: int) -> np.ndarray:
    """`s` shaped to broadcast along the channel axis of a constant with `ndim` dims that broadcasts,
    right-aligned, against a rank-`rank` tensor (and reaches its channel axis)."""
    shape = [1] * ndim
    shape[ndim - (rank - 1)] = len(s)
    return s.reshape(shape)


def _apply(weights: _Weights, idx: Index, group: Group, s: np.ndarray, rank_of: Callable[[str], int]) -> None:
    """Divide `group`'s channels by `s`: its writers' output channels by s, its readers' input channels
    by 1/s, per-channel constants and sum offsets in step."""
    tensors = set(group.tensors)
    for name in group.writers:
        node = weights.nodes[name]
        if node.op_type in CONVS:
            w, grp = weights.get(name, 1), int(_attr(node, "group", 1))
            for o in range(group.channels):
                w[_out_rows(w, node.op_type, grp, o)] /= s[o]
            b = weights.get(name, 2)
            if b is not None:
                b /= s
        else:  # a product by a per-channel constant writing the group: x * c / s, x / (c s)
            k = 1 - _scaling_operand(node, idx)[0]
            c = weights.get(name, k)
            along = _along_channels(s, c.ndim, rank_of(node.output[0]))
            weights.put(name, k, c / along if node.op_type == "Mul" else c * along)
    for name in group.readers:
        node = weights.nodes[name]
        if node.op_type in CONVS:
            w, grp = weights.get(name, 1), int(_attr(node, "group", 1))
            for c in range(group.channels):
                w[_in_columns(w, node.op_type, grp, c)] *= s[c]
        else:  # a product reading the group: (x / s) * (c s), (x / s) / (c / s)
            k = 1 - _scaling_operand(node, idx)[0]
            c = weights.get(name, k)
            along = _along_channels(s, c.ndim, rank_of(node.input[1 - k]))
            weights.put(name, k, c * along if node.op_type == "Mul" else c / along)
    for node in idx.nodes:  # a constant added to the group's tensors is divided too
        if node.op_type in SUMS and node.output[0] in tensors:
            for k, t in enumerate(node.input):
                if idx.is_const(t):
                    c = weights.get(node.name, k)
                    rank = rank_of(node.output[0])
                    full = np.broadcast_to(c, np.broadcast_shapes(c.shape, (1, group.channels) + (1,) * (rank - 2)))
                    weights.put(node.name, k, full / _bcast(s, rank))


# --- choosing the scales ----------------------------------------------------------------------------------
def _writer_ranges(weights: _Weights, group: Group) -> np.ndarray | None:
    """Per channel: the largest of the writers' output-channel weight ranges, each relative to its own
    largest (what per-tensor weights would give that channel)."""
    rows = []
    for name in group.writers:
        node = weights.nodes[name]
        if node.op_type in CONVS:
            r = _out_absmax(weights.get(name, 1), node.op_type, int(_attr(node, "group", 1)))
            rows.append(r / max(r.max(), 1e-30))
    return np.max(rows, axis=0) if rows else None


def _reader_ranges(weights: _Weights, group: Group) -> np.ndarray | None:
    """Per channel: the largest of the readers' input-channel weight ranges, each relative to its own largest."""
    rows = []
    for name in group.readers:
        node = weights.nodes[name]
        if node.op_type in CONVS:
            r = _in_absmax(weights.get(name, 1), node.op_type, int(_attr(node, "group", 1)), group.channels)
            rows.append(r / max(r.max(), 1e-30))
    return np.max(rows, axis=0) if rows else None


def _activation_ranges(stats: ChannelStats, group: Group) -> np.ndarray:
    """Per channel: the largest of the group's tensors' channel ranges, each relative to its tensor's range."""
    rows = [stats.absmax(t) / max(stats.absmax(t).max(), 1e-30) for t in group.tensors if t in stats.lo]
    return np.max(rows, axis=0)


def _even(r1: np.ndarray | None, r2: np.ndarray | None, alpha: float = 0.5) -> np.ndarray | None:
    """s = r1^alpha / r2^(1 - alpha) per channel, for ranges r1 divided by s and r2 multiplied by it: with
    alpha = 1/2 both meet at sqrt(r1 r2) (Nagel et al.'s rule). Channels with nothing on a side keep 1."""
    if r1 is None or r2 is None:
        return None
    ok = (r1 > 0) & (r2 > 0)
    s = np.ones_like(r1)
    s[ok] = r1[ok] ** alpha / r2[ok] ** (1 - alpha)
    return s


def _normalised(s: np.ndarray, power_of_two: bool) -> np.ndarray:
    s = s / np.exp(np.mean(np.log(s)))  # geometric mean 1: the tensors keep their overall size
    s = np.clip(s, 1 / SCALE_LIMIT, SCALE_LIMIT)
    return 2.0 ** np.round(np.log2(s)) if power_of_two else s


# --- the pass --------------------------------------------------------------------------------------------------
@dataclass
class Equalized:
    """What `equalize` made: the rewritten model, every group it considered (pinned ones with their
    reason), the scale applied to each equalized group (by its first writer), and the exactness rows
    of `verify` (one per feed)."""

    model: onnx.ModelProto
    groups: list[Group]
    scales: dict[str, np.ndarray]
    method: str
    exactness: list[dict] = field(default_factory=list)

    @property
    def equalized(self) -> list[Group]:
        return [g for g in self.groups if g.free]

    @property
    def skipped(self) -> list[Group]:
        return [g for g in self.groups if not g.free]

    def summary(self) -> dict:
        """One row: how many groups and (writer, reader) pairs were equalized and skipped, and the worst
        exactness margin."""
        return {"method": self.method, "groups_equalized": len(self.equalized), "groups_skipped": len(self.skipped),
                "pairs_equalized": sum(len(g.pairs) for g in self.equalized),
                "pairs_skipped": sum(len(g.pairs) for g in self.skipped),
                "residual_streams_equalized": sum(g.residual for g in self.equalized),
                "worst_snr_vs_original_db": min((r["snr_vs_original_db"] for r in self.exactness), default=None),
                "worst_margin_db": min((r["margin_db"] for r in self.exactness), default=None)}


def scales_for(model: onnx.ModelProto, groups: Sequence[Group], method: str = "weights",
               stats: ChannelStats | None = None, alpha: float = 0.5, power_of_two: bool = False,
               sweeps: int = 8) -> dict[str, np.ndarray]:
    """The per-channel scale of each free group (keyed by its first writer), the group's tensors divided by it:

    * "weights" (Nagel et al.'s data-free rule): the writers' output-channel ranges and the readers'
      input-channel ranges met half way, s = sqrt(r_writer / r_reader), iterated over the graph (a
      conv reads one group and writes another, so each choice moves the next) for `sweeps` sweeps;
    * "activations": the group's activation ranges per channel on calibration `stats` against the
      readers' input-channel ranges, s = r_act^alpha / r_reader^(1 - alpha) (alpha = 1 evens the
      activations alone; the weights are quantized per output channel, which tolerates it).

    Scales are normalised to a geometric mean of 1, held within SCALE_LIMIT, and with `power_of_two`
    rounded to powers of two (the rewrite is then exact bit for bit)."""
    if method not in METHODS:
        raise ValueError(f"equalization method {method!r}: choose one of {', '.join(METHODS)}")
    if method == "activations" and stats is None:
        raise ValueError("the 'activations' method needs channel statistics from calibration feeds (channel_stats)")
    free = [g for g in groups if g.free]
    weights = _Weights(model)
    idx = Index.inferred(model)
    rank_of = lambda t: len(idx.shapes[t])  # noqa: E731
    total = {g.writers[0]: np.ones(g.channels) for g in free}
    for _ in range(sweeps if method == "weights" else 1):
        moved = 0.0
        for g in free:
            if method == "weights":
                s = _even(_writer_ranges(weights, g), _reader_ranges(weights, g))
            else:
                s = _even(_activation_ranges(stats, g), _reader_ranges(weights, g), alpha)
            if s is None:
                continue
            s = _normalised(s, False)
            _apply(weights, idx, g, s, rank_of)
            total[g.writers[0]] *= s
            moved = max(moved, float(np.max(np.abs(np.log(s)))))
        if moved < 1e-3:
            break
    return {k: _normalised(v, power_of_two) for k, v in total.items()}


def rescale(model: onnx.ModelProto, groups: Sequence[Group], scales: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of `model` with each free group's channels divided by its scale (keyed by first writer)."""
    model = copy.deepcopy(model)
    weights = _Weights(model)
    idx = Index.inferred(model)
    for g in groups:
        if g.free and g.writers[0] in scales:
            _apply(weights, idx, g, np.asarray(scales[g.writers[0]], np.float64), lambda t: len(idx.shapes[t]))
    return prune(weights.write(model, "equalized"))


def snr_db(ref: np.ndarray, test: np.ndarray) -> float:
    """10 log10(sum ref^2 / sum (ref - test)^2); infinite for equal arrays."""
    ref, test = np.asarray(ref, np.float64).ravel(), np.asarray(test, np.float64).ravel()
    noise = float(np.sum((ref - test) ** 2))
    return float("inf") if noise == 0 else float(10 * np.log10(np.sum(ref ** 2) / noise))


def verify(original: onnx.ModelProto, rewritten: onnx.ModelProto, feeds: Sequence[Mapping[str, np.ndarray]],
           margin_db: float = EXACT_MARGIN_DB) -> list[dict]:
    """Rows, one per feed and graph output: the rewritten graph's fp32 output against the original's
    (`snr_vs_original_db`, `bit_equal`), and both against the original run in float64 (the original
    fp32's own rounding, `fp32_rounding_snr_db`, and the rewritten one's, `snr_vs_float64_db`);
    `margin_db` is how much closer to float64 the rewrite stays than the bar. Raises NotExact when the
    rewritten output sits more than `margin_db` further from float64 than the original's fp32 does."""
    from .f64 import run_f64

    outputs = [o.name for o in original.graph.output]
    rows = []
    ref32: dict[int, dict] = {}
    new32: dict[int, dict] = {}
    run_tensors(original, feeds, outputs, lambda k, a: ref32.__setitem__(k, a))
    run_tensors(rewritten, feeds, outputs, lambda k, a: new32.__setitem__(k, a))
    for k, feed in enumerate(feeds):
        ref64 = dict(zip(outputs, run_f64(original, feed)))
        for name in outputs:
            floor = snr_db(ref64[name], ref32[k][name])
            got = snr_db(ref64[name], new32[k][name])
            rows.append({"feed": k, "output": name, "snr_vs_original_db": snr_db(ref32[k][name], new32[k][name]),
                         "bit_equal": bool(np.array_equal(ref32[k][name], new32[k][name])),
                         "fp32_rounding_snr_db": floor, "snr_vs_float64_db": got,
                         "margin_db": got - (floor - margin_db), "exact": got >= floor - margin_db})
    bad = [r for r in rows if not r["exact"]]
    if bad:
        r = min(bad, key=lambda r: r["margin_db"])
        raise NotExact(f"the rewritten graph's {r['output']} is {r['snr_vs_float64_db']:.1f} dB from float64 on feed "
                       f"{r['feed']}, the original's fp32 {r['fp32_rounding_snr_db']:.1f} dB: not within fp32 rounding "
                       f"({margin_db:g} dB); the rewrite is refused")
    return rows


def equalize(model, feeds: Sequence[Mapping[str, np.ndarray]], method: str = "weights", *,
             stats: ChannelStats | None = None, alpha: float = 0.5, power_of_two: bool = False,
             check: Sequence[Mapping[str, np.ndarray]] | None = None) -> Equalized:
    """Cross-layer equalization of every free group of `model` (a pinned, folded graph or its path),
    verified exact on `check` (default: `feeds`) before it is returned (NotExact otherwise). `feeds`
    are calibration inputs: the "activations" method takes its channel statistics from them (or from
    `stats`), the exactness check runs on them."""
    from . import load

    model = named(load(model))
    if not feeds:
        raise ValueError("equalize needs real inputs to verify the rewrite on; pass calibration feeds")
    groups = find_groups(model)
    if method == "activations" and stats is None:
        stats = channel_stats(model, feeds, [t for g in groups if g.free for t in g.tensors])
    scales = scales_for(model, groups, method, stats, alpha=alpha, power_of_two=power_of_two)
    rewritten = rescale(model, groups, scales)
    rows = verify(model, rewritten, check or feeds)
    return Equalized(rewritten, groups, scales, method, rows)


# --- high biases --------------------------------------------------------------------------------------------
def absorbable(model: onnx.ModelProto, stats: ChannelStats, groups: Sequence[Group] | None = None) -> list[dict]:
    """Per free chain group whose writer's output feeds one LeakyRelu or Relu: how many of its channels
    never change sign before the activation on the data of `stats` (so a shift there is exact on
    them), and whether every reader sees a constant input at every output position (no padding): the
    condition for its bias to take the shift back exactly. Rows name what stops it."""
    idx = Index.inferred(model)
    nodes = {n.name: n for n in idx.nodes}
    rows = []
    for g in groups if groups is not None else find_groups(model):
        if len(g.writers) != 1:
            continue
        writer = nodes[g.writers[0]]
        h = writer.output[0]
        acts = idx.consumers.get(h, [])
        if h not in stats.lo or len(acts) != 1 or acts[0].op_type not in ("LeakyRelu", "Relu"):
            continue
        positive, negative = int(np.sum(stats.lo[h] > 0)), int(np.sum(stats.hi[h] < 0))
        uneven = [r for r in g.readers if _uneven(nodes[r])]
        why = ("" if g.free else g.pinned) or ("a residual sum carries the shift to other readers" if g.residual
                                               else "")
        if not why and (len(g.tensors) != 2 or any(nodes[r].op_type != "Conv" for r in g.readers)):
            why = "the activation reaches its readers through other ops, or a reader has no bias to take the shift"
        if not why and uneven:
            why = (f"{len(uneven)} reader(s) see the shift at fewer taps on the window's borders than inside "
                   f"({uneven[0]} pads its input or upsamples), so no bias can take it back exactly")
        if not why and not positive and not negative:
            why = "no channel keeps one sign on the data"
        rows.append({"writer": g.writers[0], "channels": g.channels, "positive_channels": positive,
                     "negative_channels": negative, "readers": len(g.readers), "absorbed": not why,
                     "why_not": why})
    return rows


def _uneven(node: onnx.NodeProto) -> bool:
    """A constant input reaches this conv's outputs at different numbers of taps: it pads its input (the
    padding is zeros, not the constant), or it is a ConvTranspose (its first and last outputs, and with a
    kernel that is not a multiple of its stride every phase, gather fewer taps)."""
    if node.op_type == "ConvTranspose":
        return True
    if node.op_type != "Conv":
        return False
    auto = _attr(node, "auto_pad", b"NOTSET")
    return any(_attr(node, "pads", None) or []) or auto not in (b"NOTSET", b"VALID", "NOTSET", "VALID")


def absorb_high_biases(model: onnx.ModelProto, stats: ChannelStats,
                       feeds: Sequence[Mapping[str, np.ndarray]]) -> tuple[onnx.ModelProto, list[dict]]:
    """`model` with each absorbable channel (`absorbable`) shifted toward zero before its activation and
    the shift taken back by the readers' biases: a positive channel (h >= c > 0 on the data) by c,
    a negative one under LeakyRelu (h <= c < 0) by c, its activation then moving by alpha c. Verified
    exact on `feeds` (NotExact otherwise). Returns the model and the `absorbable` rows."""
    rows = absorbable(model, stats)
    idx = Index.inferred(model)
    nodes = {n.name: n for n in idx.nodes}
    weights = _Weights(model)
    for row in rows:
        if not row["absorbed"]:
            continue
        writer = nodes[row["writer"]]
        h = writer.output[0]
        act = idx.consumers[h][0]
        slope = float(_attr(act, "alpha", 0.01)) if act.op_type == "LeakyRelu" else 0.0
        lo, hi = stats.lo[h], stats.hi[h]
        shift = np.where(lo > 0, lo, np.where((hi < 0) & (slope > 0), hi, 0.0))
        after = np.where(lo > 0, shift, slope * shift)  # what the activation's output moves by
        b = weights.get(writer.name, 2)
        if b is None:
            b = np.zeros(row["channels"])
        weights.put(writer.name, 2, b - shift)
        group = next(g for g in find_groups(model) if g.writers and g.writers[0] == writer.name)
        for name in group.readers:
            reader = nodes[name]
            w, grp = weights.get(name, 1), int(_attr(reader, "group", 1))
            rb = weights.get(name, 2)
            if rb is None:
                rb = np.zeros(w.shape[0] if reader.op_type == "Conv" else w.shape[1] * grp)
            taps = np.zeros(len(rb))
            for c in np.flatnonzero(after):
                cols = _in_columns(w, reader.op_type, grp, int(c))
                part = np.zeros_like(w)
                part[cols] = w[cols]
                taps += _out_axis_view(part, reader.op_type, grp).sum(axis=1) * after[c]
            weights.put(name, 2, rb + taps)
    out = weights.write(copy.deepcopy(model), "absorbed")
    if any(r["absorbed"] for r in rows):
        verify(model, out, feeds)
    return out, rows


# --- bias correction --------------------------------------------------------------------------------------------
def quantize_weights(w: np.ndarray, bits: int = 8, axis: int = 0) -> np.ndarray:
    """`w` rounded to a symmetric grid of 2^(bits-1) - 1 steps each side per slice along `axis` (a
    Conv's output channels are axis 0, a ConvTranspose's axis 1), scale = its largest magnitude over
    that many steps: the weights a quantized layer computes with, as floats."""
    w = np.asarray(w, np.float64)
    steps = 2 ** (bits - 1) - 1
    moved = np.moveaxis(w, axis, 0)
    scale = np.abs(moved.reshape(moved.shape[0], -1)).max(axis=1) / steps
    scale = np.where(scale > 0, scale, 1.0).reshape(-1, *([1] * (moved.ndim - 1)))
    return np.moveaxis(np.clip(np.round(moved / scale), -steps, steps) * scale, 0, axis)


def weight_axis(op: str) -> int:
    """The axis of a conv's weight that holds its output channels (per-channel quantization's axis)."""
    return 1 if op == "ConvTranspose" else 0


def _mean_shift(node: onnx.NodeProto, error: np.ndarray, mean_in: np.ndarray) -> np.ndarray:
    """The mean output shift per output channel that weight error `error` adds on an input whose channel
    means are `mean_in` (a ConvTranspose spreads each tap over its stride)."""
    grp = int(_attr(node, "group", 1))
    weighted = error.copy()
    for c in range(len(mean_in)):
        weighted[_in_columns(error, node.op_type, grp, c)] *= mean_in[c]
    shift = _out_axis_view(weighted, node.op_type, grp).sum(axis=1)
    if node.op_type == "ConvTranspose":
        shift = shift / int(np.prod(_attr(node, "strides", [1])))
    return shift


def correct_biases(model, feeds: Sequence[Mapping[str, np.ndarray]], weight_bits: int = 8,
                   check: Sequence[Mapping[str, np.ndarray]] | None = None,
                   which: Callable[[onnx.NodeProto], bool] | None = None) -> tuple[onnx.ModelProto, list[dict]]:
    """`model` with each conv's bias taking back the mean shift its quantized weights add (per-channel
    symmetric `weight_bits`, quantize_weights), from its input's channel means on `feeds` (fp32).

    This changes the fp32 function on purpose, so it is verified by what it claims: on `check` (default
    `feeds`; data held apart from them tests that the means carry over), each corrected conv run alone on
    its fp32 inputs with Q(W) must have a mean output per channel closer to fp32's than without the
    correction; a conv where it is not keeps its bias (`corrected` False, `why_not` says so). One row
    per conv: the largest per-channel mean error before and after, each also relative to the output's
    range."""
    from . import load

    model = named(load(model))
    idx = Index.inferred(model)
    convs = [n for n in idx.nodes if _is_conv(n, idx) and (which is None or which(n))]
    stats = channel_stats(model, feeds, list(dict.fromkeys(n.input[0] for n in convs)))
    shifts = {}
    for n in convs:
        w = np.asarray(idx.constants[n.input[1]], np.float64)
        shifts[n.name] = _mean_shift(n, quantize_weights(w, weight_bits, weight_axis(n.op_type)) - w,
                                     stats.mean[n.input[0]])

    def corrected_by(names: Iterable[str]) -> onnx.ModelProto:
        weights = _Weights(model)
        for name in names:
            b = weights.get(name, 2)
            weights.put(name, 2, (b if b is not None else np.zeros(len(shifts[name]))) - shifts[name])
        return weights.write(copy.deepcopy(model), "bias_corrected")

    rows = _mean_errors(model, corrected_by(shifts), convs, check or feeds, weight_bits)
    for r in rows:
        r["corrected"] = r["mean_error_after"] <= r["mean_error_before"]
        r["why_not"] = "" if r["corrected"] else "its mean output moves further from fp32's on the check data"
    return corrected_by(r["conv"] for r in rows if r["corrected"]), rows


def _mean_errors(original: onnx.ModelProto, corrected: onnx.ModelProto, convs: Sequence[onnx.NodeProto],
                 feeds: Sequence[Mapping[str, np.ndarray]], weight_bits: int) -> list[dict]:
    """Per conv: its output's per-channel means over `feeds` with fp32 weights and with Q(W), with the
    original bias and the corrected one, each conv run alone on its fp32 input."""
    idx, new = Index(original), Index(corrected)
    new_nodes = {n.name: n for n in new.nodes}
    sums: dict[str, dict[str, np.ndarray]] = {}
    count: dict[str, int] = {}

    def each(_, arrays):
        for n in convs:
            x = arrays[n.input[0]]
            w = np.asarray(idx.constants[n.input[1]])
            q = quantize_weights(w, weight_bits, weight_axis(n.op_type)).astype(w.dtype)
            c = new_nodes[n.name]
            runs = {"fp32": idx.probe([n], {n.input[0]: x}, [n.output[0]])[0],
                    "before": idx.probe([n], {n.input[0]: x}, [n.output[0]], extra={n.input[1]: q})[0],
                    "after": new.probe([c], {c.input[0]: x}, [c.output[0]], extra={c.input[1]: q})[0]}
            axes = tuple(i for i in range(x.ndim) if i != 1)
            acc = sums.setdefault(n.name, {})
            for key, y in runs.items():
                acc[key] = acc.get(key, 0) + y.astype(np.float64).sum(axis=axes)
            acc["range"] = np.maximum(acc.get("range", 0), np.abs(runs["fp32"]).max())
            count[n.name] = count.get(n.name, 0) + runs["fp32"].size // runs["fp32"].shape[1]

    run_tensors(original, feeds, list(dict.fromkeys(n.input[0] for n in convs)), each)
    rows = []
    for n in convs:
        acc, k = sums[n.name], count[n.name]
        before = float(np.max(np.abs(acc["before"] - acc["fp32"])) / k)
        after = float(np.max(np.abs(acc["after"] - acc["fp32"])) / k)
        rng = float(acc["range"])
        rows.append({"conv": n.name, "op": n.op_type, "weight_bits": weight_bits, "mean_error_before": before,
                     "mean_error_after": after, "relative_before": before / rng if rng else 0.0,
                     "relative_after": after / rng if rng else 0.0})
    return rows
