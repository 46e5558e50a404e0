"""The relative-shift detector and rewrite: on a hand-built VITS rel_to_abs/abs_to_rel pair
(the exact torch construction, exported op by op) and on the real voice's folded encoder."""

import numpy as np
import onnx
import pytest
from conftest import make_model
from onnx import TensorProto, helper, numpy_helper

from rkstudy import graph
from rkstudy.graph import relshift
from rkstudy.runtime import OrtRunner


def _const(name, values):
    return numpy_helper.from_array(np.asarray(values, dtype=np.int64), name)


def vits_attention_probe(L=6, d=4, heads=2, seed=0, tail_front=False):
    """logits = q·rel_kᵀ -> rel_to_abs -> + q·kᵀ -> Softmax -> abs_to_rel -> MatMul rel_v.

    The chains are VITS's: Pad a column, flatten, Pad the flat tail by L-1, reshape to
    [L+1, 2L-1], Slice [:L, L-1:] (and the inverse). `tail_front=True` pads the flat tail at
    the front instead: the chain onnxslim's mis-fold produces, which must not verify.
    """
    rng = np.random.default_rng(seed)
    rel_k = rng.standard_normal((1, 1, d, 2 * L - 1)).astype(np.float32)
    rel_v = rng.standard_normal((1, 1, 2 * L - 1, d)).astype(np.float32)
    flat_pad = [0, 0, L - 1, 0, 0, 0] if tail_front else [0, 0, 0, 0, 0, L - 1]
    nodes = [
        helper.make_node("MatMul", ["q", "rel_k"], ["rl"], name="/attn/MatMul_1"),
        # rel_to_abs
        helper.make_node("Pad", ["rl", "p1"], ["a1"], name="/attn/Pad_1"),
        helper.make_node("Reshape", ["a1", "s1"], ["a2"], name="/attn/Reshape_7"),
        helper.make_node("Pad", ["a2", "p2"], ["a3"], name="/attn/Pad_2"),
        helper.make_node("Reshape", ["a3", "s2"], ["a4"], name="/attn/Reshape_10"),
        helper.make_node("Slice", ["a4", "st", "en", "ax"], ["bias"], name="/attn/Slice_4"),
        helper.make_node("Transpose", ["q"], ["qt"], perm=[0, 1, 3, 2], name="/attn/Transpose"),
        helper.make_node("MatMul", ["q", "qt"], ["scores0"], name="/attn/MatMul"),
        helper.make_node("Add", ["scores0", "bias"], ["scores"], name="/attn/Add_1"),
        helper.make_node("Softmax", ["scores"], ["probs"], axis=-1, name="/attn/Softmax"),
        # abs_to_rel
        helper.make_node("Pad", ["probs", "p3"], ["b1"], name="/attn/Pad_3"),
        helper.make_node("Reshape", ["b1", "s3"], ["b2"], name="/attn/Reshape_13"),
        helper.make_node("Pad", ["b2", "p4"], ["b3"], name="/attn/Pad_4"),
        helper.make_node("Reshape", ["b3", "s4"], ["b4"], name="/attn/Reshape_16"),
        helper.make_node("Slice", ["b4", "st2", "en2", "ax2"], ["shifted"], name="/attn/Slice_8"),
        helper.make_node("MatMul", ["shifted", "rel_v"], ["y"], name="/attn/MatMul_3"),
    ]
    inits = [numpy_helper.from_array(rel_k, "rel_k"), numpy_helper.from_array(rel_v, "rel_v"),
             _const("p1", [0, 0, 0, 0, 0, 0, 0, 1]), _const("s1", [1, heads, L * 2 * L]),
             _const("p2", flat_pad), _const("s2", [1, heads, L + 1, 2 * L - 1]),
             _const("st", [0, L - 1]), _const("en", [L, 2 * L - 1]), _const("ax", [2, 3]),
             _const("p3", [0, 0, 0, 0, 0, 0, 0, L - 1]), _const("s3", [1, heads, L * (2 * L - 1)]),
             _const("p4", [0, 0, L, 0, 0, 0]), _const("s4", [1, heads, L, 2 * L]),
             _const("st2", [1]), _const("en2", [2 * L]), _const("ax2", [3])]
    return make_model(nodes, [helper.make_tensor_value_info("q", TensorProto.FLOAT, [1, heads, L, d])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, heads, L, d])], inits)


