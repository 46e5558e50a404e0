"""The perceptual scores (rkstudy.gates: PESQ-WB, STOI, log-mel distance, DNSMOS P.835) on known signals: a
synthetic voiced signal for the arithmetic, the Piper voice's own fp32 decode where a scorer needs speech."""

import math
import sys
import types

import numpy as np
import pytest

from rkstudy import gates

RATE = 22050


def voiced(seconds=2.0, rate=RATE, f0=120.0):
    """A vowel-like signal: 30 harmonics of a gliding 120 Hz pitch under a falling spectral tilt, switched on
    and off as syllables (4 per second, with pauses), so PESQ's and STOI's voice activity finds speech."""
    t = np.arange(int(seconds * rate)) / rate
    phase = 2 * np.pi * np.cumsum(f0 * (1 + 0.05 * np.sin(2 * np.pi * 3 * t))) / rate
    x = sum(np.sin(k * phase) / k for k in range(1, 31) if k * f0 < rate / 2)
    syllables = np.clip(np.sin(2 * np.pi * 2 * t), 0, None) ** 0.5
    return (0.2 * x * syllables).astype(np.float64)


def with_noise(x, snr_db, seed=0):
    noise = np.random.default_rng(seed).standard_normal(x.size)
    noise *= np.sqrt(np.mean(x**2) / 10 ** (snr_db / 10) / np.mean(noise**2))
    return x + noise


@pytest.fixture(scope="module")
def speech(voice):
    """The Piper voice's fp32 full-length decode of one sentence (4.4 s at 22050 Hz): real speech."""
    from rkstudy.families.piper.voice import read_text
    from rkstudy.families.piper_decoder.study import FullDecoder

    lat = voice.latents(read_text("phone"))[0]
    assert voice.sample_rate == RATE
    return FullDecoder(voice.model, voice.seam).decode(lat.z, lat.g).astype(np.float64)


@pytest.fixture(scope="module")
def speech_9s(speech):
    """The sentence said again to 9.5 s: one DNSMOS segment (a shorter clip is doubled into 4 to 9 of them)."""
    return np.tile(speech, 3)[: int(9.5 * RATE)]


# --- the top of each scale ------------------------------------------------------------------------
def test_identical_renders_score_the_top_of_every_scale():
    x = voiced()
    assert gates.PESQ_WB_MAX == pytest.approx(4.644, abs=1e-3) and gates.PESQ_WB_MIN == pytest.approx(1.043, abs=1e-3)
    assert gates.pesq_wb(x, x, RATE) == pytest.approx(gates.PESQ_WB_MAX, abs=1e-3)
    assert gates.stoi(x, x, RATE) == pytest.approx(1.0, abs=1e-9)
    assert gates.log_mel_distance(x, x, RATE) == 0.0


def test_log_mel_distance_of_a_gain_is_its_decibels():
    """A flat-spectrum signal has no bin at the floor, so twice the amplitude is 20·log10(2) in every bin."""
    x = np.random.default_rng(3).standard_normal(RATE)
    assert gates.log_mel_distance(x, 2 * x, RATE) == pytest.approx(20 * math.log10(2), abs=1e-9)
    assert gates.log_mel_distance(x, 0.5 * x, RATE) == pytest.approx(20 * math.log10(2), abs=1e-9)


def test_log_mel_puts_a_tone_in_its_band():
    t = np.arange(RATE) / RATE
    low, high = gates.log_mel(np.sin(2 * np.pi * 300 * t), RATE), gates.log_mel(np.sin(2 * np.pi * 6000 * t), RATE)
    assert low.shape[1] == gates.LOG_MEL_BANDS
    assert np.argmax(low.mean(0)) < np.argmax(high.mean(0)) < gates.LOG_MEL_BANDS - 1


# --- degradations on real speech ------------------------------------------------------------------
def test_white_noise_lowers_every_score_step_by_step(speech):
    ladder = [gates.perceptual(speech, with_noise(speech, snr), RATE, absolute=False) for snr in (40, 30, 20, 10, 0)]
    pesq, stoi, mel = ([r[k] for r in ladder] for k in ("pesq_wb", "stoi", "log_mel_db"))
    assert all(a > b for a, b in zip(pesq, pesq[1:])), pesq
    assert all(a > b for a, b in zip(stoi, stoi[1:])), stoi
    assert all(a < b for a, b in zip(mel, mel[1:])), mel
    # measured on this sentence: PESQ 3.4 at 40 dB to 1.04 at 0 dB, STOI 1.00 to 0.78
    assert 3.0 < pesq[0] < 4.0 and pesq[-1] < 1.2
    assert stoi[0] > 0.99 and 0.6 < stoi[-1] < 0.9


