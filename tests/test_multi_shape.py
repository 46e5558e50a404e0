"""Multi-shape engines (rknn-toolkit2's config(dynamic_input=...)): one engine, several input shape sets.
The contract records the sets, and every place an engine runs (the contract's runner check, the board
runner, the replay double of RKNNLite, the simulator) refuses a shape outside them in one line."""

import hashlib
import json
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from rkstudy import contract as contracts
from rkstudy.contract import Contract, Digest, Tensor
from rkstudy.errors import EngineMismatch, UsageError
from rkstudy.families.piper_encoder.study import ladder_graph
from rkstudy.paths import REPO
from rkstudy.toolkit.build import shape_sets_for

FIXTURES = REPO / "tests" / "fixtures"
SOURCE = Digest(file="model.onnx", sha256="0" * 64)


def conv_contract(widths=(64, 32)) -> Contract:
    """A [1, 4, T] -> [1, 4, T] stage with its real length beside it, compiled at `widths` (largest first)."""
    c = Contract(family="toolchain", stage="probe", source=SOURCE, producer="rkstudy toolchain --help",
                 inputs=(Tensor("x", (1, 4, widths[0]), role="padded", axis=2),
                         Tensor("n", (1,), dtype="int64", role="length")),
                 outputs=(Tensor("y", (1, 4, widths[0]), role="padded", axis=2),))
    return c.with_shapes([((1, 4, w), (1,)) for w in widths]) if len(widths) > 1 else c


def test_the_shape_sets_round_trip_through_the_contract_json():
    c = conv_contract()
    assert c.shape_sets == [((1, 4, 64), (1,)), ((1, 4, 32), (1,))]
    back = contracts.from_json(c.to_json(), where="test")
    assert back == c and back.shapes == (((1, 4, 64), (1,)), ((1, 4, 32), (1,)))
    assert json.loads(c.to_json())["shapes"] == [[[1, 4, 64], [1]], [[1, 4, 32], [1]]]


def test_a_single_shape_contract_keeps_its_bytes():
    """No `shapes` key unless multi-shape: the contract in every produced ONNX (and so its cache key) is unchanged."""
    c = conv_contract((64,))
    assert "shapes" not in c.to_dict() and c.shape_sets == [((1, 4, 64), (1,))]
    assert contracts.from_json(c.to_json(), where="test") == c


@pytest.mark.parametrize("sets, says", [
    ([[[1, 4, 64], [1]]], "not a list of two or more input shape sets"),
    ([[[1, 4, 64], [1]], [[1, 4, 32]]], "shape set 1 is not one shape for each of the 2 inputs"),
    ([[[1, 4, 64], [1]], [[1, 32], [1]]], "shape set 1 gives x [1, 32], not a shape of rank 3"),
    ([[[1, 4, 64], [1]], [[1, 4, 64], [1]]], "lists one input shape set twice"),
    ([[[1, 4, 32], [1]], [[1, 4, 64], [1]]], "first shape set ((1, 4, 32), (1,)) is not its inputs' shapes"),
    ([[[1, 4, 64], [1]], [[1, 4, 0], [1]]], "shape set 1 (x) entry is 0"),
])
def test_a_malformed_shape_list_is_refused_at_load(sets, says):
    d = {**json.loads(conv_contract((64,)).to_json()), "shapes": sets}
    with pytest.raises(EngineMismatch, match="make a matching one with") as err:
        contracts.from_dict(d)
    assert says in str(err.value)


class FakeRunner:
    input_names = ["x", "n"]

    def __init__(self, sets):
        self.shape_sets = sets
        self.shapes = sets[0]


def test_check_runner_refuses_a_runner_at_a_shape_the_contract_does_not_list():
    c = conv_contract()
    c.check_runner(FakeRunner([{"x": [1, 4, 64], "n": [1]}, {"x": [1, 4, 32], "n": [1]}]))
    c.check_runner(FakeRunner([{"x": [1, 4, 32], "n": [1]}]))  # a runner at one of the sets
    with pytest.raises(EngineMismatch) as err:
        c.check_runner(FakeRunner([{"x": [1, 4, 64], "n": [1]}, {"x": [1, 4, 48], "n": [1]}]))
    assert str(err.value) == ("inputs x, n of shapes (1, 4, 48), (1,) are not one of the shape sets this engine was "
                              "compiled for ((1, 4, 64), (1,) | (1, 4, 32), (1,)); pad to one of them or build the "
                              "engine with this set too")
    assert "\n" not in str(err.value)
    with pytest.raises(EngineMismatch, match=r"of shapes \(1, 4, 16\), \(1,\) are not one"):
        c.check_shapes([(1, 4, 16), (1,)])


