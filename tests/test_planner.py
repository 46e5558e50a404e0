"""The window planner on graphs whose answers are known."""

from types import SimpleNamespace

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkstudy.runtime import OrtRunner
from rkstudy.walk import planner
from rkstudy.walk.window import interior_windows, plan_windows


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


class Logged(SimpleNamespace):
    """A build report with the REGTASK numbers a model of the compiler gives."""

    def raise_for_status(self):
        return self


def logged(lines: int, value: int) -> Logged:
    return Logged(ok=True, regtask=lines, regtask_max=value, status="ok", engine_bytes=1000)


# Models of what rknn-toolkit2 2.5.0 logged for the real engines (results/*/window_plan_candidates.csv):
# the Piper decoder on rk3588 is a staircase (field value 8176 x floor(window / 32), 6 lines a step),
# on rk3566 a line (value ~255.5 x window); Kokoro's generator on rk3588 logs nothing up to 134 frames,
# then value 60 x window + 149 (its longest axis) on ~120 lines a frame.
def piper_rk3588(w):
    return logged(6 * (w // 32) + 6, 8176 * (w // 32))


def piper_rk3566(w):
    return logged(355 + 6 * (w - 93), round(255.4 * w))


def kokoro_rk3588(w):
    value = 60 * w + 149
    return logged(120 * w + 290, value) if value > 8191 else logged(0, 0)


def bisected(model, budget, lo, hi):
    """The answer of a plain bisection (lo clean, hi not) and the windows it builds besides lo."""
    ok = lambda w: planner.within(model(w), budget)  # noqa: E731
    builds = 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
        builds += 1
    return lo, builds


@pytest.mark.parametrize("model, budget, lo, hi, widest, builds", [
    (piper_rk3588, (18, 16352), 93, 192, 95, 4),    # two rounds of a pair: 94 + 95, 96 + 97
    (piper_rk3566, (355, 23752), 93, 192, 93, 2),   # one pair: 94 + 95
    (kokoro_rk3588, (0, 0), 128, 136, 134, 4),      # steps 129, 131, 135, then the fit's 134
])
def test_the_predicted_window_is_the_bisection_answer_in_fewer_builds(model, budget, lo, hi, widest, builds):
    built = []
    search = planner.largest_clean_window(lambda w: w, "rk3588", budget, lo, hi,
                                          build=lambda w: built.append(w) or model(w), known={lo: model(lo)})
    assert (search.window, len(built)) == (widest, builds)
    assert bisected(model, budget, lo, hi) == (widest, {95: 8, 93: 7, 134: 4}[widest])
    assert widest + 1 in built
    assert search.confirmed_by == f"{widest} within, {widest + 1} over"
    measured = [r for r in search.rows if r["source"] != "predicted"]
    assert all(r["within_budget"] == (r["window"] <= widest) for r in measured)
    assert sorted(r["window"] for r in measured) == sorted({lo, *built})


def test_known_builds_are_fitted_before_anything_is_built():
    """Kokoro on rk3588 with the sweep's 136 and 160 builds: the line through them predicts 134, and the
    only builds are the confirmation, 134 within and 135 over."""
    built = []
    known = {w: kokoro_rk3588(w) for w in (128, 136)}
    search = planner.largest_clean_window(lambda w: w, "rk3588", (0, 0), 128, 136,
                                          build=lambda w: built.append(w) or kokoro_rk3588(w), known=known)
    assert (search.window, sorted(built), search.confirmed_by) == (134, [134, 135], "134 within, 135 over")
    (predicted, *_) = [r for r in search.rows if r["source"] == "predicted"]
    assert (predicted["window"], predicted["fitted_on"], predicted["predicted_regtask_max_value"]) == (134, "136", 8187)
    assert predicted["regtask"] is None and [r["source"] for r in search.rows if r["window"] == 136] == ["known"]


def test_a_staircase_falls_back_to_steps_and_still_finds_the_bisection_answer():
    def stairs(w):  # flat over 64 frames, then a jump: every fit through one step predicts that step
        return logged(10 + 10 * (w // 64), 100 * (w // 64))

    built = []
    search = planner.largest_clean_window(lambda w: w, "rk3588", (10, 0), 10, 500,
                                          build=lambda w: built.append(w) or stairs(w))
    assert (search.window, bisected(stairs, (10, 0), 10, 500)) == (63, (63, 10))
    # 11 for bisection with its lo: the lo build, two missed predictions (a pair each), six steps up
    # from 14 to 77, then five bisection steps
    assert len(built) == 16


def test_the_search_refuses_a_budget_its_narrowest_window_breaks():
    search = planner.largest_clean_window(lambda w: w, "rk3588", (0, 0), 93, 256, build=piper_rk3588, floor=93)
    assert (search.window, search.confirmed_by) == (None, "93 over")
    below = planner.largest_clean_window(lambda w: w, "rk3588", (0, 0), 93, 256, build=piper_rk3588, floor=40)
    assert (below.window, below.confirmed_by) == (None, "40 over")


def kokoro_rk3566(w):
    """What 2.5.0 logs for the Kokoro generator on rk3566: 176 lines at every width, their largest value
    (60 x window + 1) under the limit, so no narrower window clears them."""
    return logged(176, 60 * w + 1)


def test_lines_that_do_not_shrink_with_the_window_cost_the_fits_pair_and_the_floors():
    """The fit through the field value predicts 127 within; 127 logs the same 176 lines, so the search goes to
    the floor, whose pair is over: no window is within, after three builds (halving from 127 to the floor
    built a pair per halving, thirteen in all)."""
    built = []
    search = planner.largest_clean_window(lambda w: w, "rk3566", planner.CLEAN, 128, 136, floor=57,
                                          build=lambda w: built.append(w) or kokoro_rk3566(w),
                                          known={128: kokoro_rk3566(128)})
    assert (search.window, search.confirmed_by) == (None, "57 over")
    assert built == [127, 57, 58]


def piper_rk3588_clean_below(w):
    """The same staircase as the compiler logs it: no line while the field value stays within 8,191."""
    value = 8176 * (w // 32)
    return logged(6 * (w // 32) + 6, value) if value > 8191 else logged(0, 0)


def test_a_clean_budget_searches_down_from_a_window_that_is_not_clean():
    """Today's 93-frame window logs 18 lines on rk3588 (rknn-toolkit2 2.5.0): clean is below it. The line
    through the origin and 93's field value predicts 46, under the floor (the narrowest window with a frame
    to emit), so the floor's pair builds first, clean; the search goes on up (the fit misses twice on the
    staircase, then bisects) and ends on the staircase's edge, confirmed by a pair as upward searches are."""
    built = []
    search = planner.largest_clean_window(lambda w: w, "rk3588", planner.CLEAN, 93, 192, floor=49,
                                          build=lambda w: built.append(w) or piper_rk3588_clean_below(w))
    assert (search.window, search.confirmed_by) == (63, "63 within, 64 over")
    assert built == [93, 49, 50, 51, 52, 53, 54, 73, 63, 68, 65, 64]
    (first, *_) = [r for r in search.rows if r["source"] == "predicted"]
    assert (first["window"], first["predicted_regtask_max_value"]) == (49, 8616)   # 16352 / 93 x 49
    assert all(r["budget"].startswith("clean: no REGTASK line") for r in search.rows)
    assert all(r["within_budget"] == (r["window"] <= 63) for r in search.rows if r["source"] == "built")


def test_a_flat_budget_reaches_the_widest_window_searched():
    search = planner.largest_clean_window(lambda w: w, "rk3588", (18, 16352), 93, 96, build=lambda w: logged(18, 16352))
    assert (search.window, search.confirmed_by) == (96, "96 within (the widest searched)")


def test_interior_snr_scores_the_interior_windows_of_the_walk_only():
    """The planner and notebook 01 score the same set: a latent whose only error is in its start
    window scores inf; one whose error is in an interior window does not."""
    hop, n, emit, context = 2, 200, 20, 5
    ref = np.arange(n * hop, dtype=np.float64)

    def decode_with_error(frame):
        def decode(z):  # z holds its frame indices; a window (not the full decode) errs at `frame`
            start = int(z[0, 0])
            out = ref[start * hop:(start + z.shape[1]) * hop].copy()
            if start <= frame < start + z.shape[1] and z.shape[1] < n:
                out[(frame - start) * hop] += 1.0
            return out
        return decode

    z = np.arange(n, dtype=np.float64)[None]
    kinds = [w.kind(n, emit + 2 * context) for w in plan_windows(n, emit, context)]
    assert kinds == ["start"] + ["interior"] * 8 + ["end"]
    assert planner.worst_interior_snr(decode_with_error(3), [z], hop, emit, context) == np.inf
    assert planner.worst_interior_snr(decode_with_error(50), [z], hop, emit, context) < 100


def test_no_interior_window_is_not_measured_and_meets_no_target():
    """A latent too short for an interior window at a context (the instance-norm graph's plan did this:
    every window a start or an end one) is no evidence: the sweep says None there, and min_context finds
    no context for any target instead of the first one swept."""
    hop, n = 2, 40
    z = np.zeros((1, n))
    assert not interior_windows(n, 16, 12)
    assert planner.worst_interior_snr(lambda z: np.zeros(z.shape[1] * hop), [z], hop, 16, 12) is None
    sweep = [{"latents": "speech", "context": c, "worst_interior_snr_db": None} for c in (8, 12, 16)]
    assert planner.min_context(sweep, 60.0) is None
    sweep[0]["worst_interior_snr_db"] = 80.0   # measured at 8 only: the larger contexts still say nothing
    assert planner.min_context(sweep, 60.0) is None


def test_the_plan_is_emit_from_window_and_context():
    sweep = [{"latents": k, "context": c, "worst_interior_snr_db": s}
             for k, c, s in (("speech", 16, 35.0), ("speech", 20, 67.0), ("speech", 24, 85.0),
                             ("white noise", 16, 20.0), ("white noise", 20, 30.0), ("white noise", 24, 42.0))]
    (row,) = planner.plan_rows({"rk3588": 93}, sweep, [60.0])
    assert (row["min_context_speech"], row["emit"], row["min_context_white_noise"]) == (20, 53, None)
    assert row["compute_ratio"] == 53 / 93
    assert row["npu_ms_predicted"] == "" and row["npu_cost_note"] == "cannot speak: not built: no layer table to " \
        "predict from"


def test_the_plan_states_its_budget_and_its_windows_predicted_npu_time():
    """The window's own build (the recorded layer table of the Piper 93-frame window, rknn-toolkit2 2.3.2,
    rk3588: no REGTASK line) gives the plan its predicted ms per window call and per emitted frame."""
    import gzip
    from pathlib import Path

    from rkstudy.toolkit import cost, log

    table = log.layer_table(gzip.decompress((Path(__file__).parent / "fixtures" / "layer_tables" /
                                             "piper_decoder_w93_rk3588_toolkit232.log.gz").read_bytes()).decode())
    p = cost.predict(table, "rk3588", "0_1_2", constants=cost.Constants(0.1, 100.0, 2.0), cpu_ms=lambda x: 0.5,
                     io_ms=lambda x: 0.25)
    report = Logged(ok=True, regtask=0, regtask_max=0, status="ok", engine_bytes=1000, prediction=lambda: p)
    sweep = [{"latents": "speech", "context": 24, "worst_interior_snr_db": 90.0}]
    clean = planner.budget_text(planner.CLEAN, "rk3588")
    (row,) = planner.plan_rows({"rk3588": 93}, sweep, [80.0], {"rk3588": "93 within, 94 over"}, {"rk3588": clean},
                               {"rk3588": report})
    assert clean == "clean: no REGTASK line (no field value past rk3588's limit of 8,191)" == row["budget"]
    assert row["emit"] == 45 and row["npu_ms_predicted"] == pytest.approx(p.ms, abs=1e-3)
    assert row["npu_ms_per_emitted_frame_predicted"] == pytest.approx(row["npu_ms_predicted"] / 45, abs=1e-4)
    assert row["npu_ms_cpu"] == pytest.approx(2.0 * 0.5 * 4) and row["npu_cost_note"] == cost.PREDICTED_BY
    at_risk = planner.budget_text((18, 16352), "rk3588")
    assert at_risk.startswith("at risk allowed: up to 18 REGTASK lines and a largest field value of 16,352")


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
        for w in plan_windows(n, emit, context):
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
    (budget,) = tables["budgets"]
    assert (budget["budget_lines"], budget["given"], budget["start_window"]) == (0, False, 28)
    assert row["budget"] == budget["budget"] == planner.budget_text(planner.CLEAN, "rk3588")
    assert row["npu_cost_note"] == "cannot speak: no toolkit build behind this row"
