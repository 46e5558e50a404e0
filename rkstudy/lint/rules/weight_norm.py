"""RK204 weight-norm: ReduceL2 left in the graph, above all over constant weights (weight norm).

torch's weight_norm keeps g and v as parameters and recomputes w = g·v/‖v‖ in the graph;
traced, every conv carries a ReduceL2 over its own weights.
"""

from __future__ import annotations

from .. import Hit, measured, node_name, reference, rule

FIX = ("fold weight norm at load: `rkstudy fold` constant-folds a norm of constant weights (onnxslim); at export, "
       "call torch.nn.utils.remove_weight_norm (or parametrize.remove_parametrizations) before tracing")


@rule("RK204", "weight-norm")
def weight_norm(g):
    """ReduceL2 over constant weights (weight norm computed in the graph), and over activations."""
    weights = [n for n in g.nodes if n.op_type == "ReduceL2" and g.from_constants(n.input[0])]
    others = [n for n in g.nodes if n.op_type == "ReduceL2" and not g.from_constants(n.input[0])]
    reference_said = reference("Kokoro weight norm left in the graph: ReduceL2 nodes, and rknn.build aborts")
    if weights:
        yield Hit("warning", [node_name(n) for n in weights],
                  f"{len(weights)} ReduceL2 node(s) over constant weights: weight norm computed in the graph",
                  why=f"{reference_said} (rknn-toolkit2 2.3.2); rknn-toolkit2 2.5.0 folds a small weight norm here "
                      "(results/lint/honesty.md), so this is a warning, not an error",
                  fix=FIX, detail={"constant_input": True})
    if others:
        _, said = measured("ReduceL2", g.target)
        yield Hit("info", [node_name(n) for n in others],
                  f"{len(others)} ReduceL2 node(s) over activations (an L2 norm, not weight norm)",
                  why=f"{said}; the reference documents' abort was weight norm ({reference_said})",
                  fix="nothing to fold; if the build aborts, compute the norm as Sqrt(ReduceSumSquare)",
                  detail={"constant_input": False})
