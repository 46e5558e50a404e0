"""The Piper decoder producer, sidecar and measurements on the real voice."""

import numpy as np
import onnx
import pytest

from rkstudy import gates, graph
from rkstudy.cli import main
from rkstudy.families import piper_decoder as pd
from rkstudy.runtime import OrtRunner, SimulatorRunner


@pytest.fixture(scope="module")
def latent(voice):
    (lat,) = voice.latents("Call me at 555 0142, extension 7.")
    return lat


@pytest.fixture(scope="module")
def produced(voice):
    return pd.produce_for_voice(voice)


def test_producer_folds_the_shape_plumbing_and_pins_the_window(produced):
    b, a = produced.before, produced.after
    assert (b.nodes, b.hazards["Shape"], b.hazards["ConstantOfShape"]) == (361, 24, 24)
    assert (a.nodes, a.hazards["Shape"], a.hazards["ConstantOfShape"]) == (281, 0, 0)
    assert graph.input_shapes(produced.model) == {"z": (1, 192, 93), "y_mask": (1, 1, 93)}
    c = pd.Contract.from_model(produced.model)
    assert (c.window, c.emit, c.context, c.hop, c.channels, c.dec_mask) == (93, 45, 24, 256, 192, False)
    assert c.source.startswith("en_US-joe-medium.onnx@")


def test_interior_windows_are_exact_and_paroli_window_is_not(voice, latent):
    rows = pd.window_sweep(voice, [latent], configs=((45, 5), (45, 24)), progress=False)
    interior = lambda w: [r["snr_db"] for r in rows if r["window"] == w and r["kind"] == "interior"]  # noqa: E731
    assert len(interior(93)) == 7 and min(interior(93)) > 80.0
    assert min(interior(55)) < 20.0  # the seeds: 8-60 dB at paroli's 45+5+5


def test_decoder_mask_fixes_the_short_tail(voice, latent):
    rows = {(r["frames"], r["dec_mask"]): r for r in pd.tail_windows(voice, latent.z)}
    for n in (30, 47):
        assert rows[(n, False)]["snr_db"] < 40.0
        assert rows[(n, False)]["last7_snr_db"] < rows[(n, False)]["first_snr_db"] - 40
        assert rows[(n, True)]["snr_db"] > 100.0


def test_masked_decoder_is_identical_where_the_mask_is_one(voice, produced):
    masked = pd.produce_for_voice(voice, dec_mask=True)
    assert masked.after.nodes == produced.after.nodes + 26  # 23 conv Muls + 3 mask upsamplers
    assert masked.after.ops["ConvTranspose"] == produced.after.ops["ConvTranspose"] + 3
    x = {"z": np.random.default_rng(0).standard_normal((1, 192, 93)).astype(np.float32),
         "y_mask": np.ones((1, 1, 93), np.float32)}
    np.testing.assert_array_equal(OrtRunner(masked.model).run(x)[0], OrtRunner(produced.model).run(x)[0])


def test_wrong_seam_is_quiet(voice, latent):
    row = pd.wrong_seam(voice, latent.z)
    assert row["rms_ratio"] < 0.5 and row["snr_db"] < 3.0


def test_sidecar_refuses_a_mismatched_engine(produced):
    runner = OrtRunner(produced.model)
    with pytest.raises(pd.EngineMismatch, match="192 latent channels, the voice has 256.*rkstudy piper decoder --voice-onnx"):
        pd.DecoderSidecar(runner, produced.contract, channels=256, hop=256)
    with pytest.raises(pd.EngineMismatch, match="256 samples per frame, the voice 512"):
        pd.DecoderSidecar(runner, produced.contract, channels=192, hop=512)
    with pytest.raises(pd.EngineMismatch, match="carries no window contract"):
        pd.Contract.from_model(onnx.ModelProto())
    with pytest.raises(pd.EngineMismatch, match="no contract beside"):
        pd.Contract.from_engine("/nonexistent/engine.rknn")


def test_simulator_walk_matches_fp32(voice, latent, produced):
    path = produced.save()
    with SimulatorRunner(path, "rk3588") as sim:
        assert sim.shapes["z"] == (1, 192, 93)
        side = pd.DecoderSidecar(sim, produced.contract, channels=voice.channels, hop=voice.hop)
        test = side.decode(latent.z, progress=False)
    ref = pd.FullDecoder(voice.model, voice.seam).decode(latent.z)
    assert test.shape == ref.shape == (latent.frames * 256,)
    assert gates.snr_db(ref, test) > 35.0
    assert gates.best_lag(ref, test) == 0 and gates.nonfinite_count(test) == 0


def test_two_stage_command_line(tmp_path, capsys):
    out = tmp_path / "decoder_z.onnx"
    assert main(["piper", "decoder", "--skip-rknn", "--output", str(out), "--dec-mask"]) == 0
    text = capsys.readouterr().out
    assert "361 -> 307 nodes, Shape 24 -> 0, ConstantOfShape 24 -> 0" in text
    assert "self-check: worst window" in text
    assert pd.Contract.from_model(onnx.load(str(out))).dec_mask
    engine = tmp_path / "decoder.rknn"
    assert main(["piper", "decoder", "--onnx", str(out), "--target", "rk3566", "--out", str(engine)]) == 0
    text = capsys.readouterr().out
    assert "window 93 = 45 + 2x24, hop 256, 192 channels, dec_mask=True" in text
    assert engine.stat().st_size > 10_000_000
    assert pd.Contract.from_engine(engine).window == 93
