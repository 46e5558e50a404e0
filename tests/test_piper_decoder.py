"""The Piper decoder producer, sidecar and measurements on the real voice."""

from collections import Counter

import numpy as np
import onnx
import pytest

from rkstudy import contract, gates, graph
from rkstudy.cli import main
from rkstudy.errors import EngineMismatch
from rkstudy.families.piper_decoder import study
from rkstudy.families.piper_decoder.producer import read_contract
from rkstudy.families.piper_decoder.sidecar import DecoderSidecar
from rkstudy.graph.decmask import UPSAMPLERS
from rkstudy.lint.compiler import Layer
from rkstudy.runtime import OrtRunner
from rkstudy.toolkit.simulator import SimulatorRunner


@pytest.fixture(scope="module")
def latent(voice):
    (lat,) = voice.latents("Call me at 555 0142, extension 7.")
    return lat


@pytest.fixture(scope="module")
def produced(voice, slice_once):
    return slice_once(voice)


pytestmark = pytest.mark.usefixtures("slice_once")


def test_producer_folds_the_shape_plumbing_and_pins_the_window(produced):
    b, a = produced.before, produced.after
    assert (b.nodes, b.hazards["Shape"], b.hazards["ConstantOfShape"]) == (361, 24, 24)
    assert (a.nodes, a.hazards["Shape"], a.hazards["ConstantOfShape"]) == (281, 0, 0)
    assert graph.input_shapes(produced.model) == {"z": (1, 192, 93), "y_mask": (1, 1, 93)}
    c = read_contract(produced.model)
    assert c == produced.contract
    assert (c.window.frames, c.window.emit, c.window.context, c.params["hop"], c.params["channels"],
            c.params["dec_mask"]) == (93, 45, 24, 256, 192, False)
    assert c.source.file == "en_US-joe-medium.onnx" and len(c.source.sha256) == 64
    assert [(t.name, t.role, t.rate) for t in c.inputs + c.outputs] == [
        ("z", "walked", 1), ("y_mask", "mask", 1), ("audio", "walked", 256)]
    assert c.target is None and c.engine is None  # stage 1: compiled fields come at stage 2


@pytest.mark.slow
def test_interior_windows_are_exact_and_paroli_window_is_not(voice, latent):
    sweep = study.window_sweep(voice, [latent], configs=((45, 5), (45, 24)), progress=False)
    rows = sweep["windows"]
    interior = lambda w: [r["snr_db"] for r in rows if r["window"] == w and r["kind"] == "interior"]  # noqa: E731
    assert len(interior(93)) == 6 and min(interior(93)) > 80.0  # the start and end windows are not interior
    assert min(interior(55)) < 20.0  # the reference documents: 8-60 dB at paroli's 45+5+5
    assert {r["where"] for r in rows} == {"fp32"}
    # the whole sentence, by what a listener would judge: the 93-frame walk is transparent, paroli's is not
    # (measured: PESQ-WB 4.644 and 3.83 at 90.9 and 10.6 dB SNR)
    whole = {r["window"]: r for r in sweep["utterances"]}
    assert set(whole) == {55, 93} and all(set(gates.PERCEPTUAL_COLUMNS) <= set(r) for r in whole.values())
    assert whole[93]["pesq_wb"] > 4.6 and whole[93]["stoi"] > 0.999 and whole[93]["log_mel_db"] < 0.01
    assert 3.0 < whole[55]["pesq_wb"] < 4.3 and whole[55]["log_mel_db"] > 1.0


@pytest.mark.slow
def test_decoder_mask_fixes_the_short_tail(voice, latent):
    rows = {(r["frames"], r["dec_mask"]): r for r in study.tail_windows(voice, latent.z)}
    for n in (30, 47):
        assert rows[(n, False)]["snr_db"] < 40.0
        assert rows[(n, False)]["last7_snr_db"] < rows[(n, False)]["first_snr_db"] - 40
        assert rows[(n, True)]["snr_db"] > 100.0


def test_masked_decoder_is_identical_where_the_mask_is_one(voice, produced, slice_once):
    masked = slice_once(voice, dec_mask=True)
    assert masked.after.nodes == produced.after.nodes + 26  # 23 conv Muls + 3 mask upsamplers
    assert masked.after.ops["ConvTranspose"] == produced.after.ops["ConvTranspose"] + 3
    x = {"z": np.random.default_rng(0).standard_normal((1, 192, 93)).astype(np.float32),
         "y_mask": np.ones((1, 1, 93), np.float32)}
    np.testing.assert_array_equal(OrtRunner(masked.model).run(x)[0], OrtRunner(produced.model).run(x)[0])


