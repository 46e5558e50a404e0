"""Relative-position shift chains: find them, prove what they compute, rewrite them as gathers.

VITS-style attention (Piper's text encoder, window_size=4) turns relative-position logits
into absolute ones and back with pure data movement: `_relative_position_to_absolute_position`
(Pad one column, flatten, Pad the flat tail, reshape to [L+1, 2L-1], Slice [:L, L-1:]) and its
inverse for the value path. Folded at a fixed width, each attention layer keeps two such chains
of Pad + Reshape + ... + Slice. The reference documents measured that the RKNN board kernels compute exactly
those chains as garbage (the flatten-Pad tails read uninitialised memory; NaN and ±65504 in the
last row's window) while the PC simulator computes them fine, so the simulator is no gate for
them and the chains must go before a graph is compiled.

Both chains are fixed index maps, so they are replaced by exact constant-index gathers:

    rel_to_abs (logit bias):  bias[b,h,w,t] = rel_logits[b,h,w,(L-1)+t-w]     GatherElements(axis=-1)
    abs_to_rel (value sum):   out[b,h,w,:]  = Σ_j probs[b,h,w,j] · rel_v[(L-1)+j-w, :]
                                                                      Gather + Mul + ReduceSum

A second, smaller rewrite (`mode="banded"`) uses that VITS pads its 2·window+1 relative
embeddings with zeros to 2L-1 positions: only K diagonals (Piper: K=9, offsets -4..4) of each
table are non-zero, so both chains are sums over those K diagonals alone (o_k: key − query):

    logit bias:  bias[b,h,w,t] = Σ_k (q[b,h,w,:]·relK[:, o_k]) · [t−w = o_k]
    value sum:   out[b,h,w,:]  = Σ_k (Σ_t p[b,h,w,t] · [t−w = o_k]) · relV[o_k, :]

Every dropped term multiplies an exactly-zero table entry, so it is exact up to fp32 rounding,
and nothing in it scales as L²·d (the gather form's slabs do: the rk3588 engine grows as
L^2.5). K and the offsets are read from each chain's constant table, never assumed; a chain
whose table is not banded (more than `max_diagonals` non-zero diagonals, or no constant table)
keeps the gather form and its finding says why.

Nothing here trusts names or a pattern alone: every candidate chain is *run* on an index
probe (an arange tensor through the chain's own nodes in onnxruntime), and only a chain whose
probe equals the shift map exactly is reported as verified and rewritten. The detector returns
plain findings (`RelShift`), which the lint rule RK201 (rkstudy.lint.rules.relshift) reports.

All functions are pure: they take a ModelProto and return new ones. One module per pass:
find.py (the detector and `plan`), gather.py and banded.py (the two rewrites).
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx

from .banded import band_masks, diagonal_mask, emit_logits, emit_values, rewrite_banded
from .find import (
    ABS_TO_REL,
    BANDED,
    CHAIN_OPS,
    GATHER,
    MAX_DIAGONALS,
    MODES,
    REL_TO_ABS,
    RelShift,
    RelShiftError,
    band_offsets,
    find_relshift,
    layer_view,
    plan,
    shift_indices,
)
from .gather import rewrite_gather

__all__ = ["ABS_TO_REL", "BANDED", "CHAIN_OPS", "GATHER", "MAX_DIAGONALS", "MODES", "REL_TO_ABS", "RelShift",
           "RelShiftError", "band_masks", "band_offsets", "diagonal_mask", "emit_logits", "emit_values",
           "find_relshift", "layer_view", "plan", "rewrite_banded", "rewrite_gather", "rewrite_relshift",
           "shift_indices"]


def rewrite_relshift(model: onnx.ModelProto, findings: Sequence[RelShift] | None = None, mode: str = GATHER,
                     max_diagonals: int = MAX_DIAGONALS) -> onnx.ModelProto:
    """Replace every verified, rewritable chain with an exact form; return a new model (the
    argument is not touched). `mode="gather"`: constant-index gathers for every chain.
    `mode="banded"`: the K-diagonal form for every chain whose table is banded (see `plan`), the
    gather form for the others. Chains that are not rewritable are left as they are (`lint`)."""
    planned = plan(find_relshift(model) if findings is None else findings, mode, max_diagonals)
    banded = [f for f in planned if f.form == BANDED]
    out = rewrite_banded(model, banded) if banded else model
    return rewrite_gather(out, [f for f in planned if f.form == GATHER])


