"""Notebook 03 section 6 (fp32): the largest value of every node, against the fp16 maximum."""

from __future__ import annotations

import numpy as np
import onnx

from .producer import INPUTS
from .rows import FP32

FP16_MAX = 65504.0


def node_maxima(onnx_path, feed: dict, batch: int = 200) -> list[dict]:
    """max |value| of every node output (onnxruntime fp32, graph optimizations off so every node runs),
    in graph order; fetched `batch` nodes at a time so a wide window fits in memory."""
    import onnxruntime as ort

    model = onnx.load(str(onnx_path))
    nodes = [(n.name or n.output[0], n.op_type, n.output[0]) for n in model.graph.node if n.op_type != "Constant"]
    declared = {o.name for o in model.graph.output}
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    rows = []
    for i in range(0, len(nodes), batch):
        chunk = nodes[i: i + batch]
        m = onnx.ModelProto()
        m.CopyFrom(model)
        for _, _, out in chunk:
            if out not in declared:
                m.graph.output.append(onnx.helper.make_empty_tensor_value_info(out))
        sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {k: feed[k] for k in INPUTS if k in feed})))
        rows += [{"index": i + j, "node": name, "op": op, "max_abs": float(np.max(np.abs(got[out])))}
                 for j, (name, op, out) in enumerate(chunk)]
        del got, sess, m
    return rows


def range_summary(rows: list[dict], **extra) -> dict:
    """The largest node, the first node (graph order) past the fp16 maximum, and the largest pooled
    statistic."""
    top = max(rows, key=lambda r: r["max_abs"])
    first = next((r for r in rows if r["max_abs"] > FP16_MAX), None)
    gap = [r["max_abs"] for r in rows if r["op"] == "GlobalAveragePool"]
    return {**extra, "nodes": len(rows), "largest_node": top["node"], "largest_op": top["op"],
            "largest_max_abs": top["max_abs"], "first_over_fp16": first["node"] if first else "",
            "first_over_max_abs": first["max_abs"] if first else float("nan"),
            "nodes_over_fp16": sum(r["max_abs"] > FP16_MAX for r in rows),
            "largest_gap_output": max(gap) if gap else float("nan"), **FP32}
