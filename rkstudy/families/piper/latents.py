"""Latent files: what the host hands to a board for `rkstudy board run piper_decoder`.

`rkstudy piper latents --text ... -o latents.npz` computes each sentence's pre-flow latent (and the
speaker embedding of a multi-speaker voice) with the voice's own front end on the host, and writes
them with the voice's digest, so the board checks that its engine was carved from the same voice.
The file is a board input file (rkstudy.inputs); files written before that format (JSON metadata as
bytes, no version) are still read, since a board may hold them.

Board side: numpy only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ... import inputs
from ...errors import InputError

KIND = "piper latents"
MAKE = 'rkstudy piper latents --text "..." -o latents.npz'


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
    sentences = []
    for lat in latents:
        arrays = {"z": np.asarray(lat.z, np.float32), "ids": np.asarray(lat.ids, np.int64)}
        if lat.g is not None:
            arrays["g"] = np.asarray(lat.g, np.float32)
        sentences.append(arrays)
    meta = {"text": latents[0].text if latents else "", "sample_rate": sample_rate}
    return inputs.save(path, inputs.InputFile(KIND, source, sentences, meta=meta), make=MAKE)


def _unversioned(path: Path, data: dict) -> LatentFile:
    """A latent file written before rkstudy.inputs: z_k / g_k / ids_k and JSON metadata as uint8 bytes."""
    try:
        meta = json.loads(bytes(data["meta"]).decode())
        n = meta["sentences"]
        return LatentFile(z=[data[f"z_{k}"] for k in range(n)], g=[data.get(f"g_{k}") for k in range(n)],
                          ids=[data[f"ids_{k}"].tolist() for k in range(n)], text=meta["text"],
                          source=meta["source"], sample_rate=int(meta["sample_rate"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{path.name} is not a latent file written by `rkstudy piper latents` ({exc}); "
                         f"write it again on the host with `{MAKE}`") from None


def load(path: Path | str) -> LatentFile:
    path = Path(path)
    data = inputs.read_arrays(path, make=MAKE)
    if "rkstudy_inputs" not in data and "meta" in data and data["meta"].dtype == np.uint8:
        return _unversioned(path, data)
    f = inputs.load(path, KIND, make=MAKE)
    try:
        return LatentFile(z=[s["z"] for s in f.sentences], g=[s.get("g") for s in f.sentences],
                          ids=[s["ids"].tolist() for s in f.sentences], text=f.meta["text"], source=f.source,
                          sample_rate=int(f.meta["sample_rate"]))
    except KeyError as exc:
        raise InputError(f"{path.name} is an incomplete latent file (no {exc}); write it again on the host "
                         f"with `{MAKE}`") from None