def reference_attention(q, rel_k, rel_v):
    """The same attention in numpy with the shift maps written out."""
    L = q.shape[2]
    rl = q @ rel_k
    w, t = np.arange(L)[:, None], np.arange(L)[None, :]
    bias = rl[..., w, (L - 1) + t - w]
    s = q @ np.swapaxes(q, -1, -2) + bias
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    slab = rel_v[0, 0][(L - 1) + t - w]  # [L, L, d]
    return np.einsum("bhwj,wjd->bhwd", p, slab)


def test_probe_graph_matches_the_shift_maps():
    m = vits_attention_probe()
    q = np.random.default_rng(1).standard_normal((1, 2, 6, 4)).astype(np.float32)
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    got = OrtRunner(m).run({"q": q})[0]
    np.testing.assert_allclose(got, reference_attention(q, inits["rel_k"], inits["rel_v"]), atol=1e-5)


def test_detector_finds_and_verifies_both_chains():
    found = relshift.find_relshift(vits_attention_probe(L=6))
    assert [(f.kind, f.length, f.ops, f.verified, f.rewritable) for f in found] == [
        ("rel_to_abs", 6, ("Pad", "Reshape", "Pad", "Reshape", "Slice"), True, True),
        ("abs_to_rel", 6, ("Pad", "Reshape", "Pad", "Reshape", "Slice"), True, True)]
    assert found[0].source_shape == (1, 2, 6, 11) and found[0].output_shape == (1, 2, 6, 6)
    assert found[1].rel_values == "rel_v" and found[1].scope == "/attn/"
    assert found[0].row()["chain"] == "Pad+Reshape+Pad+Reshape+Slice"


def test_a_misfolded_chain_is_found_but_not_verified():
    found = relshift.find_relshift(vits_attention_probe(tail_front=True))
    logits = next(f for f in found if f.kind == "rel_to_abs")
    assert not logits.verified and not logits.rewritable
    assert "differs from the shift map" in logits.note
    # the rewrite leaves an unverified chain alone instead of "fixing" a different computation
    rewritten = relshift.rewrite_relshift(vits_attention_probe(tail_front=True))
    assert sum(n.op_type == "GatherElements" for n in rewritten.graph.node) == 0


@pytest.mark.parametrize("L", [1, 2, 7, 16])
def test_rewrite_is_exact_and_removes_every_chain(L):
    m = vits_attention_probe(L=L, seed=L)
    r = relshift.rewrite_relshift(m)
    ops = [n.op_type for n in r.graph.node]
    assert "Pad" not in ops and "Slice" not in ops
    if L > 1:  # at L=1 both maps are the identity on [1, 1] and both chains read as rel_to_abs
        assert ops.count("GatherElements") == 1 and ops.count("ReduceSum") == 1 and ops.count("Gather") == 1
    assert relshift.find_relshift(r) == []
    onnx.checker.check_model(r)
    q = np.random.default_rng(L).standard_normal((1, 2, L, 4)).astype(np.float32)
    a, b = OrtRunner(m).run({"q": q})[0], OrtRunner(r).run({"q": q})[0]
    assert np.max(np.abs(a - b)) < 1e-5
    assert b.shape == (1, 2, L, 4)


def test_the_rewrite_does_not_touch_its_argument():
    m = vits_attention_probe()
    before = m.SerializeToString()
    relshift.rewrite_relshift(m)
    assert m.SerializeToString() == before


def test_shift_indices():
    np.testing.assert_array_equal(relshift.shift_indices(3, "rel_to_abs"), [[2, 3, 4], [1, 2, 3], [0, 1, 2]])
    np.testing.assert_array_equal(relshift.shift_indices(2, "abs_to_rel"), [[-1, 0, 1], [0, 1, -1]])
    with pytest.raises(relshift.RelShiftError, match="use rel_to_abs or abs_to_rel"):
        relshift.shift_indices(3, "sideways")


