"""A minimal protobuf wire editor for one job the board needs without the onnx package: exposing an
internal tensor of an ONNX model as a graph output, so onnxruntime (which the board has) can return
the Piper voice's pre-flow latent for text synthesized there.

ModelProto field 7 is the graph; GraphProto field 12 its outputs; ValueInfoProto field 1 the name.
onnxruntime accepts an output that names a tensor and leaves its type to inference.

Board side: standard library only.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from ...errors import InputError

MODEL_GRAPH, GRAPH_OUTPUT, VALUE_INFO_NAME = 7, 12, 1
LEN = 2


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
        if wire == 0:
            _, i = _read_varint(buf, i)
            payload = (i, i)
        elif wire == 1:
            i += 8
            payload = (i - 8, i)
        elif wire == LEN:
            n, i = _read_varint(buf, i)
            payload = (i, i + n)
            i += n
        elif wire == 5:
            i += 4
            payload = (i - 4, i)
        else:
            raise InputError(f"wire type {wire} at byte {start}: not an ONNX model")
        if i > len(buf):
            raise InputError("the model ends inside a field: truncated or not an ONNX model")
        yield field, start, i, *payload


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | LEN) + _varint(len(payload)) + payload


def add_graph_outputs(model: bytes, names: Sequence[str]) -> bytes:
    """`model` (serialized ModelProto) with `names` appended to its graph's outputs."""
    out, found = bytearray(), False
    for field, start, end, p0, p1 in _fields(model):
        if field == MODEL_GRAPH:
            extra = b"".join(_field(GRAPH_OUTPUT, _field(VALUE_INFO_NAME, n.encode())) for n in names)
            out += _field(MODEL_GRAPH, model[p0:p1] + extra)
            found = True
        else:
            out += model[start:end]
    if not found:
        raise InputError("no graph in this model: is it an ONNX file?")
    return bytes(out)
