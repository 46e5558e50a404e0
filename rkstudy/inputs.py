"""Board input files: what a host computes for a board job (the tensors the board cannot make without
the model's front end or torch), in one versioned .npz format for every family.

One file holds a `kind` (which command wrote it and which job reads it), the `source` digest of the
model the tensors came from ({"file", "sha256"}: a board job checks it against its engine's contract
before anything runs), small metadata as JSON, arrays shared by the whole file, and per-sentence
arrays. `FORMAT` is the layout's version: a file of another version is refused with one line naming
the command that writes a new one.

Keys in the .npz: `rkstudy_inputs` (FORMAT), `kind`, `source_file`, `source_sha256`, `meta` (JSON
text), `sentences`, `shared.<name>`, `<k>.<name>` for sentence k.

Board side: numpy only.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import atomic
from .errors import InputError

FORMAT = 1
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass
class InputFile:
    """A board job's inputs: `sentences` (one {name: array} per model call), `shared` arrays, `meta`
    (JSON-able scalars), and the `source` digest of the model they came from."""

    kind: str
    source: dict
    sentences: list[dict[str, np.ndarray]]
    shared: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)


def _check_source(source: Mapping, where: str, make: str) -> dict:
    if not isinstance(source, Mapping) or not source.get("file") or not _SHA256.fullmatch(str(source.get("sha256"))):
        raise InputError(f"{where} names no model digest (source {source!r}, want a file name and its sha256); "
                         f"write it again with `{make}`")
    return {"file": str(source["file"]), "sha256": str(source["sha256"])}


def save(path: Path | str, f: InputFile, *, make: str) -> Path:
    """Write `f` atomically; `make` is the command that writes this kind (for the refusals)."""
    arrays: dict[str, np.ndarray] = {
        "rkstudy_inputs": np.asarray(FORMAT), "kind": np.asarray(f.kind),
        **{f"source_{k}": np.asarray(v) for k, v in _check_source(f.source, "the inputs", make).items()},
        "meta": np.asarray(json.dumps(f.meta)), "sentences": np.asarray(len(f.sentences))}
    arrays.update({f"shared.{name}": np.asarray(a) for name, a in f.shared.items()})
    for k, sentence in enumerate(f.sentences):
        arrays.update({f"{k}.{name}": np.asarray(a) for name, a in sentence.items()})
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return atomic.write_bytes(path, buf.getvalue())


def read_arrays(path: Path | str, *, make: str) -> dict[str, np.ndarray]:
    """Every array of the .npz at `path` (for a reader of an older layout), or one line naming `make`."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"no inputs file at {path}; write one on the host with `{make}`")
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError) as exc:
        raise InputError(f"{path.name} is not a readable inputs file ({exc}); write it again with `{make}`") from None


def load(path: Path | str, kind: str, *, make: str) -> InputFile:
    """The file at `path`, checked: this FORMAT, this `kind`, a well-formed source digest."""
    path = Path(path)
    data = read_arrays(path, make=make)
    version = int(data["rkstudy_inputs"]) if "rkstudy_inputs" in data else None
    if version != FORMAT:
        said = "an older layout (no inputs format version)" if version is None else f"inputs format {version}"
        raise InputError(f"{path.name} has {said}, this rkstudy reads format {FORMAT}; write it again with `{make}`")
    if str(data["kind"]) != kind:
        raise InputError(f"{path.name} holds {data['kind']} inputs, not {kind}; write the right file with `{make}`")
    try:
        named = {"file": str(data["source_file"]), "sha256": str(data["source_sha256"])}
        sentences = [{} for _ in range(int(data["sentences"]))]
        shared, meta = {}, json.loads(str(data["meta"]))
    except (KeyError, ValueError) as exc:
        raise InputError(f"{path.name} is an incomplete inputs file ({exc}); write it again with `{make}`") from None
    source = _check_source(named, path.name, make)
    for key, a in data.items():
        head, dot, name = key.partition(".")
        if not dot:
            continue
        if head == "shared":
            shared[name] = a
        elif head.isdigit() and int(head) < len(sentences):
            sentences[int(head)][name] = a
    return InputFile(kind=kind, source=source, sentences=sentences, shared=shared, meta=meta)
