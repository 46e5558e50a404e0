"""rkstudy lint: every rule on a tiny graph that has its hazard and one that does not, the registry, the
API's input checks, the exit codes of `rkstudy lint`, and (simulator tier) lint against the real compiler."""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkstudy import cli, graph
from rkstudy.errors import InputError, UsageError
from rkstudy.graph import decmask, relshift, sine
from rkstudy.lint import against_toolkit, lint, load_rules, opsupport, parse_input, rule, view
from rkstudy.lint.against_toolkit import _f32, _model, _vi
from rkstudy.lint.rules.unsupported import variant
from rkstudy.runtime import OrtRunner


def codes(report, severity=None):
    return [(f.code, f.severity) for f in report.findings if severity is None or f.severity == severity]


def only(report, code):
    found = [f for f in report.findings if f.code == code]
    assert len(found) == 1, [f.text() for f in report.findings]
    return found[0]


# --- the registry --------------------------------------------------------------------------------------
def test_every_rule_registered_once_with_a_stable_code():
    rules = load_rules()
    assert list(rules) == ["RK101", "RK102", "RK103", "RK201", "RK202", "RK203", "RK204", "RK301", "RK302",
                           "RK303", "RK304", "RK305", "RK401", "RK501", "RK502"]
    assert len({r.name for r in rules.values()}) == len(rules)
    assert all(r.summary for r in rules.values())


def test_a_duplicate_code_or_name_is_refused():
    load_rules()
    with pytest.raises(ValueError, match="two lint rules claim RK201"):
        rule("RK201", "another-name")(lambda g: [])
    with pytest.raises(ValueError, match="relshift-chain"):
        rule("RK999", "relshift-chain")(lambda g: [])
    with pytest.raises(ValueError, match="three digits"):
        rule("X1", "x")


def test_parse_input():
    assert parse_input("z=1x192x93") == ("z", (1, 192, 93))
    assert parse_input("a=b=4") == ("a=b", (4,))
    for bad in ("z", "=1x2", "z=1x0", "z=1xAx3", "z=", "z=1,192,93"):
        with pytest.raises(UsageError, match="NAME=D0xD1x"):
            parse_input(bad)


# --- one rule each: a graph with the hazard, one without --------------------------------------------------
def test_shape_plumbing():
    f = only(lint(against_toolkit.shape_chain()), "RK101")
    assert f.severity == "warning" and f.nodes == ("shape", "sized") and f.detail["foldable"]
    assert "rkstudy fold" in f.fix and "(the reference documents, host, rk3588)" in f.why
    folded = graph.fold(against_toolkit.shape_chain(), {"x": [1, 4, 16]})
    assert not [f for f in lint(folded).findings if f.code == "RK101"]


def test_range_and_expand_from_a_shape_are_plumbing_too():
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Gather", ["s", "two"], ["n"], axis=0, name="len"),
             helper.make_node("Range", ["zero", "n", "one"], ["r"], name="positions"),
             helper.make_node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT, name="cast"),
             helper.make_node("Expand", ["rf", "s"], ["e"], name="expand"),
             helper.make_node("Add", ["x", "e"], ["y"], name="add")]
    inits = [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in (("two", 2), ("zero", 0), ("one", 1))]
    m = _model(nodes, [_vi("x", [1, 4, "T"])], [_vi("y", None)], inits)
    found = [f for f in lint(m, {"x": (1, 4, 16)}).findings if f.code == "RK101"]
    assert [f.detail["op"] for f in found] == ["Range", "Expand"]
    assert found[0].nodes == ("shape", "len", "positions")


def test_foreign_op():
    f = only(lint(against_toolkit.fused_matmul()), "RK102")
    assert f.severity == "warning" and f.nodes == ("matmul",) and "CPU" in f.why
    assert not codes(lint(against_toolkit.fused_matmul(foreign=False)))


def test_empty_output_and_its_fix():
    f = only(lint(against_toolkit.empty_output()), "RK103")
    assert f.severity == "error" and f.nodes == ("drop",) and "trim_outputs" in f.fix
    trimmed = graph.trim_outputs(against_toolkit.empty_output())
    assert not codes(lint(trimmed))
    assert list(trimmed.graph.node[0].output) == ["d"]


