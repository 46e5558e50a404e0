"""Inflect v2 decode.onnx (carved from the Piper voice) as the lint study lints it (host): the pinned
slice unfolded, and the produced one."""

from __future__ import annotations

from ...lint.study import FamilyGraph


def lint_graphs(quick: bool) -> list[FamilyGraph]:
    from ..piper.voice import Voice
    from ..piper_decoder.producer import decoder_graph, produce_for_voice
    from . import carve

    decode = carve.DecodeModel(carve.save_carved(Voice()))
    window = carve.EMIT + 2 * carve.CONTEXT
    return [FamilyGraph("inflect_decoder", "raw", f"slice pinned at {window}, unfolded",
                        decoder_graph(decode.model, decode.seam, window)),
            FamilyGraph("inflect_decoder", "rewritten", "produced (folded, decoder mask)",
                        produce_for_voice(decode, emit=carve.EMIT, context=carve.CONTEXT, dec_mask=True).model)]
