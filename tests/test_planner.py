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


def test_a_decoder_with_two_walked_inputs_and_global_statistics():
    """Kokoro's shape: an opaque latent (x and a per-frame conditioning), a normalization over the whole
    input (every frame reaches every other), and a frozen-statistics variant (only the conv's reach)."""
    from dataclasses import dataclass, replace

    @dataclass
    class Lat:
        x: np.ndarray            # [C, N]
        cond: np.ndarray         # [N]
        origin: np.ndarray | None = None  # the unperturbed x, for the frozen statistics

    def trunk(x, stats_from):
        pad = np.pad(x, ((0, 0), (1, 1)))
        y = pad[:, :-2] + 2 * pad[:, 1:-1] + pad[:, 2:]              # a kernel-3 conv: 1 frame each side
        ref = np.pad(stats_from, ((0, 0), (1, 1)))
        mu = (ref[:, :-2] + 2 * ref[:, 1:-1] + ref[:, 2:]).mean()    # the statistic, over the whole input
        return np.repeat((y - mu).sum(axis=0), 2)                    # hop 2

    decode = lambda lat: trunk(lat.x, lat.x) + np.repeat(lat.cond, 2)
    frozen = lambda lat: trunk(lat.x, lat.x if lat.origin is None else lat.origin) + np.repeat(lat.cond, 2)

    def perturb(lat, k, rng):
        x = lat.x.copy()
        x[:, k] = rng.standard_normal(x.shape[0])
        return replace(lat, x=x, origin=lat.x)

    def walk(lat, emit, context):
        n = lat.x.shape[1]
        out = np.zeros(2 * n)
        for w in planner.plan_windows(n, emit, context):
            part = Lat(lat.x[:, w.start:w.start + w.real], lat.cond[w.start:w.start + w.real])
            emitted = decode(part)[2 * w.offset: 2 * (w.offset + w.emit_stop - w.emit_start)]
            out[2 * w.emit_start: 2 * w.emit_stop] = emitted
        return out

    rng = np.random.default_rng(3)
    lat = Lat(rng.standard_normal((3, 80)), rng.standard_normal(80))
    pt = planner.PlanTarget(family="toy", hop=2, decode=decode, engine=lambda w: w, latents=[lat], default_emit=20,
                            default_context=4, walk=walk, perturb=perturb, n_frames=lambda lat: lat.x.shape[1],
                            noise_like=lambda lats, seed: [replace(v, x=np.random.default_rng(seed).standard_normal(
                                v.x.shape)) for v in lats], contexts=[0, 4], variants={"frozen statistics": frozen})

    class Clean(SimpleNamespace):  # every window builds with 0 REGTASK lines
        def raise_for_status(self):
            return self

    tables = planner.plan(pt, ["rk3588"], [60.0], max_window=30, build=lambda path, target: Clean(
        ok=True, regtask=0, regtask_max=0, status="ok", engine_bytes=1000))
    rf = {r["decode"]: r for r in tables["receptive_field"]}
    assert planner.receptive_field_rows(pt) == tables["receptive_field"]  # the notebooks' quick-mode rows
    assert (rf["as compiled"]["left_frames"], rf["as compiled"]["right_frames"]) == (60, 59)  # the whole latent
    assert (rf["frozen statistics"]["left_frames"], rf["frozen statistics"]["right_frames"]) == (1, 1)
    assert rf["as compiled"]["latent_frames"] == 80
    snr = {(r["latents"], r["context"]): r["worst_interior_snr_db"] for r in tables["context_sweep"]}
    assert snr[("speech", 4)] < 40  # per-window statistics: no context makes a window exact
    (row,) = tables["plan"]
    assert row["min_context_speech"] is None and row["emit"] is None and row["largest_clean_window"] == 30
