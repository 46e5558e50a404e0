"""Every function that writes a committed table, on a small case with numeric assertions."""

import numpy as np
import pytest

from rkstudy.families.piper_decoder import study as pd
from rkstudy.families.piper_encoder import study as es
from rkstudy.families.piper_encoder.sidecar import FALLBACK


class Lat:
    def __init__(self, frames):
        self.frames, self.z, self.g = frames, None, None


def test_rtf_rows_time_each_path_and_ratio_to_the_first(monkeypatch):
    """A fake clock that each path advances by a known cost: the rows must report exactly that."""
    now = [0.0]
    monkeypatch.setattr(pd.time, "perf_counter", lambda: now[0])

    def cost(seconds_per_frame):
        def run(lat):
            now[0] += seconds_per_frame * lat.frames
        return run

    lats = [Lat(100), Lat(72)]  # 172 frames x 256 / 22050 = 1.9969 s of audio
    paths = (("monolithic", cost(0.001), 1.0), ("windowed", cost(0.0025), 2.07))
    rows = pd.rtf_rows(paths, lats, hop=256, sample_rate=22050, repeats=3, where="fp32")
    audio_s = 172 * 256 / 22050
    assert [r["path"] for r in rows] == ["monolithic", "windowed"]
    assert rows[0]["rtf"] == pytest.approx(0.172 / audio_s) and rows[1]["rtf"] == pytest.approx(0.43 / audio_s)
    assert rows[1]["ratio_vs_monolithic"] == pytest.approx(2.5) and rows[0]["ratio_vs_monolithic"] == 1.0
    assert rows[0]["seconds_audio"] == 2.0 and rows[1]["decode_s"] == 0.43
    assert rows[1]["compute_bound"] == 2.07 and {r["where"] for r in rows} == {"fp32"}


def test_sweep_summary_takes_min_median_max_per_kind():
    rows = [{"window": 93, "emit": 45, "context": 24, "kind": k, "snr_db": s, "where": "fp32"}
            for k, s in (("interior", 90.0), ("interior", 100.0), ("interior", 80.0), ("end", 120.0))]
    out = {r["kind"]: r for r in pd.sweep_summary(rows)}
    assert (out["interior"]["min_snr_db"], out["interior"]["median_snr_db"], out["interior"]["windows"]) == (80, 90, 3)
    assert out["end"]["max_snr_db"] == 120 and "padded" not in out


def test_per_window_rows_score_each_emitted_span():
    hop, n = 4, 100
    ref = np.sin(np.arange(n * hop) / 7.0)
    test = ref.copy()
    test[60 * hop: 61 * hop] += 0.1  # one frame off, inside window 1 (emits 45..89)
    rows = pd.per_window_rows(ref, test, n, emit=45, context=24, hop=hop)
    assert [r["kind"] for r in rows] == ["start", "end", "end"]
    assert rows[0]["snr_db"] == np.inf and np.isfinite(rows[1]["snr_db"]) and rows[2]["snr_db"] == np.inf


def test_growth_fit_recovers_a_known_exponent():
    base = 30e6
    rows = [{"frames": n, "status": "ok", "engine_bytes": base + 50.0 * n ** 2.5,
             "onnx_initializer_bytes": 2 * base + n ** 2} for n in (64, 96, 128, 192)]
    rows.append({"frames": 320, "status": "aborted", "engine_bytes": 0, "onnx_initializer_bytes": 0})
    engine, onnx_row = es.growth_rows(rows, int(base))
    assert engine["widths"] == "64,96,128,192"  # the failed build is left out of the fit
    assert engine["exponent_over_weights"] == pytest.approx(2.5, abs=1e-6)
    assert 0 < engine["exponent_total"] < 2.5
    assert onnx_row["exponent_over_weights"] == pytest.approx(2.0, abs=1e-6)


def test_drift_rows_measure_a_known_perturbation(voice):
    """Conditioning scaled by 1.5 must move the frames; the same conditioning must not: so an
    all-zero drift column cannot pass by accident."""
    from rkstudy.families.piper import voice as piper
    from rkstudy.families.piper_encoder.seam import encoder_slice
    from rkstudy.runtime import OrtRunner

    chunks = [("Hello there, how are you today?", voice.sentences("Hello there, how are you today?")[0])]
    cond = OrtRunner(encoder_slice(voice.model)).run(piper.ids_feed(chunks[0][1]))[1]
    outputs = {1: {0: (None, cond)}, 2: {0: (None, cond * 1.5)}}
    rows = {r["frames"]: r for r in es.drift_rows(voice, chunks, outputs)}
    assert rows[1]["drift_pct"] == 0.0 and rows[1]["test_frames"] == rows[1]["fp32_frames"]
    assert abs(rows[2]["drift_pct"]) > 1.0
    assert rows[1]["fp32_reseed_pct"] != 0.0  # the flow's own sampling scale is measured too
    summary = {r["frames"]: r for r in es.drift_summary(list(rows.values()))}
    assert summary[2]["abs_drift_mean_pct"] == pytest.approx(abs(rows[2]["drift_pct"]))


