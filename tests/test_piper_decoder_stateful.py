"""The stateful Piper decoder step on the real voice: its delay map and cache, the exactness gate
(float64 step against float64 full-length decode, every sample), the fp32 numbers beside it, the
compute ratio, streaming, the sidecar's refusals and stage 1 from the command line."""

import math
from dataclasses import replace

import numpy as np
import pytest

from rkstudy.cli import main
from rkstudy.errors import EngineMismatch
from rkstudy.families.piper.voice import read_text
from rkstudy.families.piper_decoder.producer import produce_for_voice, read_contract
from rkstudy.families.piper_decoder_stateful import study
from rkstudy.families.piper_decoder_stateful.sidecar import StatefulDecoderSidecar
from rkstudy.runtime import OrtRunner

pytestmark = pytest.mark.usefixtures("slice_once")  # one fold per Piper slice setting


@pytest.fixture(scope="module")
def steps(voice):
    return study.steps_for(voice, study.EMITS)


@pytest.fixture(scope="module")
def short(voice):
    return {"short": voice.latents(read_text("short"))}


def test_the_delay_map_and_the_cache_of_the_voice(steps):
    s = steps[45].step
    # 4 flows x 4 WaveNet k5 (+2 frames each) -> conv_pre (+3) = 35 frames -> ups.0 (35*8 + 4) -> resblocks
    # (+45) -> ups.1 (x8 + 4) -> (+45) -> ups.2 (x4 + 2) -> (+45) -> conv_post (+3): 10774 audio samples
    assert (s.delay, s.output_rate, s.lookahead_frames) == (10774, 256, 42.0859375)
    assert sum(1 for c in s.delays.convs if c.op == "Conv") == 60
    c = steps[45].contract
    assert (c.window, c.family, c.params["state_floats"], len(c.state), len(s.buffers)) == (
        None, "piper_decoder_stateful", 87707, 7, 75)
    assert [(t.name, t.role, t.shape) for t in c.inputs[:2] + c.outputs[:1]] == [
        ("z", "walked", (1, 192, 45)), ("y_mask", "mask", (1, 1, 45)), ("audio", "walked", (1, 1, 1, 45 * 256))]
    # one layout at every E: a state can move between step sizes
    assert steps[16].contract.params["state_layout"] == steps[93].contract.params["state_layout"]
    assert {e: p.contract.params["first_audio_frames"] for e, p in steps.items()} == {16: 48, 45: 45, 93: 93}


@pytest.mark.slow
def test_exactness_gate_float64_step_equals_float64_full_decode(voice, steps, short):
    """The exactness gate, >= 120 dB over every sample, with both decodes in float64 (the method alone);
    fp32 beside it: onnxruntime sums a conv of <= 64 outputs in another order, so the fp32 step is not
    bit-identical to the fp32 full decode where either runs such a conv. How far fp32 lands from float64
    depends on the CPU's kernels (measured on "short", 49 frames, onnxruntime 1.26.0: on an AVX-512 host
    97.3 dB at E=16, bit-identical at E=45, 101.1 dB at E=93, the fp32 full decode 102.5 dB from float64;
    on an AVX2-only host 95.6 dB, bit-identical, 97.7 dB, and 94.6 dB), so the fp32 bounds hold both."""
    ex = study.exactness(voice, short, steps, progress=False)
    rows = ex.rows
    assert len(rows) == 3 and {r["where"] for r in rows} == {"fp32"}
    for r in rows:
        study.EXACT_GATE.check(r["f64_step_vs_full_db"], context=f"E={r['emit']}")
        assert 93.0 <= r["fp32_step_vs_full_db"] and 93.0 <= r["fp32_full_vs_f64_full_db"] <= 106.0
        assert r["fp32_first_256_max_err"] < 1e-6 and r["fp32_last_256_max_err"] < 1e-6  # the start, the flushed tail
    by_emit = {r["emit"]: r["fp32_step_vs_full_db"] for r in rows}
    assert by_emit[16] <= 100.0 and by_emit[45] == float("inf") and 96.0 <= by_emit[93] <= 103.0
    # a listener hears the same utterance at every E: PESQ-WB at its top, STOI 1, the same DNSMOS
    whole = {r["emit"]: r for r in ex.utterance_rows(voice.sample_rate)}
    assert set(whole) == {16, 45, 93} and whole[45]["snr_db"] == float("inf")
    for r in whole.values():
        assert r["pesq_wb"] > 4.6 and r["log_mel_db"] < 0.01
        assert math.isnan(r["stoi"])  # "Hello." holds under STOI's 0.4 s of voiced speech
        assert r["dnsmos_ovrl"] == pytest.approx(r["dnsmos_ovrl_ref"], abs=0.01) and r["sentences"] == 1


