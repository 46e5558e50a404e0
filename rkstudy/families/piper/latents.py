"""Latent files: what the host hands to a board for `rkstudy board run piper_decoder`.

`rkstudy piper latents --text ... -o latents.npz` computes each sentence's pre-flow latent (and the
speaker embedding of a multi-speaker voice) with the voice's own front end on the host, and writes
them with the voice's digest, so the board checks that its engine was carved from the same voice.

Board side: numpy only.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ... import atomic
from ...errors import InputError


@dataclass(frozen=True)
class LatentFile:
    """Latents z [C, N] per sentence (with g [gin, 1] for a multi-speaker voice), the phoneme ids,
    the text, and the voice they came from (file name and sha256)."""

    z: list[np.ndarray]
    g: list[np.ndarray | None]
    ids: list[list[int]]
    text: str
    source: dict
    sample_rate: int


def save(path: Path | str, latents, *, source: dict, sample_rate: int) -> Path:
    """Write `latents` (rkstudy.families.piper.voice.Latent) to an .npz, atomically."""
    arrays = {}
    for k, lat in enumerate(latents):
        arrays[f"z_{k}"] = np.asarray(lat.z, np.float32)
        if lat.g is not None:
            arrays[f"g_{k}"] = np.asarray(lat.g, np.float32)
        arrays[f"ids_{k}"] = np.asarray(lat.ids, np.int64)
    meta = {"sentences": len(latents), "text": latents[0].text if latents else "", "source": source,
            "sample_rate": sample_rate}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return atomic.write_bytes(path, buf.getvalue())


def load(path: Path | str) -> LatentFile:
    path = Path(path)
    if not path.is_file():
        raise InputError(f"no latent file at {path}; write one on the host with "
                         "`rkstudy piper latents --text \"...\" -o latents.npz`")
    try:
        with np.load(path) as data:
            meta = json.loads(bytes(data["meta"]).decode())
            n = meta["sentences"]
            return LatentFile(z=[data[f"z_{k}"] for k in range(n)],
                              g=[data[f"g_{k}"] if f"g_{k}" in data else None for k in range(n)],
                              ids=[data[f"ids_{k}"].tolist() for k in range(n)], text=meta["text"],
                              source=meta["source"], sample_rate=int(meta["sample_rate"]))
    except (OSError, ValueError, KeyError) as exc:
        raise InputError(f"{path} is not a latent file written by `rkstudy piper latents` ({exc}); "
                         "write it again on the host") from None