@pytest.mark.slow
def test_mask_upsampler_switch_reaches_the_slice_and_both_upsample_exactly(voice, latent, slice_once):
    slices = {up: slice_once(voice, dec_mask=True, upsampler=up) for up in UPSAMPLERS}
    chain = {up: set(study.mask_upsampler_nodes(p.model)) for up, p in slices.items()}  # each call copies the graph
    ops = {up: Counter(n.op_type for n in p.model.graph.node if n.name in chain[up]) for up, p in slices.items()}
    assert ops == {"convtranspose": {"ConvTranspose": 3}, "resize": {"Resize": 3}}
    assert [p.after.ops["ConvTranspose"] for p in slices.values()] == [6, 3]  # the decoder's own 3 in both
    assert slices["convtranspose"].save().name != slices["resize"].save().name
    # the mask at every rate: exactly the frame mask repeated, 0 and 1 only, from either upsampler
    x, m = study.padded_window(latent.z[:, :47], 93)
    chains = {}
    for up, p in slices.items():
        nodes = [n for n in p.model.graph.node if n.name in chain[up]]
        chains[up] = OrtRunner(graph.slice_at(p.model, ["y_mask"], [n.output[0] for n in nodes])).run({"y_mask": m})
    rate = 1
    for k, (a, b) in enumerate(zip(*chains.values())):
        rate *= a.shape[-1] // (93 * rate)
        np.testing.assert_array_equal(a, np.repeat(m, a.shape[-1] // 93, axis=-1), err_msg=f"mask_up{k}")
        np.testing.assert_array_equal(a, b)
    assert rate == 256
    # so the audio is the same to the bit, and the masked tail is the full-length decode's
    audio = {up: OrtRunner(p.model).run({"z": x, "y_mask": m})[0].reshape(-1)[: 47 * 256] for up, p in slices.items()}
    np.testing.assert_array_equal(audio["convtranspose"], audio["resize"])
    assert gates.snr_db(study.FullDecoder(voice.model, voice.seam).decode(latent.z[:, :47]), audio["resize"]) > 100


def test_compiled_layers_of_counts_what_the_compiler_made_of_each_node():
    layers = [Layer(1, "Resize", "NPU", "/dec/mask_up0"), Layer(2, "Transpose", "NPU", "/dec/mask_up0_rs#7"),
              Layer(3, "Resize", "NPU", "/dec/mask_up1"), Layer(4, "Transpose", "CPU", "/dec/mask_up1_rs#6"),
              Layer(5, "ConvTranspose", "NPU", "/dec/ups.0/ConvTranspose"), Layer(6, "Mul", "NPU", "/dec/mask_up10")]
    assert study.compiled_layers_of(layers, ["/dec/mask_up0", "/dec/mask_up1"]) == \
        "2 Resize NPU, 1 Transpose CPU, 1 Transpose NPU"
    assert study.compiled_layers_of(layers, ["/dec/other"]) == ""


@pytest.mark.slow
def test_dec_mask_opt_in_in_fp32_the_mask_shows_only_on_a_padded_window(voice):
    """fp32 walks (target None): a one-window utterance gains from the mask, one just over the
    window (three full windows, mask 1 everywhere) is unchanged to the bit."""
    lats = [voice.latents(text)[0] for text in ("No.", "Turn left here.")]
    opt_in = study.dec_mask_opt_in(voice, lats, None)
    padded, over = opt_in["rows"]
    assert (padded["frames"], padded["windows"], over["frames"], over["windows"]) == (46, 1, 95, 3)
    assert padded["masked_vs_full_db"] > 90 and 75 < padded["unmasked_vs_full_db"] < 90
    assert padded["gap_db"] == pytest.approx(padded["masked_vs_full_db"] - padded["unmasked_vs_full_db"])
    assert padded["gap_db"] > 5
    # the masked walk is the full decode to ~96 dB, so the two walks differ by the unmasked walk's error
    assert padded["masked_vs_unmasked_db"] == pytest.approx(padded["unmasked_vs_full_db"], abs=1.0)
    assert over["masked_vs_unmasked_db"] == np.inf and over["gap_db"] == 0.0
    for r in (padded, over):
        assert (r["masked_vs_full_db"], r["unmasked_vs_full_db"]) == (r["fp32_masked_vs_full_db"],
                                                                     r["fp32_unmasked_vs_full_db"])
        assert (r["where"], r["target"]) == ("fp32", "none") and "regtask" not in r
    # both utterances back to back, by what a listener would judge: the mask's gain is inaudible
    # (measured PESQ-WB 4.644 masked, 4.632 unmasked against the full decode)
    scored = {r["comparison"]: r for r in opt_in["perceptual"]}
    assert set(scored) == {"masked engine vs full decode", "unmasked engine vs full decode",
                           "masked vs unmasked engine"}
    for r in scored.values():
        assert r["pesq_wb"] > 4.5 and r["stoi"] > 0.999 and r["dnsmos_ovrl"] == pytest.approx(r["dnsmos_ovrl_ref"],
                                                                                               abs=0.05)
    assert scored["masked engine vs full decode"]["snr_db"] > scored["unmasked engine vs full decode"]["snr_db"]


@pytest.mark.slow
def test_wrong_seam_is_quiet(voice, latent):
    row = study.wrong_seam(voice, latent.z)
    assert row["rms_ratio"] < 0.5 and row["snr_db"] < 3.0
    # and a listener would hear it (measured PESQ-WB 1.13, STOI 0.69, DNSMOS 2.2 against the right decode's 3.3)
    assert row["pesq_wb"] < 1.5 and row["stoi"] < 0.8 and row["dnsmos_ovrl"] < row["dnsmos_ovrl_ref"] - 0.5


def test_sidecar_refuses_a_mismatched_engine(produced):
    runner = OrtRunner(produced.model)
    with pytest.raises(EngineMismatch,
                       match="192 latent channels, the voice has 256.*rkstudy piper decoder --voice-onnx"):
        DecoderSidecar(runner, produced.contract, channels=256, hop=256)
    with pytest.raises(EngineMismatch, match="256 samples per frame, the voice 512"):
        DecoderSidecar(runner, produced.contract, channels=192, hop=512)
    with pytest.raises(EngineMismatch, match="0-wide speaker embedding, the voice has 256"):
        DecoderSidecar(runner, produced.contract, channels=192, hop=256, speaker_dims=256)
    with pytest.raises(EngineMismatch, match="carries no stage contract"):
        read_contract(onnx.ModelProto())


@pytest.mark.simulator
def test_simulator_walk_matches_fp32(voice, latent, produced):
    with SimulatorRunner(produced.save(), "rk3588") as sim:
        assert sim.shapes["z"] == (1, 192, 93)
        test = study.sidecar(voice, sim, produced.contract).decode(latent.z, progress=False)
    ref = study.FullDecoder(voice.model, voice.seam).decode(latent.z)
    assert test.shape == ref.shape == (latent.frames * 256,)
    assert gates.snr_db(ref, test) > 35.0
    assert gates.best_lag(ref, test) == 0 and gates.nonfinite_count(test) == 0


@pytest.mark.simulator
def test_two_stage_command_line(tmp_path, capsys):
    out = tmp_path / "decoder_z.onnx"
    assert main(["piper", "decoder", "--skip-rknn", "--output", str(out), "--dec-mask"]) == 0
    text = capsys.readouterr().out
    assert "361 -> 307 nodes, Shape 24 -> 0, ConstantOfShape 24 -> 0" in text
    assert "self-check: worst window" in text
    c = read_contract(out)
    assert c.params["dec_mask"] and c.producer.startswith("rkstudy piper decoder --skip-rknn --output")
    engine = tmp_path / "decoder.rknn"
    assert main(["piper", "decoder", "--onnx", str(out), "--target", "rk3566", "--out", str(engine)]) == 0
    text = capsys.readouterr().out
    assert "window 93 = 45 + 2x24, hop 256, 192 channels, dec_mask=True" in text
    assert engine.stat().st_size > 10_000_000
    compiled = contract.for_engine(engine, family="piper_decoder", soc="rk3566")
    assert (compiled.target, compiled.window.frames, compiled.onnx.file) == ("rk3566", 93, "decoder_z.onnx")
    assert compiled.toolkit == "rknn-toolkit2 2.5.0"
    with pytest.raises(EngineMismatch, match="compiled for rk3566 and this board is rk3588"):
        contract.for_engine(engine, family="piper_decoder", soc="rk3588")


class _Lat:
    def __init__(self, frames):
        self.frames, self.z, self.g = frames, None, None


def test_the_window_walk_bound_counts_every_padded_window():
    """Every call runs the whole window: a sentence's last window and a sentence shorter than one
    window are padded to it, so on real sentences the walk computes more than 93/45 frames per frame."""
    assert study.window_compute_bound([_Lat(49)]) == pytest.approx(93 / 49)
    assert study.window_compute_bound([_Lat(45 * 20)]) == pytest.approx(20 * 93 / 900)
    notebook = [_Lat(n) for n in (49, 380, 279, 818, 380, 378, 225)]  # notebook 01's sentences
    assert study.window_compute_bound(notebook) == pytest.approx(2.187, abs=1e-3)


def test_cpu_timings_interleave_the_paths_and_take_the_median_ratio(monkeypatch):
    calls = []

    def path(name, seconds):
        def run(lat):
            calls.append(name)
            run.t += seconds.pop(0) if lat.frames else 0.0
        run.t = 0.0
        return run

    mono_s, walk_s = [0.0, 1.0, 1.0, 1.0], [0.0, 2.0, 5.0, 2.2]  # a slow spell hits the walk's 2nd repeat
    mono, walk = path("mono", mono_s), path("walk", walk_s)
    # a clock that advances only by the paths' own work
    monkeypatch.setattr(study.time, "perf_counter", lambda: mono.t + walk.t)
    rows = study.rtf_rows([("mono", mono, 1.0), ("walk", walk, 2.19)], [_Lat(10)], 256, 22050, 3, "fp32")
    assert calls == ["mono", "walk"] + ["mono", "walk"] * 3  # a warm-up each, then A, B, A, B, A, B
    assert rows[1]["ratio_vs_monolithic"] == pytest.approx(2.2) and rows[1]["ratio_max"] == pytest.approx(5.0)
    assert rows[1]["ratio_min"] == pytest.approx(2.0) and rows[1]["compute_bound"] == 2.19
    assert rows[0]["ratio_vs_monolithic"] == 1.0 and rows[1]["threads"] == 1 and rows[1]["repeats"] == 3
