"""The fixed-window walk: an engine compiled for one window shape, run over a latent of any length.

RKNN has no dynamic shapes, so a decoder is compiled for `window = emit + 2*context` latent
frames and walked over the latent. The rules (the seeds measured why each one matters):

* Each step emits `emit` frames and sees `context` frames of real data on each side, so the
  emitted frames are decoded as they would be in one full-length pass.
* The first window starts at frame 0 (there is nothing to its left) and the window that
  reaches the end of the latent is shifted left so it ends exactly on the last frame: its
  left context grows to fill the window instead of reading padding.
* Only a latent shorter than the window is padded: one window, zeros after the real frames,
  and a frame mask of 0 there (1 over real frames). A padded frame marked 1 leaks its conv
  biases into the real frames.
* Outputs are stitched by `samples_per_frame`, so every latent frame is voiced exactly once,
  in order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from tqdm.auto import tqdm


@dataclass(frozen=True)
class Window:
    """One step of the walk. Frames are latent indices; `offset` is where the emitted
    frames start inside the window."""

    start: int        # latent frame at window position 0
    real: int         # how many window positions hold real frames (the rest is padding)
    emit_start: int   # first latent frame this window voices
    emit_stop: int    # one past the last

    @property
    def offset(self) -> int:
        """Frames of left context this window carries (the end window carries more)."""
        return self.emit_start - self.start


def plan_windows(n_frames: int, emit: int, context: int) -> list[Window]:
    """The windows that voice frames [0, n_frames) with an engine of `emit + 2*context` frames."""
    if emit <= 0 or context < 0:
        raise ValueError(f"need emit > 0 and context >= 0, got emit={emit}, context={context}")
    if n_frames <= 0:
        raise ValueError(f"the latent has {n_frames} frames; there is nothing to decode")
    window = emit + 2 * context
    if n_frames <= window:
        return [Window(start=0, real=n_frames, emit_start=0, emit_stop=n_frames)]
    plan = []
    for emit_start in range(0, n_frames, emit):
        emit_stop = min(emit_start + emit, n_frames)
        start = min(max(emit_start - context, 0), n_frames - window)
        plan.append(Window(start=start, real=window, emit_start=emit_start, emit_stop=emit_stop))
    return plan


def window_inputs(latent: np.ndarray, w: Window, window: int) -> tuple[np.ndarray, np.ndarray]:
    """The window's latent `[C, window]` (zero-padded past the real frames) and its frame
    mask `[1, window]` (1 over real frames, 0 over padding), both float32."""
    channels = latent.shape[0]
    x = np.zeros((channels, window), dtype=np.float32)
    x[:, : w.real] = latent[:, w.start: w.start + w.real]
    mask = np.zeros((1, window), dtype=np.float32)
    mask[:, : w.real] = 1.0
    return x, mask


def walk_windows(latent: np.ndarray, run: Callable[[np.ndarray, np.ndarray], np.ndarray], *,
                 emit: int, context: int, samples_per_frame: int, progress: bool = True,
                 desc: str = "windows") -> np.ndarray:
    """Walk `run(window_latent [C, W], mask [1, W]) -> output [..., W*samples_per_frame]` over
    `latent [C, N]` and return the stitched output `[..., N*samples_per_frame]`.

    `run` is any engine: an onnxruntime session, the simulator, a board context. Leading
    output axes (channels, batch) are kept as they come.
    """
    latent = np.asarray(latent)
    if latent.ndim != 2:
        raise ValueError(f"latent must be [channels, frames], got shape {latent.shape}; "
                         "drop the batch axis first (latent[0])")
    window = emit + 2 * context
    hop = samples_per_frame
    pieces = []
    for w in tqdm(plan_windows(latent.shape[1], emit, context), desc=desc, disable=not progress,
                  leave=False):
        out = np.asarray(run(*window_inputs(latent, w, window)))
        if out.shape[-1] != window * hop:
            raise ValueError(f"the engine returned {out.shape[-1]} samples for a {window}-frame "
                             f"window; expected {window * hop} ({hop} per frame). Is this engine "
                             f"built for a {window}-frame window with this hop?")
        pieces.append(out[..., w.offset * hop: (w.offset + w.emit_stop - w.emit_start) * hop])
    return np.concatenate(pieces, axis=-1)
