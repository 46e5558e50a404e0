"""Signal metrics and pass/fail gates.

Every NPU number in this project is a tolerance against a CPU reference, never a bit-exact claim:
the fp16 engines differ from fp32 (and, on RK3588, per NPU core), so a gate is a metric plus a
threshold, and its measured value is recorded next to the threshold whether it passes or not.

Board side: numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def slice_snr_summary(ref, test, size: int = SLICE) -> dict[str, float]:
    """Median and minimum per-slice SNR."""
    s = slice_snr_db(ref, test, size)
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
    (rkstudy.contract.REGISTER_FIELD_BITS: rk3576's 14 bits), else the 13-bit limit other ops'
    REGTASK lines print."""
    from .contract import REGISTER_FIELD_BITS

    bits = REGISTER_FIELD_BITS.get(target or "")
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
