"""Graph surgery into a stateful step (rkstudy.graph.delays, rkstudy.graph.stateful) and the stateful
walker (rkstudy.walk.stateful), on a small VITS-shaped decoder: the step equals a full-length decode at every
step size, length and chunking, in float64 to its rounding and in fp32 to 120 dB."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkstudy import gates
from rkstudy.contract import Digest, step_contract
from rkstudy.errors import EngineMismatch
from rkstudy.families.piper_decoder_stateful.producer import stamped
from rkstudy.graph.delays import NotStreamable, conv_macs, delay_map, name_nodes
from rkstudy.graph.f64 import F64Runner, run_f64
from rkstudy.graph.stateful import make_step
from rkstudy.runtime import OrtRunner
from rkstudy.walk.stateful import StatefulWalker

C = 4


def tiny_decoder(frames: int = 20, seed: int = 0) -> onnx.ModelProto:
    """conv k5 -> mask -> split/concat coupling -> ConvTranspose (K4, s2, p1) -> mask upsampled by an
    all-ones ConvTranspose -> resblock (leaky, dilated k3, residual) -> conv k7 -> mask -> tanh: every
    conv output masked, as the decoder mask does."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(np.ones((1, 1, 2), np.float32), "ones2")]

    def w(name, *shape):
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * 0.4).astype(np.float32), name))
        return name

    inits.append(numpy_helper.from_array(np.asarray([2, 2], np.int64), "sp"))
    n = helper.make_node
    nodes = [
        n("ConvTranspose", ["m", "ones2"], ["m2"], kernel_shape=[2], strides=[2], name="mask_up"),
        n("Conv", ["x", w("w0", C, C, 5), w("b0", C)], ["h0"], pads=[2, 2], kernel_shape=[5], name="pre"),
        n("Mul", ["h0", "m"], ["h1"], name="mask0"),
        n("Split", ["h1", "sp"], ["a", "b"], axis=1, name="split"),
        n("Conv", ["a", w("w1", 2, 2, 3), w("b1", 2)], ["ca"], pads=[1, 1], kernel_shape=[3], name="coupling"),
        n("Mul", ["ca", "m"], ["cam"], name="mask1"),
        n("Sub", ["b", "cam"], ["b2"], name="sub"),
        n("Concat", ["a", "b2"], ["h2"], axis=1, name="concat"),
        n("LeakyRelu", ["h2"], ["h3"], alpha=0.1, name="act0"),
        n("ConvTranspose", ["h3", w("wt", C, C, 4), w("bt", C)], ["u"], kernel_shape=[4], strides=[2], pads=[1, 1],
          name="up"),
        n("Mul", ["u", "m2"], ["um"], name="mask2"),
        n("LeakyRelu", ["um"], ["r0"], alpha=0.1, name="act1"),
        n("Conv", ["r0", w("w2", C, C, 3), w("b2w", C)], ["r1"], pads=[2, 2], kernel_shape=[3], dilations=[2],
          name="res"),
        n("Mul", ["r1", "m2"], ["r1m"], name="mask3"),
        n("Add", ["r1m", "um"], ["r2"], name="residual"),
        n("Conv", ["r2", w("w3", 1, C, 7)], ["y0"], pads=[3, 3], kernel_shape=[7], name="post"),
        n("Mul", ["y0", "m2"], ["y1"], name="mask4"),
        n("Tanh", ["y1"], ["y"], name="tanh"),
    ]
    g = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, frames]),
                                          helper.make_tensor_value_info("m", TensorProto.FLOAT, [1, 1, frames])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def pinned(model: onnx.ModelProto, frames: int) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for i in m.graph.input:
        i.type.tensor_type.shape.dim[-1].dim_value = frames
    del m.graph.value_info[:]
    return onnx.shape_inference.infer_shapes(m)


def full_decode(model, x, run) -> np.ndarray:
    n = x.shape[1]
    return np.asarray(run(pinned(model, n), {"x": x[None], "m": np.ones((1, 1, n), x.dtype)})[0]).ravel()


def stepped(model, emit: int, layout: str = "grouped"):
    """The step, stamped with its contract (x walked, m the mask)."""
    step = make_step(model, ["x", "m"], emit, layout=layout)
    c = step_contract(step, family="piper_decoder_stateful", masks=("m",), source=Digest("tiny.onnx", "a" * 64),
                      producer="rkstudy piper decoder --stateful --emit 1", params={"hop": 2, "channels": C})
    return stamped(step, c)


def test_the_delay_map_is_the_sum_of_right_pads():
    dm = delay_map(name_nodes(tiny_decoder()), ["x", "m"])
    # pre k5 (+2) and coupling k3 (+1) at rate 1: 3 frames; up: 2*3 + 1 = 7; res k3 dilation 2 (+2): 9;
    # post k7 (+3): 12 output samples at 2 per frame
    assert (dm.output_delay, dm.output_rate, dm.lookahead_frames) == (12, 2, 6.0)
    plans = {c.node: c for c in dm.convs}
    assert (plans["up"].history, plans["up"].delay_out) == (1, 7)    # ceil((K - s) / s) input samples kept
    assert (plans["res"].history, plans["res"].delay_out) == (4, 9)  # the dilated span
    assert dm.history()["um"] == 2   # the residual's less delayed branch waits 2 samples in a delay line


