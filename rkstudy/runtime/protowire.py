"""A minimal protobuf wire editor for the few ONNX edits a board needs without the onnx package:

* expose an internal tensor as a graph output (add_graph_outputs), so onnxruntime returns it;
* cut a graph between named tensors (cut): the nodes that compute the outputs from the inputs, the
  initializers they read, the inputs typed (onnxruntime serves the cut as it would a slice);
* give every random node a fixed seed (seed_random_nodes), as rkstudy.families.piper.voice does with onnx;
* read the model's metadata_props (metadata), where a produced graph carries its stage contract.

The CPU path of a whole synthesis (`rkstudy speak`) runs a model's own graph cut at the seams its NPU
stages use, on the host and on a board alike, through these.

ModelProto field 7 is the graph and 14 the metadata; GraphProto fields 1 (nodes), 5 (initializers),
11/12 (inputs/outputs), 13 (value_info); NodeProto 1/2 (inputs/outputs), 3 (name), 4 (op_type), 5
(attributes); ValueInfoProto 1 (name), 2 (type). onnxruntime accepts an output that names a tensor
and leaves its type to inference.

Board side: standard library only.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from ..errors import InputError

MODEL_GRAPH, MODEL_METADATA = 7, 14
GRAPH_NODE, GRAPH_NAME, GRAPH_INITIALIZER, GRAPH_INPUT, GRAPH_OUTPUT, GRAPH_VALUE_INFO = 1, 2, 5, 11, 12, 13
NODE_INPUT, NODE_OUTPUT, NODE_NAME, NODE_OP, NODE_ATTRIBUTE = 1, 2, 3, 4, 5
ATTR_NAME, ATTR_FLOAT, ATTR_GRAPH, ATTR_GRAPHS, ATTR_TYPE = 1, 2, 6, 11, 20
ATTR_TYPE_FLOAT = 1
VALUE_INFO_NAME, VALUE_INFO_TYPE = 1, 2
TENSOR_NAME = 8
VARINT, FIXED64, LEN, FIXED32 = 0, 1, 2, 5
# ONNX TensorProto element types by numpy name (what a cut's inputs are declared as)
ELEM_TYPES = {"float32": 1, "uint8": 2, "int8": 3, "int32": 6, "int64": 7, "bool": 9, "float16": 10}


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _read_varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if i >= len(buf):
            raise InputError("the model ends inside a field: truncated or not an ONNX model")
        byte = buf[i]
        value |= (byte & 0x7F) << shift
        i += 1
        if not byte & 0x80:
            return value, i
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, int, int, int, int]]:
    """(field number, start, end, payload start, payload end) of each top-level field."""
    i = 0
    while i < len(buf):
        start = i
        key, i = _read_varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == VARINT:
            _, i = _read_varint(buf, i)
            payload = (i, i)
        elif wire == FIXED64:
            i += 8
            payload = (i - 8, i)
        elif wire == LEN:
            n, i = _read_varint(buf, i)
            payload = (i, i + n)
            i += n
        elif wire == FIXED32:
            i += 4
            payload = (i - 4, i)
        else:
            raise InputError(f"wire type {wire} at byte {start}: not an ONNX model")
        if i > len(buf):
            raise InputError("the model ends inside a field: truncated or not an ONNX model")
        yield field, start, i, *payload


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | LEN) + _varint(len(payload)) + payload


def _strings(buf: bytes, number: int) -> list[str]:
    return [buf[p0:p1].decode() for f, _, _, p0, p1 in _fields(buf) if f == number]


def _graph_span(model: bytes) -> tuple[int, int, int, int]:
    """(start, end, payload start, payload end) of the model's graph field."""
    for field, start, end, p0, p1 in _fields(model):
        if field == MODEL_GRAPH:
            return start, end, p0, p1
    raise InputError("no graph in this model: is it an ONNX file?")


def _with_graph(model: bytes, graph: bytes) -> bytes:
    start, end, _, _ = _graph_span(model)
    return model[:start] + _field(MODEL_GRAPH, graph) + model[end:]


def add_graph_outputs(model: bytes, names: Sequence[str]) -> bytes:
    """`model` (serialized ModelProto) with `names` appended to its graph's outputs."""
    _, _, p0, p1 = _graph_span(model)
    extra = b"".join(_field(GRAPH_OUTPUT, _field(VALUE_INFO_NAME, n.encode())) for n in names)
    return _with_graph(model, model[p0:p1] + extra)


def metadata(model: bytes) -> dict[str, str]:
    """The model's metadata_props as a plain dict (where a produced graph carries its contract)."""
    out = {}
    for field, _, _, p0, p1 in _fields(model):
        if field == MODEL_METADATA:
            entry = model[p0:p1]
            keys, values = _strings(entry, 1), _strings(entry, 2)
            out[keys[0] if keys else ""] = values[0] if values else ""
    return out


# --- the graph as nodes -----------------------------------------------------------------------
@dataclass(frozen=True)
class Node:
    """One NodeProto: its names, op and its own bytes (kept verbatim by every edit but the seed)."""

    name: str
    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    raw: bytes

    @property
    def has_subgraph(self) -> bool:
        return any(f == NODE_ATTRIBUTE and any(a in (ATTR_GRAPH, ATTR_GRAPHS) for a, *_ in _fields(self.raw[p0:p1]))
                   for f, _, _, p0, p1 in _fields(self.raw))


def _node(raw: bytes) -> Node:
    name = _strings(raw, NODE_NAME)
    op = _strings(raw, NODE_OP)
    return Node(name=name[0] if name else "", op_type=op[0] if op else "", inputs=tuple(_strings(raw, NODE_INPUT)),
                outputs=tuple(_strings(raw, NODE_OUTPUT)), raw=raw)


