"""The proving set's real modules (rkstudy.families.port.packages): `vocos` and `bigvgan` loaded from their
installed packages without their package __init__s (no torchaudio, encodec or librosa needed, nothing
fetched), the Vocos graph's split at the complex spectrum equal to the ISTFTHead's own forward, the legacy
exporter's refusal of BigVGAN kept as what it says, and BigVGAN's dynamo export streamed exactly at both
ends (its edge pads, grouped ConvTransposes and strided Convs through the rules). Two codecs' decoders: `dac`
(descript-audio-codec, loaded without audiotools) streamed exactly with its 8-sample short tail, `snac`
refused for its noise block and then its windowed attention, and lint's flood prediction on a wide
44.1 kHz DAC layout (its builds: tests/test_lint_field.py and notebook 07). The exports are cached
(a cold dynamo export of the small BigVGAN takes about a minute)."""

import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from rkstudy.families.port import packages, producer, study
from rkstudy.families.port.study import EXACT_GATE, FP32_GATE, step_exactness, window_exactness

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_modules_are_the_packages_own_and_their_inits_never_run():
    models, heads = packages.vocos_modules()
    module, _ = packages.bigvgan_modules()
    for cls, package in ((models.VocosBackbone, "vocos"), (heads.ISTFTHead, "vocos"), (module.BigVGAN, "bigvgan")):
        path = Path(sys.modules[cls.__module__].__file__)
        assert cls.__module__.startswith(package + ".") and path.parent.name == package and "site-packages" in str(path)
    # the bare packages are gone again, and neither pulled the libraries their own __init__s import
    assert "vocos" not in sys.modules and "bigvgan" not in sys.modules
    assert not {"torchaudio", "encodec", "librosa", "pytorch_lightning"} & set(sys.modules)


def test_the_vocos_graph_ends_where_the_heads_own_forward_turns_complex():
    v = packages.vocos("legacy")
    mel = torch.randn(1, packages.MELS, 24)
    with torch.no_grad():
        real, imag = v.module(mel)
        own = v.module.head(v.module.backbone(mel)).numpy()[0]   # ISTFTHead.forward: projection, spectrum, iSTFT
    np.testing.assert_allclose(packages.istft(v, real.numpy(), imag.numpy()), own, rtol=1e-5, atol=1e-6)
    assert [o.name for o in v.model.graph.output] == ["real", "imag"]


def test_the_legacy_exporter_cannot_export_bigvgan_and_says_why():
    with pytest.raises(Exception, match="ONNX export of convolution for kernel of unknown shape"):
        packages.bigvgan("legacy")


@pytest.mark.slow
def test_the_real_bigvgan_streams_exactly_at_both_ends(tmp_path):
    v = packages.bigvgan("dynamo")
    ops = {n.op_type for n in v.model.graph.node}
    assert {"Pad", "ConvTranspose", "Conv", "Sin"} <= ops and v.model.opset_import[0].version == packages.OPSET_DYNAMO
    onnx.save(v.model, tmp_path / "bigvgan.onnx")
    port = producer.port_from_flags(tmp_path / "bigvgan.onnx", ["mel:2:1"], output=[f"audio:{v.hop}"])
    step = producer.produce_step(port, 16, 48)
    assert len(step.rewritten) == sum(n.op_type == "Pad" for n in producer.folded(port, 48).graph.node) > 0
    mel = np.random.default_rng(0).standard_normal((1, packages.MELS, 13)).astype(np.float32)
    row = step_exactness(port, step, {"mel": mel})
    assert min(row["step_vs_full_f64_db"], row["first_frames_db"], row["last_frames_db"]) >= EXACT_GATE.threshold
    assert min(row["step_vs_full_fp32_db"], row["first_frames_fp32_db"], row["last_frames_fp32_db"]) >= 90.0
    tail = window_exactness(port, producer.produce_window(port, 32, 8), {"mel": mel})
    assert tail["padded"] and tail["tail_window_db"] >= FP32_GATE.threshold


def test_the_codec_decoders_load_from_their_packages_without_audiotools():
    dac = packages.dac_modules()
    snac = packages.snac_layers()
    for cls, package in ((dac.Decoder, "dac"), (snac.Decoder, "snac"), (snac.NoiseBlock, "snac")):
        path = Path(sys.modules[cls.__module__].__file__)
        assert cls.__module__.startswith(package + ".") and "site-packages" in str(path)
    assert not hasattr(dac, "DAC")   # the wrapper class that needs audiotools is left out
    assert "audiotools" not in sys.modules


@pytest.mark.slow
def test_the_real_dac_24khz_decoder_streams_exactly_with_its_short_tail(tmp_path):
    """descript-audio-codec's 24 kHz layout (strides 8, 5, 4, 2 without output_padding): 8 samples short of
    320 x frames, as the package's own decode; the step carries the tail and is float64 exact."""
    rows = study.codec_rows({"dac": packages.dac()}, tmp_path, 48, 8, 16,
                            {"z": np.random.default_rng(0).standard_normal((1, 16, 29)).astype(np.float32)})
    (r,) = rows
    assert (r["fold"], r["step"], r["output_extra"], r["step_output_extra"]) == ("ok", "ok", -8, -8)
    assert r["samples"] == r["package_samples"] == 320 * 29 - 8
    assert min(r["step_vs_full_f64_db"], r["first_frames_db"], r["last_frames_db"]) >= EXACT_GATE.threshold
    assert min(r["first_frames_fp32_db"], r["last_frames_fp32_db"]) >= FP32_GATE.threshold
    assert r["step_vs_package_fp32_db"] > 100.0


@pytest.mark.slow
def test_the_real_snac_decoder_is_refused_for_its_noise_then_for_its_attention(tmp_path):
    z = {"z": np.random.default_rng(0).standard_normal((1, 16, 40)).astype(np.float32)}
    noisy, quiet = study.codec_rows({"snac": packages.snac(), "quiet": packages.snac(noise=False)}, tmp_path, 64, 16,
                                    16, z)
    assert (noisy["fold"], noisy["step"]) == ("refused", "refused")
    assert "RandomNormalLike" in noisy["step_says"] and "feed the noise as a graph input" in noisy["fold_says"]
    assert (quiet["fold"], quiet["step"], quiet["output_extra"]) == ("ok", "refused", 0)
    assert "attends over windows of 32 of its 64 frames" in quiet["step_says"] and "Softmax" in quiet["step_says"]


def test_lint_predicts_the_wide_dac_44khz_decoders_flood_from_the_graph():
    v = packages.dac(packages.DAC_44K_RATES, channels=1024)
    from rkstudy.lint import lint

    path = Path(tempfile.mkdtemp()) / "dac44.onnx"
    onnx.save(v.model, path)
    lines = {n: [f.detail.get("predicted_lines", 0) for f in lint(path, {"z": [1, 16, n]}, time_inputs=["z"]).findings
                 if f.code == "RK305"] for n in (4, 5, 64)}
    assert lines[4] == [] and lines[5] == [17914] and sum(lines[64]) > 100_000   # 4 | 5 frames: built 0 | 17,914
