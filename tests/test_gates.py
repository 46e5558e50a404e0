import math

import numpy as np
import pytest

from rkstudy import gates


def tone(n=22050, f=220.0, sr=22050):
    return np.sin(2 * np.pi * f * np.arange(n) / sr).astype(np.float32)


def test_snr_of_known_noise_power():
    ref = tone()
    rng = np.random.default_rng(0)
    noise = rng.standard_normal(ref.size)
    noise *= np.sqrt(np.mean(ref.astype(np.float64) ** 2) / 1000.0 / np.mean(noise**2))  # 30 dB below
    assert gates.snr_db(ref, ref + noise) == pytest.approx(30.0, abs=1e-6)


def test_identical_signals_are_infinite_snr():
    ref = tone()
    assert gates.snr_db(ref, ref) == math.inf
    assert np.all(np.isinf(gates.slice_snr_db(ref, ref)))


def test_length_mismatch_is_one_clear_error():
    with pytest.raises(ValueError, match="trim or align"):
        gates.snr_db(np.zeros(10), np.zeros(11))


def test_slice_snr_finds_the_damaged_slice():
    ref = tone(256 * 10)
    test = ref.copy()
    test[3 * 256 + 10] += 0.5  # one click in slice 3
    s = gates.slice_snr_db(ref, test)
    assert s.shape == (10,)
    assert np.argmin(s) == 3
    assert np.isinf(np.delete(s, 3)).all()
    summary = gates.slice_snr_summary(ref, test)
    assert summary["median_slice_snr_db"] == math.inf
    assert summary["min_slice_snr_db"] == pytest.approx(s[3])


def test_the_slice_summary_scores_whole_audible_slices_only():
    ref = np.concatenate([tone(256 * 8), np.full(256 * 2, 1e-5), tone(100)])   # speech, a quiet pause, a tail
    test = ref + np.concatenate([np.full(256 * 8, 1e-3), np.full(256 * 2 + 100, 1e-4)])
    every = gates.slice_snr_db(ref, test)
    assert every.size == 11 and every.min() < -15  # the pause's slices: the ratio of two noise floors
    summary = gates.slice_snr_summary(ref, test)
    assert summary["min_slice_snr_db"] == pytest.approx(every[:8].min()) and summary["min_slice_snr_db"] > 40
    assert math.isnan(gates.slice_snr_summary(np.full(300, 1e-6), np.zeros(300))["min_slice_snr_db"])


def test_best_lag_recovers_a_shift():
    rng = np.random.default_rng(1)
    ref = rng.standard_normal(4000)
    late = np.concatenate([np.zeros(37), ref[:-37]])
    early = np.concatenate([ref[12:], np.zeros(12)])
    assert gates.best_lag(ref, late) == 37
    assert gates.best_lag(ref, early) == -12
    assert gates.best_lag(ref, ref) == 0


def test_max_step_nonfinite_rms_ratio():
    x = np.array([0.0, 0.1, -0.4, 0.2])
    assert gates.max_step(x) == pytest.approx(0.6)
    assert gates.nonfinite_count(np.array([1.0, np.nan, np.inf, -np.inf])) == 3
    ref = tone()
    assert gates.rms_ratio(ref, ref / 4) == pytest.approx(0.25)


def test_envelope_corr_tracks_prosody_not_phase():
    sr = 16000
    t = np.arange(sr) / sr
    env = 0.5 + 0.5 * np.sin(2 * np.pi * 3 * t)
    a = env * np.sin(2 * np.pi * 200 * t)
    b = env * np.sin(2 * np.pi * 200 * t + 1.3)  # same envelope, different phase: low SNR
    c = env[::-1] * np.sin(2 * np.pi * 200 * t)
    assert gates.snr_db(a, b) < 3
    assert gates.envelope_corr(a, b, sr) > 0.99
    assert gates.envelope_corr(a, c, sr) < 0.5


def test_gate_records_and_raises():
    g = gates.Gate("window_snr", 40.0)
    assert g.row(41.0) == {"gate": "window_snr", "measured": 41.0, "threshold": 40.0, "unit": "dB",
                           "passed": True}
    assert g.check(40.0)["passed"]
    with pytest.raises(gates.GateFailed, match=r"'window_snr' failed \(tail\): measured 39.5 dB, needs ≥ 40 dB"):
        g.check(39.5, context="tail")
    lines = gates.Gate("regtask", 100_000, unit="lines", at_least=False)
    assert lines.passes(0) and not lines.passes(100_001)
    assert not g.passes(float("nan"))


@pytest.mark.parametrize("row, verdict", [
    ({"status": "ok", "target": "rk3588", "regtask": 0, "regtask_max_value": 0}, "clean"),
    ({"status": "ok", "target": "rk3588", "regtask": "0", "regtask_max_value": "0", "nonfinite": "0"}, "clean"),
    ({"status": "failed", "regtask": 0}, "not built: failed"),
    ({"snr_db": 40.0}, "not an engine row"),
    # the Piper 93-frame rk3588 build: lines past the 13-bit field, below the known-bad magnitude
    ({"status": "ok", "target": "rk3588", "regtask": 18, "regtask_max_value": 16352},
     "at risk: 18 REGTASK lines, largest field value 16,352 (field limit 8,191): the simulator does not model "
     "the overflow"),
    # rk3576 prints a 14-bit limit: the same value is inside its field
    ({"status": "ok", "target": "rk3576", "regtask": 14, "regtask_max_value": 16352},
     "at risk: 14 REGTASK lines, largest field value 16,352: the simulator does not model the overflow"),
    ({"status": "ok", "target": "rk3588", "regtask": 0, "regtask_max_value": 0, "nonfinite": 337942},
     "at risk: 337,942 non-finite outputs (fp16 range)"),
    ({"status": "ok", "target": "rk3588", "regtask": 0, "sim_max_abs": 60000.0},
     "at risk: an output reaches 6e+04, within 2x of the fp16 limit 65504"),
])
def test_board_risk_reads_what_the_compiler_logged(row, verdict):
    assert gates.board_risk(row) == verdict


def test_a_field_value_past_the_known_bad_one_is_known_bad():
    verdict = gates.board_risk({"status": "ok", "target": "rk3588", "regtask": 62031, "regtask_max_value": 30869})
    assert verdict.startswith("known bad on a board: field value 30,869 (62,031 REGTASK lines) is at or past "
                              "0x7800 = 30,720")
    assert "-27 dB" in verdict and "RKNN decoder-path document" in verdict