def test_shape_sets_for_orders_largest_first_and_refuses_what_cannot_be_one_engine():
    assert shape_sets_for([{"x": [1, 4, 32]}, {"x": [1, 4, 64]}]) == [{"x": [1, 4, 64]}, {"x": [1, 4, 32]}]
    # in the graph's input order, whatever order each set was written in: the toolkit reads them by position
    got = shape_sets_for([{"n": [1], "x": [1, 4, 32]}, {"x": [1, 4, 64], "n": [1]}], ["x", "n"])
    assert [list(s.items()) for s in got] == [[("x", [1, 4, 64]), ("n", [1])], [("x", [1, 4, 32]), ("n", [1])]]
    with pytest.raises(UsageError, match="two or more distinct"):
        shape_sets_for([{"x": [1, 4, 32]}, {"x": [1, 4, 32]}])
    with pytest.raises(UsageError, match="give every input a shape in every set"):
        shape_sets_for([{"x": [1, 4, 32], "n": [1]}, {"x": [1, 4, 64]}])
    with pytest.raises(UsageError, match="does not keep each input's rank"):
        shape_sets_for([{"x": [1, 4, 32]}, {"x": [4, 64]}])


# --- the board runner and the replay double --------------------------------------------------------
def forget_rknnlite():
    for name in [m for m in sys.modules if m == "rknnlite" or m.startswith("rknnlite.")]:
        del sys.modules[name]


@pytest.fixture
def multi_shape_engine(monkeypatch, tmp_path):
    """A stand-in engine the double serves: a Neg over [1, 4, T] (T dynamic in the ONNX), its contract
    listing T = 64 and 32, on the recorded RK3588 tree whose librknnrt runs the toolkit's engines."""
    monkeypatch.syspath_prepend(str(REPO / "tests" / "doubles"))
    forget_rknnlite()
    monkeypatch.setenv("RKSTUDY_SYSROOT", str(FIXTURES / "boards" / "rk3588-librknnrt-2.5.0"))
    g = helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, "T"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, "T"])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "neg.onnx"))
    (tmp_path / "neg.rknn").write_bytes(b"engine")
    c = Contract(family="toolchain", stage="probe", source=SOURCE, producer="rkstudy toolchain --help",
                 inputs=(Tensor("x", (1, 4, 64), role="padded", axis=2),),
                 outputs=(Tensor("y", (1, 4, 64), role="padded", axis=2),)).with_shapes([((1, 4, 64),), ((1, 4, 32),)])
    c.compiled(target="rk3588", toolkit="rknn-toolkit2 2.5.0", onnx_path=tmp_path / "neg.onnx",
               engine_path=tmp_path / "neg.rknn").write_beside(tmp_path / "neg.rknn")
    assert hashlib.sha256((tmp_path / "neg.onnx").read_bytes()).hexdigest()  # the double checks the digest
    yield tmp_path / "neg.rknn"
    forget_rknnlite()


def test_the_board_runner_runs_each_listed_shape_and_refuses_another(multi_shape_engine):
    from rkstudy.board.runner import BoardRunner

    c = contracts.for_engine(multi_shape_engine)
    runner = BoardRunner(multi_shape_engine, c.input_names, shape_sets=c.shape_sets)
    try:
        c.check_runner(runner)
        for width in (64, 32):
            x = np.arange(4 * width, dtype=np.float32).reshape(1, 4, width)
            (y,) = runner.run([x])
            np.testing.assert_array_equal(y, -x)
        with pytest.raises(EngineMismatch, match=r"inputs x of shapes \(1, 4, 48\) are not one of the shape sets "
                                                 r"this engine was compiled for \(\(1, 4, 64\) \| \(1, 4, 32\)\)"):
            runner.run([np.zeros((1, 4, 48), np.float32)])
    finally:
        runner.close()


