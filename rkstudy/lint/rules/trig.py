"""RK202 trig-on-cpu: Sin and Cos, which the runtime computes on the CPU.

Snake activations (x + sin²(αx)/α) put one Sin per resblock in every vocoder; each is a CPU round
trip in the middle of an NPU graph.
"""

from __future__ import annotations

from collections import defaultdict

from .. import Hit, measured, node_name, reference, rule

POLYNOMIAL = "range-reduced sine polynomial, degree 5, vs exact sine: sine level / generator output"
SEVERITY = {"fails": "error", "inaccurate": "error", "cpu": "warning", "unprobed": "warning"}


@rule("RK202", "trig-on-cpu")
def trig_on_cpu(g):
    """Sin / Cos nodes: CPU operators in the runtime."""
    groups = defaultdict(list)
    for n in g.nodes:
        if n.op_type in ("Sin", "Cos") and not g.from_constants(n.output[0]):
            groups[n.op_type].append(node_name(n))
    for op, nodes in groups.items():
        support, said = measured(op, g.target)
        if support == "npu":
            continue
        yield Hit(SEVERITY[support], nodes, f"{len(nodes)} {op} node(s)",
                  why=f"{said}; {reference('Kokoro w128 window: 48 Sin nodes on the CPU, share of window time')}",
                  fix="rkstudy.graph.sine.reduce_sin(model): the range-reduced odd polynomial of Mul/Add/Floor/Sub "
                      f"(k = Floor(x/2π + 0.5), r = x − 2πk; Cos as sin(x + π/2); {reference(POLYNOMIAL)}), "
                      "whose Floor "
                      "the toolkit also leaves on the CPU (RK304 reports it); reduce_sin(model, fold=False) clips the "
                      "argument at ±π instead: the compiler places every node for the NPU, exact only where |x| <= π",
                  detail={"op": op, "support": support})
