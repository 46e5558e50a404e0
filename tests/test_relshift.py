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
