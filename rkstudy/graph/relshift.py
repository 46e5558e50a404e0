"""Relative-position shift chains: find them, prove what they compute, rewrite them as gathers.

VITS-style attention (Piper's text encoder, window_size=4) turns relative-position logits
into absolute ones and back with pure data movement: `_relative_position_to_absolute_position`
(Pad one column, flatten, Pad the flat tail, reshape to [L+1, 2L-1], Slice [:L, L-1:]) and its
inverse for the value path. Folded at a fixed width, each attention layer keeps two such chains
of Pad + Reshape + ... + Slice. The seeds measured that the RKNN board kernels compute exactly
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

All functions are pure: they take a ModelProto and return new ones.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper, shape_inference

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


@dataclass
class _Index:
    model: onnx.ModelProto
    producer: dict = field(default_factory=dict)
    consumers: dict = field(default_factory=dict)
    shapes: dict = field(default_factory=dict)
    consts: dict = field(default_factory=dict)


def _index(model: onnx.ModelProto) -> _Index:
    inferred = shape_inference.infer_shapes(model)
    idx = _Index(model=model)
    for n in model.graph.node:
        for o in n.output:
            idx.producer[o] = n
        for t in n.input:
            idx.consumers.setdefault(t, []).append(n)
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.type == onnx.AttributeProto.TENSOR:
                    idx.consts[n.output[0]] = numpy_helper.to_array(a.t)
    for init in model.graph.initializer:
        idx.consts[init.name] = numpy_helper.to_array(init)
        idx.shapes[init.name] = tuple(init.dims)
    for vi in (list(inferred.graph.input) + list(inferred.graph.value_info)
               + list(inferred.graph.output)):
        dims = vi.type.tensor_type.shape.dim
        if dims and all(d.HasField("dim_value") for d in dims):
            idx.shapes[vi.name] = tuple(d.dim_value for d in dims)
    return idx


def _is_const(idx: _Index, name: str) -> bool:
    return name == "" or name in idx.consts


def _walk_back(idx: _Index, end: onnx.NodeProto) -> tuple[list[onnx.NodeProto], str] | None:
    """From a Slice, follow the data input back through Pad/Reshape/Slice nodes whose other
    inputs are constants; return (chain nodes in order, source tensor)."""
    chain = []
    node = end
    while node is not None and node.op_type in CHAIN_OPS:
        if not all(_is_const(idx, t) for t in node.input[1:]):
            break
        chain.append(node)
        src = node.input[0]
        prev = idx.producer.get(src)
        # stop at a tensor that fans out: an interior chain tensor has exactly one consumer
        if prev is None or prev.op_type not in CHAIN_OPS or len(idx.consumers.get(src, [])) != 1:
            return chain[::-1], src
        node = prev
    return (chain[::-1], chain[-1].input[0]) if chain else None


def _probe(idx: _Index, chain: list[onnx.NodeProto], source: str, output: str,
           shape: tuple[int, ...]) -> np.ndarray:
    """Run the chain's own nodes on arange(prod(shape)) and return what lands where."""
    import onnxruntime as ort

    nodes = [copy.deepcopy(n) for n in chain]
    inits = []
    for n in chain:
        for t in n.input[1:]:
            if t and t not in {i.name for i in inits}:
                inits.append(numpy_helper.from_array(idx.consts[t], t))
    g = helper.make_graph(nodes, "relshift_probe",
                          [helper.make_tensor_value_info(source, TensorProto.FLOAT, list(shape))],
                          [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=list(idx.model.opset_import))
    m.ir_version = min(idx.model.ir_version or 8, 9)
    # +1 so that a zero written by a Pad is told apart from element 0 (exact in fp32 below 2^24)
    probe = (np.arange(int(np.prod(shape)), dtype=np.float32) + 1).reshape(shape)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {source: probe})[0].astype(np.int64) - 1  # -1 marks a padded zero


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
    idx = _index(model)
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
        s_in, s_out = idx.shapes.get(source), idx.shapes.get(output)
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
            elif mm.input[1] not in idx.consts:
                rewritable, note = False, "the rel-value operand is not a constant (fold the graph first)"
            else:
                consumer, rel_values = mm.name or mm.output[0], mm.input[1]
                rv = idx.consts[rel_values]
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


