"""Every registered streaming rule's float64 evaluation against onnxruntime (fp32), op by op, on random
inputs: the exactness gate's interpreter (rkstudy.graph.f64) runs nothing but these, so an op the surgery
streams and the interpreter got wrong would pass a wrong step as exact. The case table must cover every
op in RULES: registering an op without a case here fails `test_every_registered_op_has_a_case`."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkstudy.graph.f64 import run_f64
from rkstudy.graph.streaming import RULES, NotStreamable, rule_for

X = (2, 4, 6)   # [batch, channels, time]

# op -> (inputs, attributes, outputs, opset): an input is (kind, shape or values); kinds: x (normal), pos
# (positive), unit (inside (-1, 1)), int (small ints), bool, c (a float constant), i (an int64 constant)
UNARY = ("Abs", "Ceil", "Cos", "Erf", "Exp", "Floor", "Identity", "Neg", "Relu", "Round", "Sigmoid", "Sign", "Sin",
         "Softplus", "Softsign", "Tanh", "Atan", "Sinh", "Cosh", "Tan", "Mish", "HardSwish", "Elu", "Selu", "Gelu",
         "LeakyRelu", "HardSigmoid", "IsInf", "IsNaN")
BINARY = ("Add", "Sub", "Mul", "Div", "Max", "Min", "Sum", "Mean", "Equal", "Greater", "GreaterOrEqual", "Less",
          "LessOrEqual", "PRelu")
CASES: dict[str, tuple] = {op: ([("x", X)], {}, 1, 20 if op == "Gelu" else 18) for op in UNARY}
CASES.update({op: ([("x", X), ("x", (1, 4, 1))], {}, 1, 18) for op in BINARY})
CASES.update({
    "Elu": ([("x", X)], {"alpha": 0.7}, 1, 18),
    "LeakyRelu": ([("x", X)], {"alpha": 0.2}, 1, 18),
    "HardSigmoid": ([("x", X)], {"alpha": 0.3, "beta": 0.4}, 1, 18),
    "Gelu": ([("x", X)], {"approximate": "tanh"}, 1, 20),
    "Log": ([("pos", X)], {}, 1, 18), "Sqrt": ([("pos", X)], {}, 1, 18), "Reciprocal": ([("pos", X)], {}, 1, 18),
    "Asin": ([("unit", X)], {}, 1, 18), "Acos": ([("unit", X)], {}, 1, 18),
    "Pow": ([("pos", X), ("c", [2.5])], {}, 1, 18),
    "Mod": ([("x", X), ("c", [0.7])], {"fmod": 1}, 1, 18),
    "Not": ([("bool", X)], {}, 1, 18), "And": ([("bool", X), ("bool", X)], {}, 1, 18),
    "Or": ([("bool", X), ("bool", X)], {}, 1, 18), "Xor": ([("bool", X), ("bool", X)], {}, 1, 18),
    "Where": ([("bool", X), ("x", X), ("x", X)], {}, 1, 18),
    "Clip": ([("x", X), ("c", -0.5), ("c", 0.8)], {}, 1, 18),
    "Cast": ([("x", X)], {"to": TensorProto.INT64}, 1, 18),
    "Dropout": ([("x", X)], {}, 1, 18),
    "Conv": ([("x", X), ("c", np.random.default_rng(1).standard_normal((4, 2, 3)).tolist()),
              ("c", [0.1, 0.2, 0.3, 0.4])], {"pads": [2, 1], "dilations": [2], "group": 2, "strides": [2]}, 1, 18),
    "ConvTranspose": ([("x", X), ("c", np.random.default_rng(2).standard_normal((4, 3, 5)).tolist())],
                      {"pads": [1, 2], "strides": [3], "output_padding": [1]}, 1, 18),
    "Pad": ([("x", X), ("i", [0, 0, 2, 0, 0, 3])], {"mode": "reflect"}, 1, 18),
    "Transpose": ([("x", X)], {"perm": [0, 2, 1]}, 1, 18),
    "Unsqueeze": ([("x", X), ("i", [1, -1])], {}, 1, 18),
    "Squeeze": ([("x", (2, 1, 6)), ("i", [1])], {}, 1, 18),
    "Reshape": ([("x", X), ("i", [0, 2, -1])], {}, 1, 18),
    "Flatten": ([("x", X)], {"axis": 2}, 1, 18),
    "Slice": ([("x", X), ("i", [5, 1]), ("i", [0, 3]), ("i", [2, 1]), ("i", [-2, 1])], {}, 1, 18),
    "Split": ([("x", X), ("i", [1, 3])], {"axis": 1}, 2, 18),
    "Gather": ([("x", X), ("i", [[3, -1], [0, 2]])], {"axis": 1}, 1, 18),
    "Concat": ([("x", X), ("x", (2, 3, 6))], {"axis": 1}, 1, 18),
    "LayerNormalization": ([("x", X), ("x", (6,)), ("x", (6,))], {"axis": -1}, 1, 18),
    "BatchNormalization": ([("x", X), ("x", (4,)), ("x", (4,)), ("x", (4,)), ("pos", (4,))], {"epsilon": 1e-3}, 1, 18),
    "InstanceNormalization": ([("x", X), ("x", (4,)), ("x", (4,))], {}, 1, 18),
    "GroupNormalization": ([("x", X), ("x", (4,)), ("x", (4,))], {"num_groups": 2}, 1, 21),
    "MatMul": ([("x", X), ("x", (6, 5))], {}, 1, 18),
    "Gemm": ([("x", (3, 4)), ("x", (5, 4)), ("x", (5,))], {"transB": 1, "alpha": 0.5, "beta": 2.0}, 1, 18),
    "Softmax": ([("x", X)], {"axis": 1}, 1, 18), "LogSoftmax": ([("x", X)], {"axis": 1}, 1, 18),
    "Hardmax": ([("x", X)], {"axis": 1}, 1, 18), "LpNormalization": ([("x", X)], {"axis": 1, "p": 2}, 1, 18),
    "GlobalAveragePool": ([("x", X)], {}, 1, 18), "GlobalMaxPool": ([("x", X)], {}, 1, 18),
    "GlobalLpPool": ([("x", X)], {"p": 3}, 1, 18),
    "CumSum": ([("x", X), ("i", 2)], {"exclusive": 1, "reverse": 1}, 1, 18),
    "TopK": ([("x", X), ("i", [3])], {"axis": 1}, 2, 18),
    "Shape": ([("x", X)], {"start": 1}, 1, 18),
    "ConstantOfShape": ([("i", [2, 3])], {"value": numpy_helper.from_array(np.array([1.5], np.float32))}, 1, 18),
    "Constant": ([], {"value": numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3))}, 1, 18),
})
for op in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
           "ReduceSumSquare", "ReduceLogSumExp"):
    CASES[op] = ([("x", X), ("i", [1])], {"keepdims": 0}, 1, 18)
CASES["ReduceLogSum"] = ([("pos", X), ("i", [1, 2])], {}, 1, 18)


def _value(kind: str, spec, rng) -> np.ndarray:
    if kind in ("c", "i"):
        return np.asarray(spec, np.float32 if kind == "c" else np.int64)
    shape = spec
    if kind == "x":
        return rng.standard_normal(shape).astype(np.float32)
    if kind == "pos":
        return rng.uniform(0.2, 2.0, shape).astype(np.float32)
    if kind == "unit":
        return rng.uniform(-0.9, 0.9, shape).astype(np.float32)
    return rng.random(shape) > 0.5


def _case(op: str, seed: int = 0):
    inputs, attributes, n_out, opset = CASES[op]
    rng = np.random.default_rng(seed)
    feeds, inits, names, vis = {}, [], [], []
    for k, (kind, spec) in enumerate(inputs):
        value, name = _value(kind, spec, rng), f"in{k}"
        names.append(name)
        if kind in ("c", "i"):
            inits.append(numpy_helper.from_array(value, name))
        else:
            feeds[name] = value
            elem = TensorProto.BOOL if value.dtype == bool else TensorProto.FLOAT
            vis.append(helper.make_tensor_value_info(name, elem, value.shape))
    outs = [f"out{k}" for k in range(n_out)]
    node = helper.make_node(op, names, outs, name=f"{op}_node", **attributes)
    graph = helper.make_graph([node], op, vis, [onnx.ValueInfoProto(name=o) for o in outs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    return onnx.shape_inference.infer_shapes(model, strict_mode=True), feeds


def test_every_registered_op_has_a_case():
    assert sorted(set(RULES) - set(CASES)) == []
    assert sorted(set(CASES) - set(RULES)) == []


@pytest.mark.parametrize("op", sorted(CASES))
def test_the_float64_evaluation_matches_onnxruntime(op):
    model, feeds = _case(op)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, feeds)
    got = run_f64(model, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape, op
        if w.dtype.kind == "f":
            assert g.dtype == np.float64
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6, err_msg=op)
        else:
            np.testing.assert_array_equal(g.astype(w.dtype), w, err_msg=op)


def test_an_op_with_no_rule_is_refused_in_one_line_naming_it_and_its_node():
    model, feeds = _case("Abs")
    model.graph.node[0].op_type = "Celu"
    with pytest.raises(NotStreamable) as exc:
        run_f64(model, feeds)
    message = str(exc.value)
    assert "Celu 'Abs_node'" in message and "no streaming rule" in message and "\n" not in message
    assert f"{len(RULES)} ops" in message   # the registry says what it has, counted from RULES


def test_the_rules_note_what_a_census_counts():
    """What rkstudy.families.port.study.ops_handled prints beside each op comes from its rule."""
    notes = {op: rule_for(_case(op)[0].graph.node[0]).note(_case(op)[0].graph.node[0]) for op in RULES}
    assert notes["Conv"] == ["strided", "grouped"] and notes["Pad"] == ["reflect"]
    assert notes["ConvTranspose"] == ["output_padding"]
    assert {op for op, n in notes.items() if n} == {"Conv", "ConvTranspose", "Pad"}