def test_the_step_recomputes_nothing_but_the_flush_costs_a_short_utterance(voice, steps, short):
    macs = study.macs_rows(voice, steps)
    rows = {r["path"]: r for r in macs}
    assert rows[study.WINDOW]["compute_ratio"] == pytest.approx(0.4839, abs=1e-4)   # 45 of every 93 frames
    for e in study.EMITS:
        assert 0.998 <= rows[f"stateful step E={e}"]["compute_ratio"] < 1.0   # the upsamplers' one extra sample
    # per utterance, 49 frames: one 93-frame window, or 3 steps of 45 (49 frames + 42.09 of lookahead)
    per = {r["path"]: r for r in study.utterance_compute_rows(short, steps, macs)}
    calls = [per[path]["calls"] for path in (study.WINDOW, "stateful step E=45", "stateful step E=16")]
    assert calls == [1, 3, 6]
    assert per[study.WINDOW]["compute_ratio"] == pytest.approx(49 / 93, abs=1e-3)
    assert per["stateful step E=45"]["compute_ratio"] == pytest.approx(49 / 135, abs=1e-3)


def test_a_latent_streamed_in_any_chunking_decodes_the_same(voice, steps, short):
    produced = steps[45]
    side = study.sidecar(voice, OrtRunner(produced.model), produced)
    z = short["short"][0].z
    whole = side.decode(z)
    assert whole.shape == (z.shape[1] * 256,) and side.steps == 3
    pieces = list(side.stream([z[:, :7], z[:, 7:40], z[:, 40:41], z[:, 41:]]))
    np.testing.assert_array_equal(np.concatenate(pieces), whole)
    # nothing is final before 45 frames are in; then the first step's samples past the lookahead, then the flush
    assert [p.size for p in pieces] == [45 * 256 - 10774, 49 * 256 - (45 * 256 - 10774)]


def test_the_sidecar_refuses_a_window_engine_another_voice_and_another_step(voice, steps):
    produced = steps[45]
    window = produce_for_voice(voice)
    with pytest.raises(EngineMismatch, match="carries no state .a window walk, not a stateful step."):
        StatefulDecoderSidecar(OrtRunner(window.model), window.contract, channels=192, hop=256)
    with pytest.raises(EngineMismatch, match="192 latent channels, the voice has 256"):
        StatefulDecoderSidecar(OrtRunner(produced.model), produced.contract, channels=256, hop=256)
    with pytest.raises(EngineMismatch, match="the engine's z is .1, 192, 16. but its contract says .1, 192, 45."):
        StatefulDecoderSidecar(OrtRunner(steps[16].model), produced.contract, channels=192, hop=256)


@pytest.mark.slow
def test_stage1_from_the_command_line(steps, tmp_path, capsys):
    out = tmp_path / "decoder_step.onnx"
    assert main(["piper", "decoder", "--stateful", "--emit", "93", "--skip-rknn", "--output", str(out)]) == 0
    text = capsys.readouterr().out
    assert "stateful step of 93 frames from the --dec-mask slice" in text
    assert "lookahead 10774 samples (42.09 frames), state 87707 floats in 7 tensors" in text
    assert "self-check:" in text and "(gate 90.0 dB, fp32)" in text
    c = read_contract(out)
    assert replace(c, producer=steps[93].contract.producer) == steps[93].contract   # the same step
    assert c.producer.startswith("rkstudy piper decoder --stateful --emit 93")
    assert c.remake_engine("rk3566").startswith("rkstudy piper decoder --onnx")
    with pytest.raises(SystemExit) as exc:
        main(["piper", "decoder", "--stateful", "--context", "5", "--skip-rknn"])
    assert exc.value.code == 2 and "--stateful recomputes no context" in capsys.readouterr().err


@pytest.mark.slow
def test_the_fp32_self_check_gate_holds_at_every_step_size(voice, steps):
    for e in (16, 93):
        assert study.self_check(voice, steps[e])["measured"] >= 95.0


def test_the_stage2_probe_is_the_first_step_and_a_step_with_the_state_the_fp32_walk_carried(steps):
    from rkstudy.families.piper_decoder_stateful.producer import state_probe

    p = steps[16]
    first, last = state_probe(p.model, p.contract, steps=3)
    states = [t.name for t in p.contract.role("state")]
    assert list(first) == list(last) == p.contract.input_names
    assert first["z"].shape == last["z"].shape == (1, 192, 16) and not np.array_equal(first["z"], last["z"])
    assert all(not first[s].any() for s in states)  # the first step starts from zero state
    # measured: 32 frames in (two steps of 16), 3 of the 7 caches hold a past; the step lags its input by
    # 42 frames, so the others still hold the zero start
    assert sum(bool(last[s].any()) for s in states) == 3
