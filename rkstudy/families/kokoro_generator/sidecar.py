"""The Kokoro generator sidecar (board side): a latent and its harmonic input of any length in,
conv_post's rows out, through any runner of a produced window engine (fp32, simulator, board, replay).

The generator normalizes per window (AdaIN statistics over the window), so a multi-window decode is a
different synthesis from a full-length one, not an approximation of it. Two measured knobs, as the
the reference documents' runtime has them (`params.overlap`, `params.gain`):

* `overlap` frames are voiced by two consecutive windows and blended with a raised cosine (a seam
  knob: the walk advances emit - overlap frames a step);
* `gain` corrects each window's loudness toward a full-length decode of the same latent: the window's
  log-magnitude rows are shifted so that its spectral energy over the frames it voices equals the
  reference's (`frame_energy` of a full-length decode, computed where the reference ran: on the host,
  `rkstudy kokoro inputs --gain` writes it into the inputs file).

Board side: numpy and tqdm only.
"""

from __future__ import annotations

import numpy as np

from ...contract import Contract, Expect
from ...errors import EngineMismatch, UsageError
from ...walk.sidecar import WindowSidecar

GAIN_FLOOR = 1e-30  # spectral energy below this is silence: no gain is applied to such a window


def frame_energy(gen: np.ndarray, fine_per_frame: int, bins: int) -> np.ndarray:
    """Spectral energy per latent frame of a conv_post output gen [(1,) rows, 60 N + 1]: the sum of
    exp(2 g) over the log-magnitude rows and the frame's 60 columns (the +1 column is left out)."""
    g = np.asarray(gen, np.float64).reshape(-1, np.shape(gen)[-1])
    n = (g.shape[1] - 1) // fine_per_frame
    power = np.exp(2.0 * g[:bins, : n * fine_per_frame])
    return power.reshape(bins, n, fine_per_frame).sum(axis=(0, 2))


class GeneratorSidecar:
    """Validates the engine against the model at init (latent channels, spectrogram rows, audio
    samples per latent frame; the window against the runner's shapes) and walks it."""

    def __init__(self, runner, contract: Contract, *, channels: int, rows: int, samples_per_frame: int,
                 overlap: int = 0, gain: bool = False):
        p = contract.params
        contract.check_params({
            "channels": Expect(channels, "the engine takes {engine} latent channels, the model has {model}"),
            "rows": Expect(rows, "the engine emits {engine} spectrogram rows, the model's head takes {model}"),
            "samples_per_frame": Expect(samples_per_frame, "the engine voices {engine} samples per latent frame, "
                                                           "the model {model}")}, what="model")
        emit = contract.window.emit if contract.window else 0
        if not 0 <= overlap <= emit // 2:
            raise UsageError(f"overlap={overlap}: this engine emits {emit} frames a window, so the overlap must be "
                             f"in 0..{emit // 2}")
        self.window = WindowSidecar(runner, contract)
        self.runner, self.contract = runner, contract
        self.overlap, self.gain = overlap, gain
        self.fine = p["fine_per_frame"]
        self.bins = p["n_fft"] // 2 + 1

    def generate(self, x: np.ndarray, har: np.ndarray, style: np.ndarray, *, reference: np.ndarray | None = None,
                 progress: bool = True) -> np.ndarray:
        """conv_post's rows gen [rows, 60 N + 1] for x [channels, N], har [rows, 60 N + 1], style [style_dim].

        With `gain`, `reference` is the per-frame spectral energy of a full-length decode of the same
        latent (frame_energy), [N]."""
        c = self.contract
        x, har = np.asarray(x, np.float32), np.asarray(har, np.float32)
        n = x.shape[-1] if x.ndim == 2 else -1
        if x.ndim != 2 or x.shape[0] != c.params["channels"]:
            raise EngineMismatch(f"latent has shape {x.shape}; this engine takes [{c.params['channels']}, N]")
        if har.shape != (c.params["rows"], self.fine * n + 1):
            raise EngineMismatch(f"harmonic input has shape {har.shape}; {n} frames need "
                                 f"[{c.params['rows']}, {self.fine * n + 1}]")
        adjust = None
        if self.gain:
            if reference is None or np.shape(reference) != (n,):
                raise UsageError(f"gain needs the per-frame energy of a full-length decode ([{n}]), "
                                 f"got {None if reference is None else np.shape(reference)}")
            adjust = self._gain(np.asarray(reference, np.float64))
        (gen,) = self.window.run(n, {"x": x, "har": har}, {"style": style}, progress=progress,
                                 desc="generator windows", overlap=self.overlap, adjust=adjust)
        return gen

    def _gain(self, reference: np.ndarray):
        """The per-window correction: the log-magnitude rows shifted by half the log ratio of the
        reference's energy to the window's, over the frames the window voices."""
        fine, bins = self.fine, self.bins

        def adjust(w, outs):
            g = np.array(outs[0], np.float32)
            a, b = fine * w.offset, fine * (w.offset + w.emit_stop - w.emit_start)
            own = float(np.exp(2.0 * g[:bins, a:b].astype(np.float64)).sum())
            ref = float(reference[w.emit_start: w.emit_stop].sum())
            if own > GAIN_FLOOR and ref > GAIN_FLOOR:
                g[:bins] += np.float32(0.5 * np.log(ref / own))
            return [g, *outs[1:]]
        return adjust
