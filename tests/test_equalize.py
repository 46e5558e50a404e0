"""Cross-layer equalization (rkstudy.graph.equalize) and the quantizer's model (rkstudy.graph.quantsim):
exact in fp32 on small graphs with each edge case (a chain, a HiFi-GAN residual stream with its
upsamplers, Snake, a frame mask, grouped convs, ops that pin a group) and on the real Piper window."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkstudy.graph import equalize as eq
from rkstudy.graph import quantsim

T = 64


def make_model(nodes, inputs, outputs, inits=()):
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(inits)),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _inits(seed=7, **arrays):
    """Seeded normal weights {name: (shape, scale)}: every graph here is the same whatever ran before."""
    rng = np.random.default_rng(seed)
    return [numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)
            for name, (shape, scale) in arrays.items()]


def _io(name, channels, length=T):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, channels, length])


def _feeds(model, n=3, seed=0, offset=0.0):
    rng = np.random.default_rng(seed)
    return [{i.name: (rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]) + offset)
             .astype(np.float32) for i in model.graph.input} for _ in range(n)]


def _run(model, feed):
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]


def chain():
    """x -> conv a (8 ch, one channel 20x the others) -> LeakyRelu -> conv b -> y."""
    wa = np.random.default_rng(1).standard_normal((8, 4, 3)).astype(np.float32)
    wa[2] *= 20
    nodes = [helper.make_node("Conv", ["x", "wa", "ba"], ["h"], name="a", kernel_shape=[3], pads=[1, 1]),
             helper.make_node("LeakyRelu", ["h"], ["r"], name="act", alpha=0.1),
             helper.make_node("Conv", ["r", "wb", "bb"], ["y"], name="b", kernel_shape=[3], pads=[1, 1])]
    inits = [numpy_helper.from_array(wa, "wa"), *_inits(ba=((8,), 1), wb=((4, 8, 3), 1), bb=((4,), 1))]
    return make_model(nodes, [_io("x", 4)], [_io("y", 4)], inits)


def resblock_stage():
    """A HiFi-GAN stage in small: ConvTranspose up (x2), two resblock-2 steps summed into the stream,
    the stage average (Div 2), LeakyRelu, a one-channel conv_post and Tanh."""
    c = 6
    nodes = [helper.make_node("Conv", ["x", "wpre", "bpre"], ["pre"], name="pre", kernel_shape=[3], pads=[1, 1]),
             helper.make_node("LeakyRelu", ["pre"], ["pre_r"], name="pre_act", alpha=0.1),
             helper.make_node("ConvTranspose", ["pre_r", "wup", "bup"], ["up"], name="up", kernel_shape=[4],
                              strides=[2], pads=[1, 1]),
             helper.make_node("LeakyRelu", ["up"], ["up_r"], name="r0_act", alpha=0.1),
             helper.make_node("Conv", ["up_r", "w0", "b0"], ["c0"], name="r0_conv", kernel_shape=[3], pads=[1, 1]),
             helper.make_node("Add", ["c0", "up"], ["s0"], name="r0_add"),
             helper.make_node("LeakyRelu", ["s0"], ["s0_r"], name="r1_act", alpha=0.1),
             helper.make_node("Conv", ["s0_r", "w1", "b1"], ["c1"], name="r1_conv", kernel_shape=[3], pads=[3, 3],
                              dilations=[3]),
             helper.make_node("Add", ["c1", "s0"], ["s1"], name="r1_add"),
             helper.make_node("Add", ["s1", "s0"], ["sum"], name="stage_sum"),
             helper.make_node("Div", ["sum", "two"], ["avg"], name="stage_avg"),
             helper.make_node("LeakyRelu", ["avg"], ["avg_r"], name="post_act", alpha=0.01),
             helper.make_node("Conv", ["avg_r", "wpost"], ["post"], name="post", kernel_shape=[7], pads=[3, 3]),
             helper.make_node("Tanh", ["post"], ["audio"], name="tanh")]
    inits = _inits(wpre=((8, 4, 3), 1), bpre=((8,), 1), wup=((8, c, 4), 0.5), bup=((c,), 1), w0=((c, c, 3), 0.5),
                   b0=((c,), 1), w1=((c, c, 3), 0.5), b1=((c,), 1), wpost=((1, c, 7), 0.3))
    inits.append(numpy_helper.from_array(np.array(2.0, np.float32), "two"))
    return make_model(nodes, [_io("x", 4, 16)], [_io("audio", 1, 32)], inits)


def snake():
    """conv a -> Snake (x + c2 * sin(c1 x)^2, per-channel c1 = alpha, c2 = 1 / alpha) -> conv b."""
    alpha = np.abs(np.random.default_rng(2).standard_normal((1, 6, 1))).astype(np.float32) + 0.3
    nodes = [helper.make_node("Conv", ["x", "wa", "ba"], ["h"], name="a", kernel_shape=[3], pads=[1, 1]),
             helper.make_node("Mul", ["h", "alpha"], ["ah"], name="snake_in"),
             helper.make_node("Sin", ["ah"], ["sin"], name="snake_sin"),
             helper.make_node("Pow", ["sin", "two"], ["sin2"], name="snake_sq"),
             helper.make_node("Mul", ["sin2", "inv_alpha"], ["bump"], name="snake_out"),
             helper.make_node("Add", ["h", "bump"], ["s"], name="snake_add"),
             helper.make_node("Conv", ["s", "wb"], ["y"], name="b", kernel_shape=[3], pads=[1, 1])]
    inits = [*_inits(wa=((6, 3, 3), 1), ba=((6,), 1), wb=((2, 6, 3), 1)), numpy_helper.from_array(alpha, "alpha"),
             numpy_helper.from_array(1 / alpha, "inv_alpha"), numpy_helper.from_array(np.array(2.0, np.float32), "two")]
    return make_model(nodes, [_io("x", 3)], [_io("y", 2)], inits)


def _group(groups, writer):
    return next(g for g in groups if writer in g.writers)


def _ranges(model, writer, reader, channels):
    w = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    nodes = {n.name: n for n in model.graph.node}
    out = np.abs(w[nodes[writer].input[1]]).reshape(channels, -1).max(axis=1)
    read = np.abs(w[nodes[reader].input[1]]).transpose(1, 0, 2).reshape(channels, -1).max(axis=1)
    return out / out.max(), read / read.max()


# --- groups ---------------------------------------------------------------------------------------------
def test_a_chain_is_one_group_with_one_pair():
    groups = eq.find_groups(chain())
    assert [g.pinned for g in groups] == ["a graph input; no conv writes it", "", "a graph output; no conv reads it"]
    (g,) = [g for g in groups if g.free]
    assert (g.tensors, g.writers, g.readers, g.pairs) == (("h", "r"), ("a",), ("b",), (("a", "b"),))
    assert (g.free, g.residual, g.channels, g.kind) == (True, False, 8, "chain")


def test_a_residual_stage_is_one_stream_the_upsampler_writes_and_the_next_conv_reads():
    groups = eq.find_groups(resblock_stage())
    stream = _group(groups, "up")
    assert stream.free and stream.residual and stream.kind == "residual stream"
    assert stream.writers == ("up", "r0_conv", "r1_conv") and stream.readers == ("r0_conv", "r1_conv", "post")
    assert set(stream.tensors) >= {"up", "s0", "s1", "sum", "avg", "avg_r"}
    # every conv that writes the stream reaches the conv_post through the sums; r0's output also reaches r1
    assert {("up", "r0_conv"), ("r0_conv", "r1_conv"), ("r1_conv", "post"), ("up", "post")} <= set(stream.pairs)
    assert ("r1_conv", "r0_conv") not in stream.pairs
    assert _group(groups, "pre").readers == ("up",)  # the ConvTranspose reads the previous chain
    post = _group(groups, "post")
    assert not post.free and "Tanh tanh" in post.pinned and "one channel wide" in post.pinned


def test_snake_is_a_boundary_of_two_per_channel_products():
    groups = eq.find_groups(snake())
    g = _group(groups, "a")
    assert g.free and g.writers == ("a", "snake_out") and g.readers == ("snake_in", "b")
    assert set(g.tensors) == {"h", "bump", "s"}


def test_ops_a_channel_scale_does_not_pass_pin_the_group_and_say_which():
    nodes = [helper.make_node("Conv", ["x", "wa"], ["h"], name="a", kernel_shape=[1]),
             helper.make_node("Sigmoid", ["h"], ["g"], name="gate"),
             helper.make_node("Conv", ["g", "wb"], ["y"], name="b", kernel_shape=[1]),
             helper.make_node("Conv", ["y", "wc"], ["out"], name="c", kernel_shape=[1])]
    m = make_model(nodes, [_io("x", 4)], [_io("out", 4)], _inits(wa=((4, 4, 1), 1), wb=((4, 4, 1), 1),
                                                                 wc=((4, 4, 1), 1)))
    by = {g.writers[0] if g.writers else g.readers[0]: g for g in eq.find_groups(m)}
    assert by["a"].pinned == "read by Sigmoid gate; no conv reads it"
    assert by["b"].free  # y: written by b, read by c
    assert by["c"].pinned == "a graph output; no conv reads it"
    assert not _group(eq.find_groups(m), "b").pinned


def test_a_frame_mask_passes_the_scale_and_keeps_its_own():
    nodes = [helper.make_node("Conv", ["x", "wa", "ba"], ["h"], name="a", kernel_shape=[3], pads=[1, 1]),
             helper.make_node("Mul", ["h", "mask"], ["hm"], name="masked"),
             helper.make_node("LeakyRelu", ["hm"], ["r"], name="act", alpha=0.1),
             helper.make_node("Conv", ["r", "wb"], ["y"], name="b", kernel_shape=[3], pads=[1, 1])]
    m = make_model(nodes, [_io("x", 4), _io("mask", 1)], [_io("y", 4)],
                   _inits(wa=((8, 4, 3), 1), ba=((8,), 1), wb=((4, 8, 3), 1)))
    (g,) = [g for g in eq.find_groups(m) if g.channels == 8]
    assert g.free and g.tensors == ("h", "hm", "r")
    feeds = _feeds(m)
    for f in feeds:
        f["mask"] = (f["mask"] > 0).astype(np.float32)
    made = eq.equalize(m, feeds, power_of_two=True)
    assert all(r["bit_equal"] for r in made.exactness)


# --- the rewrite is exact -----------------------------------------------------------------------------------
@pytest.mark.parametrize("make", [chain, resblock_stage, snake])
@pytest.mark.parametrize("method", eq.METHODS)
def test_the_rewrite_is_exact_in_fp32(make, method):
    m = make()
    made = eq.equalize(m, _feeds(m), method)
    assert made.equalized and all(r["exact"] for r in made.exactness)
    assert min(r["snr_vs_original_db"] for r in made.exactness) > 120
    assert any(np.ptp(np.log2(s)) > 0.5 for s in made.scales.values())  # it did move something


@pytest.mark.parametrize("make", [chain, resblock_stage, snake])
def test_power_of_two_scales_give_bit_equal_outputs(make):
    m = make()
    made = eq.equalize(m, _feeds(m), power_of_two=True)
    assert all(r["bit_equal"] for r in made.exactness)
    assert all(np.array_equal(s, 2.0 ** np.round(np.log2(s))) for s in made.scales.values())


def test_nagel_rule_meets_the_pair_half_way():
    m = chain()
    before = _ranges(m, "a", "b", 8)
    made = eq.equalize(m, _feeds(m), "weights")
    after = _ranges(made.model, "a", "b", 8)
    ratio = before[0] / before[1]
    assert ratio.max() / ratio.min() > 10  # the 20x channel
    np.testing.assert_allclose(after[0], after[1], rtol=1e-5)  # r1 / s = r2 s = sqrt(r1 r2), normalised


def test_activation_rule_evens_the_activation_ranges():
    m = chain()
    feeds = _feeds(m, 4)
    made = eq.equalize(m, feeds, "activations", alpha=1.0)
    ranges = [quantsim.range_rows(eq.channel_stats(x, feeds, ["r"]), ["r"])[0] for x in (m, made.model)]
    assert ranges[0]["spread"] > 5 and ranges[1]["spread"] < 1.01
    assert ranges[1]["bits_lost_mean"] < ranges[0]["bits_lost_mean"] - 1


def test_grouped_convs_read_and_write_their_channels():
    nodes = [helper.make_node("Conv", ["x", "wa", "ba"], ["h"], name="a", kernel_shape=[3], pads=[1, 1], group=2),
             helper.make_node("Relu", ["h"], ["r"], name="act"),
             helper.make_node("ConvTranspose", ["r", "wt"], ["u"], name="up", kernel_shape=[2], strides=[2], group=2),
             helper.make_node("LeakyRelu", ["u"], ["ur"], name="act2", alpha=0.2),
             helper.make_node("Conv", ["ur", "wd"], ["y"], name="dw", kernel_shape=[3], pads=[1, 1], group=6)]
    m = make_model(nodes, [_io("x", 4)], [_io("y", 6, 2 * T)],
                   _inits(wa=((8, 2, 3), 1), ba=((8,), 1), wt=((8, 3, 2), 1), wd=((6, 1, 3), 1)))
    assert [(g.writers, g.readers) for g in eq.find_groups(m) if g.free] == [(("a",), ("up",)), (("up",), ("dw",))]
    made = eq.equalize(m, _feeds(m), "weights")
    assert min(r["snr_vs_original_db"] for r in made.exactness) > 120


def test_a_broken_rewrite_is_refused():
    m = chain()
    made = eq.equalize(m, _feeds(m), "weights")
    broken = made.model
    w = next(i for i in broken.graph.initializer if i.name == "wb")
    w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w) * np.float32(1.001), "wb"))
    with pytest.raises(eq.NotExact, match="not within fp32 rounding"):
        eq.verify(m, broken, _feeds(m))


def test_the_argument_is_not_edited():
    m = resblock_stage()
    before = m.SerializeToString()
    eq.equalize(m, _feeds(m))
    assert m.SerializeToString() == before


# --- high biases -------------------------------------------------------------------------------------------
def _biased(pads):
    """conv a whose channel 0 carries a bias of 50 (always positive), Relu, conv b with `pads`."""
    ba = np.zeros(4, np.float32)
    ba[0] = 50
    nodes = [helper.make_node("Conv", ["x", "wa", "ba"], ["h"], name="a", kernel_shape=[1]),
             helper.make_node("Relu", ["h"], ["r"], name="act"),
             helper.make_node("Conv", ["r", "wb", "bb"], ["y"], name="b", kernel_shape=[3], pads=[pads, pads])]
    return make_model(nodes, [_io("x", 2)], [_io("y", 3, T - 2 + 2 * pads)],
                      [*_inits(wa=((4, 2, 1), 1), wb=((3, 4, 3), 1), bb=((3,), 1)), numpy_helper.from_array(ba, "ba")])


def test_a_high_bias_is_absorbed_where_the_reader_sees_it_everywhere():
    m = _biased(0)
    feeds = _feeds(m, 4)
    stats = eq.channel_stats(m, feeds, ["h"])
    out, rows = eq.absorb_high_biases(m, stats, feeds)
    (row,) = rows
    assert row["absorbed"] and row["positive_channels"] == 1
    r = eq.channel_stats(out, feeds, ["r"])
    assert abs(r.lo["r"][0]) < 1e-4 and r.hi["r"][0] < stats.hi["h"][0] - 40  # the channel no longer sits near 50
    assert min(eq.snr_db(_run(m, f), _run(out, f)) for f in feeds) > 120


def test_a_padded_reader_leaves_the_bias_where_it_is():
    m = _biased(1)
    feeds = _feeds(m, 4)
    out, (row,) = eq.absorb_high_biases(m, eq.channel_stats(m, feeds, ["h"]), feeds)
    assert not row["absorbed"] and "(b pads its input or upsamples)" in row["why_not"]
    assert out.graph.initializer[-1] == m.graph.initializer[-1]


# --- bias correction ---------------------------------------------------------------------------------------------
def test_bias_correction_takes_back_the_mean_the_quantized_weights_add():
    m = chain()
    feeds = _feeds(m, 4, offset=2.0)  # inputs with a mean, so the weights' error has one to move
    corrected, rows = eq.correct_biases(m, feeds, weight_bits=4)
    assert [r["conv"] for r in rows] == ["a", "b"] and all(r["corrected"] for r in rows)
    assert all(r["mean_error_after"] < r["mean_error_before"] / 50 for r in rows)  # on the data it was fitted to
    _, held = eq.correct_biases(m, feeds, weight_bits=4, check=_feeds(m, 3, seed=5, offset=2.0))
    assert all(r["mean_error_after"] < r["mean_error_before"] / 2 for r in held)  # and on data held apart
    x = feeds[0]
    assert 10 < eq.snr_db(_run(m, x), _run(corrected, x)) < 80  # it changes the fp32 function, on purpose


def test_bias_correction_refuses_a_layer_whose_claim_fails_on_the_check_data():
    m = chain()
    _, rows = eq.correct_biases(m, _feeds(m, 4, offset=2.0), weight_bits=4, check=_feeds(m, 3, seed=5, offset=-2.0))
    first = rows[0]
    assert not first["corrected"] and first["why_not"] and first["mean_error_after"] > first["mean_error_before"]


# --- the quantizer's model ------------------------------------------------------------------------------------
def test_the_activation_grid_is_the_toolkits():
    # x's range and its grid as rknn-toolkit2 2.5.0's hybrid_quantization_step1 wrote them for a w8a8 build
    scale, zero, qmin, qmax = quantsim.activation_grid(-3.8994216918945312, 3.0660367012023926)
    assert (zero, qmin, qmax) == (15, -128, 127) and scale == pytest.approx(0.027315523110184016, rel=1e-12)


def test_weights_are_symmetric_per_output_channel():
    w = np.array([[[1.0, -0.5]], [[0.01, 0.004]]])
    q = eq.quantize_weights(w, 8)
    assert q[0, 0, 0] == 1.0 and q[1, 0, 0] == pytest.approx(0.01)
    assert q[1, 0, 1] == pytest.approx(0.01 / 127 * round(0.004 / (0.01 / 127)))
    assert np.array_equal(eq.quantize_weights(w.transpose(1, 0, 2), 8, axis=1), q.transpose(1, 0, 2))


def test_the_quantized_model_is_the_numpy_one():
    m = chain()
    feeds = _feeds(m, 3)
    stats = eq.channel_stats(m, feeds, quantsim.activation_tensors(m))
    q = quantsim.quantized_model(m, stats, 8, 8)
    w = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    x = feeds[0]["x"]
    fq = lambda t, a: quantsim.fake_quantize(a, stats.lo[t].min(), stats.hi[t].max())  # noqa: E731

    def conv(a, wt, b):
        pad = np.pad(a[0], ((0, 0), (1, 1)))
        return (np.einsum("oik,ikt->ot", wt, np.stack([pad[:, k:k + T] for k in range(3)], 1)) + b[:, None])[None]
    h = fq("h", conv(fq("x", x), eq.quantize_weights(w["wa"], 8), w["ba"]))
    r = fq("r", np.where(h > 0, h, 0.1 * h))
    y = fq("y", conv(r, eq.quantize_weights(w["wb"], 8), w["bb"]))
    np.testing.assert_allclose(_run(q, feeds[0]), y, atol=2 * (stats.hi["y"].max() - stats.lo["y"].min()) / 255)
    assert [o.name for o in q.graph.output] == ["y"]


def test_layer_errors_split_the_error_by_where_it_enters():
    m = resblock_stage()
    feeds = _feeds(m, 3)
    rows8 = {r["conv"]: r for r in quantsim.layer_errors(m, feeds)}
    rows16 = {r["conv"]: r for r in quantsim.layer_errors(m, feeds, activation_bits=16)}
    assert set(rows8) == {"pre", "up", "r0_conv", "r1_conv", "post"}
    for name, r in rows8.items():
        assert r["snr_db"] <= min(r["snr_weights_db"], r["snr_input_db"], r["snr_output_db"]) + 1
        assert rows16[name]["snr_input_db"] > r["snr_input_db"] + 30  # 8 more bits on the activations
        assert rows16[name]["snr_weights_db"] == r["snr_weights_db"]
    assert rows8["up"]["macs"] == 8 * 6 * 4 * 16


# --- the real window -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def window(voice, slice_once):
    from rkstudy.families.piper_decoder.study import walked_windows

    produced = slice_once(voice)
    (cal,) = voice.latents("The quick brown fox jumps over the lazy dog, twice.")
    (held,) = voice.latents("Call me at 555 0142, extension 7.")
    windows = walked_windows(voice, [cal], produced.contract)
    return eq.named(produced.model), windows, walked_windows(voice, [held], produced.contract)


def test_the_piper_window_equalizes_its_decoder_and_names_what_it_skips(window):
    model, _, _ = window
    groups = eq.find_groups(model)
    free = [g for g in groups if g.free]
    assert [(g.writers[0], g.kind, g.channels, len(g.writers), len(g.readers), len(g.pairs)) for g in free] == [
        ("/dec/conv_pre/Conv", "chain", 256, 1, 1, 1),
        ("/dec/ups.0/ConvTranspose", "residual stream", 128, 7, 7, 16),
        ("/dec/ups.1/ConvTranspose", "residual stream", 64, 7, 7, 16),
        ("/dec/ups.2/ConvTranspose", "residual stream", 32, 7, 7, 16)]
    skipped = [g for g in groups if not g.free]
    assert all(w.startswith("/flow/") for g in skipped for w in g.writers if w != "/dec/conv_post/Conv")
    post = next(g for g in skipped if "/dec/conv_post/Conv" in g.writers)
    assert "Tanh /dec/Tanh" in post.pinned
    assert any("Split" in g.pinned for g in skipped) and any("Slice" in g.pinned for g in skipped)


@pytest.mark.slow
def test_the_piper_window_rewrite_is_exact_on_held_out_windows(window, one_torch_thread):
    model, cal, held = window
    made = eq.equalize(model, cal, "activations", alpha=1.0, check=held[:2])
    assert made.summary()["pairs_equalized"] == 49 and made.summary()["residual_streams_equalized"] == 3
    assert all(r["exact"] for r in made.exactness)
    assert min(r["snr_vs_original_db"] for r in made.exactness) > 110
    pow2 = eq.equalize(model, cal, "weights", power_of_two=True, check=held[:1])
    assert all(r["bit_equal"] for r in pow2.exactness)
