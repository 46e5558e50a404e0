"""The CPU head after the generator (board side): exp / sin of the conv_post rows and the model's own
iSTFT, in numpy, so a board turns the engine's output into audio without torch.

The int8 Kokoro ONNX computes the head as StyleTTS2's conv-transpose iSTFT: magnitude exp(rows 0..10),
phase sin(rows 11..21), spec = cat(mag cos(phase), mag sin(phase)), a transposed conv with the
model's inverse basis at stride `hop`, then a division by a `window_sum` the export captured at trace
time, which is only n_fft samples long (only the first n_fft output samples are normalized), a scale
of n_fft / hop, and n_fft / 2 samples cropped on each side. torch.istft is not interchangeable with it
(the research measured 9.5 dB between the two), so the head is reproduced as exported, quirks included.

Board side: numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class IstftHead:
    """The model's iSTFT constants: inverse_basis [2 * bins, 1, n_fft], window_sum [n_fft], n_fft, hop."""

    inverse_basis: np.ndarray
    window_sum: np.ndarray
    n_fft: int
    hop: int

    @property
    def bins(self) -> int:
        return self.n_fft // 2 + 1


def istft(gen: np.ndarray, head: IstftHead) -> np.ndarray:
    """Audio [hop * (T - 1)] (300 samples per latent frame) for a conv_post output gen [(1,) 22, T]
    (T = 60 N + 1): the model's own head, in float64 then float32."""
    g = np.asarray(gen, np.float64).reshape(-1, np.shape(gen)[-1])
    bins, hop, n_fft = head.bins, head.hop, head.n_fft
    if g.shape[0] != 2 * bins:
        raise ValueError(f"the head takes {2 * bins} rows (log-magnitude and phase of {bins} bins), got {g.shape[0]}")
    mag, phase = np.exp(g[:bins]), np.sin(g[bins:])
    spec = np.concatenate([mag * np.cos(phase), mag * np.sin(phase)])           # [2 bins, T]
    frames = np.asarray(head.inverse_basis, np.float64)[:, 0, :].T @ spec       # [n_fft, T]
    t = g.shape[1]
    y = np.zeros(hop * (t - 1) + n_fft)
    for k in range(n_fft):                                                      # overlap-add
        y[k: k + hop * t: hop] += frames[k]
    wsum = np.asarray(head.window_sum, np.float64)
    n = min(wsum.size, y.size)
    keep = np.flatnonzero(wsum[:n] > np.finfo(np.float32).tiny)
    y[keep] /= wsum[keep]
    y *= float(n_fft) / hop
    half = n_fft // 2
    return y[half:-half].astype(np.float32)
