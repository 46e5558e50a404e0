"""Text to the decoder's latents on a board: piper-tts phonemizes, onnxruntime runs the voice itself
with its pre-flow latent (and speaker embedding) exposed as outputs by rkstudy.runtime.protowire, because the
board has no onnx package to slice the graph with. The seam's tensor names come from the engine's
contract, where the producer recorded them.

The voice's own sampling (durations, prior) runs unseeded here, so each call gives a fresh latent, as
piper itself would; for a reproducible comparison with the host, pass latents written there.

Board side: numpy, onnxruntime and piper-tts.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...runtime.ort import OrtRunner
from ...runtime.protowire import add_graph_outputs
from .frontend import TextFront, ids_feed


def latents_from_text(voice_onnx: Path | str, text: str, *, seam_z: str, seam_g: str = "",
                      config: Path | str | None = None, speaker: int = 0) -> tuple[list, TextFront]:
    """[(ids, z [C, N], g [gin, 1] or None)] per sentence, and the text front (sample rate)."""
    front = TextFront(config or f"{voice_onnx}.json")
    names = [seam_z] + ([seam_g] if seam_g else [])
    runner = OrtRunner(add_graph_outputs(Path(voice_onnx).read_bytes(), names))
    out = []
    for ids in front.sentences(text):
        feed = {**ids_feed(ids), "scales": front.scales}
        if "sid" in runner.input_names:
            feed["sid"] = np.array([speaker], np.int64)
        got = runner.run(feed)[-len(names):]
        g = got[1].reshape(got[1].shape[1], -1) if seam_g else None
        out.append((ids, got[0][0], g))
    return out, front