def test_ladder_summary_counts_chunks_per_rung():
    rows = [{"tokens": t, "ran_on": w, "drift_pct": d, "where": "simulator", "target": "rk3588"}
            for t, w, d in ((100, "n128", 1.0), (120, "n128", -2.0), (150, "n192", 0.5), (225, FALLBACK, 0.0))]
    out = es.ladder_summary(rows, key="ran_on")
    assert [(r["lands"], r["chunks"], r["tokens_min"], r["tokens_max"]) for r in out] == [
        ("n128", 2, 100, 120), ("n192", 1, 150, 150), (FALLBACK, 1, 225, 225)]
    assert (out[0]["drift_min_pct"], out[0]["drift_max_pct"]) == (-2.0, 1.0)
    assert "npu_ms_predicted" not in out[0]   # plan rows carry no prediction


def test_the_ladder_states_each_rungs_predicted_npu_time():
    """Each rung's prediction comes from its engine's build (the recorded layer table of the encoder window
    the fixtures hold stands in for the rung's log); the summary gives the per-call time and the rung's chunks'
    total, and the fallback's rows say why they have none."""
    from types import SimpleNamespace

    from rkstudy.families.piper_encoder.sidecar import LadderEngine
    from rkstudy.toolkit import cost

    made = cost.Prediction("rk3588", "0_1_2", 3, cost.Basis(conv_ms=2.0, dram_gbps=27.9, elementwise_bytes=0,
                                                           compute_layers=10, cpu_host_ms=0.5, io_host_ms=0.25),
                           cost.Constants(0.1, 100.0, 2.0))
    contract = SimpleNamespace(params={"width": 128}, inputs=[SimpleNamespace(axis=1)], shape_sets=[[(1, 128), (1,)]])
    rung = LadderEngine(SimpleNamespace(report=SimpleNamespace(prediction=lambda: made)), contract)
    rungs = es.rung_predictions([rung])
    assert list(rungs) == ["n128"] and rungs["n128"]["npu_ms_predicted"] == pytest.approx(2.0 + 1.0 + 1.0 + 0.5)
    fallback = es._fallback_cost()
    assert fallback["npu_cost_note"] == "cannot speak: the fp32 fallback runs on this host's CPU, not on the NPU"
    rows = [{"tokens": t, "ran_on": w, "where": "simulator", "target": "rk3588",
             **(rungs[w] if w in rungs else fallback)} for t, w in ((100, "n128"), (120, "n128"), (225, FALLBACK))]
    out = {r["lands"]: r for r in es.ladder_summary(rows, key="ran_on")}
    assert (out["n128"]["npu_ms_predicted"], out["n128"]["npu_ms_predicted_chunks"]) == (4.5, 9.0)
    assert out[FALLBACK]["npu_ms_predicted_chunks"] == "" and out[FALLBACK]["npu_cost_note"].startswith("cannot")


def test_sensitivity_summary_groups_by_snr():
    rows = [{"snr_db": s, "drift_pct": d} for s, d in ((30.0, 3.0), (30.0, -5.0), (60.0, 0.1))]
    out = es.sensitivity_summary(rows)
    assert [(r["snr_db"], r["runs"], r["abs_drift_mean_pct"]) for r in out] == [(30.0, 2, 4.0), (60.0, 1, 0.1)]


@pytest.mark.simulator
def test_mask_upsampler_rows(voice):
    (lat,) = voice.latents("Call me at 555 0142, extension 7.")
    rows = {r["upsampler"]: r for r in pd.mask_upsampler(voice, lat.z, "rk3588", frames=47)}
    for r in rows.values():
        assert r["fp32_vs_full_db"] > 100 and 25 < r["simulator_vs_fp32_db"] < 80
        assert (r["where"], r["target"]) == ("simulator", "rk3588")
    # the switch reaches the compiled graph, and the two engines still compute the same audio to the bit
    assert rows["convtranspose"]["slice_mask_ops"] == "3 ConvTranspose"
    assert rows["convtranspose"]["compiled_mask_layers"] == "3 ConvTranspose NPU"
    assert rows["resize"]["slice_mask_ops"] == "3 Resize"
    assert rows["resize"]["compiled_mask_layers"].startswith("3 Resize NPU, ")
    assert "Transpose" in rows["resize"]["compiled_mask_layers"]
    assert rows["resize"]["fp32_max_abs_diff_vs_convtranspose"] == 0.0
    assert rows["resize"]["simulator_max_abs_diff_vs_convtranspose"] == 0.0
    assert rows["convtranspose"]["simulator_vs_fp32_db"] == rows["resize"]["simulator_vs_fp32_db"]


@pytest.mark.simulator
def test_simulator_fidelity_rows(voice):
    (lat,) = voice.latents("Thank you very much for calling.")
    got = pd.simulator_fidelity(voice, [lat], "rk3588")
    rows = {r["reference"]: r for r in got["rows"]}
    assert set(rows) == {"fp32 window walk", "fp32 full-length decode"}
    for r in rows.values():
        assert 30 < r["snr_db"] < 80 and r["best_lag"] == 0 and r["nonfinite"] == 0 and r["frames"] == lat.frames
        assert r["pesq_wb"] > 4.3 and r["stoi"] > 0.99  # the fp16 engine is transparent on real speech
    n_windows = len([w for w in got["windows"] if w["reference"] == "fp32 window walk"])
    assert n_windows == len(pd.plan_windows(lat.frames, 45, 24)) and got["build"].regtask == 18
