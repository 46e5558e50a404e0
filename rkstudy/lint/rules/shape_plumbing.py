"""RK101 shape-plumbing: shape computations left in the graph that materialize a tensor.

A dynamic export sizes tensors from run-time shapes (Shape -> Gather/Concat/... -> ConstantOfShape,
Range, Expand or Tile). The reference documents measured rknn.build aborting inside fold_constant on such graphs,
with a core dump and no traceback (rknn-toolkit2 2.3.2); folding at pinned shapes removes them.
"""

from __future__ import annotations

from .. import Hit, node_name, reference, rule

SOURCES = ("Shape", "Size")
# ops through which a shape value flows as a shape value (integer arithmetic and indexing on shapes)
SHAPE_MATH = {"Gather", "Slice", "Concat", "Unsqueeze", "Squeeze", "Cast", "Add", "Sub", "Mul", "Div", "Mod",
              "Neg", "Abs", "Max", "Min", "Floor", "Ceil", "ReduceProd", "ReduceMax", "ReduceMin", "Equal",
              "Greater", "Less", "Not", "And", "Or", "Where", "Identity", "Reshape"}
# ops that turn a shape value into a tensor: which of their inputs carry the shape
MATERIALIZERS = {"ConstantOfShape": (0,), "Range": (0, 1, 2), "Expand": (1,), "Tile": (1,)}


def _why() -> str:
    qwen3 = reference("qwen3 vocoder export, nodes: toolkit-era torch/onnx (compiles) -> current pair "
                      "(rknn.build aborts in fold_constant)")
    inflect = reference("fold census: nodes / Shape / ConstantOfShape", "inflect_decoder")
    return (f"{qwen3}; the Inflect v2 slice carried the same Shape -> ConstantOfShape plumbing and aborted it the same "
            f"way until folded ({inflect}). rknn-toolkit2 2.5.0 folds small chains and the unfolded Piper decoder "
            "slice here (results/lint/honesty.md), so this is a warning, not an error")


def _unique(names):
    return list(dict.fromkeys(names))


@rule("RK101", "shape-plumbing")
def shape_plumbing(g):
    """Shape -> ConstantOfShape / Range / Expand / Tile chains that size a tensor at run time."""
    chain_of: dict[str, list[str]] = {}  # shape-valued tensor -> the nodes that computed it
    for n in g.nodes:
        if n.op_type in SOURCES:
            for o in n.output:
                chain_of[o] = [node_name(n)]
            continue
        fed = [t for t in n.input if t in chain_of]
        if not fed:
            continue
        roles = MATERIALIZERS.get(n.op_type)
        shaped = [n.input[i] for i in roles or () if i < len(n.input) and n.input[i] in chain_of]
        if shaped and (any(g.consumers.get(o) for o in n.output) or set(n.output) & set(g.outputs)):
            chain = _unique([x for t in shaped for x in chain_of[t]] + [node_name(n)])
            out = g.shape(n.output[0])
            foldable = out is not None and all(d is not None for d in out)
            yield Hit("warning", chain,
                      f"{n.op_type} {node_name(n)} sizes a tensor from Shape({', '.join(_sources(g, chain))}) at "
                      f"run time ({len(chain)} nodes){'; foldable at these shapes' if foldable else ''}",
                      why=_why(),
                      fix="pin and fold before compiling: `rkstudy fold MODEL.onnx --shape NAME:D0,D1,... -o "
                          "folded.onnx` (rkstudy.graph.fold: onnxslim at pinned shapes; the family producers do it)",
                      detail={"op": n.op_type, "foldable": foldable})
        elif n.op_type in SHAPE_MATH and not roles:
            for o in n.output:
                chain_of[o] = _unique([x for t in fed for x in chain_of[t]] + [node_name(n)])


def _sources(g, chain):
    """The tensors the chain's Shape/Size nodes read."""
    by_name = {node_name(n): n for n in g.nodes if n.op_type in SOURCES}
    return [by_name[c].input[0] for c in chain if c in by_name]
