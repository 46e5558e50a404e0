"""Signal metrics and pass/fail gates.

Every NPU number in this project is a tolerance against a CPU reference, never a bit-exact claim:
the fp16 engines differ from fp32 (and, on RK3588, per NPU core), so a gate is a metric plus a
threshold, and its measured value is recorded next to the threshold whether it passes or not.

Two renders of speech are scored twice: by SNR (rkstudy.gates.snr_db: where the samples differ) and by what
a listener would judge (rkstudy.gates.perceptual: PESQ wide-band, STOI, a log-mel distance and DNSMOS P.835),
because a waveform SNR penalises a delay or a phase change nobody hears and can pass a buzz everybody does.

Board side: numpy only at import time. The perceptual scorers import pesq, pystoi, scipy and onnxruntime
inside the functions: the converter extra has them all; the board extra has pystoi and scipy, for the board
gate's STOI (rkstudy.board.gate), and pesq where a board compiled it.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from math import exp, gcd

import numpy as np

from .errors import Failed

SLICE = 256  # samples per slice for the per-slice SNR, as the reference documents measure it


def _pair(ref, test) -> tuple[np.ndarray, np.ndarray]:
    ref = np.asarray(ref, dtype=np.float64).ravel()
    test = np.asarray(test, dtype=np.float64).ravel()
    if ref.shape != test.shape:
        raise ValueError(f"reference has {ref.size} samples and test has {test.size}; "
                         "trim or align them (see best_lag) before comparing")
    return ref, test


def _snr(signal_energy, noise_energy):
    # An exact match has no noise: +inf dB, which tables show as "inf" and every gate passes.
    with np.errstate(divide="ignore", invalid="ignore"):
        out = 10.0 * np.log10(signal_energy / noise_energy)
    return np.where(noise_energy == 0, np.inf, out)


def snr_db(ref, test) -> float:
    """Global SNR of `test` against `ref` in dB: 10·log10(Σref² / Σ(ref−test)²)."""
    ref, test = _pair(ref, test)
    return float(_snr(np.sum(ref**2), np.sum((ref - test) ** 2)))


def slice_snr_db(ref, test, size: int = SLICE) -> np.ndarray:
    """SNR of each `size`-sample slice (the last partial slice included).

    The global SNR is dominated by the loudest passages; per-slice values show where a
    decode departs (near-silence sits at the fp16 noise floor, a seam shows as one dip).
    """
    ref, test = _pair(ref, test)
    if size <= 0:
        raise ValueError(f"slice size must be positive, got {size}")
    edges = np.arange(0, ref.size, size)
    sig = np.add.reduceat(ref**2, edges) if ref.size else np.zeros(0)
    err = np.add.reduceat((ref - test) ** 2, edges) if ref.size else np.zeros(0)
    return _snr(sig, err)


SILENT_SLICE_DBFS = -60.0  # a slice of the reference quieter than this is silence: its SNR is the noise floor's


def slice_snr_summary(ref, test, size: int = SLICE) -> dict[str, float]:
    """Median and minimum per-slice SNR over the whole slices where the reference is audible (RMS above
    SILENT_SLICE_DBFS): a trailing partial slice, or a pause decoded to near-silence, scores the ratio of two
    noise floors (-6 dB at 88 dB global, measured), which names no departure of the decode. NaN when no slice is
    both whole and audible."""
    ref, test = _pair(ref, test)
    whole = ref.size // size
    s = slice_snr_db(ref[: whole * size], test[: whole * size], size)
    rms = np.sqrt(np.mean(ref[: whole * size].reshape(whole, size) ** 2, axis=1)) if whole else np.zeros(0)
    s = s[rms > 10 ** (SILENT_SLICE_DBFS / 20)]
    if not s.size:
        return {"median_slice_snr_db": float("nan"), "min_slice_snr_db": float("nan")}
    return {"median_slice_snr_db": float(np.median(s)), "min_slice_snr_db": float(np.min(s))}


def envelope(x, sample_rate: int, window_ms: float = 20.0) -> np.ndarray:
    """RMS envelope over consecutive `window_ms` windows (the last partial window dropped)."""
    x = np.asarray(x, dtype=np.float64).ravel()
    n = max(1, int(round(sample_rate * window_ms / 1000.0)))
    frames = x[: x.size // n * n].reshape(-1, n)
    return np.sqrt(np.mean(frames**2, axis=1))


def envelope_corr(ref, test, sample_rate: int, window_ms: float = 20.0) -> float:
    """Pearson correlation of the 20 ms RMS envelopes: prosody and timing agreement.

    Two valid syntheses of one text can score a negative SNR and still track each other's
    envelope; two that diverge in timing do not.
    """
    ref, test = _pair(ref, test)
    a, b = envelope(ref, sample_rate, window_ms), envelope(test, sample_rate, window_ms)
    if a.size < 2 or np.std(a) == 0 or np.std(b) == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


def best_lag(ref, test, max_lag: int = 1000) -> int:
    """Lag in samples (test relative to ref) that maximises their cross-correlation.

    Positive means `test` is late. Searched within ±max_lag via FFT correlation.
    """
    ref, test = _pair(ref, test)
    n = ref.size + test.size - 1
    size = 1 << (n - 1).bit_length()
    corr = np.fft.irfft(np.fft.rfft(test, size) * np.conj(np.fft.rfft(ref, size)), size)
    lags = np.concatenate([np.arange(0, max_lag + 1), np.arange(-max_lag, 0)])
    values = np.concatenate([corr[: max_lag + 1], corr[size - max_lag:]])
    return int(lags[int(np.argmax(values))])


def max_step(x) -> float:
    """Largest absolute sample-to-sample step: a click at a window seam shows up here."""
    x = np.asarray(x, dtype=np.float64).ravel()
    return float(np.max(np.abs(np.diff(x)))) if x.size > 1 else 0.0


def nonfinite_count(x) -> int:
    """NaN and ±inf count (an fp16 engine that saturates shows here before it shows as SNR)."""
    return int(np.size(x) - np.count_nonzero(np.isfinite(x)))


def rms_ratio(ref, test) -> float:
    """RMS(test) / RMS(ref): 0.25 is the reference documents' "4x low" wrong-seam decode."""
    ref, test = _pair(ref, test)
    r = np.sqrt(np.mean(ref**2))
    return float(np.sqrt(np.mean(test**2)) / r) if r > 0 else float("inf")


