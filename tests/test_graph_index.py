"""graph.index on small hand-made graphs: exact producers, consumers, shapes and constants; the
node probe; splice and prune; and the long-axis pass built on them (exact against onnxruntime)."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkstudy.graph.index import Index, prune, run_nodes, splice
from rkstudy.graph.longaxis import long_axis_safe


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _diamond():
    """x[1,4] -> Relu -> r; r * w -> a; r + c (Constant) -> b; a + b -> y; and a dead Neg of r."""
    w = numpy_helper.from_array(np.arange(4, dtype=np.float32).reshape(1, 4), "w")
    unused = numpy_helper.from_array(np.zeros(3, np.float32), "unused")
    two = numpy_helper.from_array(np.full((1, 4), 2.0, np.float32))
    c = helper.make_node("Constant", [], ["c"], name="c", value=two)
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"), c,
             helper.make_node("Mul", ["r", "w"], ["a"], name="mul"),
             helper.make_node("Add", ["r", "c"], ["b"], name="add"),
             helper.make_node("Neg", ["r"], ["dead"], name="neg"),
             helper.make_node("Add", ["a", "b"], ["y"], name="sum")]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n"])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, unused])


def test_producers_consumers_and_constants():
    idx = Index(_diamond())
    assert {t: n.name for t, n in idx.producer.items()} == {
        "r": "relu", "c": "c", "a": "mul", "b": "add", "dead": "neg", "y": "sum"}
    assert {t: [n.name for n in ns] for t, ns in idx.consumers.items()} == {
        "x": ["relu"], "r": ["mul", "add", "neg"], "w": ["mul"], "c": ["add"], "a": ["sum"], "b": ["sum"]}
    assert sorted(idx.constants) == ["c", "unused", "w"]
    assert idx.constants["w"].tolist() == [[0.0, 1.0, 2.0, 3.0]]
    assert idx.constants.get("c").tolist() == [[2.0] * 4] and idx.constants.get("r") is None
    assert idx.is_const("w") and not idx.is_const("r")
    assert not idx.from_constants("a") and idx.from_constants("c")
    assert [n.name for n in idx.nodes] == ["relu", "c", "mul", "add", "neg", "sum"]


def test_shapes_as_declared_and_as_inferred():
    m = _diamond()
    declared = Index(m)
    # the model declares x only (its second dim symbolic); initializers and Constants give theirs
    assert declared.shapes == {"x": (1, None), "w": (1, 4), "unused": (3,), "c": (1, 4)}
    assert declared.static_shape("x") is None and declared.static_shape("w") == (1, 4)
    inferred = Index.inferred(m)
    assert inferred.shapes["r"] == (1, None) and inferred.shapes["a"] == (1, 4)
    assert inferred.elem_types["a"] == TensorProto.FLOAT
    assert inferred.producer["a"] is m.graph.node[2]  # nodes are the model's own, not the inferred copy's
    assert len(m.graph.value_info) == 0  # the model is not changed


def test_shapes_of_a_pinned_graph():
    m = _diamond()
    m.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 4
    idx = Index.inferred(m)
    assert {t: idx.static_shape(t) for t in ("x", "r", "a", "b", "y", "dead")} == {
        "x": (1, 4), "r": (1, 4), "a": (1, 4), "b": (1, 4), "y": (1, 4), "dead": (1, 4)}


def test_probe_runs_the_graphs_own_nodes_with_its_constants():
    m = _diamond()
    idx = Index(m)
    x = np.array([[-1.0, 0.5, 2.0, -3.0]], np.float32)
    mul, add = m.graph.node[2], m.graph.node[3]
    r = np.maximum(x, 0)
    a, b = idx.probe([mul, add], {"r": r}, ["a", "b"])
    assert a.tolist() == [[0.0, 0.5, 4.0, 0.0]] and b.tolist() == [[2.0, 2.5, 4.0, 2.0]]
    (y,) = idx.probe(list(m.graph.node), {"x": x}, ["y"])
    assert y.tolist() == [[2.0, 3.0, 8.0, 2.0]]
    # a new node reading a constant the graph does not hold takes it from `extra`
    new = helper.make_node("Sub", ["r", "k"], ["s"], name="sub")
    (s,) = idx.probe([new], {"r": r}, ["s"], extra={"k": np.ones((1, 4), np.float32)})
    assert s.tolist() == [[-1.0, -0.5, 1.0, -1.0]]
    with pytest.raises(ValueError, match="'a' is neither fed nor a constant"):
        idx.probe([m.graph.node[5]], {"b": b}, ["y"])


def test_run_nodes_keeps_integer_feeds():
    node = helper.make_node("Add", ["i", "j"], ["k"])
    (k,) = run_nodes([node], {"i": np.array([1, 2], np.int64)}, ["k"], {"j": np.array([10, 20], np.int64)},
                     opset_imports=[helper.make_opsetid("", 17)], output_types={"k": TensorProto.INT64})
    assert k.dtype == np.int64 and k.tolist() == [11, 22]


def test_splice_then_prune():
    m = _diamond()
    # replace mul (index 2) by Sub(r, w) under the same output name
    sub = helper.make_node("Sub", ["r", "w"], ["a"], name="sub")
    splice(m, {2: [sub]}, drop=[2])
    assert [n.name for n in m.graph.node] == ["relu", "c", "sub", "add", "neg", "sum"]
    prune(m)
    assert [n.name for n in m.graph.node] == ["relu", "c", "sub", "add", "sum"]  # the dead Neg is gone
    assert [i.name for i in m.graph.initializer] == ["w"]  # and the unused initializer
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.array([[1.0, 1.0, 1.0, 1.0]], np.float32)
    assert sess.run(None, {"x": x})[0].tolist() == [[4.0, 3.0, 2.0, 1.0]]  # (1-w) + (1+2)


def test_splice_inserts_before_and_keeps_order():
    m = _diamond()
    extra = [helper.make_node("Identity", ["r"], [f"r{k}"], name=f"id{k}") for k in range(2)]
    splice(m, {0: [extra[0]], 5: [extra[1]]})
    assert [n.name for n in m.graph.node] == ["id0", "relu", "c", "mul", "add", "neg", "id1", "sum"]
    assert len(prune(m).graph.node) == 5


def _long_graph(length=64, channels=3):
    """x[1,C,L] -> Slice [5:-7] -> s; x -> dilated Conv (k=3, d=4, bias) -> y."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((2, channels, 3)).astype(np.float32), "w")
    bias = numpy_helper.from_array(rng.standard_normal(2).astype(np.float32), "bias")
    starts, ends, axes = (numpy_helper.from_array(np.array([v], np.int64), n)
                          for n, v in (("starts", 5), ("ends", -7), ("axes", 2)))
    nodes = [helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["s"], name="slice"),
             helper.make_node("Conv", ["x", "w", "bias"], ["y"], name="conv", kernel_shape=[3], dilations=[4])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, length])],
                  [helper.make_tensor_value_info("s", TensorProto.FLOAT, None),
                   helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, bias, starts, ends, axes])