def test_real_voice_encoder_has_two_chains_per_layer(voice):
    """The real folded encoder at width 32: 6 attention layers x (logits, values), all verified."""
    from rkstudy.families.piper_encoder.seam import encoder_slice, shapes_for

    folded = graph.fold(encoder_slice(voice.model), shapes_for(32))
    found = relshift.find_relshift(folded)
    assert len(found) == 12
    assert sorted({f.scope for f in found}) == [f"/enc_p/encoder/attn_layers.{i}/" for i in range(6)]
    assert all(f.verified and f.rewritable and f.length == 32 for f in found)
    assert [f.kind for f in found].count("rel_to_abs") == 6


# --- the banded form ---------------------------------------------------------------------------
def windowed(L, d, window, seed):
    """rel_k [1,1,d,2L-1] and rel_v [1,1,2L-1,d] non-zero only at offsets |o| <= window (VITS pads
    its 2·window+1 embeddings with zeros to 2L-1 positions)."""
    rng = np.random.default_rng(seed)
    keep = np.abs(np.arange(2 * L - 1) - (L - 1)) <= window
    rel_k = rng.standard_normal((1, 1, d, 2 * L - 1)).astype(np.float32) * keep
    rel_v = rng.standard_normal((1, 1, 2 * L - 1, d)).astype(np.float32) * keep[:, None]
    return rel_k, rel_v


def attention(rel_k, rel_v, heads=2):
    """The VITS chains of vits_attention_probe around given tables, plus the content term
    probs·q, so the value chain's MatMul is one of two summands as in the real encoder."""
    L = (rel_k.shape[-1] + 1) // 2
    m = vits_attention_probe(L=L, d=rel_k.shape[-2], heads=heads)
    for init in m.graph.initializer:
        if init.name in ("rel_k", "rel_v"):
            init.CopyFrom(numpy_helper.from_array(rel_k if init.name == "rel_k" else rel_v, init.name))
    mm3 = next(n for n in m.graph.node if n.name == "/attn/MatMul_3")
    mm3.output[0] = "y1"
    m.graph.node.extend([helper.make_node("MatMul", ["probs", "q"], ["y0"], name="/attn/MatMul_2"),
                         helper.make_node("Add", ["y0", "y1"], ["y"], name="/attn/Add_3")])
    onnx.checker.check_model(m)
    return m


def exactness(m, r, seed):
    """(SNR dB, max |diff|) of the rewritten graph against the original on random queries."""
    from rkstudy import gates

    shape = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    q = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    a, b = OrtRunner(m).run({"q": q})[0], OrtRunner(r).run({"q": q})[0]
    assert a.shape == b.shape
    return gates.snr_db(a, b), float(np.max(np.abs(a - b)))


def ops(model):
    return [n.op_type for n in model.graph.node]


def test_band_offsets_are_read_from_the_table():
    _, rel_v = windowed(L=6, d=3, window=2, seed=0)
    assert relshift.band_offsets(rel_v, -2, 6) == (-2, -1, 0, 1, 2)
    table = np.zeros((4, 11), np.float32)
    table[1, 0] = table[3, 7] = 1.0  # offsets -5 and +2: not contiguous, read as they are
    assert relshift.band_offsets(table, -1, 6) == (-5, 2)
    with pytest.raises(relshift.RelShiftError, match="has 11 positions; a width-5"):
        relshift.band_offsets(table, -1, 5)
    np.testing.assert_array_equal(relshift.diagonal_mask(3, 1), [[0, 1, 0], [0, 0, 1], [0, 0, 0]])