def test_trim_outputs_names_an_empty_output_before_a_used_one():
    node = helper.make_node("LayerNormalization", ["x", "g", "b"], ["y", "", "rstd"], axis=-1, name="ln")
    m = _model([node], [_vi("x", [1, 8, 32])], [_vi("y", [1, 8, 32])],
                       [_f32("g", np.ones(32)), _f32("b", np.zeros(32))])
    trimmed = graph.trim_outputs(m)
    assert list(trimmed.graph.node[0].output) == ["y", "ln_unused_output_1", "rstd"]
    assert not [f for f in lint(trimmed).findings if f.code == "RK103"]
    x = {"x": np.random.default_rng(0).standard_normal((1, 8, 32)).astype(np.float32)}
    np.testing.assert_array_equal(OrtRunner(m).run(x)[0], OrtRunner(trimmed).run(x)[0])


def test_relshift_chains():
    report = lint(against_toolkit.attention())
    found = [f for f in report.findings if f.code == "RK201"]
    assert [f.severity for f in found] == ["error", "error"]
    assert [f.detail["kind"] for f in found] == ["rel_to_abs", "abs_to_rel"]
    assert "rewrite_relshift" in found[0].fix and "0.4 dB (the reference documents, board, rk3588)" in found[0].why
    assert "mode='banded' applies" in found[0].fix  # the probe's tables are banded (window 4)
    assert not [f for f in lint(relshift.rewrite_relshift(against_toolkit.attention())).findings if f.code == "RK201"]


def test_a_relshift_chain_that_cannot_be_rewritten_says_so():
    m = against_toolkit.attention()
    pad = next(i for i in m.graph.initializer if i.name == "p2")  # the flat tail padded in front: onnxslim's mis-fold
    pad.CopyFrom(numpy_helper.from_array(np.array([0, 0, 5, 0, 0, 0], np.int64), "p2"))
    f = next(f for f in lint(m).findings if f.code == "RK201" and f.detail["kind"] == "rel_to_abs")
    assert not f.detail["verified"] and "cannot be rewritten as is" in f.fix and "rkstudy.graph.fold" in f.fix


def test_sin_on_the_cpu_and_the_polynomial():
    f = only(lint(against_toolkit.snake_sin()), "RK202")
    assert f.severity == "warning" and f.nodes == ("sin",) and "reduce_sin" in f.fix and "41 (350 of 846 ms)" in f.why
    for fold in (True, False):
        rewritten = sine.reduce_sin(against_toolkit.snake_sin(), fold=fold)
        assert "Sin" not in {n.op_type for n in rewritten.graph.node}
        assert not [f for f in lint(rewritten).findings if f.code == "RK202"]
    # the fold's Floor is judged by the op table like any other op
    floor = [f for f in lint(sine.reduce_sin(against_toolkit.snake_sin())).findings if f.code == "RK304"]
    support = opsupport.load()["targets"]["rk3588"]["Floor"]["support"]
    assert [f.detail["key"] for f in floor] == ([] if support == "npu" else ["Floor"])


@pytest.mark.parametrize("degree,floor_db", [(5, 40.0), (7, 70.0)])
def test_reduce_sin_tracks_the_sine_over_many_periods(degree, floor_db):
    from rkstudy.gates import snr_db

    x = (np.random.default_rng(0).standard_normal((1, 8, 32)) * 20).astype(np.float32)
    cos = helper.make_node("Cos", ["x"], ["c"], name="cos")
    m = _model([helper.make_node("Sin", ["x"], ["s"], name="sin"), cos],
                       [_vi("x", [1, 8, 32])], [_vi("s", [1, 8, 32]), _vi("c", [1, 8, 32])])
    s, c = OrtRunner(sine.reduce_sin(m, degree)).run({"x": x})
    assert snr_db(np.sin(x), s) > floor_db and snr_db(np.cos(x), c) > floor_db - 1
    np.testing.assert_allclose(s, sine.evaluate(x.astype(np.float64), degree), atol=1e-4)
    clipped, _ = OrtRunner(sine.reduce_sin(m, degree, fold=False)).run({"x": x})
    np.testing.assert_allclose(clipped, sine.evaluate(x.astype(np.float64), degree, fold=False), atol=1e-4)
    assert snr_db(np.sin(x), clipped) < 10  # most of these arguments lie past ±π: the clip is no sine there
    with pytest.raises(ValueError, match="odd degree"):
        sine.coefficients(4)