def _band(idx: _Index, kind: str, source: str, rel_values: str | None, length: int) -> dict:
    """The chain's constant table, the operand the band form multiplies, and the offsets of the
    table's non-zero diagonals, read from the graph (RelShift fields)."""
    if kind == REL_TO_ABS:
        mm = idx.producer.get(source)
        if mm is None or mm.op_type != "MatMul" or mm.input[1] not in idx.consts:
            return {"band_note": "the logit chain's source is not MatMul(query, constant rel-key table)"}
        table, operand, axis = mm.input[1], mm.input[0], -1
    else:
        table, operand, axis = rel_values, source, -2
    values = idx.consts[table]
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


def _prune(model: onnx.ModelProto) -> onnx.ModelProto:
    """Drop nodes no graph output depends on, and initializers nothing reads."""
    g = model.graph
    needed = {o.name for o in g.output}
    keep = []
    for n in reversed(list(g.node)):
        if any(o in needed for o in n.output):
            keep.append(n)
            needed.update(t for t in n.input if t)
    keep.reverse()
    del g.node[:]
    g.node.extend(keep)
    inits = [i for i in g.initializer if i.name in needed]
    del g.initializer[:]
    g.initializer.extend(inits)
    vis = [v for v in g.value_info if v.name in needed]
    del g.value_info[:]
    g.value_info.extend(vis)
    return model


def rewrite_relshift(model: onnx.ModelProto, findings: Sequence[RelShift] | None = None, mode: str = GATHER,
                     max_diagonals: int = MAX_DIAGONALS) -> onnx.ModelProto:
    """Replace every verified, rewritable chain with an exact form; return a new model (the
    argument is not touched). `mode="gather"`: constant-index gathers for every chain.
    `mode="banded"`: the K-diagonal form for every chain whose table is banded (see `plan`), the
    gather form for the others. Chains that are not rewritable are left as they are (`lint`)."""
    planned = plan(find_relshift(model) if findings is None else findings, mode, max_diagonals)
    banded = [f for f in planned if f.form == BANDED]
    out = _rewrite_banded(model, banded) if banded else model
    return _rewrite_gather(out, [f for f in planned if f.form == GATHER])


def _rewrite_gather(model: onnx.ModelProto, todo: Sequence[RelShift]) -> onnx.ModelProto:
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
    consts = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    for n in g.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].type == onnx.AttributeProto.TENSOR:
            consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
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
    out = []
    for i, n in enumerate(nodes):
        out.extend(new_nodes.get(i, []))
        if i not in drop:
            out.append(n)
    del g.node[:]
    g.node.extend(out)
    del g.value_info[:]  # stale shapes of the removed chains; re-inferred below
    model = _prune(model)
    return shape_inference.infer_shapes(model)


# --- the banded form -------------------------------------------------------------------------
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


def _rewrite_banded(model: onnx.ModelProto, todo: Sequence[RelShift], logits=None, values=None) -> onnx.ModelProto:
    """Insert each chain's band form where its result is consumed, drop the node it replaces
    (the logit chain's last Slice, or the value chain's MatMul), prune what is left dead. A table
    with no non-zero position contributes nothing: a zero constant of the output's shape.
    `logits`/`values`: other emitters with emit_logits' signature (scripts/relshift_candidates
    builds the layouts it was chosen from this way); default: emit_logits / emit_values."""
    logits, values = logits or emit_logits, values or emit_values
    model = copy.deepcopy(model)
    g = model.graph
    consts = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    for n in g.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].type == onnx.AttributeProto.TENSOR:
            consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
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
    out_nodes = []
    for i, n in enumerate(nodes):
        out_nodes.extend(at.get(i, []))
        if i not in drop:
            out_nodes.append(n)
    del g.node[:]
    g.node.extend(out_nodes)
    del g.value_info[:]  # stale shapes of the removed chains; re-inferred below
    return shape_inference.infer_shapes(_prune(model))

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
