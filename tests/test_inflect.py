"""The Inflect v2 decode.onnx contract, carved from the Piper voice, through the shared producer."""

import numpy as np
import pytest

from rkstudy import graph
from rkstudy.cli import main
from rkstudy.families.inflect_decoder import carve, study
from rkstudy.families.piper_decoder.producer import produce_for_voice, read_contract

pytestmark = pytest.mark.usefixtures("slice_once")  # one fold per Piper slice setting


@pytest.fixture(scope="module")
def decode(voice):
    return carve.DecodeModel(carve.save_carved(voice))


def test_carved_decode_has_the_contract(decode):
    names = [i.name for i in decode.model.graph.input]
    assert names == list(carve.HEAD_INPUTS)
    assert (decode.seam.z, decode.seam.y_mask) == ("z", "y_mask")  # the head output, found by structure
    assert (decode.hop, decode.channels) == (256, 192)


def test_head_stays_outside_the_engine(decode):
    produced = produce_for_voice(decode, emit=carve.EMIT, context=carve.CONTEXT, dec_mask=True)
    assert graph.input_shapes(produced.model) == {"z": (1, 192, 256), "y_mask": (1, 1, 256)}
    assert not [n.name for n in produced.model.graph.node if n.name.startswith("/head/")]
    c = read_contract(produced.model)
    assert c.family == "inflect_decoder" and c.params["dec_mask"]
    assert c.producer.startswith("rkstudy inflect decoder --decode-onnx decode-")


@pytest.mark.slow
def test_context_sweep_on_prior_samples(voice, decode):
    z = max(carve.prior_samples(voice, "Call me at 555 0142, extension 7."), key=lambda z: z.shape[1])
    assert z.shape == (192, 380)
    rows = {r["context"]: r for r in study.context_sweep(decode, z, (0, 32), progress=False)}
    assert rows[0]["snr_db"] < 30.0
    assert rows[32]["snr_db"] > 100.0 and rows[32]["windows"] == 2
    # what a listener would judge: no context is audible, 32 frames are transparent
    assert rows[32]["pesq_wb"] > 4.6 and rows[32]["stoi"] > 0.999
    assert rows[0]["pesq_wb"] < rows[32]["pesq_wb"] - 0.2 and rows[0]["log_mel_db"] > rows[32]["log_mel_db"]


@pytest.mark.slow
def test_decoder_mask_on_by_default_and_needed(decode):
    z = np.random.default_rng(3).standard_normal((192, 47)).astype(np.float32) * 0.5
    masked = study.context_sweep(decode, z, (32,), progress=False)[0]
    plain = study.context_sweep(decode, z, (32,), dec_mask=False, progress=False)[0]
    assert masked["snr_db"] > 90.0 > 40.0 > plain["snr_db"]


@pytest.mark.slow
def test_command_line_carve_then_produce(tmp_path, capsys):
    dec, out = tmp_path / "decode.onnx", tmp_path / "slice.onnx"
    assert main(["inflect", "decoder", "--carve", "--output", str(dec)]) == 0
    assert main(["inflect", "decoder", "--decode-onnx", str(dec), "--skip-rknn", "--output", str(out)]) == 0
    text = capsys.readouterr().out
    assert "self-check: worst window" in text
    c = read_contract(out)
    assert (c.window.frames, c.window.emit, c.window.context, c.params["dec_mask"], c.family) == (
        256, 192, 32, True, "inflect_decoder")
