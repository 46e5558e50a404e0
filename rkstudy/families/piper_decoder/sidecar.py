"""The Piper decoder sidecar (board side): a latent of any length in, PCM out, through any runner
of a produced window engine (fp32, simulator, board, replay).

Board side: numpy and tqdm only.
"""

from __future__ import annotations

import numpy as np

from ...contract import Contract, Expect
from ...errors import EngineMismatch
from ...walk.sidecar import WindowSidecar


def check_voice(contract: Contract, *, channels: int, hop: int, speaker_dims: int = 0) -> None:
    """Refuse an engine made for another voice (latent channels, hop, speaker embedding), naming the
    command that produces a matching one (shared by the window and the stateful decoder sidecars)."""
    contract.check_params({
        "channels": Expect(channels, "the engine takes {engine} latent channels, the voice has {model}"),
        "hop": Expect(hop, "the engine voices {engine} samples per frame, the voice {model}"),
        "speaker_dims": Expect(speaker_dims, "the engine takes a {engine}-wide speaker embedding, the voice has "
                                             "{model}", absent=0)}, what="voice")


class DecoderSidecar:
    """Validates the engine against the voice at init (channels, hop; the window against the
    runner's shapes) and refuses a mismatch with the command that produces a matching one."""

    def __init__(self, runner, contract: Contract, *, channels: int, hop: int, speaker_dims: int = 0):
        check_voice(contract, channels=channels, hop=hop, speaker_dims=speaker_dims)
        self.window = WindowSidecar(runner, contract)
        self.runner, self.contract = runner, contract

    def decode(self, z: np.ndarray, g: np.ndarray | None = None, progress: bool = True) -> np.ndarray:
        """PCM (float, [-1, 1]) for a pre-flow latent z [C, N] (and speaker embedding g [gin, 1])."""
        c = self.contract
        if z.ndim != 2 or z.shape[0] != c.params["channels"]:
            raise EngineMismatch(f"latent has shape {z.shape}; this engine takes [{c.params['channels']}, N]")
        if c.params.get("speaker_dims") and g is None:
            raise EngineMismatch("this engine was produced from a multi-speaker voice: pass the speaker embedding g")
        (audio,) = self.window.run(z.shape[1], {"z": z}, {"g": g} if g is not None else None,
                                   progress=progress, desc="decoder windows")
        return audio.reshape(-1)