def test_resize_mask_upsampler_and_its_rewrite():
    f = only(lint(against_toolkit.mask_upsample()), "RK203")
    assert f.severity == "error" and f.detail["mask"] and "-7.9 dB (the reference documents, board, rk3588)" in f.why
    fixed = decmask.resize_to_convtranspose(against_toolkit.mask_upsample())
    assert [n.op_type for n in fixed.graph.node] == ["ConvTranspose", "Mul"]
    assert not [f for f in lint(fixed).findings if f.code == "RK203"]
    feeds = {"h": np.random.default_rng(0).standard_normal((1, 4, 128)).astype(np.float32),
             "y_mask": (np.arange(16) < 11).astype(np.float32).reshape(1, 1, 16)}
    np.testing.assert_array_equal(OrtRunner(against_toolkit.mask_upsample()).run(feeds)[0],
                                  OrtRunner(fixed).run(feeds)[0])


def test_a_resize_that_is_not_nearest_repetition_is_left_alone():
    m = against_toolkit.mask_upsample()
    mode = next(a for a in m.graph.node[0].attribute if a.name == "coordinate_transformation_mode")
    mode.s = b"align_corners"  # not a repetition of each frame
    assert [n.op_type for n in decmask.resize_to_convtranspose(m).graph.node] == ["Resize", "Mul"]


def test_a_resize_of_features_is_a_warning():
    node = helper.make_node("Resize", ["x", "", "sc"], ["y"], name="up", mode="nearest")
    m = _model([node], [_vi("x", [1, 8, 16])], [_vi("y", [1, 8, 32])],
                       [numpy_helper.from_array(np.array([1, 1, 2], np.float32), "sc")])
    f = only(lint(m), "RK203")
    assert f.severity == "warning" and not f.detail["mask"]


def test_weight_norm():
    f = only(lint(against_toolkit.weight_norm_conv()), "RK204")
    assert f.severity == "warning" and f.detail["constant_input"] and "51 nodes (the reference documents" in f.why
    assert not [f for f in lint(graph.fold(against_toolkit.weight_norm_conv(), {"x": [1, 4, 16]})).findings
                if f.code == "RK204"]
    act = helper.make_node("ReduceL2", ["x"], ["n"], axes=[1], keepdims=1, name="l2")
    div = helper.make_node("Div", ["x", "n"], ["y"], name="div")
    m = _model([act, div], [_vi("x", [1, 8, 32])], [_vi("y", [1, 8, 32])])
    assert only(lint(m), "RK204").severity == "info"


def test_register_field_reports_the_axis_length():
    f = only(lint(against_toolkit.long_conv(8192, channels=4)), "RK301")
    assert f.severity == "warning" and f.detail["axis"] == 8192 and f.nodes == ("conv",)
    assert "800000 lines (the reference documents" in f.why
    assert not codes(lint(against_toolkit.long_conv(8191, channels=4)))
    # through a pinned dynamic input, and a reduction over the long axis
    red = helper.make_node("ReduceSum", ["x", "ax"], ["y"], keepdims=1, name="sum")
    m = _model([red], [_vi("x", [1, 4, "T"])], [_vi("y", None)],
                       [numpy_helper.from_array(np.array([2], np.int64), "ax")])
    found = [f for f in lint(m, {"x": (1, 4, 30720)}).findings if f.code == "RK301"]
    assert [(f.detail["axis"], f.detail.get("reduction", False)) for f in found] == [(30720, False), (30720, True)]


def test_convtranspose_stride_follows_the_measured_table():
    table = opsupport.load()["targets"]["rk3588"]
    for stride in (3, 4):
        key = f"ConvTranspose/stride={stride}"
        found = [f for f in lint(against_toolkit.upsampler(stride)).findings if f.code == "RK302"]
        expected = {"npu": [], "cpu": ["warning"], "fails": ["error"], "inaccurate": ["error"]}[table[key]["support"]]
        assert [f.severity for f in found] == expected, key


