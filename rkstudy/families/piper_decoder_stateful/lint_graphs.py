"""The Piper stateful decoder's graphs as the lint study lints them (host): the --dec-mask window slice
the surgery starts from, and the step cut from it (the caches as graph I/O), each with a real latent
window (the step's state zeroed)."""

from __future__ import annotations

import numpy as np

from ...lint.study import FamilyGraph

EMIT = 45


def lint_graphs(quick: bool) -> list[FamilyGraph]:
    from ..piper.voice import Voice, read_text
    from ..piper_decoder.lint_graphs import first_window_sample
    from .producer import produce_step_for_voice

    voice = Voice()
    produced = produce_step_for_voice(voice, EMIT)
    z = voice.latents(read_text("short"))[0].z
    window = produced.slice.contract.window.frames
    step_in = {i.name: tuple(d.dim_value for d in i.type.tensor_type.shape.dim) for i in produced.model.graph.input}
    step_sample = {k: np.zeros(shape, np.float32) for k, shape in step_in.items()}
    step_sample.update({k: v[..., : step_in[k][-1]] for k, v in first_window_sample(z, step_in["z"][-1]).items()})
    return [FamilyGraph("piper_decoder_stateful", "raw", f"--dec-mask slice at {window} (before the step surgery)",
                        produced.slice.model, sample=first_window_sample(z, window)),
            FamilyGraph("piper_decoder_stateful", "rewritten", f"stateful step at E={EMIT}", produced.model,
                        sample=step_sample)]