class Graph:
    """A serialized model read as its graph's nodes, initializer names, inputs and outputs: what a
    seam search and a cut need, with nothing decoded beyond names."""

    def __init__(self, model: bytes):
        self.model = bytes(model)
        _, _, p0, p1 = _graph_span(self.model)
        self.body = self.model[p0:p1]
        self.nodes: list[Node] = []
        self.initializers: dict[str, bytes] = {}   # name -> the field's bytes
        self.inputs: dict[str, bytes] = {}         # name -> the field's bytes
        self.outputs: list[str] = []
        for field, start, end, q0, q1 in _fields(self.body):
            if field == GRAPH_NODE:
                self.nodes.append(_node(self.body[q0:q1]))
            elif field == GRAPH_INITIALIZER:
                names = _strings(self.body[q0:q1], TENSOR_NAME)
                self.initializers[names[0] if names else ""] = self.body[start:end]
            elif field == GRAPH_INPUT:
                self.inputs[_strings(self.body[q0:q1], VALUE_INFO_NAME)[0]] = self.body[start:end]
            elif field == GRAPH_OUTPUT:
                self.outputs.append(_strings(self.body[q0:q1], VALUE_INFO_NAME)[0])

    def producers(self) -> dict[str, Node]:
        return {t: n for n in self.nodes for t in n.outputs if t}

    def consumers(self) -> dict[str, list[Node]]:
        out: dict[str, list[Node]] = {}
        for n in self.nodes:
            for t in n.inputs:
                if t:
                    out.setdefault(t, []).append(n)
        return out


def _typed_input(name: str, dtype: str) -> bytes:
    if dtype not in ELEM_TYPES:
        raise ValueError(f"a cut input of dtype {dtype!r}: give one of {', '.join(ELEM_TYPES)}")
    tensor_type = _field(1, _varint(1 << 3 | VARINT) + _varint(ELEM_TYPES[dtype]))
    return _field(GRAPH_INPUT, _field(VALUE_INFO_NAME, name.encode()) + _field(VALUE_INFO_TYPE, tensor_type))


def cut(model: bytes | Graph, inputs: Mapping[str, str], outputs: Sequence[str]) -> bytes:
    """The part of `model` that computes `outputs` from `inputs` ({tensor: numpy dtype name}) and the
    model's own inputs and initializers, as a model onnxruntime serves: the nodes needed (in their
    order), the initializers they read, the given inputs typed and the model's inputs the cut still
    reads. A cut that needs a tensor nothing provides, or runs through a node with a subgraph (whose
    reads the wire does not show), is refused."""
    g = model if isinstance(model, Graph) else Graph(model)
    given = set(inputs)
    produced = g.producers()
    missing = [t for t in [*inputs, *outputs] if t not in produced and t not in g.inputs and t not in g.initializers]
    if missing:
        raise InputError(f"no tensor {missing[0]!r} in this graph: the seam names another model")
    needed, keep = set(outputs) - given, []
    for n in reversed(g.nodes):
        if not any(t in needed for t in n.outputs):
            continue
        if n.has_subgraph:
            raise InputError(f"the cut runs through {n.op_type} node {n.name!r}, which holds a subgraph; "
                             "cut this graph on the host with the onnx package")
        keep.append(n)
        needed.update(t for t in n.inputs if t and t not in given)
    keep.reverse()
    made = {t for n in keep for t in n.outputs}
    open_ = sorted(t for t in needed if t not in made and t not in g.initializers and t not in g.inputs)
    if open_:
        raise InputError(f"the cut between {', '.join(inputs)} and {', '.join(outputs)} is not closed: it also needs "
                         f"{', '.join(open_[:3])}; cut at a seam that separates the graph")
    kept_inputs = [t for t in g.inputs if t in needed and t not in given]
    body = b"".join(_field(GRAPH_NODE, n.raw) for n in keep)
    body += _field(GRAPH_NAME, b"cut")
    body += b"".join(raw for name, raw in g.initializers.items() if name in needed)
    body += b"".join(_typed_input(t, inputs[t]) for t in inputs)
    body += b"".join(g.inputs[t] for t in kept_inputs)
    body += b"".join(_field(GRAPH_OUTPUT, _field(VALUE_INFO_NAME, t.encode())) for t in outputs)
    return _with_graph(g.model, body)


def seed_random_nodes(model: bytes, seed: int) -> bytes:
    """`model` with every RandomNormal / RandomNormalLike node given its own fixed seed, seed * 1000 + i
    for the i-th in node order (the random seed rkstudy.families.piper.voice.seed_random_nodes gives each with onnx),
    so onnxruntime draws the same noise on every fresh session."""
    _, _, p0, p1 = _graph_span(model)
    body, out, i = model[p0:p1], bytearray(), 0
    for field, start, end, q0, q1 in _fields(body):
        if field == GRAPH_NODE and _node(body[q0:q1]).op_type.startswith("RandomNormal"):
            raw = body[q0:q1]
            kept = b"".join(raw[s:e] for f, s, e, a0, a1 in _fields(raw)
                            if not (f == NODE_ATTRIBUTE and _strings(raw[a0:a1], ATTR_NAME) == ["seed"]))
            attr = (_field(ATTR_NAME, b"seed") + _varint(ATTR_FLOAT << 3 | FIXED32)
                    + struct.pack("<f", float(seed * 1000 + i)) + _varint(ATTR_TYPE << 3 | VARINT)
                    + _varint(ATTR_TYPE_FLOAT))
            out += _field(GRAPH_NODE, kept + _field(NODE_ATTRIBUTE, attr))
            i += 1
        else:
            out += body[start:end]
    return _with_graph(model, bytes(out))
