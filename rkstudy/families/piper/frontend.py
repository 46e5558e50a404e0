"""A Piper voice's text front end from its config alone: espeak-ng phonemes (the espeak-ng that
piper-tts bundles), phoneme ids, the inference scales, and the id feed of the voice's graph. Shared by
the host (rkstudy.families.piper.voice) and a board synthesizing text (rkstudy.families.piper.boardfront).

Board side: numpy, and piper-tts at call time.
"""

from __future__ import annotations

import json
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import InputError


def ids_feed(ids) -> dict[str, np.ndarray]:
    """The voice's id inputs for one exact-length sentence or chunk (batch 1)."""
    return {"input": np.array([ids], dtype=np.int64), "input_lengths": np.array([len(ids)], dtype=np.int64)}


@dataclass(frozen=True)
class Latent:
    """The decoder's real input for one sentence: z [C, N], the phoneme ids it came from, and for a
    multi-speaker voice the speaker embedding g [gin, 1] the decoder is conditioned on."""

    text: str
    ids: list[int]
    z: np.ndarray
    g: np.ndarray | None = None

    @property
    def frames(self) -> int:
        return self.z.shape[1]


class TextFront:
    """Text -> sentences of phoneme ids, and the scales the voice's config asks for."""

    def __init__(self, config_path: Path | str):
        self.config_path = Path(config_path)
        if not self.config_path.is_file():
            raise InputError(f"no voice config at {self.config_path} (piper keeps it beside the ONNX as "
                             "<voice>.onnx.json); pass --voice-config PATH")
        self.config = json.loads(self.config_path.read_text())
        self.sample_rate = int(self.config["audio"]["sample_rate"])
        inference = self.config.get("inference", {})
        self.scales = np.array([inference.get("noise_scale", 0.667), inference.get("length_scale", 1.0),
                                inference.get("noise_w", 0.8)], dtype=np.float32)

    def phonemes(self, text: str) -> list[list[str]]:
        """Sentences of espeak-ng phonemes (piper-tts' bundled espeak-ng and its data)."""
        try:
            from piper.phonemize_espeak import EspeakPhonemizer
        except ImportError:
            raise InputError("text needs piper-tts for its espeak-ng phonemes (pip install piper-tts), or pass "
                             "latents written on the host (`rkstudy piper latents`)") from None
        return EspeakPhonemizer().phonemize(self.config["espeak"]["voice"], unicodedata.normalize("NFC", text))

    def ids(self, phonemes: list[str]) -> list[int]:
        """Phoneme ids with the voice's own phoneme_id_map (BOS, pads between, EOS)."""
        from piper.phoneme_ids import phonemes_to_ids

        return phonemes_to_ids(phonemes, self.config["phoneme_id_map"])

    def sentences(self, text: str) -> list[list[int]]:
        return [self.ids(p) for p in self.phonemes(text)]
