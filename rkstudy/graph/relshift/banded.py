"""The banded form of a relative-shift chain: sums over the table's K non-zero diagonals only.

VITS pads its 2*window+1 relative embeddings with zeros to 2L-1 positions, so only K diagonals
(Piper: K=9, offsets -4..4) of each table are non-zero and both chains are sums over those K
diagonals alone (o_k: key - query):

    logit bias:  bias[b,h,w,t] = sum_k (q[b,h,w,:].relK[:, o_k]) * [t-w = o_k]
    value sum:   out[b,h,w,:]  = sum_k (sum_t p[b,h,w,t] * [t-w = o_k]) * relV[o_k, :]

Every dropped term multiplies an exactly-zero table entry; nothing in it scales as L^2*d.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from ..index import Index, prune, splice
from .find import REL_TO_ABS, RelShift, RelShiftError


def diagonal_mask(length: int, offset: int) -> np.ndarray:
    """[L, L] float32: 1 where key − query == offset (row = query w, column = key t)."""
    return np.eye(length, k=offset, dtype=np.float32)


def band_masks(length: int, offsets: Sequence[int]) -> np.ndarray:
    """[K, L, L] float32: mask k is diagonal_mask(L, offsets[k])."""
    return np.stack([diagonal_mask(length, o) for o in offsets])


class _Emitter:
    """Adds initializers to a model. A constant is added once per name, so the masks (named by
    width, heads and offsets) are shared by every layer that needs them; a name already in the
    graph with other contents is an error, never silently reused."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.arrays = {i.name: i for i in model.graph.initializer}

    def const(self, name: str, array: np.ndarray) -> str:
        if name in self.arrays:
            if not np.array_equal(numpy_helper.to_array(self.arrays[name]), array):
                raise RelShiftError(f"initializer {name!r} already exists with other contents; rename it "
                                    "before rewriting (banded.* names are this rewrite's)")
            return name
        tensor = numpy_helper.from_array(np.ascontiguousarray(array), name)
        self.model.graph.initializer.append(tensor)
        self.arrays[name] = tensor
        return name

    def ints(self, name: str, values: Sequence[int]) -> str:
        return self.const(name, np.array(values, np.int64))


def _key(offsets: Sequence[int]) -> str:
    return "_".join(str(o) for o in offsets)


def _band_rows(table: np.ndarray, f: RelShift, axis: int) -> np.ndarray:
    """The K non-zero positions of the table (its only rows the chain can read non-zero)."""
    return np.take(table, [(f.length - 1) + o for o in f.offsets], axis=axis)


def _lead(f: RelShift) -> int:
    """Product of the chain's leading (batch, head) dims."""
    return int(np.prod(f.source_shape[:-2]))


def emit_logits(em: _Emitter, f: RelShift, table: np.ndarray, tag: str, prefix: str, out: str) -> list:
    """bias = GroupConv_B( qk[1, B·K, L, 1] ⊙ masks[B·K, L, L] ): one MatMul of the query with the
    K band columns of relK to [.., L, K]; a Transpose and Reshape that put (head, offset) on the
    channel axis; one broadcast Mul with the diagonal masks (tiled once per head, shared by every
    layer); one 1x1 Conv with B groups of K ones that sums each head's K channels into [1, B, L, L].

    Why a grouped Conv and not a ReduceSum: reducing leaves [B, 1, L, L], and the compiler moves
    that to [1, B, L, L] with an L x L Transpose it runs on the CPU, once per layer (the research
    run's `kfirst+stack4` candidate); the ones-Conv is the same sum landing in the right layout."""
    L, K, B = f.length, f.diagonals, _lead(f)
    rank = len(f.source_shape)
    masks = em.const(f"banded.masks.L{L}.B{B}.{_key(f.offsets)}", np.tile(band_masks(L, f.offsets), (B, 1, 1)))
    ones = em.const(f"banded.sum.B{B}.K{K}", np.ones((B, K, 1, 1), np.float32))
    band = em.const(f"{tag}.table", _band_rows(table, f, -1))
    return [helper.make_node("MatMul", [f.operand, band], [f"{tag}.qk"], name=f"{prefix}/MatMul"),
            helper.make_node("Transpose", [f"{tag}.qk"], [f"{tag}.kq"], name=f"{prefix}/Transpose",
                             perm=list(range(rank - 2)) + [rank - 1, rank - 2]),
            helper.make_node("Reshape", [f"{tag}.kq", em.ints(f"{tag}.bk", [1, B * K, L, 1])], [f"{tag}.kq4"],
                             name=f"{prefix}/Reshape"),
            helper.make_node("Mul", [f"{tag}.kq4", masks], [f"{tag}.spread"], name=f"{prefix}/Mul"),
            helper.make_node("Conv", [f"{tag}.spread", ones], [f"{tag}.sum"], name=f"{prefix}/Conv",
                             group=B, kernel_shape=[1, 1]),
            helper.make_node("Reshape", [f"{tag}.sum", em.ints(f"{tag}.shape", f.output_shape)], [out],
                             name=f"{prefix}/Reshape_1")]


