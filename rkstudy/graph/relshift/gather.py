"""The gather form of a relative-shift chain: the exact constant-index gather it computes.

rel_to_abs (logit bias):  bias[b,h,w,t] = rel_logits[b,h,w,(L-1)+t-w]     GatherElements(axis=-1)
abs_to_rel (value sum):   out[b,h,w,:]  = sum_j probs[b,h,w,j] * rel_v[(L-1)+j-w, :]
                                                                  Gather + Mul + ReduceSum
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from ..index import Index, prune, splice
from .find import REL_TO_ABS, RelShift, shift_indices


def rewrite_gather(model: onnx.ModelProto, todo: Sequence[RelShift]) -> onnx.ModelProto:
    """Replace each chain of `todo` with its exact gather form; return a new model.

    rel_to_abs: GatherElements(source, idx[.., L, L], axis=-1), same output name, so the
    consumers (the logits Add) are untouched.
    abs_to_rel + MatMul(shifted, rel_v): Gather(rel_v, idx[L, L], axis=-2) gives a constant-index
    [.., L, L, d] slab; Mul with probs[.., L, L, 1] and ReduceSum over the key axis is the
    MatMul's output, under the MatMul's output name.
    """
    model = copy.deepcopy(model)
    if not todo:
        return model
    g = model.graph
    consts = Index(model).constants
    nodes = list(g.node)
    new_nodes: dict[str, list[onnx.NodeProto]] = {}  # inserted before the node that consumed
    drop: set[int] = set()
    for k, f in enumerate(todo):
        L = f.length
        tag = f"relshift_{k}"
        prefix = f"{f.scope}relshift_{f.kind}_{k}"
        if f.kind == REL_TO_ABS:
            cols = shift_indices(L, REL_TO_ABS)
            index = np.broadcast_to(cols, tuple(f.source_shape[:-2]) + cols.shape).astype(np.int64)
            g.initializer.append(numpy_helper.from_array(np.ascontiguousarray(index), f"{tag}.index"))
            node = helper.make_node("GatherElements", [f.source, f"{tag}.index"], [f.output],
                                    name=f"{prefix}/GatherElements", axis=len(f.source_shape) - 1)
            end = next(i for i, n in enumerate(nodes) if f.output in n.output)
            drop.add(end)
            new_nodes.setdefault(end, []).append(node)
        else:
            mm_i = next(i for i, n in enumerate(nodes)
                        if n.op_type == "MatMul" and n.input[0] == f.output)
            mm = nodes[mm_i]
            rv = consts[f.rel_values]
            cols = (L - 1) + np.arange(L)[None, :] - np.arange(L)[:, None]  # rel index of key j at query w
            g.initializer.append(numpy_helper.from_array(cols.astype(np.int64), f"{tag}.index"))
            r = rv.ndim
            one = numpy_helper.from_array(np.array([-1], np.int64), f"{tag}.last")
            axis = numpy_helper.from_array(np.array([-2], np.int64), f"{tag}.keys")
            g.initializer.extend([one, axis])
            seq = [
                # [.., 2L-1, d] -> [.., L, L, d]: rel_v row for (query w, key j)
                helper.make_node("Gather", [f.rel_values, f"{tag}.index"], [f"{tag}.slab"],
                                 name=f"{prefix}/Gather", axis=r - 2),
                helper.make_node("Unsqueeze", [f.source, f"{tag}.last"], [f"{tag}.probs"],
                                 name=f"{prefix}/Unsqueeze"),
                helper.make_node("Mul", [f"{tag}.probs", f"{tag}.slab"], [f"{tag}.weighted"],
                                 name=f"{prefix}/Mul"),
                helper.make_node("ReduceSum", [f"{tag}.weighted", f"{tag}.keys"], [mm.output[0]],
                                 name=f"{prefix}/ReduceSum", keepdims=0),
            ]
            drop.add(mm_i)
            new_nodes.setdefault(mm_i, []).extend(seq)
    del g.value_info[:]  # stale shapes of the removed chains; re-inferred below
    return shape_inference.infer_shapes(prune(splice(model, new_nodes, drop)))
