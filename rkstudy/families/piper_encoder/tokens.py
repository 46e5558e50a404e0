"""Real tokens for the encoder: the runtime's text chunker, and ids padded to an engine's width.

chunk_text and pad_ids are board side (standard library and numpy); the functions taking a voice
run its espeak-ng front end (host, or a board with piper-tts installed).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from ...errors import UsageError


def chunk_text(text: str, chunk_chars: int) -> list[str]:
    """Split at word boundaries into pieces of at most `chunk_chars` characters, never across
    a sentence end: the runtime's --text-chunk-size chunker the reference documents measured with."""
    chunks = []
    for sentence in re.split(r"(?<=[.!?])\s+", text.strip()):
        cur = ""
        for word in sentence.split():
            if cur and len(cur) + 1 + len(word) > chunk_chars:
                chunks.append(cur)
                cur = word
            else:
                cur = f"{cur} {word}".strip()
        if cur:
            chunks.append(cur)
    return chunks


def chunk_ids(voice, text: str, chunk_chars: int) -> list[tuple[str, list[int]]]:
    """(chunk text, phoneme ids) for every chunk; a chunk espeak splits further stays one
    chunk (its sentences' ids concatenated), as the runtime feeds it to the encoder."""
    out = []
    for chunk in chunk_text(text, chunk_chars):
        ids = [i for s in voice.sentences(chunk) for i in s]
        if ids:
            out.append((chunk, ids))
    return out


def real_tokens(voice, n: int, text: str | None = None) -> list[int]:
    """The first `n` phoneme ids of real text (the paragraph's sentences, BOS..EOS each,
    back to back): real token statistics at any count, for the per-count fidelity rows."""
    from ..piper.voice import read_text

    stream = [i for s in voice.sentences(text or read_text("paragraph")) for i in s]
    if n > len(stream):
        raise UsageError(f"the text has {len(stream)} tokens, asked for {n}; pass a longer text")
    return stream[:n]


def pad_ids(ids: Sequence[int], frames: int) -> dict[str, np.ndarray]:
    """Right-pad ids with 0 (piper's pad id) to the engine width; lengths carries the real count."""
    if len(ids) > frames:
        raise UsageError(f"{len(ids)} tokens do not fit a width-{frames} engine; use the ladder "
                         "(or a wider engine)")
    x = np.zeros((1, frames), np.int64)
    x[0, : len(ids)] = ids
    return {"input": x, "input_lengths": np.array([len(ids)], np.int64)}
