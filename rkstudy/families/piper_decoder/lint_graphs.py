"""The Piper decoder's graphs as the lint study lints them (host): the pinned slice as cut (unfolded),
the produced slice, and the produced slice with the decoder mask upsampled by ConvTranspose (the
producer's) and by Resize (the form that failed on the board)."""

from __future__ import annotations

import numpy as np

from ...lint.study import FamilyGraph
from ...walk.window import Window, window_inputs


def first_window_sample(z: np.ndarray, window: int) -> dict[str, np.ndarray]:
    """A real latent's first `window` frames (zero-padded past its end) and their mask, batched: the
    feed the walk gives the engine's first step."""
    real = min(z.shape[-1], window)
    x, mask = window_inputs(z, Window(start=0, real=real, emit_start=0, emit_stop=real), window)
    return {"z": x[None], "y_mask": mask[None]}


def lint_graphs(quick: bool) -> list[FamilyGraph]:
    from ..piper.voice import Voice, read_text
    from .producer import DEFAULT_CONTEXT, DEFAULT_EMIT, decoder_graph, produce_for_voice

    voice = Voice()
    window = DEFAULT_EMIT + 2 * DEFAULT_CONTEXT
    sample = first_window_sample(voice.latents(read_text("short"))[0].z, window)
    return [FamilyGraph("piper_decoder", "raw", f"slice pinned at {window}, unfolded",
                        decoder_graph(voice.model, voice.seam, window), sample=sample),
            FamilyGraph("piper_decoder", "rewritten", "produced (folded)", produce_for_voice(voice).model,
                        sample=sample),
            FamilyGraph("piper_decoder", "rewritten", "produced --dec-mask (ConvTranspose mask upsampler)",
                        produce_for_voice(voice, dec_mask=True).model, sample=sample),
            FamilyGraph("piper_decoder", "raw", "--dec-mask with a Resize mask upsampler (measured on the board)",
                        produce_for_voice(voice, dec_mask=True, upsampler="resize").model, sample=sample)]