def test_clip_with_an_empty_min():
    f = only(lint(against_toolkit.clip(with_min=False)), "RK303")
    assert f.nodes == ("clip",) and f.severity in ("info", "warning", "error")
    assert not codes(lint(against_toolkit.clip(with_min=True)))


def test_op_support_from_the_measured_table():
    table = opsupport.load()["targets"]["rk3588"]
    severity = {"npu": None, "cpu": "warning", "fails": "error", "inaccurate": "error"}
    for op in ("RandomNormalLike", "Atan", "Tanh"):
        found = [f.severity for f in lint(against_toolkit.one_op(op)).findings if f.code == "RK304"]
        assert found == ([severity[table[op]["support"]]] if severity[table[op]["support"]] else []), op
    flip = [f for f in lint(against_toolkit.flip(True)).findings if f.code == "RK304"]
    assert [f.detail["key"] for f in flip] == (["Slice/negative-step"]
                                               if table["Slice/negative-step"]["support"] != "npu" else [])


def test_layer_norm_is_told_apart_by_its_epsilon_attribute():
    """The toolkit's LayerNorm fuse rule reads the epsilon attribute: without it the build fails (the
    one-op probe), with it (as torch writes it, the DiT stand-in's five LayerNorms) it lands on the NPU."""
    f = only(lint(against_toolkit.layer_norm(epsilon_written=False)), "RK304")
    assert f.severity == "error" and f.detail["key"] == "LayerNormalization/no-epsilon" and "epsilon" in f.fix
    assert not [f for f in lint(against_toolkit.layer_norm(epsilon_written=True)).findings if f.code == "RK304"]


def test_expand_is_told_apart_by_the_axis_it_grows():
    """The probes measured a batch-growing Expand on the CPU and a broadcast along channels on the NPU
    (the DiT stand-in's mask broadcast, which the compiler kept on the NPU)."""
    f = only(lint(against_toolkit.expand(batch=True)), "RK304")
    assert f.severity == "warning" and f.detail["key"] == "Expand/batch"
    assert not [f for f in lint(against_toolkit.expand(batch=False)).findings if f.code == "RK304"]


def test_a_reciprocal_written_as_div_is_its_own_key():
    """1 / x (an AdaIN's 1/std in the Kokoro trunk) lands on the CPU; x / y stays on the NPU."""
    one_over = helper.make_node("Div", ["one", "x"], ["y"], name="one_over")
    m = _model([one_over], [_vi("x", [1, 8, 32])], [_vi("y", [1, 8, 32])],
                       [_f32("one", 1.0)])
    f = only(lint(m), "RK304")
    assert f.detail["key"] == "Div/const-numerator" and f.severity == "warning"


def test_the_reciprocal_inside_an_rms_norm_is_not_reported():
    """1 / sqrt(ReduceMean(x^2) + eps): the compiler fuses the RMSNorm pattern on the NPU."""
    nodes = [helper.make_node("Mul", ["x", "x"], ["sq"], name="sq"),
             helper.make_node("ReduceMean", ["sq"], ["ms"], name="mean", axes=[-1], keepdims=1),
             helper.make_node("Add", ["ms", "eps"], ["v"], name="add"),
             helper.make_node("Sqrt", ["v"], ["rms"], name="sqrt"),
             helper.make_node("Div", ["one", "rms"], ["inv"], name="inv"),
             helper.make_node("Mul", ["x", "inv"], ["y"], name="norm")]
    m = _model(nodes, [_vi("x", [1, 8, 32])], [_vi("y", [1, 8, 32])],
                       [_f32("one", 1.0), _f32("eps", 1e-6)])
    assert not [f for f in lint(m).findings if f.code == "RK304" and f.detail.get("key") == "Div/const-numerator"]


def test_an_unprobed_op_is_reported_as_info():
    det = helper.make_node("Det", ["x"], ["d"], name="det")
    m = _model([det], [_vi("x", [2, 4, 4])], [_vi("d", [2])])
    f = only(lint(m), "RK304")
    assert f.severity == "info" and f.detail["keys"] == "Det"


