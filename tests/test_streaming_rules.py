"""The streaming rules one op family at a time (rkstudy.graph.streaming): each rule's timing on a tiny
graph built here, and the stateful step it makes against the full-length decode of the same graph in
float64 (every sample, both ends), for the shapes exporters write: pads in constant, edge and reflect
mode, strided convs and grouped transposed convs chained as anti-aliased activations chain them,
output_padding at odd strides, time moved by Transpose and Reshape around LayerNorm, MatMul and Gemm,
and what really mixes time refused with its node. onnxruntime and the float64 interpreter only."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkstudy import gates
from rkstudy.contract import Digest, step_contract
from rkstudy.graph.delays import NotStreamable, delay_map, name_nodes, time_axes
from rkstudy.graph.f64 import F64Runner, run_f64
from rkstudy.graph.stateful import make_step
from rkstudy.graph.streaming import RULES
from rkstudy.graph.validity import mask_boundaries
from rkstudy.runtime import OrtRunner
from rkstudy.walk.stateful import StatefulWalker

C = 3


class G:
    """A tiny graph x [1, C, T] -> ... -> y, built node by node."""

    def __init__(self, seed=0):
        self.nodes, self.inits, self.rng, self.k = [], [], np.random.default_rng(seed), 0

    def w(self, *shape, scale=0.5):
        self.k += 1
        name = f"w{self.k}"
        self.inits.append(numpy_helper.from_array((self.rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    def c(self, values, dtype=np.int64):
        self.k += 1
        name = f"c{self.k}"
        self.inits.append(numpy_helper.from_array(np.asarray(values, dtype), name))
        return name

    def op(self, op, inputs, out=None, **attrs):
        self.k += 1
        out = out or f"t{self.k}"
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"{op}_{self.k}", **attrs))
        return out

    def model(self, frames=20, opset=18, outputs=("y",)):
        g = helper.make_graph(self.nodes, "tiny",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, frames])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
        m.ir_version = 8
        return onnx.shape_inference.infer_shapes(m)


def pinned(model, frames):
    m = onnx.ModelProto()
    m.CopyFrom(model)
    m.graph.input[0].type.tensor_type.shape.dim[-1].dim_value = frames
    del m.graph.value_info[:]
    return onnx.shape_inference.infer_shapes(m)


def streams(model, emits=(1, 4, 7), lengths=(1, 6, 23), edge=3):
    """The step at every `emits` against the full decode at every length, float64: worst SNR over all
    samples and over the first and last `edge` frames."""
    worst = np.inf
    for emit in emits:
        step = make_step(model, ["x"], emit)
        c = step_contract(step, family="port", masks=(), source=Digest("t.onnx", "0" * 64), producer="t", params={})
        for n in lengths:
            x = np.random.default_rng(n).standard_normal((C, n))
            full = run_f64(pinned(model, n), {"x": x[None]})[0][0]
            (got,) = StatefulWalker(F64Runner(step.model), c, dtype=np.float64).decode({"x": x})
            hop = step.output_rate
            for span in (slice(None), slice(0, edge * hop), slice(-edge * hop, None)):
                worst = min(worst, gates.snr_db(full[..., span], got.reshape(full.shape)[..., span]))
    return worst


def conv(g, x, cin, cout, k, pads, **kw):
    weight = g.w(cout, cin // kw.get("group", 1), k)
    return g.op("Conv", [x, weight, g.w(cout)], kernel_shape=[k], pads=list(pads), **kw)


def pad(g, x, lo, hi, mode):
    return g.op("Pad", [x, g.c([0, 0, lo, 0, 0, hi])], mode=mode)


# --- one rule at a time ----------------------------------------------------------------------------

def test_every_rule_module_is_imported_and_registers_its_ops():
    """Each module of rkstudy/graph/streaming that defines a rule is imported by the package (the one
    import line a new op needs), and every rule it defines is registered for its ops."""
    import importlib
    import pkgutil

    from rkstudy.graph import streaming
    from rkstudy.graph.streaming import Rule

    for info in pkgutil.iter_modules(streaming.__path__):
        module = importlib.import_module(f"rkstudy.graph.streaming.{info.name}")
        rules = [v for v in vars(module).values()
                 if isinstance(v, type) and issubclass(v, Rule) and v is not Rule and v.__module__ == module.__name__]
        for rule in rules:
            assert rule.ops and all(type(RULES[op]) is rule for op in rule.ops), rule.__name__
    assert {r.family for r in RULES.values()} >= {"conv", "resample", "pad", "pointwise", "layout", "norm"}
    for op in ("Conv", "ConvTranspose", "Pad", "Transpose", "Reshape", "LayerNormalization", "MatMul", "Gemm",
               "Softmax", "ReduceMean", "Slice", "Mul", "InstanceNormalization"):
        assert op in RULES


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect"])
def test_a_pad_then_a_valid_conv_streams_exactly_in_each_mode(mode):
    g = G()
    h = pad(g, "x", 3, 2, mode)
    h = conv(g, h, C, C, 6, (0, 0))
    g.op("Tanh", [h], "y")
    assert streams(g.model(), lengths=(4, 9, 23)) > 250.0


def test_an_edge_pad_replicates_the_first_and_last_real_frame_in_a_padded_window():
    g = G()
    g.op("Identity", [conv(g, pad(g, "x", 4, 5, "edge"), C, C, 10, (0, 0))], "y")
    model = g.model(frames=12)
    valid = mask_boundaries(model, ["x"])
    assert valid.rewritten and valid.mask == "valid"
    x = np.random.default_rng(0).standard_normal((1, C, 12)).astype(np.float32)
    with_ones = OrtRunner(valid.model).run({"x": x, "valid": np.ones((1, 1, 12), np.float32)})[0]
    assert gates.snr_db(OrtRunner(model).run({"x": x})[0], with_ones) == np.inf   # the same function on real frames
    short, mask = x.copy(), np.ones((1, 1, 12), np.float32)
    short[..., 7:], mask[..., 7:] = 0.0, 0.0    # 7 real frames walked in a 12-frame window
    ref = OrtRunner(pinned(model, 7)).run({"x": x[..., :7]})[0]
    got = OrtRunner(valid.model).run({"x": short, "valid": mask})[0][..., :7]
    assert gates.snr_db(ref, got) > 120.0


def test_a_constant_pad_of_another_value_is_rewritten_and_streams():
    g = G()
    p = g.op("Pad", ["x", g.c([0, 0, 2, 0, 0, 2]), g.c(0.5, np.float32)], mode="constant")
    g.op("Relu", [conv(g, p, C, C, 5, (0, 0))], "y")
    assert streams(g.model()) > 250.0


def test_an_anti_aliased_activation_chain_streams_up_and_down():
    """BigVGAN's Activation1d as its export writes it: edge pad 5, grouped ConvTranspose x2 (kernel 12),
    a crop of 15 each side, a Snake, edge pad (5, 6), a strided grouped low-pass Conv /2."""
    g = G()
    up = g.op("ConvTranspose", [pad(g, "x", 5, 5, "edge"), g.w(C, 1, 12)], kernel_shape=[12], strides=[2], group=C)
    up = g.op("Slice", [up, g.c([15]), g.c([-15]), g.c([2])])
    s = g.op("Sin", [g.op("Mul", [up, g.w(1, C, 1)])])
    snake = g.op("Add", [up, g.op("Mul", [g.op("Mul", [s, s]), g.w(1, C, 1)])])
    down = g.op("Conv", [pad(g, snake, 5, 6, "edge"), g.w(C, 1, 12)], kernel_shape=[12], strides=[2], group=C)
    g.op("Identity", [conv(g, down, C, C, 3, (1, 1))], "y")
    model = g.model()
    plans = {p.op: p for p in delay_map(name_nodes(model), ["x"]).convs if p.group == C}
    assert (plans["ConvTranspose"].rate_out, plans["Conv"].stride, plans["Conv"].rate_out) == (2, 2, 1)
    assert streams(model, lengths=(3, 9, 23)) > 250.0


@pytest.mark.parametrize("stride", [3, 4, 5])
def test_odd_strides_with_output_padding_stream(stride):
    g = G()
    up = g.op("ConvTranspose", ["x", g.w(C, C, 2 * stride), g.w(C)], kernel_shape=[2 * stride], strides=[stride],
              pads=[(stride + 1) // 2] * 2, output_padding=[stride % 2])
    g.op("Tanh", [conv(g, up, C, 1, 3, (1, 1))], "y")
    model = g.model()
    assert delay_map(name_nodes(model), ["x"]).output_rate == stride
    assert streams(model) > 250.0


def test_a_kernel_shorter_than_its_stride_leaves_the_bias_alone_in_the_gap():
    g = G()
    g.op("Identity", [g.op("ConvTranspose", ["x", g.w(C, C, 2), g.w(C)], kernel_shape=[2], strides=[3],
                           output_padding=[1])], "up")
    g.op("Identity", [conv(g, "up", C, C, 3, (1, 1))], "y")
    assert streams(g.model()) > 250.0


def test_a_strided_conv_needs_a_rate_its_stride_divides():
    g = G()
    g.op("Identity", [conv(g, "x", C, C, 4, (1, 1), strides=[2])], "y")
    with pytest.raises(NotStreamable, match="stride 2 at 1 samples per frame"):
        delay_map(name_nodes(g.model()), ["x"])


def test_time_moves_through_transpose_layernorm_and_linear_as_vocos_writes_them():
    """[B, C, T] -> Transpose -> LayerNormalization over C -> MatMul (Linear) -> Transpose back, and the
    Gemm form onnxslim folds a Linear into (Reshape to [T, C], Gemm, Reshape back)."""
    g = G()
    h = conv(g, "x", C, C, 7, (3, 3), group=C)
    t = g.op("Transpose", [h], perm=[0, 2, 1])
    t = g.op("LayerNormalization", [t, g.w(C), g.w(C)], axis=-1, epsilon=1e-6)
    t = g.op("Add", [g.op("MatMul", [t, g.w(C, 2 * C)]), g.w(2 * C)])
    flat = g.op("Reshape", [g.op("Erf", [t]), g.c([-1, 2 * C])])
    t = g.op("Reshape", [g.op("Gemm", [flat, g.w(2 * C, C), g.w(C)]), g.c([1, -1, C])])
    back = g.op("Transpose", [t], perm=[0, 2, 1])
    g.op("Add", [back, h], "y")
    model = g.model()
    dm = time_axes(model, ["x"])
    assert not dm.refused and dm.axis(t) == 1 and dm.axis(flat) == 0 and dm.axis("y") == 2
    assert streams(model) > 250.0


def test_a_softmax_and_a_mean_over_channels_stream_and_over_time_are_refused():
    g = G()
    h = conv(g, "x", C, C, 3, (1, 1))
    s = g.op("Softmax", [h], axis=1)
    g.op("Add", [s, g.op("ReduceMean", [h, g.c([1])], keepdims=1)], "y")
    assert streams(g.model()) > 250.0
    for node in (helper.make_node("Softmax", ["h"], ["y"], axis=2, name="attn"),
                 helper.make_node("ReduceMean", ["h", "ax"], ["y"], keepdims=1, name="mean")):
        g = G()
        g.op("Identity", ["x"], "h")
        g.c([2])
        g.inits[-1].name = "ax"
        g.nodes.append(node)
        with pytest.raises(NotStreamable, match=f"'{node.name}' (normalises|reduces) over the time axis"):
            delay_map(name_nodes(g.model()), ["x"])


def test_attention_over_time_and_a_reshape_that_folds_time_are_refused_naming_the_node():
    g = G()
    t = g.op("Transpose", ["x"], perm=[0, 2, 1])
    g.op("MatMul", [t, "x"], "y")   # [T, C] x [C, T]: every frame meets every frame
    with pytest.raises(NotStreamable, match="MatMul 'MatMul_2' multiplies two time-carrying tensors"):
        delay_map(name_nodes(g.model()), ["x"])
    g = G()
    g.op("Reshape", ["x", g.c([1, -1])], "y")
    with pytest.raises(NotStreamable, match="folds the time axis into another dim"):
        delay_map(name_nodes(g.model()), ["x"])


def test_a_graph_that_zeroes_itself_needs_no_mask_and_comes_back_unchanged():
    g = G()
    h = g.op("Relu", [conv(g, "x", C, C, 3, (1, 1))])
    m = g.op("Mul", [h, "x"])    # zero wherever x is
    g.op("Identity", [conv(g, g.op("Pad", [m, g.c([0, 0, 1, 0, 0, 1])]), C, C, 3, (0, 0))], "y")
    model = g.model()
    valid = mask_boundaries(model, ["x"])
    assert valid.mask is None and [n.op_type for n in valid.model.graph.node] == [n.op_type for n in model.graph.node]
    assert streams(model) > 250.0


def test_a_pad_ahead_of_the_first_frame_reads_every_input_late():
    """A zero pad of 4 then a valid conv k3: the pad's output would run 4 samples ahead of its input; the
    inputs are read late instead (`lead`), and the first frame is exact."""
    g = G()
    h = conv(g, pad(g, "x", 4, 0, "constant"), C, C, 3, (0, 0))
    g.op("Identity", [g.op("Slice", [h, g.c([2]), g.c([2 ** 62]), g.c([2])])], "y")
    model = g.model()
    assert delay_map(name_nodes(model), ["x"]).lead >= 1
    assert streams(model) > 250.0


def test_lint_names_the_time_axis_it_tracks_through_a_transpose():
    """RK301 reads the time axis the streaming rules track (the one concept the step and the contract use):
    a ReduceSum over the long axis of a transposed [1, T, C] tensor is a reduction over time; the same
    length on a channel axis is only an axis."""
    from rkstudy.lint import lint

    t = 9000
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1], name="to_btc"),
             helper.make_node("ReduceSum", ["xt", "ax"], ["y"], keepdims=1, name="sum_time")]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, t])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.array([1], np.int64), "ax")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    found = {f.detail.get("reduction", False): f for f in lint(m, time_inputs=["x"]).findings if f.code == "RK301"}
    assert found[True].message == f"1 reduction(s) over the time axis of {t} (> 8191)"
    assert found[True].detail["time_axis"] and found[False].detail["time_axis"]
    wide = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "t",
                             [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, t, 16])],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(wide, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    (f,) = [f for f in lint(m, time_inputs=["x"]).findings if f.code == "RK301"]
    assert f.message.startswith(f"1 node(s) carry an axis of {t}") and not f.detail["time_axis"]
