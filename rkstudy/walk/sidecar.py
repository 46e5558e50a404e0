"""The contract-driven window sidecar: a fixed-window engine, any runner, inputs of any length.

The contract says everything the walk needs: which inputs are walked (and at what rate per latent
frame), which are masks the walker makes, which are constants, the window, and the rate of each
output. A family's sidecar adds only its own checks against the model it serves (latent channels,
hop, spectrogram rows) and its own entry point (decode a latent, generate a spectrogram).

Board side: numpy and tqdm only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from ..contract import Contract
from ..errors import EngineMismatch, UsageError
from .window import Rate, walk


class WindowSidecar:
    """Walk `runner` (fp32, simulator, board or replay) over inputs of any length per `contract`."""

    def __init__(self, runner, contract: Contract):
        if contract.window is None:
            raise EngineMismatch(f"the {contract.family} contract has no window; it is not a walked engine "
                                 f"(make one with `{contract.remake}`)")
        contract.check_runner(runner)
        self.runner, self.contract = runner, contract

    @property
    def where(self) -> str:
        return self.runner.where

    @property
    def target(self) -> str:
        return self.runner.target

    def run(self, n_frames: int, walked: Mapping[str, np.ndarray], constants: Mapping[str, np.ndarray] | None = None,
            *, progress: bool = True, desc: str = "windows", overlap: int = 0,
            adjust: Callable | None = None) -> list[np.ndarray]:
        """The walked outputs, stitched over `n_frames` latent frames.

        `walked` maps each walked input to its full-length array without the batch axis (frame axis
        last, `rate * n_frames + extra` long); `constants` maps each constant input to its value.
        `overlap` and `adjust` are rkstudy.walk.window.walk's (shared frames blended with a raised cosine;
        a per-window correction of the outputs, without the batch axis, before they are stitched).
        """
        c, constants = self.contract, dict(constants or {})
        missing = [t.name for t in c.role("walked") if t.name not in walked]
        missing += [t.name for t in c.role("constant") if t.name not in constants]
        if missing:
            raise EngineMismatch(f"the {c.family} engine needs {', '.join(missing)} as well")
        fixed = {t.name: np.reshape(np.asarray(constants[t.name], np.float32), t.shape) for t in c.role("constant")}
        outputs = [t for t in c.outputs if t.role == "walked"]
        index = [c.outputs.index(t) for t in outputs]

        def one_window(feed):
            full = {t.name: fixed[t.name] if t.name in fixed else np.reshape(feed[t.name], t.shape)
                    for t in c.inputs}
            got = self.runner.run(full)
            return [got[i][0] for i in index]  # drop the batch axis

        w = c.window
        if not 0 <= overlap <= w.emit // 2:
            raise UsageError(f"overlap={overlap}: this engine emits {w.emit} frames a window, so the "
                             f"overlap must be in 0..{w.emit // 2}")
        return walk(n_frames, one_window, emit=w.emit, context=w.context,
                    walked={t.name: (walked[t.name], Rate(t.rate, t.extra)) for t in c.role("walked")},
                    masks={t.name: Rate(t.rate, t.extra) for t in c.role("mask")},
                    outputs=[Rate(t.rate, t.extra) for t in outputs], progress=progress, desc=desc,
                    overlap=overlap, adjust=adjust)
