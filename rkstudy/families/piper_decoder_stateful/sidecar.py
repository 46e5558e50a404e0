"""The stateful Piper decoder sidecar (board side): a latent of any length in, PCM out, through any
runner of a stateful step engine (fp32, simulator, board, replay), streaming or whole.

Board side: numpy only.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from ...contract import Contract
from ...errors import EngineMismatch
from ...walk.stateful import StatefulWalker
from ..piper_decoder.sidecar import check_voice


class StatefulDecoderSidecar:
    """Validates the engine against the voice (channels, hop, speaker embedding) and the runner
    against the contract at init, then walks it: one step per `emit` frames, no recomputed context."""

    def __init__(self, runner, contract: Contract, *, channels: int, hop: int, speaker_dims: int = 0):
        check_voice(contract, channels=channels, hop=hop, speaker_dims=speaker_dims)
        constants = {"g": np.zeros((speaker_dims, 1), np.float32)} if speaker_dims else {}
        self.walker = StatefulWalker(runner, contract, constants)
        self.runner, self.contract = runner, contract

    def _speaker(self, g: np.ndarray | None) -> None:
        if self.contract.params.get("speaker_dims"):
            if g is None:
                raise EngineMismatch("this engine was produced from a multi-speaker voice: pass the speaker "
                                     "embedding g")
            self.walker.set_constants({"g": g})

    def decode(self, z: np.ndarray, g: np.ndarray | None = None) -> np.ndarray:
        """PCM (float, [-1, 1]) for a pre-flow latent z [C, N] (and speaker embedding g [gin, 1])."""
        channels = self.contract.params["channels"]
        if z.ndim != 2 or z.shape[0] != channels:
            raise EngineMismatch(f"latent has shape {z.shape}; this engine takes [{channels}, N]")
        self._speaker(g)
        (audio,) = self.walker.decode({"z": z})
        return audio.reshape(-1)

    def stream(self, chunks: Iterable[np.ndarray], g: np.ndarray | None = None) -> Iterator[np.ndarray]:
        """PCM as soon as it is final while latent chunks [C, n] arrive, then the flushed tail."""
        self._speaker(g)
        for (audio,) in self.walker.stream({"z": z} for z in chunks):
            yield audio.reshape(-1)

    @property
    def steps(self) -> int:
        """Steps the last decode ran (flush included)."""
        return self.walker.steps
