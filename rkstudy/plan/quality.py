"""A plan's audio against the CPU plan's, as the RKNN decoder-path document measures it: global SNR,
median (and worst) per-256-sample SNR, the best lag, and the largest sample-to-sample step of each (in
16-bit units, as the document gives it: a click at a seam shows there); and beside them, given the rate,
what a listener would judge (rkstudy.gates.perceptual: PESQ-WB, STOI, a log-mel distance, DNSMOS).

Two plans voice the same latent only where their duration stages agree; when their frame counts differ
(the fp16 duration encoder moved a chunk's durations), the samples compared are the shorter render's and
the row says how many frames apart they are: that SNR measures a different utterance, not the decoder.

Board side: numpy only.
"""

from __future__ import annotations

import numpy as np

from .. import gates

INT16 = 32767


def against_cpu(reference: np.ndarray, test: np.ndarray, *, hop: int | None = None, rate: int | None = None,
                absolute: bool = True) -> dict:
    """The document's quality figures of `test` against `reference` (the CPU plan's audio, same rate); with
    `rate`, the perceptual scores too (`absolute=False` leaves out DNSMOS, for audio that is not speech)."""
    ref = np.asarray(reference, np.float64).ravel()
    got = np.asarray(test, np.float64).ravel()
    n = min(ref.size, got.size)
    row = {"samples_cpu": int(ref.size), "samples": int(got.size), "same_length": ref.size == got.size}
    if hop:
        row["frames_apart"] = (got.size - ref.size) // hop
    row.update({"snr_db": gates.snr_db(ref[:n], got[:n]), **gates.slice_snr_summary(ref[:n], got[:n]),
                "best_lag": gates.best_lag(ref[:n], got[:n]),
                "max_step_cpu_int16": round(gates.max_step(ref) * INT16),
                "max_step_int16": round(gates.max_step(got) * INT16),
                "nonfinite": gates.nonfinite_count(got)})
    if rate:
        row.update(gates.perceptual(ref[:n], got[:n], rate, absolute=absolute))
    return row
