"""The toolchain study's measurements (host): what notebook 00 calls."""

from __future__ import annotations

import numpy as np
from tqdm.auto import tqdm

from ... import gates
from ...graph import REGISTER_FIELD_MAX
from ...process import shows_progress
from ...toolkit.build import BuildFailed, build_engine
from ...toolkit.calibration import Calibration
from ...toolkit.convert import simulator_vs_fp32
from ...toolkit.probes import long_axis_probe, save_probe, vocoder_probe

SNR_GATE = gates.Gate("simulator_vs_fp32_probe", 40.0)  # the reference documents' export gates sit at 40 dB and up


def _probe_simulated(target: str, frames: int = 64, seed: int = 1):
    """The vocoder probe built for `target` (verbose) and run in the simulator and in onnxruntime on
    one input, through the shared engine and simulator cache: the build row, the simulator row and
    the lint study's placement of the same graph and input all read this one build."""
    path = save_probe(vocoder_probe(frames=frames), f"vocoder_probe_t{frames}")
    x = np.random.default_rng(seed).standard_normal((1, 16, 1, frames)).astype(np.float32)
    return simulator_vs_fp32(path, target, [{"x": x}], keep=True, cache=True, verbose=True,
                             compare=lambda ref, test, _: gates.compare(ref[0], test[0]))


def simulate_probe(target: str, frames: int = 64, seed: int = 1) -> tuple[dict, np.ndarray, np.ndarray]:
    """Build the vocoder probe for `target`, run it in the simulator and in onnxruntime on the
    same input, gate the SNR. Returns (results row, fp32 output, simulator output)."""
    sim = _probe_simulated(target, frames, seed)
    ref, test = sim.fp32[0][0].ravel(), sim.simulator[0][0].ravel()
    r = sim.rows[0]
    row = {"graph": "vocoder_probe", "frames": frames, "build_s": round(sim.report.seconds, 1),
           "regtask": sim.report.regtask,
           **{k: r[k] for k in ("snr_db", "median_slice_snr_db", "best_lag", "nonfinite", "rms_ratio")},
           **SNR_GATE.check(r["snr_db"], context=f"vocoder probe on {target}"),
           "where": r["where"], "target": r["target"]}
    return row, ref, test


def build_probe(target: str) -> dict:
    """Compile the vocoder probe to an engine file and report it (the build simulate_probe runs)."""
    report = _probe_simulated(target).report.raise_for_status()
    return {"graph": "vocoder_probe", **report.row()}


def regtask_row(length: int, target: str, channels: int = 256, simulate: bool = True) -> dict:
    """Build the long-axis probe at `length` (verbose), count the compiler's REGTASK lines and, with
    `simulate`, score the simulator against onnxruntime on the same graph, in the same child: one
    build per (length, target), kept in the shared engine and simulator cache, where the lint study's
    cases and placement of the same graphs find it.

    256 channels, because the overflow depends on the conv's tiling and not on the axis alone:
    the same 30720-frame conv at 64 channels logs nothing.
    """
    path = save_probe(long_axis_probe(length, channels=channels), f"long_axis_c{channels}_t{length}")
    sim = None
    if simulate:
        x = np.random.default_rng(0).standard_normal((1, channels, length)).astype(np.float32)
        try:
            sim = simulator_vs_fp32(path, target, [[x]], cache=True, verbose=True)
            report = sim.report
        except BuildFailed as exc:  # a REGTASK-limit kill or a timeout is a row of the sweep
            if exc.report is None:
                raise
            report = exc.report
    else:
        report = build_engine(path, target, verbose=True)
    row = {"graph": "long_axis_probe", "channels": channels, "length": length,
           "past_13_bit_field": length > REGISTER_FIELD_MAX, **report.row()}
    if simulate:
        row["simulator_snr_db"] = float("nan")  # stays nan when the build did not produce an engine
    if sim is not None:
        row["simulator_snr_db"], row["where"] = sim.rows[0]["snr_db"], sim.rows[0]["where"]
    return row


def regtask_sweep(lengths, targets, channels: int = 256, progress: bool = True) -> list[dict]:
    """regtask_row for every target and length (one build and one simulator run each)."""
    jobs = [(t, n) for t in targets for n in lengths]
    return [regtask_row(n, t, channels) for t, n in tqdm(jobs, desc="builds", disable=not shows_progress(progress))]


# --- how to read a perceptual score: one speech render, scored at both ends ----------------------------
CALIBRATION_TARGET = "rk3588"
NOISE_SNRS_DB = (40, 30, 20, 10)


def white_noise(x: np.ndarray, snr_db: float, seed: int = 0) -> np.ndarray:
    """`x` plus seeded white noise whose power sits `snr_db` below the render's mean power."""
    noise = np.random.default_rng(seed).standard_normal(x.size)
    noise *= np.sqrt(np.mean(x.astype(np.float64) ** 2) / 10 ** (snr_db / 10) / np.mean(noise**2))
    return x + noise


