"""Audio files in and out of a whole synthesis, through soundfile (libsndfile; its aarch64 wheels carry
the library, so a board reads and writes the same formats as the host): WAV or FLAC, 16-bit PCM, mono,
at the model's own rate, written atomically.

Board side: numpy and soundfile.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .. import atomic
from ..errors import InputError, UsageError

FORMATS = {".wav": "WAV", ".flac": "FLAC"}


def audio_format(path: Path | str) -> str:
    """The container for `path` by its suffix; another suffix is a usage error naming the two."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise UsageError(f"--audio {path}: write .wav or .flac (soundfile writes 16-bit PCM in either)")
    return FORMATS[suffix]


def _soundfile():
    try:
        import soundfile
    except (ImportError, OSError) as exc:
        raise InputError(f"audio files need soundfile and its libsndfile ({exc}): pip install soundfile (its "
                         "manylinux_2_28 aarch64 wheel carries libsndfile; on an older image, apt install "
                         "libsndfile1)") from None
    return soundfile


def write(path: Path | str, pcm: np.ndarray, sample_rate: int) -> Path:
    """`pcm` (float, [-1, 1]) as 16-bit mono WAV or FLAC at `sample_rate`, replacing `path` atomically."""
    fmt = audio_format(path)
    sf = _soundfile()
    data = np.clip(np.asarray(pcm, np.float64).ravel(), -1.0, 1.0)
    with atomic.replacing(path) as tmp:
        sf.write(str(tmp), data, int(sample_rate), subtype="PCM_16", format=fmt)
    return Path(path)


def read(path: Path | str) -> tuple[np.ndarray, int]:
    """(float32 mono samples, sample rate) of a WAV or FLAC file."""
    sf = _soundfile()
    try:
        data, rate = sf.read(str(path), dtype="float32", always_2d=True)
    except (RuntimeError, sf.LibsndfileError) as exc:
        raise InputError(f"{path} is not an audio file soundfile reads ({exc}); give a WAV or FLAC file") from None
    return data.mean(axis=1) if data.shape[1] > 1 else data[:, 0], int(rate)