def emit_values(em: _Emitter, f: RelShift, table: np.ndarray, tag: str, prefix: str, out: str) -> list:
    """out = ReduceSum_t( p[B, L, 1, L] ⊙ select[L, K, L] ) · relV_band: one broadcast Mul with the
    [L, K, L] selection (row w, band k picks key w + o_k; shared by every layer), one ReduceSum
    over the keys to the K diagonals [B, L, K], one MatMul with the K non-zero rows of relV."""
    L, K, B = f.length, f.diagonals, _lead(f)
    select = em.const(f"banded.select.L{L}.{_key(f.offsets)}",
                      np.ascontiguousarray(band_masks(L, f.offsets).transpose(1, 0, 2)))
    band = em.const(f"{tag}.table", _band_rows(table, f, -2))
    lead = list(f.source_shape[:-2])
    return [helper.make_node("Reshape", [f.operand, em.ints(f"{tag}.bl1l", [B, L, 1, L])], [f"{tag}.p4"],
                             name=f"{prefix}/Reshape"),
            helper.make_node("Mul", [f"{tag}.p4", select], [f"{tag}.masked"], name=f"{prefix}/Mul"),
            helper.make_node("ReduceSum", [f"{tag}.masked", em.ints(f"{tag}.keys", [-1])], [f"{tag}.blk"],
                             name=f"{prefix}/ReduceSum", keepdims=0),
            helper.make_node("Reshape", [f"{tag}.blk", em.ints(f"{tag}.shape", lead + [L, K])], [f"{tag}.diags"],
                             name=f"{prefix}/Reshape_1"),
            helper.make_node("MatMul", [f"{tag}.diags", band], [out], name=f"{prefix}/MatMul")]


def rewrite_banded(model: onnx.ModelProto, todo: Sequence[RelShift], logits=None, values=None) -> onnx.ModelProto:
    """Insert each chain's band form where its result is consumed, drop the node it replaces
    (the logit chain's last Slice, or the value chain's MatMul), prune what is left dead. A table
    with no non-zero position contributes nothing: a zero constant of the output's shape.
    `logits`/`values`: other emitters with emit_logits' signature (research/relshift_candidates
    builds the layouts it was chosen from this way); default: emit_logits / emit_values."""
    logits, values = logits or emit_logits, values or emit_values
    model = copy.deepcopy(model)
    g = model.graph
    consts = Index(model).constants
    em = _Emitter(model)
    nodes = list(g.node)
    at: dict[int, list] = {}
    drop = set()
    taken = {t for n in nodes for t in n.output} | set(em.arrays)
    k = 0
    for f in todo:
        while any(t.startswith(f"banded_{k}.") for t in taken):  # a graph rewritten before
            k += 1
        tag, prefix = f"banded_{k}", f"{f.scope}banded_{f.kind}_{k}"
        k += 1
        table = consts[f.table]
        if f.kind == REL_TO_ABS:
            i = next(i for i, n in enumerate(nodes) if f.output in n.output)
            out, shape, emit = f.output, f.output_shape, logits
        else:
            i = next(i for i, n in enumerate(nodes) if n.op_type == "MatMul" and n.input[0] == f.output)
            out, shape, emit = nodes[i].output[0], tuple(f.source_shape[:-1]) + (table.shape[-1],), values
        if f.offsets:
            new = emit(em, f, table, tag, prefix, out)
        else:
            new = [helper.make_node("Identity", [em.const(f"{tag}.zero", np.zeros(shape, np.float32))], [out],
                                    name=f"{prefix}/Identity")]
        at.setdefault(i, []).extend(new)
        drop.add(i)
    del g.value_info[:]  # stale shapes of the removed chains; re-inferred below
    return shape_inference.infer_shapes(prune(splice(model, at, drop)))