def _run(m, x):
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})


def test_long_axis_rewrites_are_exact_and_prune_the_replaced_constants():
    m = _long_graph()
    safe, done = long_axis_safe(m, limit=16)
    assert (done.slices, done.dilated_convs, done.added_nodes) == (1, 1, 4)
    assert [n.op_type for n in safe.graph.node] == ["ConvTranspose"] * 4 + ["Add"] * 2
    assert sorted(i.name for i in safe.graph.initializer) == [
        "bias", "conv/tap0.weight", "conv/tap1.weight", "conv/tap2.weight", "longaxis/ones_3"]
    x = np.random.default_rng(1).standard_normal((1, 3, 64)).astype(np.float32)
    (s0, y0), (s1, y1) = _run(m, x), _run(safe, x)
    assert s1.shape == (1, 3, 52) and np.array_equal(s0, s1)  # the crop is a copy
    assert y1.shape == (1, 2, 56) and np.max(np.abs(y0 - y1)) < 1e-5  # the tap sum, fp32 rounding apart
    assert len(m.graph.node) == 2  # the argument is untouched


def test_long_axis_leaves_short_axes_alone():
    safe, done = long_axis_safe(_long_graph(), limit=8191)
    assert (done.slices, done.dilated_convs, done.added_nodes) == (0, 0, 0)
    assert [n.op_type for n in safe.graph.node] == ["Slice", "Conv"]