@pytest.mark.parametrize("window,K", [(1, 3), (2, 5), (4, 9)])
def test_the_finding_carries_k_and_the_offsets_of_its_table(window, K):
    m = attention(*windowed(L=12, d=4, window=window, seed=window))
    found = relshift.plan(relshift.find_relshift(m), "banded")
    assert [(f.kind, f.form, f.table, f.diagonals) for f in found] == [
        ("rel_to_abs", "banded", "rel_k", K), ("abs_to_rel", "banded", "rel_v", K)]
    assert found[0].offsets == tuple(range(-window, window + 1))
    assert found[0].operand == "q" and found[1].operand == "probs"
    assert f"{K} of 23 relative positions non-zero" in found[0].band_note
    row = found[1].row()
    assert row["form"] == "banded" and row["diagonals"] == K
    # gather mode reads the same band but keeps the gathers
    assert {f.form for f in relshift.plan(found, "gather")} == {"gather"}


def test_an_irregular_band_is_read_not_assumed():
    """Offsets -3, 0, +5 (not symmetric, not contiguous): K = 3, and the rewrite is exact."""
    L, d = 9, 4
    rel_k, rel_v = windowed(L, d, window=L, seed=11)
    keep = np.zeros(2 * L - 1, bool)
    keep[[(L - 1) - 3, L - 1, (L - 1) + 5]] = True
    m = attention(rel_k * keep, rel_v * keep[:, None])
    found = relshift.plan(relshift.find_relshift(m), "banded")
    assert {f.offsets for f in found} == {(-3, 0, 5)}
    snr, diff = exactness(m, relshift.rewrite_relshift(m, mode="banded"), seed=11)
    assert snr >= 120 and diff <= 1e-5


@pytest.mark.parametrize("L,window", [(2, 4), (3, 1), (7, 2), (16, 4), (33, 4)])
def test_banded_rewrite_is_exact(L, window):
    """fp32 against the original graph: >= 120 dB and max |diff| <= 1e-5, no chain, no gather."""
    m = attention(*windowed(L, 5, window, seed=L))
    r = relshift.rewrite_relshift(m, mode="banded")
    onnx.checker.check_model(r)
    assert relshift.find_relshift(r) == []
    for op in ("Pad", "Slice", "GatherElements", "Gather"):
        assert op not in ops(r), op
    snr, diff = exactness(m, r, seed=L)
    assert snr >= 120 and diff <= 1e-5, (snr, diff)


def test_the_band_form_shares_its_masks_and_keeps_nothing_l2_times_d():
    L, d = 16, 8
    m = attention(*windowed(L, d, window=3, seed=3))
    r = relshift.rewrite_relshift(m, mode="banded")
    inits = {i.name: numpy_helper.to_array(i) for i in r.graph.initializer}
    masks, select = inits["banded.masks.L16.B2.-3_-2_-1_0_1_2_3"], inits["banded.select.L16.-3_-2_-1_0_1_2_3"]
    assert masks.shape == (2 * 7, L, L) and select.shape == (L, 7, L)  # logit masks tiled per head
    np.testing.assert_array_equal(masks[7 + 6], np.eye(L, k=3))
    np.testing.assert_array_equal(select[:, 0, :], np.eye(L, k=-3))
    assert max(a.size for a in inits.values()) == masks.size  # heads·K·L², no d
    assert "rel_k" not in inits and "rel_v" not in inits  # replaced by their 7 band rows
    assert set(ops(r)) == {"MatMul", "Transpose", "Reshape", "Mul", "Conv", "ReduceSum", "Add", "Softmax"}
    rows = relshift.layer_view(r, "/attn/")
    assert sum(x["role"] == "banded" for x in rows) == 11  # 6 logit-side + 5 value-side nodes