def low_pass(x: np.ndarray, rate: int, cutoff_hz: float = 4000.0) -> np.ndarray:
    """An 8th-order Butterworth low-pass, run forward and back (no delay): a dull render, half of the band
    PESQ-WB hears gone."""
    from scipy.signal import butter, sosfiltfilt

    return sosfiltfilt(butter(8, cutoff_hz, fs=rate, output="sos"), x)


def mu_law_8bit(x: np.ndarray, mu: int = 255) -> np.ndarray:
    """G.711-style mu-law at 8 bits (256 levels), at full scale (the render's peak mapped to 1)."""
    peak = float(np.max(np.abs(x))) or 1.0
    u = x / peak
    code = np.round((np.sign(u) * np.log1p(mu * np.abs(u)) / np.log1p(mu) + 1) / 2 * 255) / 255 * 2 - 1
    return np.sign(code) * ((1 + mu) ** np.abs(code) - 1) / mu * peak


def seam_dropouts(x: np.ndarray, hop: int, every: int) -> np.ndarray:
    """One latent frame (`hop` samples) zeroed at every `every`-frame seam: the clicks a window walk that
    loses a frame at each seam would voice."""
    y = np.array(x, dtype=np.float64, copy=True)
    for start in range(every * hop, y.size, every * hop):
        y[start:start + hop] = 0.0
    return y


def score_row(render: str, what: str, ref: np.ndarray, test: np.ndarray, rate: int) -> dict:
    """One calibration row: the pair's SNR, every perceptual column, and the test render's DNSMOS parts."""
    parts = gates.dnsmos(test, rate)
    return {"render": render, "what": what, "snr_db": gates.snr_db(ref, test), **gates.perceptual(ref, test, rate),
            "dnsmos_sig": parts["dnsmos_sig"], "dnsmos_bak": parts["dnsmos_bak"], "seconds_audio": ref.size / rate}


def perceptual_calibration(quick: bool, target: str = CALIBRATION_TARGET, progress: bool = True) -> list[dict]:
    """The perceptual scores of known renders of one piece of real speech, so a reader can place any row:
    the Piper voice's 93-frame decoder window walked over its own latents in onnxruntime fp32 (the
    reference), against the same walk on the real fp16 engine and on an int8 w8a8 engine in the `target`
    simulator (the engine's cost alone), and against known degradations of the reference: white noise at
    40/30/20/10 dB SNR, a 4 kHz low-pass, 8-bit mu-law, and one frame dropped at every window seam.

    The engines are the Piper decoder's quantization lever stage (rkstudy.families.piper_decoder.study.
    quantization_stage, built as notebook 08 builds it): full mode scores the held-apart texts `short` and
    `phone` (int8 calibrated on 16 windows of `paragraph`), quick mode `phone` (int8 calibrated on `short`).
    Their renders are scored back to back, as one clip. An engine row carries its REGTASK count (and so its
    board risk); a degradation row has none (`not an engine row`)."""
    from ...levers.quantization.bench import Bench
    from ..piper.voice import Voice
    from ..piper_decoder.study import quantization_stage

    voice = Voice()
    stage = (quantization_stage(voice, calibration_texts=("short",), evaluation_texts=("phone",)) if quick
             else quantization_stage(voice, calibration_windows=16))
    bench = Bench(stage, target, listen=False,
                  progress=(lambda say: tqdm.write(say)) if shows_progress(progress) else None)
    plain = Calibration(stage.calibration)  # every calibration window, min/max, per channel: the toolkit's defaults
    engine_rows = [bench.build("fp16"), bench.build(plain.label, plain)]
    ref = np.concatenate(stage.outputs["fp32"]).astype(np.float64)
    rate, hop = voice.sample_rate, voice.hop
    texts = stage.texts["evaluation"]
    rows = []
    for built in engine_rows:
        test = np.concatenate(stage.outputs[built["setting"]]).astype(np.float64)
        rows.append({**score_row(f"{built['setting']} engine", f"the 93-frame window walked on the {target} "
                                 f"simulator ({built['dtype']}), texts {texts}", ref, test, rate),
                     "regtask": built["regtask"], "where": built["where"], "target": built["target"]})
    known = [*((f"white noise {snr} dB", f"white noise {snr} dB below the render's power", white_noise(ref, snr))
               for snr in NOISE_SNRS_DB),
             ("low-pass 4 kHz", "8th-order Butterworth at 4 kHz, zero phase", low_pass(ref, rate)),
             ("mu-law 8-bit", "G.711-style mu-law, 256 levels at full scale", mu_law_8bit(ref)),
             ("seam dropouts", "one frame (256 samples) zeroed at every 45-frame window seam",
              seam_dropouts(ref, hop, every=45))]
    for render, what, test in tqdm(known, desc="degradations", disable=not shows_progress(progress)):
        rows.append({**score_row(render, what, ref, test, rate), "regtask": "", "where": "fp32", "target": "none"})
    return rows