def test_constant_subgraphs_are_not_reported():
    """An op on constants only is folded by the toolkit before any kernel sees it."""
    nodes = [helper.make_node("Atan", ["c"], ["ac"], name="atan_const"),
             helper.make_node("Add", ["x", "ac"], ["y"], name="add")]
    m = _model(nodes, [_vi("x", [1, 8, 32])], [_vi("y", [1, 8, 32])],
                       [numpy_helper.from_array(np.ones((1, 8, 32), np.float32), "c")])
    assert not [f for f in lint(m).findings if f.code == "RK304"]


def test_dynamic_inputs():
    f = only(lint(against_toolkit.dynamic_conv(pinned=False)), "RK401")
    assert f.severity == "error" and f.nodes == ("x",) and "--input x=" in f.fix
    assert not codes(lint(against_toolkit.dynamic_conv(pinned=True)))
    pinned = only(lint(against_toolkit.dynamic_conv(pinned=False), {"x": (1, 4, 16)}), "RK401")
    assert pinned.severity == "info" and "x:1,4,16" in pinned.fix


def test_fp16_range_with_a_sample():
    x = {"x": np.random.default_rng(1).standard_normal((1, 8, 64)).astype(np.float32)}
    f = only(lint(against_toolkit.squared(300.0), sample=x), "RK501")
    assert f.severity == "error" and f.detail["first"] == "square" and f.nodes[0] == "square"
    assert f.detail["largest_max_abs"] > 65504 and f.detail["largest"] == "square"
    assert "612487 abs (the reference documents" in f.why
    clean = lint(against_toolkit.squared(3.0), sample=x)
    assert not [f for f in clean.findings if f.code == "RK501"]
    head = only(clean, "RK502")
    assert head.severity == "info" and head.detail["max_abs"] < 65504
    # without a sample the range rules do not run at all
    assert not [f for f in lint(against_toolkit.squared(300.0)).findings if f.code in ("RK501", "RK502")]


def test_node_maxima_are_in_graph_order_and_exact():
    from rkstudy.lint.rules.fp16_range import node_maxima

    x = np.random.default_rng(1).standard_normal((1, 8, 64)).astype(np.float32)
    rows = node_maxima(against_toolkit.squared(300.0), {"x": x})
    assert [r["node"] for r in rows] == ["scale_up", "square", "scale_down", "sin", "add"]
    assert rows[1]["max_abs"] == pytest.approx(float(np.max((300.0 * x.astype(np.float64)) ** 2)), rel=1e-5)


# --- the table keys and the API ---------------------------------------------------------------------------
def test_every_probe_maps_to_its_own_table_key():
    """The key lint computes for each probe's node is the key the probe was measured under."""
    for p in opsupport.probes():
        v = view(p.make())
        node = next(n for n in v.nodes if n.name == "probe")
        assert variant(v, node) == p.key


def test_the_committed_table_covers_every_probe_on_both_targets():
    table = opsupport.load()
    assert table["toolkit"].startswith("rknn-toolkit2")
    for target in ("rk3588", "rk3566"):
        assert set(table["targets"][target]) == {p.key for p in opsupport.probes()}, target
        assert {r["support"] for r in table["targets"][target].values()} <= {"npu", "cpu", "fails", "inaccurate"}


def test_an_op_row_is_the_simulators_only_when_the_simulator_ran():
    # the committed table records a failed build with a non-finite count of 0: no simulator ran on it
    table = opsupport.load()["targets"]
    rows = {r["key"]: r for r in opsupport.table_rows(table, ["rk3588"])}
    failed, built = rows["RandomNormalLike"], rows["Tanh"]
    assert (failed["status"], failed["where"], failed["simulator_nonfinite"]) == ("failed", "host", None)
    assert (built["where"], built["target"]) == ("simulator", "rk3588") and built["simulator_snr_db"] > 30
    assert len(rows) == len(table["rk3588"])


def test_input_checks_are_usage_errors():
    m = against_toolkit.dynamic_conv(pinned=False)
    with pytest.raises(UsageError, match="no graph input named z; inputs are x"):
        lint(m, {"z": (1, 4, 16)})
    with pytest.raises(UsageError, match="has rank 3"):
        lint(m, {"x": (1, 16)})
    with pytest.raises(UsageError, match="contradicts the graph's fixed dims"):
        lint(m, {"x": (1, 5, 16)})
    with pytest.raises(UsageError, match="--sample x has shape 1x4x8, --input pins 1x4x16"):
        lint(m, {"x": (1, 4, 16)}, sample={"x": np.zeros((1, 4, 8), np.float32)})
    with pytest.raises(UsageError, match="has no array for input"):
        lint(m, sample={})
    with pytest.raises(UsageError, match="no lint rule RK000"):
        lint(m, select=["RK000"])
    with pytest.raises(UsageError, match="--target"):
        lint(m, target="rk9999")