def test_a_table_that_is_not_banded_keeps_the_gather_rewrite_and_says_why():
    """Width 20, rel_k dense (39 of 39 positions non-zero > 32): the logit chain keeps the gather
    form, the value chain (window 1) is banded, the whole graph stays exact."""
    L, d = 20, 4
    rel_k = np.random.default_rng(4).standard_normal((1, 1, d, 2 * L - 1)).astype(np.float32)
    _, rel_v = windowed(L, d, window=1, seed=4)
    m = attention(rel_k, rel_v)
    logits, values = relshift.plan(relshift.find_relshift(m), "banded")
    assert logits.form == "gather" and values.form == "banded" and logits.diagonals == 39
    assert ("table is not banded: 39 of 39 relative positions are non-zero (> max_diagonals=32); "
            "kept the gather form") == logits.band_note
    r = relshift.rewrite_relshift(m, mode="banded")
    assert ops(r).count("GatherElements") == 1 and ops(r).count("Conv") == 0
    assert relshift.find_relshift(r) == []
    snr, diff = exactness(m, r, seed=4)
    assert snr >= 120 and diff <= 1e-5, (snr, diff)
    # every chain dense: banded mode is the gather rewrite, node for node
    dense = attention(rel_k, np.random.default_rng(5).standard_normal(rel_v.shape).astype(np.float32))
    assert ops(relshift.rewrite_relshift(dense, mode="banded")) == ops(relshift.rewrite_relshift(dense))


def test_a_logit_chain_without_a_constant_table_keeps_gather():
    rel_k, rel_v = windowed(6, 4, window=2, seed=5)
    m = attention(rel_k, rel_v)
    m.graph.initializer.remove(next(i for i in m.graph.initializer if i.name == "rel_k"))
    m.graph.input.append(helper.make_tensor_value_info("rel_k", TensorProto.FLOAT, list(rel_k.shape)))
    logits = relshift.plan(relshift.find_relshift(m), "banded")[0]
    assert logits.form == "gather" and logits.offsets is None
    assert "not MatMul(query, constant rel-key table); kept the gather form" in logits.band_note


def test_an_all_zero_table_gives_zero_terms():
    rel_k, rel_v = windowed(6, 3, window=2, seed=6)
    m = attention(np.zeros_like(rel_k), rel_v)
    logits = relshift.plan(relshift.find_relshift(m), "banded")[0]
    assert logits.form == "banded" and logits.offsets == () and logits.band_note == "the table is all zeros"
    snr, diff = exactness(m, relshift.rewrite_relshift(m, mode="banded"), seed=6)
    assert diff <= 1e-5


def test_banded_mode_leaves_an_unverified_chain_and_its_argument_alone():
    m = vits_attention_probe(tail_front=True)
    before = m.SerializeToString()
    logits = relshift.plan(relshift.find_relshift(m), "banded")[0]
    assert logits.form == "" and logits.offsets is None
    r = relshift.rewrite_relshift(m, mode="banded")
    assert m.SerializeToString() == before
    assert ops(r).count("Pad") == 2 and "GatherElements" not in ops(r)  # only the value chain went
    from rkstudy.lint import lint

    left = [f for f in lint(r).findings if f.code == "RK201"]
    assert len(left) == 1 and "cannot be rewritten" in left[0].fix
    with pytest.raises(relshift.RelShiftError, match="use one of gather, banded"):
        relshift.rewrite_relshift(m, mode="diagonal")


def test_real_voice_encoder_is_banded_and_exact(voice):
    """The real folded encoder at width 32: every chain's table has 9 non-zero diagonals
    (-4..4, Piper's window 4), and the banded graph, padded, reproduces the raw slice."""
    from rkstudy import gates
    from rkstudy.families.piper import voice as piper
    from rkstudy.families.piper_encoder.seam import encoder_slice, shapes_for
    from rkstudy.families.piper_encoder.tokens import pad_ids, real_tokens

    raw = encoder_slice(voice.model)
    folded = graph.fold(raw, shapes_for(32))
    found = relshift.plan(relshift.find_relshift(folded), "banded")
    assert len(found) == 12 and {f.form for f in found} == {"banded"}
    assert {f.offsets for f in found} == {tuple(range(-4, 5))}
    r = relshift.rewrite_relshift(folded, found, mode="banded")
    ids = real_tokens(voice, 17)
    a, b = OrtRunner(raw).run(piper.ids_feed(ids)), OrtRunner(r).run(pad_ids(ids, 32))
    for x, y in zip(a, b):
        assert gates.snr_db(x[..., :17], y[..., :17]) >= 120
        assert np.max(np.abs(x[..., :17] - y[..., :17])) <= 1e-5
