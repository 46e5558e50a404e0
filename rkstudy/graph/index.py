"""One index over an ONNX graph, and the node surgery every graph pass shares.

Every pass and every lint rule asks the same questions of a graph: which node produces this
tensor, which nodes read it, what is its shape, is it a constant and what is its value. `Index`
answers them from one walk over the model (tensor <-> node links in the spirit of
onnx-graphsurgeon's, but over the ModelProto itself, so a pass edits the protos it found).
`Index.probe` runs a few of the graph's nodes in onnxruntime on given inputs (how a pass proves
that a rewrite computes what the nodes it replaces computed); `splice` and `prune` are the tail of
every rewrite: insert new nodes, drop the replaced ones, remove what nothing reads any more.

Nothing here copies or mutates a model except `splice` and `prune`, which edit the model they are
given (a pass hands them its own copy).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper, shape_inference


def _constant_tensor(node: onnx.NodeProto) -> onnx.TensorProto | None:
    """The tensor a Constant node holds in its `value` attribute (None for the scalar/list forms)."""
    if node.op_type != "Constant":
        return None
    return next((a.t for a in node.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR), None)


class Constants(Mapping):
    """The graph's constant tensors (initializers and Constant nodes) by name, as numpy arrays,
    converted on first read (a large model's weights are never all decoded for one rule)."""

    def __init__(self, protos: Mapping[str, onnx.TensorProto]):
        self._protos = protos
        self._arrays: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._arrays:
            self._arrays[name] = numpy_helper.to_array(self._protos[name])
        return self._arrays[name]

    def __contains__(self, name) -> bool:
        return name in self._protos

    def __iter__(self) -> Iterator[str]:
        return iter(self._protos)

    def __len__(self) -> int:
        return len(self._protos)


class Index:
    """Producers, consumers, shapes, element types and constants of one model's main graph.

    producer[t]: the node writing tensor t; consumers[t]: the nodes reading t, in graph order
    (a node reading t twice is listed twice); shapes[t]: dims (None where not concrete) of every
    tensor the model's value_info, inputs, outputs, initializers or Constant nodes give a shape;
    constants: initializers and Constant nodes' values. `shapes_from` reads the shapes from
    another model with the same tensors (a shape-inferred copy: `Index.inferred`), the nodes
    always from `model`.
    """

    def __init__(self, model: onnx.ModelProto, shapes_from: onnx.ModelProto | None = None):
        self.model = model
        g = model.graph
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        self.shapes: dict[str, tuple[int | None, ...]] = {}
        self.elem_types: dict[str, int] = {}
        self.initializers: dict[str, onnx.TensorProto] = {i.name: i for i in g.initializer}
        protos: dict[str, onnx.TensorProto] = dict(self.initializers)
        s = (shapes_from or model).graph
        for vi in list(s.input) + list(s.value_info) + list(s.output):
            t = vi.type.tensor_type
            if t.HasField("shape"):
                self.shapes[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim)
            if t.elem_type:
                self.elem_types[vi.name] = t.elem_type
        for init in g.initializer:
            self.shapes[init.name] = tuple(init.dims)
            self.elem_types[init.name] = init.data_type
        for n in g.node:
            for o in n.output:
                if o:
                    self.producer[o] = n
            for t in n.input:
                if t:
                    self.consumers.setdefault(t, []).append(n)
            tensor = _constant_tensor(n)
            if tensor is not None:
                protos[n.output[0]] = tensor
                self.shapes[n.output[0]] = tuple(tensor.dims)
                self.elem_types[n.output[0]] = tensor.data_type
        self.constants = Constants(protos)
        self._from_constants: dict[str, bool] = {}

    @classmethod
    def inferred(cls, model: onnx.ModelProto, data_prop: bool = False) -> Index:
        """The index of `model` with the shapes onnx's shape inference gives (the model is not changed)."""
        return cls(model, shapes_from=shape_inference.infer_shapes(model, data_prop=data_prop))

    @property
    def nodes(self) -> list[onnx.NodeProto]:
        """Nodes in graph order (ONNX requires it to be topological)."""
        return list(self.model.graph.node)

    def static_shape(self, tensor: str) -> tuple[int, ...] | None:
        """Dims of `tensor` when every one is concrete, else None."""
        dims = self.shapes.get(tensor)
        return dims if dims and all(d is not None for d in dims) else None

    def is_const(self, tensor: str) -> bool:
        return tensor in self.constants

    def from_constants(self, tensor: str) -> bool:
        """`tensor` is computed from constants only (so a constant fold removes it); "" (an omitted
        optional input) counts as constant, a Random* op's output never does."""
        seen = self._from_constants
        stack = [tensor]
        while stack:
            t = stack[-1]
            if t in seen:
                stack.pop()
                continue
            node = self.producer.get(t)
            if t == "" or self.is_const(t):
                seen[t] = True
            elif node is None or node.op_type.startswith("Random"):
                seen[t] = False
            else:
                todo = [i for i in node.input if i and i not in seen]
                if todo:
                    stack.extend(todo)
                    continue
                seen[t] = all(seen[i] for i in node.input if i)
            stack.pop()
        return seen[tensor]

    def probe(self, nodes: Sequence[onnx.NodeProto], feeds: Mapping[str, np.ndarray], outputs: Sequence[str],
              extra: Mapping[str, np.ndarray] | None = None) -> list[np.ndarray]:
        """Run `nodes` (the graph's own or new ones) alone in onnxruntime on `feeds` and return
        `outputs`. Every other input the nodes read and do not compute themselves is taken from
        `extra` or the graph's constants (a non-constant one is a ValueError naming it)."""
        extra = dict(extra or {})
        made = {o for n in nodes for o in n.output}
        inits: dict[str, np.ndarray] = {}
        for n in nodes:
            for t in n.input:
                if not t or t in feeds or t in made or t in inits:
                    continue
                if t in extra:
                    inits[t] = extra[t]
                elif t in self.constants:
                    inits[t] = self.constants[t]
                else:
                    raise ValueError(f"probe of {', '.join(n.name or n.op_type for n in nodes)}: input {t!r} is "
                                     "neither fed nor a constant; feed it")
        types = {o: self.elem_types.get(o, TensorProto.FLOAT) for o in outputs}
        return run_nodes(nodes, feeds, outputs, inits, opset_imports=self.model.opset_import,
                         ir_version=self.model.ir_version, output_types=types)


def run_nodes(nodes: Sequence[onnx.NodeProto], feeds: Mapping[str, np.ndarray], outputs: Sequence[str],
              initializers: Mapping[str, np.ndarray] | None = None, *,
              opset_imports: Iterable[onnx.OperatorSetIdProto], ir_version: int | None = None,
              output_types: Mapping[str, int] | None = None) -> list[np.ndarray]:
    """Run `nodes` as a model of their own (`nodes_model`) in onnxruntime's CPU provider and return
    `outputs`."""
    import onnxruntime as ort  # heavy import, host only

    m = nodes_model(nodes, feeds, outputs, initializers, opset_imports=opset_imports, ir_version=ir_version,
                    output_types=output_types)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(list(outputs), {k: np.asarray(v) for k, v in feeds.items()})


def nodes_model(nodes: Sequence[onnx.NodeProto], feeds: Mapping[str, np.ndarray], outputs: Sequence[str],
                initializers: Mapping[str, np.ndarray] | None = None, *,
                opset_imports: Iterable[onnx.OperatorSetIdProto], ir_version: int | None = None,
                output_types: Mapping[str, int] | None = None) -> onnx.ModelProto:
    """`nodes` as a model of their own: inputs shaped and typed as `feeds`, constants `initializers`,
    `outputs` of `output_types` (float by default). The IR version is capped at 9, which every
    onnxruntime this project supports reads."""
    ins = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.asarray(a).dtype), list(np.shape(a)))
           for name, a in feeds.items()]
    outs = [helper.make_tensor_value_info(o, (output_types or {}).get(o, TensorProto.FLOAT), None) for o in outputs]
    inits = [numpy_helper.from_array(np.asarray(a), name) for name, a in (initializers or {}).items()]
    g = helper.make_graph(list(nodes), "probe", ins, outs, inits)
    m = helper.make_model(g, opset_imports=list(opset_imports))
    m.ir_version = min(ir_version or 8, 9)
    return m


