"""`rkstudy speak ... --stream FILE|-`: the audio written as it is made, a chunk (or a step) at a time, flushed
each time, so a player hears the first chunk while the rest of the text is synthesized:

    rkstudy speak piper --plan plans/piper.rk3588.json ... --stream - | aplay -f S16_LE -r 22050 -c 1

`-` is the command's standard output, as raw 16-bit little-endian mono PCM at the model's rate (what aplay and
sox read with the rate given); everything the command prints then goes to standard error. A FILE ending in .wav
gets a WAV header whose lengths say "open" (0xFFFFFFFF) while it grows, and the real lengths once the run ends
(the header a streaming WAV writer leaves: players read it to the end of the data); any other name is raw PCM.
The samples are the ones `--audio` writes, byte for byte.

A reader that goes away (the player closed, `| head -c`) ends the run at the next chunk: the child stops, no row
and no --audio file are written, and the command exits 141 (rkstudy.errors.StreamClosed: what a shell shows for a writer
ended by SIGPIPE). A run that fails otherwise removes a stream FILE it started: what it held was not the text.

Runs in the synthesis child (rkstudy.plan.speak): numpy and soundfile.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np

from ..errors import StreamClosed

STDOUT = "-"
OPEN = 0xFFFFFFFF


def pcm16(pcm: np.ndarray, rate: int) -> bytes:
    """float samples as 16-bit little-endian PCM, the bytes --audio writes (clipped to [-1, 1], then libsndfile's
    own PCM_16 conversion, whose rounding a hand-written scale does not reproduce)."""
    import io

    import soundfile as sf

    out = io.BytesIO()
    sf.write(out, np.clip(np.asarray(pcm, np.float64).reshape(-1), -1.0, 1.0), int(rate), subtype="PCM_16",
             format="RAW", endian="LITTLE")
    return out.getvalue()


def wav_header(rate: int, data_bytes: int = OPEN) -> bytes:
    """A 44-byte mono 16-bit WAV header; `data_bytes` OPEN while the data grows."""
    riff = OPEN if data_bytes == OPEN else 36 + data_bytes
    return (b"RIFF" + struct.pack("<I", riff) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, rate, 2 * rate, 2, 16)
            + b"data" + struct.pack("<I", data_bytes))


class Sink:
    """Where a job's audio goes as it is made. `write` each chunk in order; `close` once the text is spoken,
    `abandon` when the run failed. A Sink for no target writes nothing."""

    def __init__(self, target: str | None, rate: int):
        self.target, self.rate, self.bytes = target, int(rate), 0
        self.wav = target not in (None, STDOUT) and str(target).lower().endswith(".wav")
        self._fd = None
        if target is None:
            return
        if target == STDOUT:
            # the audio takes this process's standard output; whatever else prints here goes to stderr
            self._fd = os.dup(1)
            os.dup2(2, 1)
        else:
            self._fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        if self.wav:
            self._send(wav_header(self.rate))

    def _send(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._fd, view):]
        except BrokenPipeError:
            raise StreamClosed(f"the stream's reader closed {self.where} after {self.seconds:.2f} s of audio; the "
                               "run stopped and wrote no row") from None

    @property
    def where(self) -> str:
        return "standard output" if self.target == STDOUT else str(self.target)

    @property
    def seconds(self) -> float:
        return self.bytes / 2 / self.rate

    def write(self, pcm: np.ndarray) -> None:
        if self._fd is None:
            return
        data = pcm16(pcm, self.rate)
        self._send(data)
        self.bytes += len(data)

    def close(self) -> None:
        """The text is spoken: a WAV FILE gets its real lengths (a pipe keeps the open ones)."""
        if self._fd is None:
            return
        if self.wav:
            os.lseek(self._fd, 0, os.SEEK_SET)
            self._send(wav_header(self.rate, self.bytes))
        os.close(self._fd)
        self._fd = None

    def abandon(self) -> None:
        """The run failed: a FILE it started goes (its audio is not the text's)."""
        if self._fd is None:
            return
        os.close(self._fd)
        self._fd = None
        if self.target != STDOUT:
            Path(self.target).unlink(missing_ok=True)


OPENED: list[Sink] = []   # this child's sinks, which the child closes or abandons once its job has ended


def sink_for(payload: dict, rate: int) -> Sink:
    """The job's sink: the payload's `stream` target (rkstudy.plan.speak.payload_of), or none."""
    OPENED.append(Sink(payload.get("stream"), rate))
    return OPENED[-1]


def finish(ok: bool) -> None:
    """The job ended: close its sinks (`ok`) or abandon them."""
    while OPENED:
        sink = OPENED.pop()
        sink.close() if ok else sink.abandon()