def test_the_double_refuses_an_unlisted_shape_as_rknnlite_does(multi_shape_engine, capfd):
    """set_inputs fails inside the runtime: logged with its traceback, and inference returns None."""
    from rknnlite.api import RKNNLite

    lite = RKNNLite()
    assert lite.load_rknn(str(multi_shape_engine)) == 0 and lite.init_runtime() == 0
    assert lite.inference(inputs=[np.ones((1, 4, 32), np.float32)])[0].shape == (1, 4, 32)
    capfd.readouterr()
    assert lite.inference(inputs=[np.ones((1, 4, 48), np.float32)]) is None
    log = capfd.readouterr().err
    assert "E Catch exception when setting inputs." in log
    assert "Exception: Set input shape failed. error code: RKNN_ERR_INPUT_INVALID" in log
    lite.release()


# --- one real build --------------------------------------------------------------------------------
@pytest.mark.simulator
def test_one_build_runs_at_both_shapes_in_the_simulator(tmp_path):
    """A Conv1d graph compiled once for T = 32 and 16: exact output shapes at each, fp32-close values, and
    a third T refused before the toolkit sees it."""
    from rkstudy.runtime import OrtRunner
    from rkstudy.toolkit.simulator import SimulatorRunner

    rng = np.random.default_rng(0)
    w = helper.make_tensor("w", TensorProto.FLOAT, [6, 4, 3], rng.normal(0, 0.3, 72).astype(np.float32).ravel())
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1])], "conv",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, "T"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, "T"])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "conv.onnx"))
    sets = [{"x": [1, 4, 16]}, {"x": [1, 4, 32]}]
    with SimulatorRunner(tmp_path / "conv.onnx", "rk3588", shape_sets=sets, out=tmp_path / "conv.rknn") as sim:
        assert sim.report.ok and sim.report.shape_sets == [{"x": [1, 4, 32]}, {"x": [1, 4, 16]}]
        for t in (16, 32):
            x = rng.normal(size=(1, 4, t)).astype(np.float32)
            (y,) = sim.run([x])
            (ref,) = OrtRunner(tmp_path / "conv.onnx").run([x])
            assert y.shape == (1, 6, t)
            np.testing.assert_allclose(y, ref, atol=0.02)
        with pytest.raises(EngineMismatch, match=r"of shapes \(1, 4, 24\) are not one of the shape sets"):
            sim.run([np.zeros((1, 4, 24), np.float32)])


# --- the encoder ladder and the choice ---------------------------------------------------------------
class EchoRunner:
    """Stats and cond of the fed width, filled with it, so a test sees which width ran."""

    def __init__(self):
        self.widths = []

    def run(self, feed):
        w = feed["input"].shape[1]
        self.widths.append(w)
        return [np.full((1, 4, w), float(w), np.float32), np.full((1, 2, w), float(w), np.float32)]


def encoder_engine(widths):
    from rkstudy.families.piper_encoder.producer import encoder_contract
    from rkstudy.families.piper_encoder.sidecar import LadderEngine

    c = encoder_contract(frames=max(widths), stats=4, cond=2, n_vocab=10, source=SOURCE,
                         producer="rkstudy piper encoder --voice-onnx v.onnx --frames 64")
    if len(widths) > 1:
        c = c.with_shapes([((1, w), (1,)) for w in sorted(widths, reverse=True)])
    return LadderEngine(EchoRunner(), c)


def test_a_multi_shape_engine_is_the_ladder_rung_of_each_of_its_widths():
    from rkstudy.families.piper_encoder.sidecar import Ladder

    multi, wide = encoder_engine((32, 64)), encoder_engine((128,))
    ladder = Ladder([wide, multi])
    assert ladder.widths == [32, 64, 128] and multi.widths == [32, 64]
    for tokens, where in ((20, "n32"), (50, "n64"), (100, "n128")):
        stats, cond, ran = ladder.run(list(range(tokens)))
        assert ran == where and stats.shape == (1, 4, tokens) and cond.shape == (1, 2, tokens)
    assert multi.runner.widths == [32, 64] and wide.runner.widths == [128]
    with pytest.raises(EngineMismatch, match=r"two engines share a width in \[32, 64, 64\]"):
        Ladder([multi, encoder_engine((64,))])


def measured(**over):
    """A summary row as rkstudy.levers.multi_shape.summary makes it (the quick conv stack's numbers)."""
    row = {"multi_status": "ok", "multi_error": "", "multi_engine_bytes": 240_805, "single_engines": 2,
           "single_total_bytes": 406_602, "multi_worst_snr_db": 64.23, "single_worst_snr_db": 64.23}
    return {**row, **over}