def splice(model: onnx.ModelProto, insert: Mapping[int, Sequence[onnx.NodeProto]],
           drop: Iterable[int] = ()) -> onnx.ModelProto:
    """`model` with insert[i] placed before its i-th node (graph order) and the nodes at `drop`
    removed; edits `model` and returns it. A new node that writes a dropped node's output takes
    over its consumers, so nothing else needs rewiring."""
    g = model.graph
    drop = set(drop)
    out = []
    for i, n in enumerate(g.node):
        out.extend(insert.get(i, []))
        if i not in drop:
            out.append(n)
    del g.node[:]
    g.node.extend(out)
    return model


def prune(model: onnx.ModelProto) -> onnx.ModelProto:
    """Drop nodes no graph output depends on, and initializers and value_info nothing needed
    reads; edits `model` and returns it."""
    g = model.graph
    needed = {o.name for o in g.output}
    keep = []
    for n in reversed(list(g.node)):
        if any(o in needed for o in n.output):
            keep.append(n)
            needed.update(t for t in n.input if t)
    keep.reverse()
    del g.node[:]
    g.node.extend(keep)
    inits = [i for i in g.initializer if i.name in needed]
    del g.initializer[:]
    g.initializer.extend(inits)
    vis = [v for v in g.value_info if v.name in needed]
    del g.value_info[:]
    g.value_info.extend(vis)
    return model
