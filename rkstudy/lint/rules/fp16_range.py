"""RK501 fp16-range and RK502 fp16-headroom (with --sample): every node's max |x| in an onnxruntime
fp32 run on the sample, against the largest finite float16 (65504).

The engines are fp16 (w16a16): an intermediate past 65504 saturates or turns non-finite on the
NPU even when the graph's output is small, and nothing in the build says so.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx

from .. import FP16_MAX, Hit, node_name, reference, rule

FLOAT = onnx.TensorProto.FLOAT


def node_maxima(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[dict]:
    """One row per node with a float output, in graph (topological) order: its largest finite |x|
    over its outputs and its non-finite count, from one onnxruntime fp32 run (every float node
    output exposed as a graph output, graph optimizations off so no node is fused away)."""
    import onnxruntime as ort

    m = onnx.shape_inference.infer_shapes(model)  # every node output typed, so each can be exposed
    typed = {vi.name: vi.type.tensor_type.elem_type for vi in list(m.graph.value_info) + list(m.graph.output)}
    exposed = {o.name for o in m.graph.output}
    for n in m.graph.node:
        for o in n.output:
            if o and o not in exposed and typed.get(o) == FLOAT:
                m.graph.output.append(onnx.helper.make_tensor_value_info(o, FLOAT, None))
                exposed.add(o)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    values = dict(zip(names, sess.run(names, {k: np.asarray(v) for k, v in feeds.items()})))
    rows = []
    for n in m.graph.node:
        outs = [np.asarray(values[o], np.float64) for o in n.output if o in values]
        if not outs:
            continue
        finite = [x[np.isfinite(x)] for x in outs]
        peak = max((float(np.max(np.abs(f))) for f in finite if f.size), default=0.0)
        rows.append({"node": node_name(n), "op": n.op_type, "max_abs": peak,
                     "nonfinite": int(sum(x.size - f.size for x, f in zip(outs, finite)))})
    return rows


def _maxima(g) -> list[dict]:
    if "node_maxima" not in g.memo:
        g.memo["node_maxima"] = node_maxima(g.model, g.sample)
    return g.memo["node_maxima"]


@rule("RK501", "fp16-range", needs="sample")
def fp16_range(g):
    """Nodes whose fp32 values on the sample pass the fp16 limit 65504: the first (topological) and the largest."""
    over = [r for r in _maxima(g) if r["max_abs"] > FP16_MAX or r["nonfinite"]]
    if not over:
        return
    first, largest = over[0], max(over, key=lambda r: r["max_abs"])
    yield Hit("error", [r["node"] for r in over],
              f"{len(over)} node(s) pass the fp16 range on the sample: first {first['node']} ({first['op']}, "
              f"{first['max_abs']:.6g}), largest {largest['node']} ({largest['op']}, {largest['max_abs']:.6g})",
              why=f"{reference('Kokoro W=256 sliced fine axis: first node past fp16 max (a Mul), fp32 max |x|')}, "
                  f"{reference('Kokoro W=256 sliced fine axis: largest node (an Add), fp32 max |x|')}, and that engine "
                  "voiced "
                  f"{reference('Kokoro W=256 sliced fine axis: non-finite output values in a 14.85 s utterance')}",
              fix="keep intermediates in range: statistics as means or count fractions rather than raw sums, a "
                  "narrower window (fewer frames per reduction), or a rescale before the growth; rkstudy has no "
                  "automatic rewrite for it. Cross-check with rkstudy.toolkit.convert.accuracy_analysis (q_inf layers)",
              detail={"first": first["node"], "first_max_abs": first["max_abs"], "largest": largest["node"],
                      "largest_max_abs": largest["max_abs"], "limit": FP16_MAX})


@rule("RK502", "fp16-headroom", needs="sample")
def fp16_headroom(g):
    """The largest |x| on the sample when it stays in the fp16 range (how much headroom is left)."""
    rows = _maxima(g)
    if not rows or any(r["max_abs"] > FP16_MAX or r["nonfinite"] for r in rows):
        return
    top = max(rows, key=lambda r: r["max_abs"])
    yield Hit("info", [top["node"]],
              f"largest |x| on the sample: {top['max_abs']:.6g} at {top['node']} ({top['op']}), "
              f"{100 * top['max_abs'] / FP16_MAX:.3g}% of the fp16 limit",
              why="in range on this sample; a longer or louder input scales the sums that grow with it",
              fix="lint again with the widest and loudest sample the engine will see",
              detail={"node": top["node"], "max_abs": top["max_abs"], "limit": FP16_MAX})