def test_a_sample_pins_a_dynamic_input():
    x = np.zeros((1, 4, 16), np.float32)
    report = lint(against_toolkit.dynamic_conv(pinned=False), sample={"x": x})
    assert report.pinned == {"x": (1, 4, 16)} and report.sampled
    assert only(report, "RK401").severity == "info"


def test_report_json_round_trip():
    report = lint(against_toolkit.snake_sin())
    data = json.loads(json.dumps(report.to_json()))
    assert data["exit_code"] == 0 and data["counts"] == {"error": 0, "warning": 1, "info": 0}
    assert data["findings"][0]["code"] == "RK202" and data["findings"][0]["nodes"] == ["sin"]
    assert report.worst("RK202") == "warning" and report.worst("RK201") == "clean"


# --- the command line: exit 0 / 1 / 2 ------------------------------------------------------------------------
@pytest.fixture
def graphs(tmp_path):
    """Graphs on disk for the CLI: clean, with an error, dynamic, corrupt, empty."""
    paths = {"clean": tmp_path / "clean.onnx", "error": tmp_path / "error.onnx", "dynamic": tmp_path / "dyn.onnx",
             "corrupt": tmp_path / "corrupt.onnx", "empty": tmp_path / "empty.onnx"}
    onnx.save(against_toolkit.one_op("Tanh"), paths["clean"])
    onnx.save(against_toolkit.empty_output(), paths["error"])
    onnx.save(against_toolkit.dynamic_conv(pinned=False), paths["dynamic"])
    paths["corrupt"].write_bytes(paths["clean"].read_bytes()[:40])
    paths["empty"].write_bytes(b"")
    return paths


@pytest.mark.parametrize("args,code", [
    (["{clean}"], 0),
    (["{error}"], 1),
    (["{dynamic}"], 1),
    (["{dynamic}", "--input", "x=1x4x16"], 0),
    (["{missing}"], 2),
    (["{corrupt}"], 2),
    (["{empty}"], 2),
    (["{dynamic}", "--input", "z=1x4x16"], 2),
    (["{dynamic}", "--input", "x=1x4xT"], 2),
    (["{dynamic}", "--input", "x=1x4"], 2),
    (["{dynamic}", "--input", "x=1x4x16", "--input", "x=1x4x8"], 2),
    (["{clean}", "--sample", "{missing}"], 2),
    (["{clean}", "--sample", "{clean}"], 2),
    (["{clean}", "--target", "rk1234"], 2),
])
def test_exit_codes(graphs, tmp_path, capsys, args, code):
    paths = {**{k: str(v) for k, v in graphs.items()}, "missing": str(tmp_path / "nope.onnx")}
    try:
        got = cli.main(["lint", *[a.format(**paths) for a in args]])
    except SystemExit as exc:  # argparse refuses a bad --target itself
        got = exc.code
    assert got == code
    if code == 2:
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and err.startswith(("rkstudy: error:", "rkstudy lint: error:")), err