def test_a_delay_wrecks_the_snr_and_not_pesq(speech):
    """PESQ realigns the renders; SNR and STOI do not: 5 ms late is a negative SNR and a perfect PESQ."""
    late = np.concatenate([np.zeros(int(0.005 * RATE)), speech[: -int(0.005 * RATE)]])
    assert gates.snr_db(speech, late) < 0
    assert gates.pesq_wb(speech, late, RATE) > 4.5
    assert 0.8 < gates.stoi(speech, late, RATE) < 0.99
    very_late = np.concatenate([np.zeros(int(0.05 * RATE)), speech[: -int(0.05 * RATE)]])
    assert gates.stoi(speech, very_late, RATE) < 0.5


def test_a_low_pass_costs_pesq_and_the_band_above_it(speech):
    from scipy.signal import butter, sosfiltfilt

    dull = sosfiltfilt(butter(8, 4000, fs=RATE, output="sos"), speech)
    assert 3.5 < gates.pesq_wb(speech, dull, RATE) < 4.5   # measured 4.21
    assert gates.stoi(speech, dull, RATE) > 0.99           # intelligibility lives below 4 kHz
    assert gates.log_mel_distance(speech, dull, RATE) > 5   # measured 9.9 dB: the lost band


def test_dnsmos_hears_noise_on_real_speech(speech_9s):
    clean, noisy = gates.dnsmos(speech_9s, RATE), gates.dnsmos(with_noise(speech_9s, 10), RATE)
    assert set(clean) == set(gates.DNSMOS_COLUMNS)
    assert all(1 <= v <= 5 for v in (*clean.values(), *noisy.values()))
    # measured: OVRL 3.33 clean, 2.24 at 10 dB; the background score falls furthest
    assert clean["dnsmos_ovrl"] > noisy["dnsmos_ovrl"] + 0.5
    assert clean["dnsmos_bak"] > noisy["dnsmos_bak"] + 1.0


@pytest.mark.slow
def test_dnsmos_is_speechmos_own_p835_score(speech, monkeypatch):
    """Our DNSMOS is the package's: speechmos.dnsmos.run on the same 16 kHz audio gives the same SIG, BAK and
    OVRL. Its module imports librosa and requests for the P.808 score it also computes; they are stood in for
    here (its P.808 input is then meaningless, and that score is not compared)."""
    librosa = types.SimpleNamespace(feature=types.SimpleNamespace(melspectrogram=lambda **kw: np.zeros((120, 900))),
                                    power_to_db=lambda spec, ref=None: spec)
    monkeypatch.setitem(sys.modules, "librosa", librosa)
    monkeypatch.setitem(sys.modules, "requests", types.SimpleNamespace(session=None))
    monkeypatch.delitem(sys.modules, "speechmos.dnsmos", raising=False)
    from speechmos import dnsmos as package

    monkeypatch.setattr(package, "dnsmos", None)
    # 4.4 s, doubled to 17.6 s by the package's rule: 8 segments, of which its floating-point bounds drop the 8th
    audio = np.clip(gates.resample(speech, RATE, gates.PESQ_RATE), -1, 1).astype(np.float32)
    theirs = package.run(audio, gates.PESQ_RATE)
    ours = gates.dnsmos(speech, RATE)
    for name in ("sig", "bak", "ovrl"):
        assert ours[f"dnsmos_{name}"] == pytest.approx(float(theirs[f"{name}_mos"]), abs=1e-9)


def test_dnsmos_opens_one_session_and_remembers_a_render(speech_9s, monkeypatch):
    first = gates.dnsmos(with_noise(speech_9s, 25, seed=7), RATE, threads=1)
    session = gates._dnsmos_sessions[1]
    gates.dnsmos(with_noise(speech_9s, 25, seed=8), RATE, threads=1)
    assert gates._dnsmos_sessions[1] is session
    # the same audio again is not run again
    monkeypatch.setattr(gates, "_dnsmos_session", lambda threads: pytest.fail("scored twice"))
    assert gates.dnsmos(with_noise(speech_9s, 25, seed=7), RATE, threads=1) == first