def test_the_ladder_form_follows_the_measured_row():
    from rkstudy.levers import multi_shape as ms

    assert ms.choose(measured()) == (ms.MULTI, "59% of the bytes of 2 engines at worst-width SNR 64.23 dB "
                                               "(theirs 64.23 dB)")
    assert ms.prefer_multi_shape(measured()) and not ms.prefer_multi_shape(None)
    failed = measured(multi_status="failed", multi_error="KeyError: '/enc_p/Mul_1_output_0-rs'")
    assert ms.choose(failed) == (ms.SINGLE, "the multi-shape build failed: KeyError: '/enc_p/Mul_1_output_0-rs'")
    assert ms.choose(measured(multi_worst_snr_db=63.0))[0] == ms.SINGLE  # 1.23 dB lost
    assert ms.choose(measured(multi_worst_snr_db=63.5))[0] == ms.MULTI  # 0.73 dB: within the tolerance
    assert ms.choose(measured(multi_engine_bytes=406_602)) == (ms.SINGLE, "406602 B is not smaller than 406602 B")
    assert ms.choose(measured(multi_worst_snr_db="")) == (ms.SINGLE, "a width has no simulator SNR to compare")


@pytest.mark.simulator
def test_convert_writes_a_contract_that_lists_the_shape_sets(tmp_path):
    """Stage 2 with shape_sets: one engine, probed at the contract's own shapes, whose contract beside it
    lists every set, and loads back through for_engine."""
    from rkstudy import graph
    from rkstudy.toolkit.convert import convert

    g = helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "neg",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, "T"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, "T"])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    c = Contract(family="toolchain", stage="probe", source=SOURCE, producer="rkstudy toolchain --help",
                 inputs=(Tensor("x", (1, 4, 32), role="padded", axis=2),),
                 outputs=(Tensor("y", (1, 4, 32), role="padded", axis=2),))
    onnx.save(graph.with_metadata(m, **{contracts.METADATA_KEY: c.to_json()}), str(tmp_path / "neg.onnx"))
    done = convert(tmp_path / "neg.onnx", "rk3588", tmp_path / "neg.rknn",
                   shape_sets=[{"x": [1, 4, 16]}, {"x": [1, 4, 32]}])
    back = contracts.for_engine(tmp_path / "neg.rknn")
    assert back == done.contract and back.shape_sets == [((1, 4, 32),), ((1, 4, 16),)]
    assert back.target == "rk3588" and done.simulated.rows[0]["snr_db"] > 60


def test_the_committed_row_is_read_back_with_its_numbers(tmp_path):
    from rkstudy.levers import multi_shape as ms
    from rkstudy.tables import results

    rows = [{"graph": "conv stack", "widths": "32,16", **measured(), "choice": ms.MULTI, "why": "",
             "where": "host", "target": "rk3588"},
            {"graph": ladder_graph("gather"), "widths": "192,128", **measured(multi_status="failed"),
             "choice": ms.SINGLE, "why": "", "where": "host", "target": "rk3588"}]
    results.write_table("toolkit_levers", "multi_shape", [results.stamp(r) for r in rows], root=tmp_path,
                        title="test")
    back = ms.measured("conv stack", root=tmp_path)
    assert back["multi_engine_bytes"] == 240_805 and back["widths"] == "32,16" and ms.prefer_multi_shape(back)
    assert not ms.prefer_multi_shape(ms.measured(ladder_graph("gather"), root=tmp_path))
    assert ms.measured("no such graph", root=tmp_path) is None
    assert ms.measured("conv stack", root=tmp_path / "x") is None


def test_a_multi_shape_build_log_has_one_memory_plan_per_shape_set():
    """As rknn-toolkit2 2.5.0 printed them for the conv stack compiled for T = 256 and 64 (verbose)."""
    from rkstudy.toolkit.log import MemoryPlan, memory_plan, memory_plans

    log = ("D RKNN: [23:49:12.402] Total Internal Memory Size: 96KB\n"
           "D RKNN: [23:49:12.402] Total Weight Memory Size: 162.125KB\n"
           "D RKNN: [23:49:12.427] Total Internal Memory Size: 24KB\n"
           "D RKNN: [23:49:12.427] Total Weight Memory Size: 162.125KB\n")
    assert memory_plans(log) == [MemoryPlan(98_304, 166_016), MemoryPlan(24_576, 166_016)]
    assert memory_plans(log)[1] == memory_plan(log)  # the single-plan reader keeps the last
