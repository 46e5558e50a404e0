"""Find relative-shift chains, prove what they compute, and plan the form each is rewritten to.

A candidate is a Slice reached from a source tensor through Pad/Reshape/Slice nodes with constant
parameters; it is *run* on an index probe (an arange tensor through the chain's own nodes in
onnxruntime) and reported as verified only when the probe equals the shift map exactly. The lint
rule RK201 reports these findings; `plan` picks the rewrite (gather.py, banded.py) for each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import onnx

from ..index import Index

CHAIN_OPS = ("Pad", "Reshape", "Slice")
REL_TO_ABS, ABS_TO_REL = "rel_to_abs", "abs_to_rel"
GATHER, BANDED = "gather", "banded"
MODES = (GATHER, BANDED)
# The band form's masks and elementwise work grow as K·L² per chain, the gather form's slab as
# L²·d (Piper: K=9, d=96). Past 32 non-zero diagonals a table is treated as dense (no window)
# and keeps the gather form, whose cost does not depend on K.
MAX_DIAGONALS = 32


class RelShiftError(ValueError):
    """A graph cannot be probed or rewritten as asked."""


@dataclass(frozen=True)
class RelShift:
    """One relative-shift chain.

    kind: rel_to_abs ([.., L, 2L-1] -> [.., L, L], the logit bias) or abs_to_rel
    ([.., L, L] -> [.., L, 2L-1], the value path); source/output: the chain's boundary tensors;
    nodes: the chain's node names (Pad/Reshape/Slice, Constants excluded); length: L;
    verified: the index probe reproduced the shift map exactly; rewritable: the chain can be
    replaced (a value chain needs a single MatMul consumer with a constant right-hand side).
    table/operand/offsets: the constant relative-embedding table the chain applies (the rel-key
    MatMul's right operand before a logit chain, the rel-value operand after a value chain),
    the tensor the band form multiplies (query or probabilities) and the key−query offsets of
    the table's non-zero diagonals (None when no constant table was found: `band_note` says why).
    form: the rewrite `plan` chose for it (gather, banded, or "" when it is not rewritable).
    """

    kind: str
    source: str
    output: str
    nodes: tuple[str, ...]
    ops: tuple[str, ...]
    length: int
    source_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    verified: bool
    rewritable: bool
    consumer: str | None = None  # abs_to_rel: the MatMul that contracts the shifted probs
    rel_values: str | None = None  # abs_to_rel: that MatMul's constant right-hand side
    note: str = ""
    scope: str = ""  # the attention layer's name scope (from the source's producer)
    table: str | None = None
    operand: str | None = None
    offsets: tuple[int, ...] | None = None
    band_note: str = ""
    form: str = ""

    @property
    def diagonals(self) -> int:
        """K: how many relative positions of the table are non-zero (0 when unread)."""
        return len(self.offsets or ())

    def row(self) -> dict:
        """Results-row / lint-finding fragment."""
        return {"scope": self.scope, "kind": self.kind, "length": self.length, "chain": "+".join(self.ops),
                "nodes": len(self.nodes), "source": self.source, "output": self.output,
                "verified": self.verified, "rewritable": self.rewritable, "note": self.note,
                "form": self.form, "table": self.table or "", "diagonals": self.diagonals,
                "offsets": ",".join(str(o) for o in self.offsets or ()), "band_note": self.band_note}


def _walk_back(idx: Index, end: onnx.NodeProto) -> tuple[list[onnx.NodeProto], str] | None:
    """From a Slice, follow the data input back through Pad/Reshape/Slice nodes whose other
    inputs are constants; return (chain nodes in order, source tensor)."""
    chain = []
    node = end
    while node is not None and node.op_type in CHAIN_OPS:
        if not all(t == "" or idx.is_const(t) for t in node.input[1:]):
            break
        chain.append(node)
        src = node.input[0]
        prev = idx.producer.get(src)
        # stop at a tensor that fans out: an interior chain tensor has exactly one consumer
        if prev is None or prev.op_type not in CHAIN_OPS or len(idx.consumers.get(src, [])) != 1:
            return chain[::-1], src
        node = prev
    return (chain[::-1], chain[-1].input[0]) if chain else None


def _probe(idx: Index, chain: list[onnx.NodeProto], source: str, output: str,
           shape: tuple[int, ...]) -> np.ndarray:
    """Run the chain's own nodes on arange(prod(shape)) and return what lands where."""
    # +1 so that a zero written by a Pad is told apart from element 0 (exact in fp32 below 2^24)
    probe = (np.arange(int(np.prod(shape)), dtype=np.float32) + 1).reshape(shape)
    return idx.probe(chain, {source: probe}, [output])[0].astype(np.int64) - 1  # -1 marks a padded zero


def shift_indices(length: int, kind: str) -> np.ndarray:
    """The shift map as indices into the last axis of the source: [L, L] for rel_to_abs
    (column (L-1)+t-w of row w), [L, 2L-1] for abs_to_rel (column k-(L-1)+w of row w, -1 where
    the relative offset falls outside the row)."""
    w = np.arange(length)[:, None]
    if kind == REL_TO_ABS:
        return (length - 1) + np.arange(length)[None, :] - w
    if kind == ABS_TO_REL:
        j = np.arange(2 * length - 1)[None, :] - (length - 1) + w
        return np.where((j >= 0) & (j < length), j, -1)
    raise RelShiftError(f"unknown shift kind {kind!r}; use {REL_TO_ABS} or {ABS_TO_REL}")


def _expected(shape: tuple[int, ...], kind: str) -> np.ndarray:
    """Flat source indices every output element must come from, for an arange probe."""
    length = shape[-2]
    cols = shift_indices(length, kind)
    lead = int(np.prod(shape[:-2]))
    base = (np.arange(lead) * shape[-2] * shape[-1])[:, None, None]
    rows = (np.arange(length) * shape[-1])[:, None]
    flat = np.where(cols >= 0, base + rows + cols, -1)
    return flat.reshape(tuple(shape[:-2]) + cols.shape)


def _scope(node: onnx.NodeProto | None) -> str:
    return node.name.rsplit("/", 1)[0] + "/" if node is not None and "/" in node.name else ""


def find_relshift(model: onnx.ModelProto) -> list[RelShift]:
    """Every relative-shift chain in a shape-pinned graph, each probed and classified.

    A candidate is a Slice reached from a source tensor through Pad/Reshape/Slice nodes with
    constant parameters, containing at least one Pad and one Reshape, whose source is
    [.., L, 2L-1] with output [.., L, L] or the reverse. The graph's shapes must be concrete
    (pin and fold it first: rkstudy.graph.fold).
    """
    idx = Index.inferred(model)
    found = []
    seen_ends = set()
    for node in model.graph.node:
        if node.op_type != "Slice" or node.output[0] in seen_ends:
            continue
        walked = _walk_back(idx, node)
        if walked is None:
            continue
        chain, source = walked
        ops = tuple(n.op_type for n in chain)
        if "Pad" not in ops or "Reshape" not in ops:
            continue
        output = chain[-1].output[0]
        s_in, s_out = idx.static_shape(source), idx.static_shape(output)
        if s_in is None or s_out is None or len(s_in) < 2 or s_in[:-2] != s_out[:-2]:
            continue
        L = s_in[-2]
        if s_in[-1] == 2 * L - 1 and s_out[-2:] == (L, L):
            kind = REL_TO_ABS
        elif s_in[-1] == L and s_out[-2:] == (L, 2 * L - 1):
            kind = ABS_TO_REL
        else:
            continue
        seen_ends.add(output)
        got = _probe(idx, chain, source, output, s_in)
        verified = bool(np.array_equal(got, _expected(s_in, kind)))
        consumer = rel_values = None
        rewritable, note = verified, "" if verified else "index probe differs from the shift map"
        if verified and kind == ABS_TO_REL:
            users = idx.consumers.get(output, [])
            mm = users[0] if len(users) == 1 else None
            if mm is None or mm.op_type != "MatMul" or mm.input[0] != output:
                rewritable, note = False, "value chain is not consumed by one MatMul as its left operand"
            elif not idx.is_const(mm.input[1]):
                rewritable, note = False, "the rel-value operand is not a constant (fold the graph first)"
            else:
                consumer, rel_values = mm.name or mm.output[0], mm.input[1]
                rv = idx.constants[rel_values]
                if rv.ndim < 2 or rv.shape[-2] != 2 * L - 1:
                    rewritable, note = False, f"rel-value operand has shape {rv.shape}, expected [.., {2*L-1}, d]"
        band = _band(idx, kind, source, rel_values, L) if rewritable else {}
        found.append(RelShift(kind=kind, source=source, output=output,
                              nodes=tuple(n.name or n.output[0] for n in chain), ops=ops, length=L,
                              source_shape=tuple(s_in), output_shape=tuple(s_out),
                              verified=verified, rewritable=rewritable, consumer=consumer,
                              rel_values=rel_values, note=note,
                              scope=_scope(idx.producer.get(source)), **band))
    return found


def band_offsets(table: np.ndarray, axis: int, length: int) -> tuple[int, ...]:
    """Key−query offsets (−(L−1)..L−1) of the positions along `axis` of a width-L relative table
    (2L−1 positions, position (L−1)+o for offset o) where any entry is non-zero."""
    if table.shape[axis] != 2 * length - 1:
        raise RelShiftError(f"table axis {axis} has {table.shape[axis]} positions; a width-{length} "
                            f"relative table has {2 * length - 1}")
    rows = np.moveaxis(table, axis, 0).reshape(table.shape[axis], -1)
    return tuple(int(r) - (length - 1) for r in np.flatnonzero(np.any(rows != 0, axis=1)))


def _band(idx: Index, kind: str, source: str, rel_values: str | None, length: int) -> dict:
    """The chain's constant table, the operand the band form multiplies, and the offsets of the
    table's non-zero diagonals, read from the graph (RelShift fields)."""
    if kind == REL_TO_ABS:
        mm = idx.producer.get(source)
        if mm is None or mm.op_type != "MatMul" or not idx.is_const(mm.input[1]):
            return {"band_note": "the logit chain's source is not MatMul(query, constant rel-key table)"}
        table, operand, axis = mm.input[1], mm.input[0], -1
    else:
        table, operand, axis = rel_values, source, -2
    values = idx.constants[table]
    if values.ndim < 2 or values.shape[axis] != 2 * length - 1:
        return {"table": table, "band_note": f"table {table} has shape {values.shape}, expected "
                                             f"2L-1={2 * length - 1} positions on axis {axis}"}
    offsets = band_offsets(values, axis, length)
    note = (f"{len(offsets)} of {2 * length - 1} relative positions non-zero ({offsets[0]}..{offsets[-1]})"
            if offsets else "the table is all zeros")
    return {"table": table, "operand": operand, "offsets": offsets, "band_note": note}


def plan(findings: Sequence[RelShift], mode: str = GATHER, max_diagonals: int = MAX_DIAGONALS) -> list[RelShift]:
    """The form each chain gets under `mode`, with the reason in its `band_note`: `gather` for
    every rewritable chain in gather mode; in banded mode `banded` when the chain's table was read
    and has at most `max_diagonals` non-zero diagonals, else `gather` (kept, and the note says
    why). A chain that is not rewritable gets form "" (left alone; `lint` reports it)."""
    if mode not in MODES:
        raise RelShiftError(f"unknown relshift mode {mode!r}; use one of {', '.join(MODES)}")
    out = []
    for f in findings:
        if not (f.verified and f.rewritable):
            out.append(replace(f, form=""))
        elif mode == GATHER:
            out.append(replace(f, form=GATHER))
        elif f.offsets is None:
            out.append(replace(f, form=GATHER, band_note=f"{f.band_note}; kept the gather form"))
        elif len(f.offsets) > max_diagonals:
            out.append(replace(f, form=GATHER, band_note=(
                f"table is not banded: {len(f.offsets)} of {2 * f.length - 1} relative positions are "
                f"non-zero (> max_diagonals={max_diagonals}); kept the gather form")))
        else:
            out.append(replace(f, form=BANDED))
    return out


def layer_view(model: onnx.ModelProto, scope: str, findings: Sequence[RelShift] = ()) -> list[dict]:
    """The nodes of one attention layer in graph order, each with its role: `chain` (a node of
    a finding's shift chain, including the nameless ones a fold leaves), `gather` or `banded`
    (a rewrite's nodes) or `other`. Used to show a layer before and after the rewrite."""
    chain = {n for f in findings if f.scope == scope for n in f.nodes}
    rows = []
    for n in model.graph.node:
        key = n.name or n.output[0]
        if not (n.name.startswith(scope) or key in chain):
            continue
        role = ("chain" if key in chain else "gather" if "/relshift_" in n.name
                else "banded" if "/banded_" in n.name else "other")
        rows.append({"op": n.op_type, "node": key.rsplit("/", 1)[-1], "role": role})
    return rows