def test_cli_json_and_sample(graphs, tmp_path, capsys):
    sample = tmp_path / "x.npz"
    np.savez(sample, x=np.random.default_rng(0).standard_normal((1, 8, 32)).astype(np.float32))
    assert cli.main(["lint", str(graphs["clean"]), "--sample", str(sample), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["sampled"] and [f["code"] for f in data["findings"]] == ["RK502"]
    assert cli.main(["lint", str(graphs["error"])]) == 1
    out = capsys.readouterr().out
    assert out.startswith("error.onnx (rk3588): 1 error(s)") and "RK103 error empty-output" in out
    assert "fix: rkstudy.graph.trim_outputs" in out


def test_load_sample_errors(tmp_path):
    from rkstudy.lint import load_sample

    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    with pytest.raises(InputError, match="not a readable .npz"):
        load_sample(bad)


# --- lint against the real compiler (the toolkit builds each graph) --------------------------------------------
@pytest.mark.simulator
@pytest.mark.parametrize("case", against_toolkit.cases(), ids=lambda c: f"{c.code}-{c.graph}")
def test_lint_agrees_with_the_compiler(case):
    """Where the toolkit can show a hazard, lint's verdict matches it; where it cannot, the case says why,
    and then lint flags a graph the compiler passes (never the other way round)."""
    out = against_toolkit.evaluate(case, "rk3588")
    if out.agree:
        return
    assert case.blind, f"{case.graph}: lint said {out.lint_said}, compiler: {out.compiler_did}"
    assert out.lint_flags and not out.compiler_flags, out.row()


@pytest.mark.simulator
def test_fp16_findings_match_the_toolkits_per_layer_report():
    hot = against_toolkit.numerics(next(c for c in against_toolkit.cases() if c.code == "RK501" and c.has_hazard))
    assert hot["first_agrees"] and hot["lint_over_fp16"] == "square"
    assert hot["accuracy_analysis_q_inf"].startswith("square")
    assert hot["sin_single_cos"] > 0.999  # the Sin left on the CPU computes right: its cost is time, not accuracy
    cool = against_toolkit.numerics(next(c for c in against_toolkit.cases() if c.code == "RK501" and not c.has_hazard))
    assert cool["lint_over_fp16"] == "-" and cool["accuracy_analysis_q_inf"] == "-"


def test_lint_study_loops_over_the_family_registry(monkeypatch):
    """Every registered family with a `lint_graphs` hook contributes its graphs, in registry order, and
    a family without one contributes none: adding a family needs no edit in rkstudy.lint."""
    from rkstudy import families, registry
    from rkstudy.lint import study

    hooked = {name for name, f in families.load_all().items() if f.lint_graphs}
    assert hooked == set(families.FAMILIES) - {"port"}  # the port family's graphs are the user's own
    for name, f in families.load_all().items():
        if name not in hooked:
            continue
        module, _, attr = f.lint_graphs.partition(":")
        assert module == f"rkstudy.families.{name}.lint_graphs" and callable(f.resolve("lint_graphs"))

    calls = []
    fake = {"b": families.Family("b", "b", lint_graphs="fake:b"), "a": families.Family("a", "a"),
            "c": families.Family("c", "c", lint_graphs="fake:c")}
    monkeypatch.setattr(registry, "load_all", lambda: fake)
    monkeypatch.setattr(families.Family, "resolve", lambda self, which: lambda quick: calls.append(
        (self.name, quick)) or [study.FamilyGraph(self.name, "raw", f"{self.name} graph", onnx.ModelProto())])
    got = list(study.family_graphs(quick=True))
    assert calls == [("b", True), ("c", True)] and [g.family for g in got] == ["b", "c"]


def test_lint_study_toolchain_graphs_quick_and_full():
    from rkstudy.families.toolchain.lint_graphs import lint_graphs

    quick = [(g.family, g.stage, g.label, len(g.model.graph.node)) for g in lint_graphs(quick=True)]
    assert quick == [("toolchain", "raw", "vocoder_probe", 6),
                     ("toolchain", "rewritten", "vocoder_probe, sine.reduce_sin", 16),
                     ("toolchain", "raw", "long_axis_probe L=8191", 1),
                     ("toolchain", "raw", "long_axis_probe L=32768", 1)]
    full = [g.label for g in lint_graphs(quick=False)]
    assert full[2:] == [f"long_axis_probe L={n}" for n in (4096, 8191, 8192, 12288, 16384, 24576, 32768, 65536)]


def test_lint_study_heavy_families_skip_quick_runs():
    from rkstudy.families.kokoro_generator.lint_graphs import lint_graphs as kokoro
    from rkstudy.families.qwen3_vocoder.lint_graphs import lint_graphs as qwen3

    assert kokoro(quick=True) == [] and qwen3(quick=True) == []


@pytest.mark.parametrize("frames,window", [(5, 8), (12, 8), (8, 8)])
def test_lint_study_first_window_sample(frames, window):
    """A latent's first window, zero-padded past its end, and a mask of 1 over its real frames only."""
    from rkstudy.families.piper_decoder.lint_graphs import first_window_sample

    z = np.arange(2 * frames, dtype=np.float32).reshape(2, frames) + 1
    got = first_window_sample(z, window)
    real = min(frames, window)
    assert got["z"].shape == (1, 2, window) and got["y_mask"].shape == (1, 1, window)
    assert got["z"].dtype == got["y_mask"].dtype == np.float32
    np.testing.assert_array_equal(got["z"][0, :, :real], z[:, :real])
    assert not got["z"][0, :, real:].any()
    assert got["y_mask"].ravel().tolist() == [1.0] * real + [0.0] * (window - real)


def test_placement_builds_one_graph_per_shape_family():
    """Full mode builds each distinct graph once for the placement check: the long-axis probe at every
    length and the encoder at every width are one graph each; a different graph of the same family and
    stage (the Resize mask upsampler beside the ConvTranspose one) is kept."""
    from rkstudy.lint import study

    def fg(family, stage, label):
        return (study.FamilyGraph(family, stage, label, onnx.ModelProto()), None)

    linted = [fg("toolchain", "raw", "vocoder_probe"), fg("toolchain", "raw", "long_axis_probe L=4096"),
              fg("toolchain", "raw", "long_axis_probe L=65536"), fg("piper_encoder", "raw", "folded at width 64"),
              fg("piper_encoder", "raw", "folded at width 192"),
              fg("piper_encoder", "rewritten", "rewritten at width 96"),
              fg("piper_decoder", "rewritten", "produced --dec-mask (ConvTranspose mask upsampler)"),
              fg("piper_decoder", "rewritten", "--dec-mask with a Resize mask upsampler")]
    got = [(g.family, g.label) for g, _ in study.one_per_shape(linted)]
    assert got == [("toolchain", "vocoder_probe"), ("toolchain", "long_axis_probe L=4096"),
                   ("piper_encoder", "folded at width 64"), ("piper_encoder", "rewritten at width 96"),
                   ("piper_decoder", "produced --dec-mask (ConvTranspose mask upsampler)"),
                   ("piper_decoder", "--dec-mask with a Resize mask upsampler")]


def test_linted_family_graphs_are_kept_on_disk_not_in_memory(tmp_path, monkeypatch):
    """lint_family lints each graph as the hook yields it and stores it: the study never holds every family's
    weights at once, and a later step reads the same bytes back."""
    from rkstudy.families.toolchain.lint_graphs import lint_graphs
    from rkstudy.lint import study

    monkeypatch.setenv("RKSTUDY_CACHE", str(tmp_path))
    graphs = lint_graphs(quick=True)
    originals = [g.model.SerializeToString() for g in graphs]
    linted = study.lint_family(iter(graphs))
    assert all(fg.model is None and fg.path.is_file() for fg, _ in linted)
    assert [fg.graph().SerializeToString() for fg, _ in linted] == originals
    assert [r["nodes"] for r in study.summary_rows(linted)] == [len(onnx.load_from_string(b).graph.node)
                                                                 for b in originals]


def test_the_exit_code_table_names_files_never_the_runs_temporary_folder(tmp_path):
    """rkstudy lint run as a command in the study's scratch folder on the files' own names: the first
    line it prints is the same every run (a temporary folder's name differs every run)."""
    from types import SimpleNamespace

    from onnx import TensorProto, helper

    from rkstudy.lint import study as lint_study

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "toy", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    toy = SimpleNamespace(family="toy", label="one Relu", model=model, graph=lambda: model, inputs={}, sample=None)
    workdir = tmp_path / "rkstudy-lint-abc123"
    workdir.mkdir()
    rows = lint_study.cli_exit_codes([(toy, SimpleNamespace(exit_code=0))], workdir)
    assert [r["exit_code"] for r in rows] == [0, 2, 2, 2] and all(r["agrees"] for r in rows)
    corrupt = next(r for r in rows if r["graph"] == "corrupt copy of the first graph")
    assert corrupt["first_line"].startswith("rkstudy: error: corrupt.onnx is not a readable ONNX model")
    assert not any(str(tmp_path) in r["first_line"] or "rkstudy-lint-" in r["first_line"] for r in rows)