def compare(ref, test, sample_rate: int | None = None) -> dict[str, float]:
    """Every metric above for one ref/test pair, as a results-row fragment."""
    row = {"snr_db": snr_db(ref, test), **slice_snr_summary(ref, test),
           "best_lag": best_lag(ref, test), "max_step_ref": max_step(ref),
           "max_step_test": max_step(test), "nonfinite": nonfinite_count(test),
           "rms_ratio": rms_ratio(ref, test)}
    if sample_rate:
        row["envelope_corr"] = envelope_corr(ref, test, sample_rate)
    return row


# --- perceptual scores: what a listener would judge ----------------------------------------------
# Every pair of speech renders a study compares carries these columns beside its SNR, named once here.
# PESQ, STOI and the log-mel distance score `test` against `ref`; DNSMOS scores one render on its own
# (no reference), for the test render and for the reference itself.
RELATIVE_COLUMNS = ("pesq_wb", "stoi", "log_mel_db")
ABSOLUTE_COLUMNS = ("dnsmos_ovrl", "dnsmos_ovrl_ref")
PERCEPTUAL_COLUMNS = RELATIVE_COLUMNS + ABSOLUTE_COLUMNS
DNSMOS_COLUMNS = ("dnsmos_sig", "dnsmos_bak", "dnsmos_ovrl")  # what dnsmos() returns for one render

PESQ_RATE = 16000  # PESQ wide-band (ITU-T P.862.2) and DNSMOS are defined at 16 kHz only


