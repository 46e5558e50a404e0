"""Which tensors a hybrid can keep in float16, by where they sit in the graph (host).

The toolkit's quantization config names tensors, not layers, and some of them are the compiler's own
(tiles, splits, the casts at the graph's inputs and outputs). A search moves groups of them, so each is
traced back to the exporter's module path of the graph node it belongs to, and the groups are weighed by
the conv MACs they hold.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from ... import graph
from ...graph.index import Index
from ...toolkit import macs
from .stages import Stage

CONVERT_OPS = ("exDataConvert",)  # the dtype casts a hybrid engine inserts between int8 and fp16 layers
# what accuracy_analysis reports beside the layers: the graph's inputs and the casts at its inputs and
# outputs (an output's cast carries the output's name)
ANALYSIS_IO_OPS = ("Input",) + CONVERT_OPS
IO_GROUP = "graph inputs and outputs"  # the casts and reshapes of the graph's own inputs and outputs


def module_of(node: str) -> str:
    """The exporter's module path of a node name: '/dec/resblocks.3/convs1.0/Conv' -> '/dec/resblocks.3/
    convs1.0' (every component but the op's own); '' for a name without one ('Tanh_5597')."""
    parts = node.strip("/").split("/")
    return "/" + "/".join(parts[:-1]) if node.startswith("/") and len(parts) > 1 else ""


def first_levels(module: str, depth: int = 2) -> str:
    """A module path cut to its first `depth` levels ('/dec/resblocks.3/convs1.0' -> '/dec/resblocks.3');
    '/' for the graph's top level."""
    parts = [p for p in module.split("/") if p]
    return "/" + "/".join(parts[:depth])


def tensor_modules(onnx, names: Iterable[str]) -> dict[str, str]:
    """{config tensor: the module path of the graph node it belongs to}, or IO_GROUP for the casts and
    reshapes of the graph's own inputs and outputs. A tensor is named after a node or a node's output
    (rkstudy.toolkit.macs.locate: a compiler-made tile or split after the tensor it splits); a node
    without a module path (an exporter's anonymous 'Tanh_5597') takes its nearest named producer's."""
    index = Index(graph.load(onnx, load_external_data=False))
    g = index.model.graph
    io = {v.name for v in list(g.input) + list(g.output)}
    nodes = {n.name: n for n in index.nodes}

    def named(node) -> str:
        seen = set()
        queue = [node]
        while queue:
            n = queue.pop(0)
            if n is None or n.name in seen:
                continue
            seen.add(n.name)
            if module_of(n.name):
                return module_of(n.name)
            queue += [index.producer.get(t) for t in n.input if t in index.producer]
        return "/"

    out = {}
    for name in names:
        kind, found = macs.locate(name, index)
        if kind == "tensor" and found in io:
            out[name] = IO_GROUP
        elif kind == "tensor" and found in index.producer:
            out[name] = named(index.producer[found])
        elif kind == "node":
            out[name] = named(nodes[found])
        else:
            out[name] = "/"
    return out


# Constants the toolkit lists in the config beside the layers, which step 2 refuses by name ('Invalid operands
# name ... in custom_quantize_layers'): an operand it stores for an op it rewrote (a Div by a constant turned
# into a Mul by its reciprocal, '/dec/Div_2mul_i1'; an einsum's '..._2einsum_i1'), an exporter's Constant
# output (kept under its name after folding, '/enc_p/Constant_output_0', '..._dup1').
STORED_OPERAND = re.compile(r"_i\d+$")
EXPORTED_CONSTANT = re.compile(r"(^|/)Constant(_\d+)?_output_\d+(_dup\d+)?$")
REFUSED_NAME = re.compile(r"Invalid operands name '([^']+)' in custom_quantize_layers")


