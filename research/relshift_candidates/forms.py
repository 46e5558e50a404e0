"""The formulations tried for the banded rewrite, as (logits emitter, values emitter) pairs.

A candidate is named `LOGITS+VALUES` (a single name uses it on both sides); `gather` is
rkstudy.graph.relshift's rewrite. The shipped pair, `kconv+stack4`, is relshift.emit_logits /
relshift.emit_values (mode="banded"); the others live here only so that
`python -m research.relshift_candidates candidates` can compare them again (its tables stay under
build/relshift_candidates/). Every form but `floor` is exact; `floor` zeroes both relative terms and
is a reference only: what the rest of the encoder costs the compiler at that width, the size no
exact form can go below.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper

from rkstudy.graph import relshift
from rkstudy.graph.relshift import banded  # the shipped form's helpers (masks, emitters)


def _band(table, f, axis):
    return np.take(table, [(f.length - 1) + o for o in f.offsets], axis=axis)


def _select(em, f) -> str:
    """The [L, K, L] selection constant (row w, band k picks key w + o_k), shared by name."""
    return em.const(f"banded.select.L{f.length}.{banded._key(f.offsets)}",
                    np.ascontiguousarray(banded.band_masks(f.length, f.offsets).transpose(1, 0, 2)))


def _mask(em, f, offset: int) -> str:
    """One [L, L] diagonal mask, shared by name across layers and sides."""
    return em.const(f"banded.diag.L{f.length}.o{offset}", banded.diagonal_mask(f.length, offset))


def _ints(em, name, values) -> str:
    return em.const(name, np.array(values, np.int64))


def _sum(terms: Sequence[str], out: str, prefix: str) -> list:
    """A left-to-right Add chain of `terms` into `out`."""
    nodes, acc = [], terms[0]
    for k, t in enumerate(terms[1:], 1):
        dst = out if k == len(terms) - 1 else f"{out}.acc{k}"
        nodes.append(helper.make_node("Add", [acc, t], [dst], name=f"{prefix}/Add_{k}"))
        acc = dst
    return nodes


# --- masks: one [L, L] mask per offset, shared by all layers and both sides ----------------------------
def masks_logits(em, f, table, tag, prefix, out):
    cols = [f"{tag}.qk{k}" for k in range(f.diagonals)]
    terms = [f"{tag}.term{k}" for k in range(f.diagonals)]
    nodes = [helper.make_node("MatMul", [f.operand, em.const(f"{tag}.table", _band(table, f, -1))], [f"{tag}.qk"],
                              name=f"{prefix}/MatMul"),
             helper.make_node("Split", [f"{tag}.qk", _ints(em, f"{tag}.ones", [1] * f.diagonals)], cols,
                              name=f"{prefix}/Split", axis=-1)]
    nodes += [helper.make_node("Mul", [cols[k], _mask(em, f, o)], [terms[k]], name=f"{prefix}/Mul_{k}")
              for k, o in enumerate(f.offsets)]
    return nodes + _sum(terms, out, prefix)


def masks_values(em, f, table, tag, prefix, out):
    axes = _ints(em, f"{tag}.keys", [-1])
    cols = [f"{tag}.diag{k}" for k in range(f.diagonals)]
    nodes = []
    for k, o in enumerate(f.offsets):
        nodes += [helper.make_node("Mul", [f.operand, _mask(em, f, o)], [f"{tag}.masked{k}"], name=f"{prefix}/Mul_{k}"),
                  helper.make_node("ReduceSum", [f"{tag}.masked{k}", axes], [cols[k]], name=f"{prefix}/ReduceSum_{k}",
                                   keepdims=1)]
    return nodes + [helper.make_node("Concat", cols, [f"{tag}.diags"], name=f"{prefix}/Concat", axis=-1),
                    helper.make_node("MatMul", [f"{tag}.diags", em.const(f"{tag}.table", _band(table, f, -2))], [out],
                                     name=f"{prefix}/MatMul")]


# --- mm: per offset one [d, 1] MatMul instead of the Split (the toolkit rejects it) ----------------------
def mm_logits(em, f, table, tag, prefix, out):
    band = _band(table, f, -1)
    nodes, terms = [], []
    for k, o in enumerate(f.offsets):
        col = em.const(f"{tag}.col{k}", np.take(band, [k], axis=-1))
        nodes += [helper.make_node("MatMul", [f.operand, col], [f"{tag}.qk{k}"], name=f"{prefix}/MatMul_{k}"),
                  helper.make_node("Mul", [f"{tag}.qk{k}", _mask(em, f, o)], [f"{tag}.term{k}"], name=f"{prefix}/Mul_{k}")]
        terms.append(f"{tag}.term{k}")
    return nodes + _sum(terms, out, prefix)


# --- sum: per-offset masks without the Concat: Σ_k ReduceSum(p ⊙ D_k) · relV_k --------------------------
def sum_values(em, f, table, tag, prefix, out):
    band = _band(table, f, -2)
    axes = _ints(em, f"{tag}.keys", [-1])
    nodes, terms = [], []
    for k, o in enumerate(f.offsets):
        row = em.const(f"{tag}.row{k}", np.take(band, [k], axis=-2))
        nodes += [helper.make_node("Mul", [f.operand, _mask(em, f, o)], [f"{tag}.masked{k}"], name=f"{prefix}/Mul_{k}"),
                  helper.make_node("ReduceSum", [f"{tag}.masked{k}", axes], [f"{tag}.diag{k}"],
                                   name=f"{prefix}/ReduceSum_{k}", keepdims=1),
                  helper.make_node("Mul", [f"{tag}.diag{k}", row], [f"{tag}.term{k}"], name=f"{prefix}/MulV_{k}")]
        terms.append(f"{tag}.term{k}")
    return nodes + _sum(terms, out, prefix)


# --- stack: the one-layer prototype, 5-D: [.., L, K, 1] x [L, K, L] -> ReduceSum --------------------------
def stack_logits(em, f, table, tag, prefix, out):
    return [helper.make_node("MatMul", [f.operand, em.const(f"{tag}.table", _band(table, f, -1))], [f"{tag}.qk"],
                             name=f"{prefix}/MatMul"),
            helper.make_node("Unsqueeze", [f"{tag}.qk", _ints(em, f"{tag}.last", [-1])], [f"{tag}.qk1"],
                             name=f"{prefix}/Unsqueeze"),
            helper.make_node("Mul", [f"{tag}.qk1", _select(em, f)], [f"{tag}.spread"], name=f"{prefix}/Mul"),
            helper.make_node("ReduceSum", [f"{tag}.spread", _ints(em, f"{tag}.k", [-2])], [out],
                             name=f"{prefix}/ReduceSum", keepdims=0)]


def stack_values(em, f, table, tag, prefix, out):
    return [helper.make_node("Unsqueeze", [f.operand, _ints(em, f"{tag}.ax", [-2])], [f"{tag}.p1"],
                             name=f"{prefix}/Unsqueeze"),
            helper.make_node("Mul", [f"{tag}.p1", _select(em, f)], [f"{tag}.masked"], name=f"{prefix}/Mul"),
            helper.make_node("ReduceSum", [f"{tag}.masked", _ints(em, f"{tag}.keys", [-1])], [f"{tag}.diags"],
                             name=f"{prefix}/ReduceSum", keepdims=0),
            helper.make_node("MatMul", [f"{tag}.diags", em.const(f"{tag}.table", _band(table, f, -2))], [out],
                             name=f"{prefix}/MatMul")]


# --- stack4 logits: the [L, K, L] select constant of the value side, 4-D, the bias left as [B, L, 1, L] ----
def stack4_logits(em, f, table, tag, prefix, out):
    L, K, B = f.length, f.diagonals, banded._lead(f)
    return [helper.make_node("MatMul", [f.operand, em.const(f"{tag}.table", _band(table, f, -1))], [f"{tag}.qk"],
                             name=f"{prefix}/MatMul"),
            helper.make_node("Reshape", [f"{tag}.qk", _ints(em, f"{tag}.s1", [B, L, K, 1])], [f"{tag}.qk4"],
                             name=f"{prefix}/Reshape"),
            helper.make_node("Mul", [f"{tag}.qk4", _select(em, f)], [f"{tag}.spread"], name=f"{prefix}/Mul"),
            helper.make_node("ReduceSum", [f"{tag}.spread", _ints(em, f"{tag}.k", [2])], [f"{tag}.sum"],
                             name=f"{prefix}/ReduceSum", keepdims=1),
            helper.make_node("Reshape", [f"{tag}.sum", _ints(em, f"{tag}.s2", f.output_shape)], [out],
                             name=f"{prefix}/Reshape_1")]


# --- kfirst: offsets on the channel axis, ReduceSum over them: [B, K, L, 1] x [K, L, L] -> [B, 1, L, L] ----------
def kfirst_logits(em, f, table, tag, prefix, out):
    L, K, B = f.length, f.diagonals, banded._lead(f)
    rank = len(f.source_shape)
    masks = em.const(f"banded.masks.L{L}.{banded._key(f.offsets)}", banded.band_masks(L, f.offsets))
    return [helper.make_node("MatMul", [f.operand, em.const(f"{tag}.table", _band(table, f, -1))], [f"{tag}.qk"],
                             name=f"{prefix}/MatMul"),
            helper.make_node("Transpose", [f"{tag}.qk"], [f"{tag}.kq"], name=f"{prefix}/Transpose",
                             perm=list(range(rank - 2)) + [rank - 1, rank - 2]),
            helper.make_node("Reshape", [f"{tag}.kq", _ints(em, f"{tag}.bkl1", [B, K, L, 1])], [f"{tag}.kq4"],
                             name=f"{prefix}/Reshape"),
            helper.make_node("Mul", [f"{tag}.kq4", masks], [f"{tag}.spread"], name=f"{prefix}/Mul"),
            helper.make_node("ReduceSum", [f"{tag}.spread", _ints(em, f"{tag}.k", [1])], [f"{tag}.sum"],
                             name=f"{prefix}/ReduceSum", keepdims=1),
            helper.make_node("Reshape", [f"{tag}.sum", _ints(em, f"{tag}.shape", f.output_shape)], [out],
                             name=f"{prefix}/Reshape_1")]


def kconv2_logits(em, f, table, tag, prefix, out):
    """kconv without tiling the masks: Mul at [B, K, L, L], then a Reshape to [1, B*K, L, L]."""
    L, K, B = f.length, f.diagonals, banded._lead(f)
    masks = em.const(f"banded.masks.L{L}.{banded._key(f.offsets)}", banded.band_masks(L, f.offsets))
    rank = len(f.source_shape)
    return [helper.make_node("MatMul", [f.operand, em.const(f"{tag}.table", _band(table, f, -1))], [f"{tag}.qk"],
                             name=f"{prefix}/MatMul"),
            helper.make_node("Transpose", [f"{tag}.qk"], [f"{tag}.kq"], name=f"{prefix}/Transpose",
                             perm=list(range(rank - 2)) + [rank - 1, rank - 2]),
            helper.make_node("Reshape", [f"{tag}.kq", _ints(em, f"{tag}.s1", [B, K, L, 1])], [f"{tag}.kq4"],
                             name=f"{prefix}/Reshape"),
            helper.make_node("Mul", [f"{tag}.kq4", masks], [f"{tag}.spread"], name=f"{prefix}/Mul"),
            helper.make_node("Reshape", [f"{tag}.spread", _ints(em, f"{tag}.s3", [1, B * K, L, L])], [f"{tag}.spread1"],
                             name=f"{prefix}/Reshape_2"),
            helper.make_node("Conv", [f"{tag}.spread1", em.const(f"banded.sum.B{B}.K{K}", np.ones((B, K, 1, 1), np.float32))],
                             [f"{tag}.sum"], name=f"{prefix}/Conv", group=B, kernel_shape=[1, 1]),
            helper.make_node("Reshape", [f"{tag}.sum", _ints(em, f"{tag}.s2", f.output_shape)], [out],
                             name=f"{prefix}/Reshape_1")]


# --- bmm: per-query selection as a batched MatMul over w -------------------------------------------------
def bmm_logits(em, f, table, tag, prefix, out):
    L, K, B = f.length, f.diagonals, banded._lead(f)
    return [helper.make_node("MatMul", [f.operand, em.const(f"{tag}.table", _band(table, f, -1))], [f"{tag}.qk"],
                             name=f"{prefix}/MatMul"),
            helper.make_node("Reshape", [f"{tag}.qk", _ints(em, f"{tag}.s1", [B, L, 1, K])], [f"{tag}.qk1"],
                             name=f"{prefix}/Reshape"),
            helper.make_node("MatMul", [f"{tag}.qk1", _select(em, f)], [f"{tag}.rows"], name=f"{prefix}/MatMul_1"),
            helper.make_node("Reshape", [f"{tag}.rows", _ints(em, f"{tag}.s2", f.output_shape)], [out],
                             name=f"{prefix}/Reshape_1")]


def bmm_values(em, f, table, tag, prefix, out):
    L, K, B = f.length, f.diagonals, banded._lead(f)
    select_t = em.const(f"banded.selectT.L{L}.{banded._key(f.offsets)}",
                        np.ascontiguousarray(banded.band_masks(L, f.offsets).transpose(1, 2, 0)))
    lead = list(f.source_shape[:-2])
    return [helper.make_node("Reshape", [f.operand, _ints(em, f"{tag}.s1", [B, L, 1, L])], [f"{tag}.p1"],
                             name=f"{prefix}/Reshape"),
            helper.make_node("MatMul", [f"{tag}.p1", select_t], [f"{tag}.d1"], name=f"{prefix}/MatMul"),
            helper.make_node("Reshape", [f"{tag}.d1", _ints(em, f"{tag}.s2", lead + [L, K])], [f"{tag}.diags"],
                             name=f"{prefix}/Reshape_1"),
            helper.make_node("MatMul", [f"{tag}.diags", em.const(f"{tag}.table", _band(table, f, -2))], [out],
                             name=f"{prefix}/MatMul_1")]


# --- kfirst values: the logits' [K, L, L] layout on the value side ---------------------------------------------
def kfirst_values(em, f, table, tag, prefix, out):
    L, B = f.length, banded._lead(f)
    band = _band(table, f, -2)
    masks = em.const(f"banded.masks.L{L}.{banded._key(f.offsets)}", banded.band_masks(L, f.offsets))
    lead = list(f.source_shape[:-2])
    return [helper.make_node("Reshape", [f.operand, _ints(em, f"{tag}.s1", [B, 1, L, L])], [f"{tag}.p1"],
                             name=f"{prefix}/Reshape"),
            helper.make_node("Mul", [f"{tag}.p1", masks], [f"{tag}.masked"], name=f"{prefix}/Mul"),
            helper.make_node("ReduceSum", [f"{tag}.masked", _ints(em, f"{tag}.keys", [-1])], [f"{tag}.kd"],
                             name=f"{prefix}/ReduceSum", keepdims=0),
            helper.make_node("Transpose", [f"{tag}.kd"], [f"{tag}.lk"], name=f"{prefix}/Transpose", perm=[0, 2, 1]),
            helper.make_node("MatMul", [f"{tag}.lk", em.const(f"{tag}.table", band.reshape(band.shape[-2:]))],
                             [f"{tag}.y"], name=f"{prefix}/MatMul"),
            helper.make_node("Reshape", [f"{tag}.y", _ints(em, f"{tag}.s2", lead + [L, int(table.shape[-1])])], [out],
                             name=f"{prefix}/Reshape_1")]


# --- floor: both relative terms zeroed (NOT exact; a reference size) --------------------------------------
def floor_logits(em, f, table, tag, prefix, out):
    return _zero(em, tag, prefix, out, f.output_shape)


def floor_values(em, f, table, tag, prefix, out):
    return _zero(em, tag, prefix, out, tuple(f.source_shape[:-1]) + (table.shape[-1],))


def _zero(em, tag, prefix, out, shape):
    return [helper.make_node("Identity", [em.const(f"{tag}.zero", np.zeros(shape, np.float32))], [out],
                             name=f"{prefix}/Identity")]


LOGITS = {"kconv": banded.emit_logits, "kfirst": kfirst_logits, "stack4": stack4_logits, "kconv2": kconv2_logits, "masks": masks_logits, "mm": mm_logits, "stack": stack_logits,
          "bmm": bmm_logits, "floor": floor_logits}
VALUES = {"stack4": banded.emit_values, "masks": masks_values, "sum": sum_values, "stack": stack_values,
          "bmm": bmm_values, "kfirst": kfirst_values, "floor": floor_values}
DESCRIBE_LOGITS = {
    "kfirst": "q.relK_band [.,L,K] -> Transpose+Reshape [B,K,L,1] x [K,L,L] masks -> ReduceSum(channels) [B,1,L,L]",
    "stack4": "q.relK_band -> Reshape [B,L,K,1] x [L,K,L] select (the value side's) -> ReduceSum(K) [B,L,1,L]",
    "kconv": "q.relK_band -> Transpose+Reshape [1,B*K,L,1] x [B*K,L,L] masks (tiled per head) -> grouped 1x1 Conv [1,B,L,L]",
    "kconv2": "as kconv without tiling the masks: [B,K,L,1] x [K,L,L] -> Reshape [1,B*K,L,L] -> grouped 1x1 Conv",
    "masks": "q.relK_band [.,L,K] -> Split -> K x Mul([.,L,1], shared [L,L] mask) -> Add chain",
    "mm": "K MatMuls q.relK_k [.,L,1] x shared [L,L] mask -> Add chain (no Split)",
    "stack": "[.,L,K,1] x [L,K,L] select -> ReduceSum(K) (5-D)",
    "bmm": "batched MatMul over queries [B,L,1,K] @ [L,K,L] select",
    "floor": "zeros (NOT EXACT)",
}
DESCRIBE_VALUES = {
    "stack4": "[B,L,1,L] x [L,K,L] select -> ReduceSum(keys) [B,L,K] -> MatMul relV_band",
    "masks": "K x (Mul shared [L,L] mask + ReduceSum keys) -> Concat [.,L,K] -> MatMul relV_band",
    "sum": "K x (Mul mask + ReduceSum keys -> Mul relV_k [1,d]) -> Add chain (no Concat)",
    "stack": "[.,L,1,L] x [L,K,L] select -> ReduceSum(keys) [.,L,K] -> MatMul relV_band (5-D)",
    "bmm": "batched MatMul over queries [B,L,1,L] @ [L,L,K] -> MatMul relV_band",
    "kfirst": "[B,1,L,L] x [K,L,L] masks -> ReduceSum(keys) [B,K,L] -> Transpose -> MatMul relV_band",
    "floor": "zeros (NOT EXACT)",
}
SHIPPED = "kconv+stack4"


def split(form: str) -> tuple[str, str]:
    """`logits+values` (for example `kfirst+stack4`); a single name uses it for both sides."""
    l, _, v = form.partition("+")
    v = v or l
    if l not in LOGITS or v not in VALUES:
        raise ValueError(f"unknown form {form!r}; use gather or LOGITS+VALUES with LOGITS in "
                         f"{', '.join(LOGITS)} and VALUES in {', '.join(VALUES)}")
    return l, v


def describe(form: str) -> str:
    if form == "gather":
        return "relshift.rewrite_relshift: GatherElements [.,L,L] idx ; Gather [L,L,d] slab + Mul + ReduceSum"
    if form == "banded":
        form = SHIPPED
    l, v = split(form)
    return f"logits: {DESCRIBE_LOGITS[l]} | values: {DESCRIBE_VALUES[v]}"


def make(form: str, folded: onnx.ModelProto) -> onnx.ModelProto:
    """The folded encoder with its shift chains rewritten in `form` (`gather` or `logits+values`)."""
    if form == "gather":
        return relshift.rewrite_relshift(folded)
    l, v = split(form)
    todo = [f for f in relshift.plan(relshift.find_relshift(folded), relshift.BANDED) if f.form == relshift.BANDED]
    return banded.rewrite_banded(folded, todo, LOGITS[l], VALUES[v])