def _pesq_mos_lqo(raw: float) -> float:
    # P.862.2's mapping from the raw PESQ score (-0.5 .. 4.5) to MOS-LQO
    return 0.999 + 4.0 / (1.0 + exp(-1.3669 * raw + 3.8224))


PESQ_WB_MAX = _pesq_mos_lqo(4.5)   # 4.644: identical signals
PESQ_WB_MIN = _pesq_mos_lqo(-0.5)  # 1.043: the scale's floor, returned for a silent test render
PESQ_MIN_SECONDS = 0.25            # shorter buffers the ITU code refuses
STOI_FRAMES = 30                   # STOI's 384 ms intermediate window: 30 frames of 128 samples at 10 kHz
LOG_MEL_BANDS = 80
LOG_MEL_FLOOR_DB = -80.0           # below the reference's loudest mel bin, both renders are floored here


def _host_module(name: str, dist: str):
    """`name` imported, or one error naming the converter extra that installs `dist`."""
    import importlib

    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as missing:
        if missing.name != name.split(".")[0]:
            raise
        raise ModuleNotFoundError(f"the perceptual scores need {dist}: pip install -e '.[converter]' "
                                  f"(or make venv)", name=missing.name) from None


def _perceptual_pair(ref, test, rate: int, who: str) -> tuple[np.ndarray, np.ndarray]:
    ref, test = _pair(ref, test)
    if int(rate) != rate or rate <= 0:
        raise ValueError(f"{who}: sample rate must be a positive integer in Hz, got {rate!r}")
    if not (np.all(np.isfinite(ref)) and np.all(np.isfinite(test))):
        raise ValueError(f"{who}: a render holds NaN or inf samples (count them with nonfinite_count); "
                         "a perceptual score of a broken render means nothing")
    if not np.any(ref):
        raise ValueError(f"{who}: the reference render is silent; there is nothing to score against")
    return ref, test


