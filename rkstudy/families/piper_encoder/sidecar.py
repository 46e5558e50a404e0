"""The encoder ladder (board side): route each chunk to the smallest engine whose width fits its
tokens, and above the widest to an fp32 fallback (or refuse, where none is given).

The reference documents measured that fp16 duration drift grows with width, so the fallback is a quality gate,
not a convenience. Every rung's contract must come from the same voice and agree on the channel
counts; against a voice (on the host) they must match its enc_p.proj and dp.proj widths.

Board side: numpy only (the fallback runner is whatever the caller passes: onnxruntime on a board).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...board.memory import smallest_rung
from ...contract import Contract
from ...errors import EngineMismatch
from .tokens import pad_ids

FALLBACK = "fp32 fallback"


@dataclass
class LadderEngine:
    """One rung: a runner (simulator, board or replay) and its contract."""

    runner: object
    contract: Contract

    @property
    def width(self) -> int:
        return self.contract.params["width"]

    @property
    def widths(self) -> list[int]:
        """Every width this engine runs at: its one width, or a multi-shape engine's shape sets."""
        axis = self.contract.inputs[0].axis  # the padded token ids: their frame axis is the width
        return sorted(one[0][axis] for one in self.contract.shape_sets)

    @property
    def channels(self) -> tuple[int, int]:
        return self.contract.params["stats_channels"], self.contract.params["cond_channels"]


class Ladder:
    """A sorted list of per-width engines, validated at init; `run(ids)` -> stats, cond, where. A
    multi-shape engine is the rung of each width it was compiled for."""

    def __init__(self, engines: Sequence[LadderEngine], fallback=None, *, channels: tuple[int, int] | None = None,
                 remake: str = "rkstudy piper encoder --voice-onnx <voice.onnx> --frames N"):
        if not engines and fallback is None:
            raise EngineMismatch("a ladder needs at least one engine or a fallback")
        sources = {e.contract.source.sha256 for e in engines}
        if len(sources) > 1:
            raise EngineMismatch(f"the ladder's engines come from {len(sources)} different voices "
                                 f"({', '.join(sorted(e.contract.source.file for e in engines))}); "
                                 f"make every rung from one voice with `{remake}`")
        for e in engines:
            if e.contract.family != "piper_encoder":
                raise EngineMismatch(f"a {e.contract.family} engine is not a ladder rung; make one with `{remake}`")
            want = channels or engines[0].channels
            if e.channels != want:
                raise EngineMismatch(
                    f"the width-{e.width} engine emits stats {e.channels[0]} / cond {e.channels[1]} channels, "
                    f"but the voice has stats {want[0]} / cond {want[1]}: it was built for another voice; "
                    f"rebuild it with `{e.contract.remake}`")
        widths = [w for e in engines for w in e.widths]
        if len(set(widths)) != len(widths):
            raise EngineMismatch(f"two engines share a width in {sorted(widths)}; keep one per width")
        self.engines = sorted(engines, key=lambda e: e.width)
        self.fallback = fallback

    @property
    def widths(self) -> list[int]:
        return sorted(w for e in self.engines for w in e.widths)

    def route(self, tokens: int) -> int | None:
        """The smallest width >= tokens, or None when the chunk is above the widest."""
        return smallest_rung(self.widths, tokens)

    def run(self, ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray, str]:
        """(stats [1, 2C, n], cond [1, Cd, n], where it ran: `n<width>` or the fallback)."""
        width = self.route(len(ids))
        n = len(ids)
        if width is None:
            if self.fallback is None:
                raise EngineMismatch(f"{n} tokens are above the widest engine ({max(self.widths)}) and the "
                                     "ladder has no fallback; pass one (the fp32 encoder slice) or a wider engine")
            feed = {"input": np.array([list(ids)], np.int64), "input_lengths": np.array([n], np.int64)}
            stats, cond = self.fallback.run(feed)
            return stats, cond, FALLBACK
        engine = next(e for e in self.engines if width in e.widths)
        stats, cond = engine.runner.run(pad_ids(ids, width))
        return stats[..., :n], cond[..., :n], f"n{width}"

    def plan(self, chunks: Sequence[tuple[str, Sequence[int]]]) -> list[dict]:
        """Which chunk lands where (no inference)."""
        return [{"chunk": k, "tokens": len(ids), "lands": (f"n{w}" if (w := self.route(len(ids))) else FALLBACK),
                 "pad_slots": (w - len(ids)) if w else 0, "text": text[:48]}
                for k, (text, ids) in enumerate(chunks)]