def test_perceptual_gives_the_named_columns(speech_9s):
    noisy = with_noise(speech_9s, 30)
    row = gates.perceptual(speech_9s, noisy, RATE)
    assert tuple(row) == gates.PERCEPTUAL_COLUMNS
    assert row["dnsmos_ovrl_ref"] == gates.dnsmos(speech_9s, RATE)["dnsmos_ovrl"]
    assert row["dnsmos_ovrl"] < row["dnsmos_ovrl_ref"]
    assert tuple(gates.perceptual(speech_9s, noisy, RATE, absolute=False)) == gates.RELATIVE_COLUMNS


# --- sample rates ---------------------------------------------------------------------------------
def test_a_render_scores_alike_at_its_rate_and_resampled(speech):
    """22.05 kHz and the same renders at 24 and 16 kHz: PESQ and STOI score the band they share."""
    noisy = with_noise(speech, 20)
    at_own = gates.pesq_wb(speech, noisy, RATE), gates.stoi(speech, noisy, RATE)
    for rate in (24000, 16000):
        a, b = gates.resample(speech, RATE, rate), gates.resample(noisy, RATE, rate)
        assert abs(a.size - speech.size * rate / RATE) <= 1
        assert gates.pesq_wb(a, b, rate) == pytest.approx(at_own[0], abs=0.1)
        assert gates.stoi(a, b, rate) == pytest.approx(at_own[1], abs=0.01)


def test_resample_reduces_the_ratio():
    x = voiced(1.0)
    assert gates.resample(x, RATE, RATE) is not x and np.array_equal(gates.resample(x, RATE, RATE), x)
    assert gates.resample(x, 24000, 16000).size == math.ceil(x.size * 2 / 3)


def test_rates_pesq_cannot_score_are_refused():
    x = voiced(1.0, rate=8000)
    with pytest.raises(ValueError, match="16 kHz or more"):
        gates.pesq_wb(x, x, 8000)
    with pytest.raises(ValueError, match="positive integer"):
        gates.pesq_wb(x, x, 22050.5)


# --- edge cases -----------------------------------------------------------------------------------
def test_different_lengths_are_refused_like_snr():
    x = voiced()
    for score in (gates.pesq_wb, gates.stoi, gates.log_mel_distance, gates.perceptual):
        with pytest.raises(ValueError, match="trim or align"):
            score(x, x[:-1], RATE)


def test_too_short_clips_are_refused_or_score_nan():
    x = voiced(0.2)
    with pytest.raises(ValueError, match="at least 0.25 s"):
        gates.pesq_wb(x, x, RATE)
    y = voiced(0.3)
    assert math.isnan(gates.stoi(y, y, RATE))  # under STOI's 30 voiced frames: no score, not pystoi's 1e-5


def test_silence():
    x, quiet = voiced(), np.zeros(int(2.0 * RATE))
    assert gates.pesq_wb(x, quiet, RATE) == gates.PESQ_WB_MIN
    assert gates.stoi(x, quiet, RATE) == 0.0
    for score in (gates.pesq_wb, gates.stoi, gates.log_mel_distance):
        with pytest.raises(ValueError, match="reference render is silent"):
            score(quiet, x, RATE)
    assert all(math.isnan(v) for v in gates.dnsmos(quiet, RATE).values())
    row = gates.perceptual(x, quiet, RATE)  # a decode that lost everything is a row, not a crash
    assert row["pesq_wb"] == gates.PESQ_WB_MIN and row["stoi"] == 0.0 and math.isnan(row["dnsmos_ovrl"])
    with pytest.raises(ValueError, match="empty"):
        gates.dnsmos(np.zeros(0), RATE)


def test_non_finite_renders_are_refused():
    x = voiced()
    y = x.copy()
    y[100] = np.nan
    with pytest.raises(ValueError, match="NaN or inf"):
        gates.perceptual(x, y, RATE)
    with pytest.raises(ValueError, match="NaN or inf"):
        gates.dnsmos(y, RATE)


def test_a_missing_scorer_names_the_extra_that_installs_it(monkeypatch):
    x = voiced()
    monkeypatch.setitem(sys.modules, "pystoi", None)
    with pytest.raises(ModuleNotFoundError, match=r"pystoi==0.4.1: pip install -e '.\[converter\]'"):
        gates.stoi(x, x, RATE)
