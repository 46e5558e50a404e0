"""The Inflect v2 contract's measurements (host): the context sweep on the model's own prior samples."""

from __future__ import annotations

import numpy as np
from tqdm.auto import tqdm

from ... import gates
from ...process import shows_progress
from ...runtime import OrtRunner
from ..piper_decoder.producer import produce_for_voice
from ..piper_decoder.study import FullDecoder, per_window_rows, sidecar
from .carve import EMIT, DecodeModel

CONTEXT_SWEEP = (0, 20, 24, 32)       # the reference documents' measured points
SWEEP_FRAMES = 480                    # the reference documents measured the sweep on 480-slice prior samples


def context_sweep(decode: DecodeModel, z: np.ndarray, contexts=CONTEXT_SWEEP, emit: int = EMIT,
                  dec_mask: bool = True, progress: bool = True) -> list[dict]:
    """Windowed fp32 decode of one prior sample at each context against a full-length decode, by SNR (the
    whole decode and its worst window) and by what a listener would judge of the whole decode
    (rkstudy.gates.perceptual; STOI is NaN on a latent under ~0.4 s of voiced speech)."""
    ref = FullDecoder(decode.model, decode.seam).decode(z)
    rows = []
    for context in tqdm(contexts, desc="contexts", disable=not shows_progress(progress)):
        produced = produce_for_voice(decode, emit=emit, context=context, dec_mask=dec_mask)
        runner = OrtRunner(produced.model)
        test = sidecar(decode, runner, produced.contract).decode(z, progress=False)
        per = per_window_rows(ref, test, z.shape[1], emit, context, decode.hop)
        rows.append({"frames": z.shape[1], "emit": emit, "context": context, "window": emit + 2 * context,
                     "dec_mask": dec_mask, "snr_db": gates.snr_db(ref, test),
                     "min_window_snr_db": min(r["snr_db"] for r in per), "windows": len(per),
                     **gates.perceptual(ref, test, decode.sample_rate), "where": runner.where})
    return rows


def plan_target():
    """The Inflect contract as rkstudy.walk.planner sees it: the carved decode.onnx, its own prior samples
    from the shipped texts as the real latents, today's 256 = 192 + 2 x 32 window, decoder mask on."""
    from ..piper.voice import Voice, read_text
    from ..piper_decoder.study import PLAN_TEXTS
    from ..piper_decoder.study import plan_target as decoder_plan_target
    from .carve import CONTEXT, prior_samples, save_carved

    voice = Voice()
    decode = DecodeModel(save_carved(voice))
    latents = [z for name in PLAN_TEXTS for z in prior_samples(voice, read_text(name))]
    return decoder_plan_target(decode, latents=latents, emit=EMIT, context=CONTEXT, dec_mask=True)