@pytest.mark.parametrize("layout", ["grouped", "flat"])
@pytest.mark.parametrize("emit", [1, 3, 7, 25])
@pytest.mark.parametrize("frames", [1, 5, 19])
def test_the_step_equals_a_full_length_decode(emit, frames, layout):
    model = tiny_decoder()
    x = np.random.default_rng(frames).standard_normal((C, frames))
    produced = stepped(model, emit, layout)
    (out64,) = StatefulWalker(F64Runner(produced.model), produced.contract, dtype=np.float64).decode(x)
    assert gates.snr_db(full_decode(model, x, run_f64), out64) > 250.0   # the method: float64 rounding only
    (out32,) = StatefulWalker(OrtRunner(produced.model), produced.contract).decode(x.astype(np.float32))
    ref32 = full_decode(model, x.astype(np.float32), lambda m, f: OrtRunner(m).run(f))
    assert out32.shape == (1, frames * 2) and gates.snr_db(ref32, out32) >= 120.0


def test_a_stream_in_any_chunking_is_the_same_stream():
    produced = stepped(tiny_decoder(), 4)
    x = np.random.default_rng(1).standard_normal((C, 23)).astype(np.float32)
    walker = StatefulWalker(OrtRunner(produced.model), produced.contract)
    (whole,) = walker.decode(x)
    pieces = [out for (out,) in walker.stream([x[:, :1], x[:, 1:9], x[:, 9:10], x[:, 10:]])]
    np.testing.assert_array_equal(whole, np.concatenate(pieces, axis=-1))
    # a lookahead of 12 samples (6 frames) at 8 samples per step: the first real sample comes out of step 2,
    # and 23 frames need 23 * 2 + 12 = 58 stream samples, 8 steps
    assert walker.first_audio_frames == 8 and walker.steps == 8


def test_the_state_layout_is_one_tensor_per_channel_count():
    produced = stepped(tiny_decoder(), 5)
    s = produced.step
    # x: pre's k5 span; a: coupling's k3; b: waits 1 for the coupling; h3: the ConvTranspose's one input
    # sample; um: the residual's delay line; r0: the dilated span; r2: post's k7; m and m2: the mask at
    # the largest delay any Mul reads it at (3 frames; 12 samples for post's output)
    assert {b.tensor: b.history for b in s.buffers} == {"x": 4, "a": 2, "b": 1, "h3": 1, "um": 2, "r0": 4, "r2": 6,
                                                        "m": 3, "m2": 12}
    assert [g.shape for g in s.groups] == [(1, C, 17), (1, 2, 3), (1, 1, 15)]
    assert s.state_floats == produced.contract.params["state_floats"] == 4 * 17 + 2 * 3 + 15
    assert produced.contract.state == tuple((g.input, g.output) for g in s.groups)
    assert [t.name for t in produced.contract.role("state", outputs=True)] == [g.output for g in s.groups]


def test_macs_count_only_the_transposed_conv_history_beyond_the_full_decode():
    model = tiny_decoder()
    produced = stepped(model, 10)
    mono = conv_macs(pinned(model, 1000)) / 1000
    # the ConvTranspose reads one extra input sample per step (K=4, s=2); the mask upsampler (K = s) none
    extra = C * C * 4 * 1 / 10
    assert conv_macs(produced.model) / 10 == pytest.approx(mono + extra)


def test_time_axis_ops_and_strides_below_a_frame_are_refused_naming_the_node():
    model = tiny_decoder()
    model.graph.node.append(helper.make_node("ReduceMean", ["y"], ["mean"], axes=[2], keepdims=1, name="global"))
    model.graph.output.append(helper.make_tensor_value_info("mean", TensorProto.FLOAT, None))
    with pytest.raises(NotStreamable, match="ReduceMean 'global' reduces over the time axis"):
        delay_map(name_nodes(onnx.shape_inference.infer_shapes(model)), ["x", "m"])
    model = tiny_decoder()   # a stride-2 conv at one sample per frame would make half a sample per frame
    next(n for n in model.graph.node if n.name == "pre").attribute.append(helper.make_attribute("strides", [2]))
    with pytest.raises(NotStreamable, match="Conv 'pre': stride 2 at 1 samples per frame leaves a fraction"):
        delay_map(model, ["x", "m"])


def test_the_walker_checks_the_runner_and_the_frames_against_the_contract():
    produced = stepped(tiny_decoder(), 4)
    other = stepped(tiny_decoder(), 5)
    with pytest.raises(EngineMismatch, match="the engine's x is .1, 4, 5. but its contract says .1, 4, 4."):
        StatefulWalker(OrtRunner(other.model), produced.contract)
    walker = StatefulWalker(OrtRunner(produced.model), produced.contract)
    with pytest.raises(EngineMismatch, match="x has shape .3, 10.; this step takes"):
        walker.decode(np.zeros((3, 10), np.float32))
    from dataclasses import replace

    with pytest.raises(EngineMismatch, match="carries no state"):
        StatefulWalker(OrtRunner(produced.model), replace(produced.contract, state=()))
