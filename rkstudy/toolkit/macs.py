"""Which compiled layer computes which ONNX conv (host): the conv layers of a verbose build's layer table
attributed to the graph's Conv / ConvTranspose nodes, each with its multiply-accumulates from its own
table shapes, and every MAC the table prints that the graph's convs do not have, said by cause.

Why attribution: a quantized engine's speed is decided by how many of its conv MACs run on low-bit
weights, and the layer table is the only place that says which compiled layer computes in which dtype.
Summing the table's conv layers as printed counts 8-34 % more MACs than the graph has (measured on the
Piper encoder, the Qwen3 step and the Kokoro window), for four reasons this module separates:

* ops that are no conv in the graph compiled as convs: a MatMul (attention, a style projection), a
  ReduceSum, a GlobalAveragePool (a chain of strided depthwise convs), a scalar Mul (a 1x1 conv);
* a depthwise conv's weight printed as (1, C, kh, kw): read as (C_out, C_in/group, ...) it counts C
  times its MACs;
* a transposed conv the compiler lowers to a zero-stuffing `exConvTransposePad` and a plain conv over
  the stuffed input: its printed MACs count every inserted zero (stride times the real ones);
* a conv whose output the graph slices: the compiler computes only the samples kept (fewer MACs than
  the graph's node).

The attribution is by name, because the compiler names a layer after what it came from: the conv node
(`/dec/conv_post/Conv`, fused: `..._ConvAdd`, split: `#1`), its output tensor (`..._output_0_tile1`),
or the tensor it reads (`/flow/flows.6/Mul_output_0-rs_conv`, `input.376-rs_conv`); a layer named
after any other node (`/enc_p/.../MatMul_1`, `/GlobalAveragePool_2conv0`) computes no graph conv.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .. import graph
from ..graph.index import Index
from .log import Layer

CONV_OPS = ("Conv", "ConvTranspose")
_SEPARATOR = re.compile(r"[_\-#]")
LOWERED_PAD = "exConvTransposePad"  # the zero-stuffing half of a transposed conv the compiler lowers


def shapes(text: str) -> list[tuple[int, ...]]:
    """The shapes of a layer-table shape column, '(1,16,1,64),(16,16,1,7),(16)' -> [(1, 16, 1, 64), ...]."""
    return [tuple(int(d) for d in group.split(",") if d) for group in re.findall(r"\(([0-9,]*)\)", text)]


@dataclass(frozen=True)
class ConvLayer:
    """One compiled layer that computes with a weight (the table's op Conv*), with its MACs from its own
    shapes (`printed_macs` read naively: data elements x weight[1] x kernel; `macs` corrected for the
    depthwise layout and the zero-stuffed input of a lowered transposed conv), `kind` (conv, depthwise,
    transposed, lowered transposed), the graph conv it computes (`node`, None when it computes none)
    and how its name resolved (`origin`: node, output, input, or the non-conv op it came from)."""

    layer: Layer
    macs: int
    printed_macs: int
    kind: str
    node: str | None
    origin: str


def graph_convs(model) -> dict[str, dict]:
    """{node name: {op, macs, weight_params}} of every Conv / ConvTranspose, from the shapes onnx infers
    (Conv: output elements x C_in/group x kernel; ConvTranspose: input elements x C_out/group x kernel)."""
    idx = Index.inferred(graph.load(model))
    out = {}
    for n in idx.nodes:
        if n.op_type not in CONV_OPS:
            continue
        w = idx.initializers[n.input[1]].dims if n.input[1] in idx.initializers else None
        dims = idx.shapes.get(n.output[0] if n.op_type == "Conv" else n.input[0])
        if w is None or not dims or not all(dims):
            raise ValueError(f"{n.op_type} {n.name!r}: no static weights or shape; pin the inputs first")
        out[n.name] = {"op": n.op_type, "macs": int(np.prod(dims)) * int(w[1]) * int(np.prod(w[2:])),
                       "weight_params": int(np.prod(w))}
    return out


def locate(name: str, index: Index) -> tuple[str | None, str]:
    """What of the graph a compiled layer or a quantization-config tensor is named after: the longest
    prefix of `name` (cut at '_', '-' or '#') that is a node ('node', its name) or a tensor ('tensor',
    its name: a node's output, a graph input or output); (None, name) when no prefix is either."""
    nodes = {n.name for n in index.nodes}
    inputs = {i.name for i in index.model.graph.input}
    for cut in sorted([m.start() for m in _SEPARATOR.finditer(name)] + [len(name)], reverse=True):
        prefix = name[:cut]
        if prefix in index.producer or prefix in index.consumers or prefix in inputs:
            return "tensor", prefix
        if prefix in nodes:
            return "node", prefix
    return None, name


def resolve(name: str, index: Index, convs: Iterable[str]) -> tuple[str | None, str]:
    """The graph conv a compiled layer named `name` computes, and how the name resolved (see locate): a
    conv node: `node`; a tensor a conv produces: `output`; a tensor only one conv reads: `input`; anything
    else: (None, what it is: 'MatMul', 'GlobalAveragePool', 'tensor of Unsqueeze', 'graph input')."""
    convs = set(convs)
    kind, found = locate(name, index)
    if kind == "node":
        if found in convs:
            return found, "node"
        return None, next(n.op_type for n in index.nodes if n.name == found)
    if kind == "tensor":
        producer = index.producer.get(found)
        if producer is not None and producer.name in convs:
            return producer.name, "output"
        readers = [n.name for n in index.consumers.get(found, []) if n.name in convs]
        if len(readers) == 1:
            return readers[0], "input"
        if readers:
            return None, f"tensor read by {len(readers)} convs"
        return None, f"tensor of {producer.op_type}" if producer is not None else "graph input"
    return None, "unresolved"


def conv_layers(layers: Sequence[Layer]) -> list[tuple[Layer, int, int, str]]:
    """(layer, corrected MACs, printed MACs, kind) of every table layer that computes with a weight."""
    stuffed: dict[tuple[int, ...], tuple[int, ...]] = {}  # a zero-stuffing pad's output (N, H, W) -> its input
    out = []
    for layer in layers:
        ins, outs = shapes(layer.inputs), shapes(layer.output)
        if layer.op == LOWERED_PAD and ins and outs:
            x, y = ins[0], outs[0]
            stuffed[(y[0], *y[2:])] = x
            continue
        if not layer.op.startswith("Conv") or len(ins) < 2 or not outs:
            continue
        x, w, y = ins[0], ins[1], outs[0]
        kernel = int(np.prod(w[2:]))
        if layer.op.startswith("ConvTranspose"):  # weight (C_in, C_out/group, k): every input meets every tap
            printed = macs = int(np.prod(x)) * w[1] * kernel
            kind = "transposed"
        else:
            printed = int(np.prod(y)) * w[1] * kernel
            real = stuffed.get((x[0], *x[2:]))
            if real is not None:  # the plain half of a lowered transposed conv: only the real samples count
                macs, kind = x[0] * x[1] * int(np.prod(real[2:])) * y[1] * kernel, "lowered transposed"
            elif w[0] == 1 and w[1] == y[1] == x[1] and y[1] > 1:  # depthwise, printed (1, C, kh, kw)
                macs, kind = int(np.prod(y)) * kernel, "depthwise"
            else:
                macs, kind = printed, "conv"
        out.append((layer, macs, printed, kind))
    return out


@dataclass
class Accounting:
    """A compiled engine's conv layers against its graph's convs. `graph` is graph_convs; `layers` every
    ConvLayer. Shares weigh each graph conv by its own MACs (or weights), split between its layers'
    dtypes by their table MACs (tiles of one conv can differ)."""

    graph: dict[str, dict]
    layers: list[ConvLayer] = field(default_factory=list)

    @property
    def conv_macs(self) -> int:
        return sum(c["macs"] for c in self.graph.values())

    @property
    def coverage(self) -> float:
        """The share of the graph's conv MACs whose conv has a compiled layer (1.0: every conv found)."""
        found = {c.node for c in self.layers if c.node}
        return sum(c["macs"] for n, c in self.graph.items() if n in found) / self.conv_macs if self.graph else 0.0

    def share(self, chosen: Callable[[Layer], bool], weights: bool = False) -> float:
        """The share of the graph's conv MACs (`weights`: conv weight parameters) computed by layers
        `chosen` says yes to (e.g. layers on weights of 8 bits or fewer)."""
        per: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for c in self.layers:
            if c.node:
                per[c.node][0] += c.macs if chosen(c.layer) else 0
                per[c.node][1] += c.macs
        key = "weight_params" if weights else "macs"
        total = sum(c[key] for c in self.graph.values())
        got = sum(self.graph[n][key] * yes / all_ for n, (yes, all_) in per.items() if all_)
        return got / total if total else 0.0

    def chosen_nodes(self, chosen: Callable[[Layer], bool]) -> list[str]:
        """The graph convs any of whose layers `chosen` says yes to, in graph order."""
        hit = {c.node for c in self.layers if c.node and chosen(c.layer)}
        return [n for n in self.graph if n in hit]

    def reconciliation(self) -> dict:
        """The table's printed conv MACs against the graph's, every difference by cause; `unexplained`
        is what no cause accounts for (0 when the attribution is exact)."""
        printed = sum(c.printed_macs for c in self.layers)
        not_conv: dict[str, int] = defaultdict(int)
        for c in self.layers:
            if c.node is None:
                not_conv[c.origin] += c.printed_macs
        per_node: dict[str, int] = defaultdict(int)
        for c in self.layers:
            if c.node:
                per_node[c.node] += c.macs
        trimmed = sum(max(0, self.graph[n]["macs"] - m) for n, m in per_node.items())
        over = sum(max(0, m - self.graph[n]["macs"]) for n, m in per_node.items())
        missing = sum(c["macs"] for n, c in self.graph.items() if n not in per_node)
        return {"graph_conv_macs": self.conv_macs, "table_printed_conv_macs": printed,
                "printed_over_graph": round(printed / self.conv_macs, 4) if self.conv_macs else 0.0,
                "not_graph_convs_macs": sum(not_conv.values()),
                "not_graph_convs": " ".join(f"{k}:{v}" for k, v in sorted(not_conv.items())),
                "depthwise_layout_extra_macs": sum(c.printed_macs - c.macs for c in self.layers
                                                   if c.node and c.kind == "depthwise"),
                "zero_stuffing_extra_macs": sum(c.printed_macs - c.macs for c in self.layers
                                                if c.node and c.kind == "lowered transposed"),
                "sliced_output_macs_not_computed": trimmed, "convs_without_a_layer_macs": missing,
                "unexplained_macs": over, "coverage": round(self.coverage, 6)}


def account(model, layers: Sequence[Layer]) -> Accounting:
    """Attribute `layers` (a verbose build's layer table) to the convs of `model` (path or ModelProto)."""
    model = graph.load(model)
    convs = graph_convs(model)
    index = Index(model)
    found = []
    for layer, macs, printed, kind in conv_layers(layers):
        node, origin = resolve(layer.node, index, convs)
        found.append(ConvLayer(layer, macs, printed, kind, node, origin))
    return Accounting(convs, found)