def resample(x, rate: int, to: int) -> np.ndarray:
    """`x` at `rate` resampled to `to` Hz by polyphase filtering (scipy.signal.resample_poly, the ratio
    reduced: 22050 -> 16000 is up 320, down 441; 24000 -> 16000 is up 2, down 3). Host only (scipy)."""
    resample_poly = _host_module("scipy.signal", "scipy").resample_poly
    x = np.asarray(x, dtype=np.float64).ravel()
    if rate == to:
        return x
    g = gcd(int(rate), int(to))
    return resample_poly(x, int(to) // g, int(rate) // g)


def pesq_wb(ref, test, rate: int) -> float:
    """PESQ wide-band (ITU-T P.862.2, MOS-LQO from PESQ_WB_MIN 1.04 to PESQ_WB_MAX 4.64) of `test`
    against `ref`, both at `rate` Hz, through the `pesq` package (the ITU reference code).

    P.862.2 is defined at 16 kHz, so both renders are resampled to 16 kHz first (`resample`: the
    Piper voices' 22050 Hz and Kokoro's and Qwen3's 24 kHz lose their band above 8 kHz; PESQ never
    hears it, the log-mel distance does). PESQ aligns the two renders in time and level itself, so a
    delay or a gain that wrecks the SNR costs little here.

    Refused (ValueError, naming why): renders of different lengths (as snr_db refuses them), a rate
    below 16 kHz (narrow-band audio has no wide-band score), a clip shorter than 0.25 s (the ITU code's
    minimum: score the whole utterance, not a window), a silent or voiceless reference. A silent
    test render against a voiced reference scores PESQ_WB_MIN, the floor of the scale.
    """
    itu = _host_module("pesq", "pesq==0.0.4")
    ref, test = _perceptual_pair(ref, test, rate, "PESQ-WB")
    if rate < PESQ_RATE:
        raise ValueError(f"PESQ-WB needs audio sampled at 16 kHz or more, got {rate} Hz")
    if ref.size / rate < PESQ_MIN_SECONDS:
        raise ValueError(f"PESQ-WB needs at least {PESQ_MIN_SECONDS} s of audio, got {ref.size / rate:.3f} s; "
                         "score the whole utterance, not one window")
    if not np.any(test):
        return PESQ_WB_MIN
    try:
        return float(itu.pesq(PESQ_RATE, resample(ref, rate, PESQ_RATE), resample(test, rate, PESQ_RATE), "wb"))
    except itu.NoUtterancesError:
        raise ValueError("PESQ-WB found no speech in the reference (its voice activity detector heard none); "
                         "score a render that holds speech") from None


def stoi(ref, test, rate: int) -> float:
    """STOI (short-time objective intelligibility, Taal et al. 2011: 0 .. 1, 1 for identical renders)
    of `test` against `ref` at `rate` Hz, through `pystoi` (which resamples to its 10 kHz itself and drops
    the frames 40 dB below the reference's loudest). It correlates short-time band envelopes, so it does
    not realign: a delay of a few milliseconds barely moves it, one of tens of milliseconds does.

    Refused (ValueError): renders of different lengths, a silent reference. A reference with fewer than 30
    voiced frames (384 ms of speech after silence removal: a one-word utterance such as "Hello." can be one)
    has no STOI and scores NaN (pystoi would return 1e-5 with a warning, a number that looks measured). A
    silent test render scores 0.
    """
    taal_stoi = _host_module("pystoi", "pystoi==0.4.1").stoi
    ref, test = _perceptual_pair(ref, test, rate, "STOI")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        score = float(taal_stoi(ref, test, int(rate)))
    if any("Not enough STFT frames" in str(w.message) for w in caught):
        return float("nan")
    return score


def _mel_filters(rate: int, n_fft: int, bands: int) -> np.ndarray:
    """Triangular filters on the HTK mel scale from 0 Hz to the Nyquist frequency, [bands, n_fft//2+1]."""
    mel = lambda f: 2595.0 * np.log10(1.0 + f / 700.0)
    hz = lambda m: 700.0 * (10.0 ** (m / 2595.0) - 1.0)
    edges = hz(np.linspace(0.0, mel(rate / 2.0), bands + 2))
    freqs = np.linspace(0.0, rate / 2.0, n_fft // 2 + 1)
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    return np.maximum(0.0, np.minimum((freqs - lo) / (mid - lo), (hi - freqs) / (hi - mid)))


def log_mel(x, rate: int, bands: int = LOG_MEL_BANDS) -> np.ndarray:
    """Mel power spectrogram [frames, bands] of `x`: 40 ms Hann frames every 10 ms, `bands` triangular
    mel bands from 0 Hz to the Nyquist frequency of `rate` (the band a 22.05 or 24 kHz vocoder writes, above
    PESQ's 8 kHz). Numpy only."""
    x = np.asarray(x, dtype=np.float64).ravel()
    win = max(16, int(round(0.040 * rate)))
    hop = max(1, win // 4)
    n_fft = 1 << (win - 1).bit_length()
    if x.size < win:
        x = np.pad(x, (0, win - x.size))
    frames = np.lib.stride_tricks.sliding_window_view(x, win)[::hop] * np.hanning(win)
    power = np.abs(np.fft.rfft(frames, n_fft, axis=1)) ** 2
    return power @ _mel_filters(rate, n_fft, bands).T


def log_mel_distance(ref, test, rate: int) -> float:
    """RMS over frames and mel bands of the difference of the two renders' log-mel spectra, in dB
    (rkstudy.gates.log_mel: 80 bands to the Nyquist frequency, 40 ms frames every 10 ms): 0 for identical
    renders, 6.02 for a render at twice the amplitude (where no bin sits at the floor). Bins more than 80 dB
    below the reference's loudest bin are floored there in both renders, so silence between words does not
    dominate. Unlike PESQ it hears the band above 8 kHz and a gain, and unlike SNR it ignores phase. Numpy
    only. Refused (ValueError): renders of different lengths, a silent reference."""
    ref, test = _perceptual_pair(ref, test, rate, "log-mel distance")
    a, b = log_mel(ref, int(rate)), log_mel(test, int(rate))
    floor = a.max() * 10.0 ** (LOG_MEL_FLOOR_DB / 10.0)
    diff = 10.0 * (np.log10(np.maximum(a, floor)) - np.log10(np.maximum(b, floor)))
    return float(np.sqrt(np.mean(diff**2)))


# DNSMOS P.835 (Reddy et al. 2022) as the speechmos package computes it: its sig_bak_ovr.onnx on 9.01 s
# segments every second at 16 kHz (a shorter clip doubled until it is long enough), each segment's raw
# outputs through the package's polynomials, averaged. The package's own module imports librosa (for the
# P.808 model it also runs) and requests; the P.835 scores need neither, so only its model file is read.
DNSMOS_SEGMENT_S = 9.01
_DNSMOS_POLY = {"sig": (-0.08397278, 1.22083953, 0.0052439), "bak": (-0.13166888, 1.60915514, -0.39604546),
                "ovrl": (-0.06766283, 1.11546468, 0.04602535)}
_dnsmos_sessions: dict[int, object] = {}
_dnsmos_scores: dict[tuple, dict] = {}
_DNSMOS_REMEMBERED = 256


def dnsmos_model_path():
    """The DNSMOS P.835 model inside the installed speechmos wheel (nothing is fetched)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("speechmos")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the perceptual scores need speechmos==0.0.1.1 (DNSMOS): pip install -e "
                                  "'.[converter]' (or make venv)", name="speechmos")
    return Path(next(iter(spec.submodule_search_locations))) / "dnsmos_models" / "sig_bak_ovr.onnx"


def _dnsmos_threads(threads: int | None) -> int:
    # the caller's OpenMP cap where it sets one (onnxruntime reads no environment variable), else
    # onnxruntime's default (0: one thread per core)
    return int(threads if threads is not None else (os.environ.get("OMP_NUM_THREADS") or 0))


def _dnsmos_session(threads: int):
    """One onnxruntime CPU session per thread count per process."""
    if threads not in _dnsmos_sessions:
        ort = _host_module("onnxruntime", "onnxruntime")
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        _dnsmos_sessions[threads] = ort.InferenceSession(str(dnsmos_model_path()), options,
                                                         providers=["CPUExecutionProvider"])
    return _dnsmos_sessions[threads]


def dnsmos(x, rate: int, threads: int | None = None) -> dict[str, float]:
    """DNSMOS P.835 of one render, no reference: {dnsmos_sig, dnsmos_bak, dnsmos_ovrl}, each a predicted
    mean opinion score from 1 to 5 (speech signal, background, overall), as speechmos 0.0.1.1's
    `dnsmos.run(x, 16000)` computes them (tests/test_perceptual.py holds the two equal).

    `x` at `rate` Hz is resampled to 16 kHz (`resample`) and clipped to [-1, 1] as a WAV file would hold
    it. A clip shorter than 9.01 s is doubled until it is that long (the package's rule) and then scored on
    every 9.01 s segment starting each second, so a 1 s clip costs 4 to 8 segments (~0.4 s each on one core)
    and a 9.5 s clip one. The model runs on a CPU session opened once per process with `threads`
    intra-op threads (default: $OMP_NUM_THREADS, else onnxruntime's own), and a score is remembered
    by the audio's bytes, so a reference scored beside many test renders runs once.

    Absolute: it says how much a render sounds like clean speech, so it means something only for a
    model that speaks (random weights make noise, and its score is about that noise). A silent render
    (every sample zero: a decode that lost everything) scores NaN; an empty one or NaN samples are refused.
    """
    x = np.asarray(x, dtype=np.float64).ravel()
    if int(rate) != rate or rate <= 0:
        raise ValueError(f"DNSMOS: sample rate must be a positive integer in Hz, got {rate!r}")
    if x.size == 0:
        raise ValueError("DNSMOS: the render is empty; there is nothing to score")
    if not np.any(x):
        return dict.fromkeys(DNSMOS_COLUMNS, float("nan"))
    if not np.all(np.isfinite(x)):
        raise ValueError("DNSMOS: the render holds NaN or inf samples (count them with nonfinite_count)")
    audio = np.clip(resample(x, int(rate), PESQ_RATE), -1.0, 1.0).astype(np.float32)
    key = (hashlib.sha1(audio.tobytes()).hexdigest(), audio.size)
    if key in _dnsmos_scores:
        return dict(_dnsmos_scores[key])
    need = int(DNSMOS_SEGMENT_S * PESQ_RATE)
    while audio.size < need:
        audio = np.append(audio, audio)
    hops = int(np.floor(audio.size / PESQ_RATE) - DNSMOS_SEGMENT_S) + 1
    # the segment bounds in floating point, as the package and Microsoft's DNSMOS script compute them: a
    # bound that rounds one sample short drops that segment (the 8th to the 24th second among others)
    segments = [audio[int(k * PESQ_RATE): int((k + DNSMOS_SEGMENT_S) * PESQ_RATE)] for k in range(hops)]
    session = _dnsmos_session(_dnsmos_threads(threads))
    raw = np.stack([session.run(None, {"input_1": seg[None]})[0][0] for seg in segments if seg.size == need])
    scores = {f"dnsmos_{name}": float(np.mean(np.poly1d(_DNSMOS_POLY[name])(raw[:, i].astype(np.float64))))
              for i, name in enumerate(("sig", "bak", "ovrl"))}
    if len(_dnsmos_scores) >= _DNSMOS_REMEMBERED:
        _dnsmos_scores.pop(next(iter(_dnsmos_scores)))
    _dnsmos_scores[key] = scores
    return dict(scores)


def perceptual(ref, test, rate: int, absolute: bool = True, threads: int | None = None) -> dict[str, float]:
    """What a listener would judge of `test` against `ref` (both at `rate` Hz, same length), as results-row
    columns named by PERCEPTUAL_COLUMNS: pesq_wb, stoi, log_mel_db (test against ref), and with `absolute`
    dnsmos_ovrl of the test render and dnsmos_ovrl_ref of the reference (DNSMOS P.835 overall, no reference).

    Put it beside the pair's SNR (`compare` or `snr_db`) wherever two renders of speech are compared, on
    whole utterances: PESQ needs 0.25 s (shorter is refused) and STOI ~0.4 s of voiced speech (less scores
    NaN), and a window's scores belong to the utterance it is part of. Cost on one core of this project's
    2-core host: PESQ ~15 ms, STOI ~10 ms and the log-mel distance ~5 ms per second of audio; DNSMOS ~0.4 s
    per 9 s segment it scores: a clip under 9 s is doubled to 9-18 s (1 to 9 segments, 0.4-3.5 s), a longer
    one costs up to ~0.4 s per second (the reference's score is remembered).
    `absolute=False` leaves out DNSMOS, for a model with random weights whose output is not speech. Errors as
    each scorer's.
    """
    row = {"pesq_wb": pesq_wb(ref, test, rate), "stoi": stoi(ref, test, rate),
           "log_mel_db": log_mel_distance(ref, test, rate)}
    if absolute:
        row["dnsmos_ovrl"] = dnsmos(test, rate, threads)["dnsmos_ovrl"]
        row["dnsmos_ovrl_ref"] = dnsmos(ref, rate, threads)["dnsmos_ovrl"]
    return row


class GateFailed(Failed, AssertionError):
    """A measured value missed its gate's threshold (exit 1)."""


@dataclass(frozen=True)
class Gate:
    """A named threshold. `at_least=True` means measured ≥ threshold passes (SNR);
    `at_least=False` means measured ≤ threshold passes (REGTASK lines, non-finite count)."""

    name: str
    threshold: float
    unit: str = "dB"
    at_least: bool = True

    def passes(self, measured: float) -> bool:
        if np.isnan(measured):
            return False
        return measured >= self.threshold if self.at_least else measured <= self.threshold

    def row(self, measured: float) -> dict:
        """The gate's verdict as a results-row fragment (recorded whether it passed or not)."""
        return {"gate": self.name, "measured": float(measured), "threshold": self.threshold,
                "unit": self.unit, "passed": self.passes(measured)}

    def check(self, measured: float, context: str = "") -> dict:
        """Return the row if the gate passes, raise GateFailed naming both numbers otherwise."""
        row = self.row(measured)
        if not row["passed"]:
            op = "≥" if self.at_least else "≤"
            where = f" ({context})" if context else ""
            raise GateFailed(f"gate {self.name!r} failed{where}: measured {measured:.4g} {self.unit}, "
                             f"needs {op} {self.threshold:g} {self.unit}")
        return row


# --- an engine against the fp32 graph it was compiled from: one floor per kind, wherever it runs ---------
@dataclass(frozen=True)
class EngineFloor:
    """The SNR an engine's outputs must reach against the fp32 graph it was compiled from, fed the same inputs:
    in the simulator at stage 2 (the family's probe, rkstudy.toolkit.convert) and on a board (the run's own
    inputs, every window or step: rkstudy.board.gate). Both read the floor from here, so a board never passes
    an engine below what stage 2 refuses. `kind` names what stage 2 probes it with; `why` says where the
    number comes from."""

    kind: str
    db: float
    why: str

    def gate(self, where: str = "simulator") -> Gate:
        """The floor as a Gate named for where it is measured (`simulator_vs_fp32_tokens`, `board_vs_fp32_tokens`)."""
        return Gate(f"{where}_vs_fp32_{self.kind}", self.db)


ENGINE_FLOORS = {f.kind: f for f in (
    EngineFloor("white_noise", 15.0, "a decoder on white noise is alive: the fp16 noise floor of real decoders sits at "
                                     "22-36 dB, a broken engine far below"),
    EngineFloor("tokens", 30.0, "the Piper encoder: 40-48 dB on the Piper duration-encoder pull request's board, "
                                "55-61 dB in the simulator; its overflowed ladder scored 9.9-16 dB on that board"),
    EngineFloor("window", 40.0, "the Kokoro generator's probe window: 61.8-65.7 dB in the simulator"),
    EngineFloor("step", 30.0, "a vocoder step with its cache: the fp16 engine alive, the cache path included"),
    EngineFloor("estimator", 30.0, "a flow estimator: the stand-in measured 46-59 dB in the simulator"),
)}


def engine_floor(gate_name: str | None) -> EngineFloor | None:
    """The floor a gate named `<where>_vs_fp32_<kind>` stands for (a stage-2 gate as its contract records it),
    or None for a gate that is no engine floor."""
    kind = str(gate_name or "").partition("_vs_fp32_")[2]
    return ENGINE_FLOORS.get(kind)


# --- board risk: what a simulator number cannot vouch for ----------------------------------------
# The toolkit's PC simulator does not model the compiler's register-field overflow (notebook 00
# measures it bit-identical across targets and REGTASK counts), so a simulator SNR says nothing about
# an engine whose build logged REGTASK lines. The verdict is read from what the compiler logged.
FIELD_LIMIT = 0x1FFF  # the 13-bit `limit: 0x1fff` the REGTASK lines print where no wider field is measured
# The RKNN decoder-path document's board measurement: the Kokoro W=512 engine, whose build logged
# ~800k lines of field value 0x7800, voiced clipped noise at -27 dB against the CPU decode on an RK3588.
KNOWN_BAD_FIELD_VALUE = 0x7800
KNOWN_BAD = ("0x7800 = 30,720, the value whose ~800k lines made the Kokoro W=512 engine voice clipped "
             "noise at -27 dB on an RK3588 board (the RKNN decoder-path document)")
FP16_MAX = 65504.0
_NONFINITE = ("nonfinite", "audio_nonfinite", "gen_nonfinite", "cache_out_nonfinite")
_MAX_ABS = ("sim_max_abs", "gen_max_abs")


def field_limit(target: str | None) -> int:
    """The register field's largest value for `target`: the width the long-axis probe measured
    (rkstudy.targets.Target.register_field_bits: rk3576's 14 bits), else the 13-bit limit other ops'
    REGTASK lines print."""
    from .targets import record

    soc = record(target)
    bits = soc.register_field_bits if soc else None
    return (1 << bits) - 1 if bits else FIELD_LIMIT


def _number(row, *keys) -> float | None:
    for key in keys:
        value = row.get(key)
        if value in (None, ""):
            continue
        try:
            return float(value)
        except (TypeError, ValueError):
            continue
    return None


def board_risk(row) -> str:
    """`clean`, `at risk: <why>` or `known bad on a board: <the reference figure>` for one engine row
    (a build row, or any table row with its REGTASK columns), from what the compiler logged: REGTASK
    lines and their largest field value against the target's field, non-finite outputs or an output
    near the fp16 limit, and ops the compiler placed on the CPU. `not built: <status>` when the build
    did not finish, and `not an engine row` when the row has no REGTASK count at all.

    Rows are read as written (numbers or the strings of a committed CSV), so the results index can
    state the verdict of rows made before the column existed.
    """
    status = str(row.get("status") or "ok")
    if status != "ok":
        return f"not built: {status}"
    lines = _number(row, "regtask")
    if lines is None:
        return "not an engine row"
    value = _number(row, "regtask_max_value", "regtask_max") or 0.0
    limit = field_limit(row.get("target"))
    if value >= KNOWN_BAD_FIELD_VALUE:
        return (f"known bad on a board: field value {int(value):,} ({int(lines):,} REGTASK lines) is at or "
                f"past {KNOWN_BAD}")
    why = []
    if lines > 0:
        largest = f", largest field value {int(value):,}" if value else ""
        past = f" (field limit {limit:,})" if value > limit else ""
        why.append(f"{int(lines):,} REGTASK lines{largest}{past}: the simulator does not model the overflow")
    nonfinite = _number(row, *_NONFINITE)
    if nonfinite:
        why.append(f"{int(nonfinite):,} non-finite outputs (fp16 range)")
    peak = _number(row, *_MAX_ABS)
    if peak is not None and peak > FP16_MAX / 2:
        why.append(f"an output reaches {peak:.4g}, within 2x of the fp16 limit {FP16_MAX:g}")
    cpu = str(row.get("cpu_ops") or "").strip()
    if cpu and cpu not in ("0", "{}", "none"):
        why.append(f"ops on the CPU ({cpu}): board time the simulator does not measure")
    return "at risk: " + "; ".join(why) if why else "clean"


RISK_ORDER = ("known bad on a board", "at risk", "not built", "clean")


def risk_summary(rows) -> str:
    """One board-risk verdict for a number drawn from engine rows (a headline's worst over a sweep):
    the worst row's verdict (known bad, then at risk, then clean), and with several rows how many of
    them share its kind. A row without a REGTASK count cannot vouch for a board: `not an engine row`."""
    rows = [rows] if isinstance(rows, Mapping) else list(rows)
    if not rows:
        raise ValueError("no engine rows to state a board risk for")
    verdicts = [str(r.get("board_risk") or board_risk(r)) for r in rows]
    rank = {kind: n for n, kind in enumerate(RISK_ORDER)}

    def kind(verdict: str) -> str:
        return next((k for k in RISK_ORDER if verdict.startswith(k)), "not an engine row")

    worst = min(verdicts, key=lambda v: rank.get(kind(v), -1))
    if len(verdicts) == 1:
        return worst
    share = sum(kind(v) == kind(worst) for v in verdicts)
    return f"{worst} [{share} of {len(verdicts)} engines {kind(worst)}]"