def quantized_tensors(tensors: Sequence[Mapping], onnx=None) -> list[str]:
    """The config tensors a hybrid can keep in float16: every one the build quantizes (int8 under w8a8,
    int16 under w16a16i_dfp; under w4a16 the activations are float16 already and 'float16' there keeps
    the layer's weights in float16 too), less the constants the config lists beside the layers (stored
    operands and exporters' Constant outputs; with `onnx`, the graph's initializers and any tensor a
    Constant node makes): step 2 refuses those by name. The graph's float inputs and outputs are float32
    in the config and stay so."""
    names = [t["name"] for t in tensors if t["dtype"] != "float32" and not STORED_OPERAND.search(t["name"])
             and not EXPORTED_CONSTANT.search(t["name"])]
    if onnx is None:
        return names
    index = Index(graph.load(onnx, load_external_data=False))

    def constant(name: str) -> bool:
        if name in index.initializers:
            return True
        kind, found = macs.locate(name, index)
        producer = index.producer.get(found) if kind == "tensor" else None
        return producer is not None and producer.op_type == "Constant"
    return [n for n in names if not constant(n)]


def group_macs(stage: Stage, groups: Mapping[str, Sequence[str]]) -> dict[str, int]:
    """{group: the graph conv MACs it holds}: what returning it to low bits can move (0 for blocks of
    activations only). A conv belongs to the group holding a tensor named after it or its output
    (rkstudy.toolkit.macs.resolve); else, since the compiler names a fused conv's tensors after the op it
    feeds (so a conv's own output may not be in the config at all), to the group whose tensors' modules
    match its own most closely (the same module, or one inside the other: tensor_modules); a conv that
    writes a graph output, to the graph's inputs and outputs when that is a group, since its output cast
    decides its dtype. Each conv counts once."""
    model = graph.load(stage.onnx, load_external_data=False)
    convs = macs.graph_convs(model)
    index = Index(model)
    names = [t for members in groups.values() for t in members]
    modules = tensor_modules(stage.onnx, names)
    outputs = {o.name for o in model.graph.output}
    writes_output = {n.name for n in model.graph.node if n.name in convs and set(n.output) & outputs}
    module_groups = {g: {modules[t] for t in members} for g, members in groups.items()}
    named: dict[str, str] = {}  # conv -> the first group holding a tensor named after it or its output
    for g, members in groups.items():
        for t in members:
            node, origin = macs.resolve(t, index, convs)
            if node is not None and origin in ("node", "output"):
                named.setdefault(node, g)

    def related(where: str, module: str) -> int:
        """How closely a tensor's module matches a conv's: the length of the shared path when one contains
        the other (or they are equal), else -1."""
        if module == IO_GROUP:
            return -1
        if where == module or where.startswith(module.rstrip("/") + "/") or module.startswith(where.rstrip("/") + "/"):
            return min(len(where), len(module))
        return -1

    out = dict.fromkeys(groups, 0)
    for conv, info in convs.items():
        where = module_of(conv) or "/"
        if conv in writes_output and IO_GROUP in groups:
            home = IO_GROUP
        elif conv in named:
            home = named[conv]
        else:
            closeness = {g: max((related(where, m) for m in mods), default=-1) for g, mods in module_groups.items()}
            home = max(closeness, key=closeness.get) if closeness and max(closeness.values()) >= 0 else None
        if home is not None:
            out[home] += info["macs"]
    return out


def config_groups(stage: Stage, names: Sequence[str], depth: int | None = None) -> dict[str, list[str]]:
    """{group: config tensors}, in graph order: the stage's `groups` of each tensor's module (or its first
    `depth` levels when given), the graph's inputs and outputs one group of their own."""
    modules = tensor_modules(stage.onnx, names)
    out: dict[str, list[str]] = {}
    for name in names:
        module = modules[name]
        if module == IO_GROUP:
            label = IO_GROUP
        elif depth is not None:
            label = first_levels(module, depth)
        else:
            label = stage.groups(module) if stage.groups else first_levels(module)
        out.setdefault(label, []).append(name)
    return out
