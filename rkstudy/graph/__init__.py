"""Small pure functions over ONNX graphs: census, slicing at a seam, shape pinning, folding.

Every function takes a ModelProto (or a path) and returns a new ModelProto or a plain record;
nothing here mutates its argument.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import helper, numpy_helper, shape_inference

from ..errors import InputError, UsageError

# Ops the reference documents name as build hazards for rknn.build: dynamic-shape plumbing that aborts
# fold_constant with a core dump (Shape, ConstantOfShape, Range), decompositions of LayerNorm /
# Softmax / weight norm (Pad, Exp, ReduceL2), ops with no NPU kernel on the board (Sin) or that
# the board lowers wrongly (Resize), and time-axis reductions that hit the 13-bit field (ReduceSum).
HAZARD_OPS = ("Shape", "ConstantOfShape", "Range", "Pad", "Exp", "ReduceL2", "ReduceSum",
              "Sin", "Resize")

REGISTER_FIELD_MAX = 0x1FFF  # the compiler's 13-bit op-encoding field: an axis past 8191 overflows it

Shapes = Mapping[str, Sequence[int]]


class SeamNotFound(InputError, LookupError):
    """The tensors a slice was asked for are not in the graph."""


def load(model, load_external_data: bool = True) -> onnx.ModelProto:
    """A ModelProto from a path or a ModelProto (copied, so callers may keep theirs).

    A path that is missing, empty, truncated or not ONNX at all is an InputError naming the file:
    onnx.load itself accepts an empty file as an empty model and fails on the rest with a
    protobuf traceback.
    """
    if isinstance(model, onnx.ModelProto):
        return copy.deepcopy(model)
    path = Path(model)
    if not path.is_file():
        raise InputError(f"no ONNX model at {path}; check the path")
    if path.stat().st_size == 0:
        raise InputError(f"{path} is empty (0 bytes): not an ONNX model; export it again")
    try:
        loaded = onnx.load(str(path), load_external_data=load_external_data)
    except (DecodeError, RuntimeWarning, ValueError, OSError) as exc:
        raise InputError(f"{path} is not a readable ONNX model (truncated or corrupt: "
                         f"{' '.join(str(exc).split()) or type(exc).__name__}); export it again") from None
    if not loaded.HasField("graph") or not loaded.graph.output or not loaded.graph.node:
        raise InputError(f"{path} holds no ONNX graph (no nodes or no outputs); is it the right file?")
    return loaded


@dataclass(frozen=True)
class Census:
    """What a graph holds: node count, op histogram, weight bytes, hazard ops, longest axis."""

    nodes: int
    ops: Counter
    initializer_bytes: int
    hazards: dict = field(default_factory=dict)
    longest_axis: int | None = None

    def row(self, prefix: str = "") -> dict:
        """Flat results-row fragment; `prefix` tells before/after apart."""
        out = {f"{prefix}nodes": self.nodes, f"{prefix}initializer_bytes": self.initializer_bytes}
        out.update({f"{prefix}{op}": n for op, n in self.hazards.items()})
        if self.longest_axis is not None:
            out[f"{prefix}longest_axis"] = self.longest_axis
        return out


def _initializer_bytes(graph: onnx.GraphProto) -> int:
    total = sum(numpy_helper.to_array(t).nbytes for t in graph.initializer)
    for node in graph.node:  # Constant nodes carry weights too once a graph is folded
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.TENSOR:
                    total += numpy_helper.to_array(attr.t).nbytes
    return total


def longest_axis(model) -> int:
    """The largest dimension of any tensor whose shape inference can pin (0 if none can).

    A value past REGISTER_FIELD_MAX on a conv's time axis is what makes the compiler log
    REGTASK overflow lines.
    """
    inferred = shape_inference.infer_shapes(load(model), data_prop=True)
    graph = inferred.graph
    best = 0
    for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_value"):
                best = max(best, d.dim_value)
    return best


def census(model, with_axis: bool = True) -> Census:
    """Count nodes, ops, initializer bytes and the HAZARD_OPS of `model`."""
    model = load(model)
    ops = Counter(n.op_type for n in model.graph.node)
    return Census(nodes=len(model.graph.node), ops=ops,
                  initializer_bytes=_initializer_bytes(model.graph),
                  hazards={op: ops.get(op, 0) for op in HAZARD_OPS},
                  longest_axis=longest_axis(model) if with_axis else None)


def tensor_names(model) -> set[str]:
    """Every tensor name a slice may start or end at."""
    graph = load(model).graph
    names = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    for node in graph.node:
        names.update(node.output)
    return names


def _set_shape(vi: onnx.ValueInfoProto, dims: Sequence[int] | None) -> None:
    shape = vi.type.tensor_type.shape
    del shape.dim[:]
    for d in dims or []:
        shape.dim.add().dim_value = int(d)
    if dims is None:
        vi.type.tensor_type.ClearField("shape")


def pin_shapes(model, shapes: Shapes) -> onnx.ModelProto:
    """Fix the named inputs to concrete shapes and re-infer everything else.

    The stale `value_info` of the dynamic export is dropped first: left in place it keeps the
    symbolic dims, and then nothing downstream folds.
    """
    model = load(model)
    inputs = {i.name: i for i in model.graph.input}
    unknown = sorted(set(shapes) - set(inputs))
    if unknown:
        raise UsageError(f"no graph input named {', '.join(unknown)}; inputs are "
                           f"{', '.join(sorted(inputs))}")
    for name, dims in shapes.items():
        _set_shape(inputs[name], dims)
    del model.graph.value_info[:]
    for out in model.graph.output:
        _set_shape(out, None)
    return shape_inference.infer_shapes(model, data_prop=True)


def slice_at(model, inputs: Sequence[str], outputs: Sequence[str],
             shapes: Shapes | None = None) -> onnx.ModelProto:
    """The subgraph from tensors `inputs` to tensors `outputs` (onnx's own extractor), with
    the new inputs pinned to `shapes` when given."""
    model = load(model)
    names = tensor_names(model)
    missing = [t for t in list(inputs) + list(outputs) if t not in names]
    if missing:
        raise SeamNotFound(f"tensor(s) {', '.join(missing)} not in the graph; "
                           "list candidates with rkstudy.graph.tensor_names()")
    # The extractor needs a value_info for every boundary tensor; a dynamic export often has
    # none for a mid-graph seam, so declare the missing ones (float, shape left to inference).
    inferred = shape_inference.infer_shapes(model)
    known = {v.name for v in list(inferred.graph.value_info) + list(inferred.graph.input)
             + list(inferred.graph.output)}
    for name in list(inputs) + list(outputs):
        if name not in known:
            inferred.graph.value_info.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    sliced = onnx.utils.Extractor(inferred).extract_model(list(inputs), list(outputs))
    return pin_shapes(sliced, shapes) if shapes else sliced


def fold(model, shapes: Shapes) -> onnx.ModelProto:
    """Constant-fold and simplify with onnxslim at pinned input shapes.

    onnxslim folds a Shape -> ConstantOfShape -> Slice chain only when the shapes are concrete
    and no stale value_info contradicts them, hence pin_shapes first. The shapes are not passed
    to onnxslim a second time (its `input_shapes`): on the Piper encoder, onnxslim 0.1.98 then
    folds the relative-shift chains' tail Pad into a front pad and the graph computes ~14 dB
    against the voice, while slimming the pinned graph folds to the same node count, exactly.
    """
    import onnxslim  # heavy import, host only

    return onnxslim.slim(pin_shapes(model, shapes))


def input_shapes(model) -> dict[str, tuple[int, ...]]:
    """Concrete input shapes of a pinned graph (raises if an input is still dynamic)."""
    graph = load(model, load_external_data=False).graph
    init = {i.name for i in graph.initializer}
    shapes = {}
    for vi in graph.input:
        if vi.name in init:
            continue
        dims = vi.type.tensor_type.shape.dim
        if not all(d.HasField("dim_value") for d in dims):
            raise UsageError(f"input {vi.name!r} has a dynamic shape; pin it (rkstudy fold --shape "
                             f"{vi.name}:D0,D1,... or --shape on the build) before building an engine")
        shapes[vi.name] = tuple(d.dim_value for d in dims)
    return shapes


def random_inputs(model, seed: int = 0) -> dict[str, np.ndarray]:
    """Standard-normal float32 arrays for every input of a pinned graph."""
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape).astype(np.float32)
            for name, shape in input_shapes(model).items()}


def rename(model, names: Mapping[str, str]) -> onnx.ModelProto:
    """Rename tensors everywhere they appear (node inputs/outputs, graph I/O, value_info), so a
    slice can expose `z` and `y_mask` instead of `/Add_output_0` and `/Cast_2_output_0`."""
    model = load(model)
    g = model.graph
    taken = tensor_names(model) | {o.name for o in g.output}
    clash = [new for old, new in names.items() if new in taken and new != old]
    if clash:
        raise ValueError(f"cannot rename to {', '.join(clash)}: already a tensor of this graph")
    for node in g.node:
        node.input[:] = [names.get(t, t) for t in node.input]
        node.output[:] = [names.get(t, t) for t in node.output]
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        vi.name = names.get(vi.name, vi.name)
    return model


def trim_outputs(model) -> onnx.ModelProto:
    """A copy of `model` in which no node has an output named '': trailing empty (omitted optional)
    outputs are dropped, and an empty one before a used output gets a name of its own.

    Why: rknn-toolkit2's fold_constant runs the graph in onnxruntime and fails on an output named ''
    ("Could not find OrtValue with name ''"), although onnxruntime itself runs such a graph.
    """
    model = load(model)
    taken = tensor_names(model)
    for node in model.graph.node:
        outs = list(node.output)
        while len(outs) > 1 and outs[-1] == "":
            outs.pop()
        for k, name in enumerate(outs):
            if name == "":
                fresh = f"{node.name or node.op_type}_unused_output_{k}"
                while fresh in taken:
                    fresh += "_"
                taken.add(fresh)
                outs[k] = fresh
        node.output[:] = outs
    return model


def metadata(model) -> dict[str, str]:
    """The model's metadata_props as a dict (where producers record a stage's contract)."""
    return {p.key: p.value for p in load(model, load_external_data=False).metadata_props}


def with_metadata(model, **props: str) -> onnx.ModelProto:
    """A copy of `model` with `props` set in metadata_props (existing keys replaced)."""
    model = load(model)
    kept = [p for p in model.metadata_props if p.key not in props]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    for key, value in props.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    return model
