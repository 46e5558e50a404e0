"""RK102 foreign-op and RK103 empty-output: what an onnxruntime-optimized or hand-edited graph carries.

onnxruntime's graph optimizations write com.microsoft fused operators (FusedMatMul, FusedConv,
Gelu, SkipLayerNormalization, ...), which are not ONNX and which the toolkit has no kernel for; and
exporters leave optional outputs named '' (a LayerNormalization's mean, a Dropout's mask), which
onnxruntime accepts but the toolkit's own fold_constant does not.
"""

from __future__ import annotations

from collections import defaultdict

from .. import Hit, measured, node_name, rule

STANDARD = ("", "ai.onnx")
SEVERITY = {"fails": "error", "inaccurate": "error", "cpu": "warning", "unprobed": "warning"}
REFOLD = ("export again without onnxruntime's graph optimizations (do not save an ORT-optimized model), or fold "
          "the exported graph with `rkstudy fold` (onnxslim keeps standard ONNX operators)")


@rule("RK102", "foreign-op")
def foreign_op(g):
    """Operators outside the ONNX domain (com.microsoft fused ops from an onnxruntime-optimized graph)."""
    groups = defaultdict(list)
    for n in g.nodes:
        if n.domain not in STANDARD:
            groups[(n.domain, n.op_type)].append(node_name(n))
    for (domain, op), nodes in groups.items():
        support, said = measured(f"{domain}.{op}", g.target)
        if support == "npu":
            continue
        yield Hit(SEVERITY[support], nodes, f"{len(nodes)} {domain}.{op} node(s): not an ONNX operator",
                  why=said if support != "unprobed" else (f"{said}; the com.microsoft ops that were probed landed "
                                                          "on the CPU or failed (rkstudy/lint/op_support.json)"),
                  fix=REFOLD, detail={"op": f"{domain}.{op}", "support": support})


@rule("RK103", "empty-output")
def empty_output(g):
    """Nodes with an optional output named '' (fails the toolkit's fold_constant)."""
    groups = defaultdict(list)
    for n in g.nodes:
        if "" in list(n.output):
            groups[n.op_type].append(node_name(n))
    for op, nodes in groups.items():
        yield Hit("error", nodes, f"{len(nodes)} {op} node(s) with an output named ''",
                  why="measured (rknn-toolkit2 2.5.0, results/lint/honesty.md): rknn.build fails in fold_constant, "
                      "whose onnxruntime session cannot find the value named '' (onnxruntime itself runs the graph)",
                  fix="rkstudy.graph.trim_outputs(model): drops trailing empty outputs and names the others",
                  detail={"op": op})
