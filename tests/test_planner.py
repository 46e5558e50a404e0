"""The window planner on graphs whose answers are known."""

from types import SimpleNamespace

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from rkstudy import planner
from rkstudy.runtime import OrtRunner


def conv_chain(kernels=(3, 5), channels=4, seed=0) -> OrtRunner:
    """x [1,C,T] -> Conv(k) ... (same padding): a receptive field of sum((k-1)/2) frames each side."""
    rng = np.random.default_rng(seed)
    nodes, inits, prev = [], [], "x"
    for i, k in enumerate(kernels):
        w = numpy_helper.from_array(rng.standard_normal((channels, channels, k)).astype(np.float32), f"w{i}")
        inits.append(w)
        nodes.append(helper.make_node("Conv", [prev, f"w{i}"], [f"h{i}"], pads=[k // 2, k // 2]))
        nodes.append(helper.make_node("Tanh", [f"h{i}"], [f"t{i}"]))
        prev = f"t{i}"
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, "T"])],
                          [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, channels, "T"])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return OrtRunner(m)


def decode_with(runner):
    return lambda z: runner.run({"x": z[None]})[0][0].reshape(-1, order="F")  # [C, T] -> frame-major samples


def test_receptive_field_of_a_known_conv_chain():
    z = np.random.default_rng(1).standard_normal((4, 60)).astype(np.float32)
    rf = planner.receptive_field(decode_with(conv_chain((3, 5))), z, hop=4)
    assert (rf["left_frames"], rf["right_frames"]) == (3, 3)  # 1 + 2 frames each side


def test_context_at_the_receptive_field_is_exact_and_less_is_not():
    runner = conv_chain((3, 5))
    z = [np.random.default_rng(2).standard_normal((4, 90)).astype(np.float32)]
    rows = planner.context_sweep(decode_with(runner), z, hop=4, contexts=[1, 2, 3, 4], emit=10, kind="speech")
    snr = {r["context"]: r["worst_interior_snr_db"] for r in rows}
    assert snr[3] == np.inf and snr[4] == np.inf and snr[1] < 40
    assert planner.min_context(rows, 100.0) == 3
    assert planner.min_context(rows, 1000.0) == 3  # inf reaches any target
    assert planner.min_context(rows, 100.0, kind="white noise") is None


def test_bisection_finds_the_largest_window_within_the_budget():
    def build(window):  # REGTASK lines grow with the window: clean up to 131 frames
        return SimpleNamespace(ok=True, regtask=18 if window <= 131 else 18 + window - 131, regtask_max=16352,
                               status="ok", engine_bytes=window * 1000)

    w, rows = planner.largest_clean_window(lambda w: w, "rk3588", (18, 16352), 93, 256, build=build)
    assert w == 131
    assert len(rows) <= 10 and all(r["within_budget"] == (r["window"] <= 131) for r in rows)
    assert planner.largest_clean_window(lambda w: w, "rk3588", (0, 0), 93, 256, build=build)[0] is None


def test_the_plan_is_emit_from_window_and_context():
    sweep = [{"latents": k, "context": c, "worst_interior_snr_db": s}
             for k, c, s in (("speech", 16, 35.0), ("speech", 20, 67.0), ("speech", 24, 85.0),
                             ("white noise", 16, 20.0), ("white noise", 20, 30.0), ("white noise", 24, 42.0))]
    (row,) = planner.plan_rows({"rk3588": 93}, sweep, [60.0])
    assert (row["min_context_speech"], row["emit"], row["min_context_white_noise"]) == (20, 53, None)
    assert row["compute_ratio"] == 53 / 93
