"""The fixed-window walk: an engine compiled for one window shape, run over a latent of any length.

RKNN has no dynamic shapes, so a decoder is compiled for `window = emit + 2*context` latent
frames and walked over the latent. The rules (the reference documents measured why each one matters):

* Each step emits `emit` frames and sees `context` frames of real data on each side, so the
  emitted frames are decoded as they would be in one full-length pass.
* The first window starts at frame 0 (there is nothing to its left) and the window that
  reaches the end of the latent is shifted left so it ends exactly on the last frame: its
  left context grows to fill the window instead of reading padding.
* Only a latent shorter than the window is padded: one window, zeros after the real frames,
  and a frame mask of 0 there (1 over real frames). A padded frame marked 1 leaks its conv
  biases into the real frames, and so does an unmasked graph whatever its mask says: build its
  window with rkstudy.graph.validity.mask_conv_inputs and walk the mask it adds.
* Outputs are stitched at their own rate, so every latent frame is voiced exactly once, in
  order. Several inputs may be walked at once, each at its own rate per latent frame (Kokoro's
  latent at 1 and its harmonic input at 60 per frame plus one).
* With `overlap` > 0 (at most emit / 2) the walk advances `emit - overlap` frames a step, so
  consecutive windows voice `overlap` frames twice, and the two renders of those frames are blended with a raised cosine
  (the weights of the outgoing and the incoming window sum to one at every column). That is a seam
  knob: it changes how two windows meet, not what either window computes.

Board side: numpy and tqdm only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from tqdm.auto import tqdm

from ..process import shows_progress


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

    def kind(self, n_frames: int, window: int) -> str:
        """Which edge of a latent of `n_frames` this step of a `window`-frame walk sees, one of
        WINDOW_KINDS: `padded` (the latent is shorter than the window: zeros after its real frames),
        `start` (the window starts on the latent's first frame), `end` (it ends on the last frame: the
        window shifted left to end there) or `interior` (neither edge: the walk cuts both of its sides).

        Why `interior` is that set: only there do the emitted frames depend on the context the window
        carries on both sides, which is what a context is chosen for. A start window sees the latent's
        own start, as the full-length decode does, and carries 2 x context frames to its right (an end
        window likewise to its left), so it is exact on one side by construction and its score says
        less about the context. Every "worst interior window" figure (notebook 01's window sweep, the
        planner's minimum context) is the worst over this set."""
        if self.real < window:
            return "padded"
        if self.start == 0:
            return "start"
        return "end" if self.start + self.real == n_frames else "interior"


WINDOW_KINDS = ("interior", "start", "end", "padded")


def plan_windows(n_frames: int, emit: int, context: int, overlap: int = 0) -> list[Window]:
    """The windows that voice frames [0, n_frames) with an engine of `emit + 2*context` frames,
    advancing `emit - overlap` frames a step (consecutive emitted spans share `overlap` frames)."""
    if emit <= 0 or context < 0:
        raise ValueError(f"need emit > 0 and context >= 0, got emit={emit}, context={context}")
    if not 0 <= overlap <= emit // 2:
        raise ValueError(f"overlap={overlap} must be in 0..{emit // 2} (at most half of the {emit} emitted "
                         "frames, so a frame is shared by two windows at most)")
    if n_frames <= 0:
        raise ValueError(f"the latent has {n_frames} frames; there is nothing to decode")
    window = emit + 2 * context
    if n_frames <= window:
        return [Window(start=0, real=n_frames, emit_start=0, emit_stop=n_frames)]
    plan = []
    for emit_start in range(0, n_frames, emit - overlap):
        emit_stop = min(emit_start + emit, n_frames)
        start = min(max(emit_start - context, 0), n_frames - window)
        plan.append(Window(start=start, real=window, emit_start=emit_start, emit_stop=emit_stop))
        if emit_stop == n_frames:
            break
    return plan


def interior_windows(n_frames: int, emit: int, context: int) -> list[Window]:
    """The windows of the walk over `n_frames` whose kind is `interior` (see Window.kind)."""
    window = emit + 2 * context
    return [w for w in plan_windows(n_frames, emit, context) if w.kind(n_frames, window) == "interior"]


@dataclass(frozen=True)
class Rate:
    """How a tensor's last axis relates to latent frames: `per_frame * frames + extra` elements
    (the latent itself: 1, 0; Piper's audio: 256, 0; Kokoro's harmonic input: 60, 1)."""

    per_frame: int = 1
    extra: int = 0

    def length(self, frames: int) -> int:
        return self.per_frame * frames + self.extra


def _window_slice(x: np.ndarray, w: Window, window: int, rate: Rate) -> np.ndarray:
    """`x[..., rate.length(N)]` cut to this window and zero-padded past its real frames."""
    out = np.zeros(x.shape[:-1] + (rate.length(window),), dtype=x.dtype)
    a, b = rate.per_frame * w.start, rate.per_frame * (w.start + w.real) + rate.extra
    out[..., : b - a] = x[..., a:b]
    return out


def _window_mask(w: Window, window: int, rate: Rate, lead: tuple[int, ...] = (1,)) -> np.ndarray:
    """1 over the window's real frames (at `rate`), 0 over the padding."""
    m = np.zeros(lead + (rate.length(window),), dtype=np.float32)
    m[..., : rate.length(w.real)] = 1.0
    return m


def window_inputs(latent: np.ndarray, w: Window, window: int) -> tuple[np.ndarray, np.ndarray]:
    """The window's latent `[C, window]` (zero-padded past the real frames) and its frame
    mask `[1, window]` (1 over real frames, 0 over padding), both float32."""
    return (_window_slice(np.asarray(latent, np.float32), w, window, Rate()),
            _window_mask(w, window, Rate()))


def raised_cosine(n: int) -> np.ndarray:
    """The incoming window's weights over `n` shared columns, rising from ~0 to ~1; the outgoing
    window's are the same reversed, and the two sum to exactly one at every column."""
    return (0.5 - 0.5 * np.cos(np.pi * (np.arange(n) + 0.5) / n)).astype(np.float32)


def walk(n_frames: int, run: Callable[[dict], Sequence[np.ndarray]], *, emit: int, context: int,
         walked: Mapping[str, tuple[np.ndarray, Rate]], masks: Mapping[str, Rate] | None = None,
         outputs: Sequence[Rate], progress: bool = True, desc: str = "windows", overlap: int = 0,
         adjust: Callable[[Window, list[np.ndarray]], list[np.ndarray]] | None = None) -> list[np.ndarray]:
    """Walk a fixed-window engine over `n_frames` latent frames; return each output stitched.

    `walked` maps an input name to its full-length array (frame axis last, `rate.length(n_frames)`
    long) and its rate; `masks` names the mask inputs the walker makes, each at its own rate;
    `run(feed)` takes {name: window array} and returns the outputs in order, each with its frame
    axis last at the rate given in `outputs`. Every latent frame is voiced exactly once, in order,
    and the `extra` tail of an output (Kokoro's +1 column) comes from the window that ends the walk.
    With `overlap`, consecutive windows share `overlap` emitted frames, blended with a raised cosine;
    `adjust(window, outputs)` may rescale a window's outputs before they are stitched (a per-window
    loudness correction).
    """
    masks = dict(masks or {})
    for name, (x, rate) in walked.items():
        if np.shape(x)[-1] != rate.length(n_frames):
            raise ValueError(f"walked input {name!r} has {np.shape(x)[-1]} elements on its last axis; "
                             f"{n_frames} frames at {rate.per_frame}/frame + {rate.extra} need "
                             f"{rate.length(n_frames)}")
    window = emit + 2 * context
    plan = plan_windows(n_frames, emit, context, overlap)
    pieces: list[list[np.ndarray]] = [[] for _ in outputs]
    for w in tqdm(plan, desc=desc, disable=not shows_progress(progress), leave=False):
        feed = {name: _window_slice(np.asarray(x), w, window, rate) for name, (x, rate) in walked.items()}
        feed.update({name: _window_mask(w, window, rate) for name, rate in masks.items()})
        outs = [np.asarray(o) for o in run(feed)]
        for k, (out, rate) in enumerate(zip(outs, outputs)):
            if out.shape[-1] != rate.length(window):
                raise ValueError(f"output {k} has {out.shape[-1]} elements for a {window}-frame window; "
                                 f"expected {rate.length(window)} ({rate.per_frame} per frame + {rate.extra}). "
                                 f"Is this engine built for a {window}-frame window at this rate?")
        if adjust is not None:
            outs = [np.asarray(o) for o in adjust(w, outs)]
        for k, (out, rate) in enumerate(zip(outs, outputs)):
            a = rate.per_frame * w.offset
            b = rate.per_frame * (w.offset + w.emit_stop - w.emit_start)
            if w.emit_stop == n_frames:
                b += rate.extra
            piece = out[..., a:b]
            # an output short of rate x frames (extra < 0) ends before an emit that reaches the window's end
            # (no context after it): the samples it does not make stay zero, so every later piece keeps its place
            pieces[k].append(np.pad(piece, [(0, 0)] * (piece.ndim - 1) + [(0, b - a - piece.shape[-1])]))
    if overlap == 0 or len(plan) == 1:
        return [np.concatenate(p, axis=-1) for p in pieces]
    return [_blend(p, plan, rate, n_frames) for p, rate in zip(pieces, outputs)]


def _blend(pieces: list[np.ndarray], plan: list[Window], rate: Rate, n_frames: int) -> np.ndarray:
    """Overlapping emitted pieces summed into one output, raised-cosine weighted where they overlap."""
    out = np.zeros(pieces[0].shape[:-1] + (rate.length(n_frames),), dtype=np.result_type(*pieces, np.float32))
    for i, (piece, w) in enumerate(zip(pieces, plan)):
        piece = piece.astype(out.dtype, copy=True)
        if i > 0 and plan[i - 1].emit_stop > w.emit_start:
            n = rate.per_frame * (plan[i - 1].emit_stop - w.emit_start)
            piece[..., :n] *= raised_cosine(n)
        if i + 1 < len(plan) and plan[i + 1].emit_start < w.emit_stop:
            n = rate.per_frame * (w.emit_stop - plan[i + 1].emit_start)
            stop = rate.per_frame * (w.emit_stop - w.emit_start)
            piece[..., stop - n: stop] *= raised_cosine(n)[::-1]
        a = rate.per_frame * w.emit_start
        out[..., a: a + piece.shape[-1]] += piece
    return out


def walk_windows(latent: np.ndarray, run: Callable[[np.ndarray, np.ndarray], np.ndarray], *,
                 emit: int, context: int, samples_per_frame: int, progress: bool = True,
                 desc: str = "windows") -> np.ndarray:
    """Walk `run(window_latent [C, W], mask [1, W]) -> output [..., W*samples_per_frame]` over
    `latent [C, N]` and return the stitched output `[..., N*samples_per_frame]` (one walked input
    and its mask: the single-rate case of `walk`).

    `run` is any engine: an onnxruntime session, the simulator, a board context. Leading
    output axes (channels, batch) are kept as they come.
    """
    latent = np.asarray(latent)
    if latent.ndim != 2:
        raise ValueError(f"latent must be [channels, frames], got shape {latent.shape}; "
                         "drop the batch axis first (latent[0])")
    (out,) = walk(latent.shape[1], lambda feed: [run(feed["x"], feed["mask"])], emit=emit, context=context,
                  walked={"x": (latent, Rate())}, masks={"mask": Rate()},
                  outputs=[Rate(samples_per_frame)], progress=progress, desc=desc)
    return out
