"""What the Piper duration encoder offers the shared studies that build graphs from every family (host): its
width ladder for the multi-shape lever and the width-64 engine for the quantization lever. It builds on the
study (its widths, its quantization stage and the ladder's row label); the study never imports it.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...levers import LeverGraphs, QuantizationPlan
from ...levers.multi_shape import ShapeLadder
from ...runtime import OrtRunner


def shape_ladder(voice, widths: Sequence[int], mode: str | None = None) -> ShapeLadder:
    """The encoder ladder: a width-w engine is compiled from the width-w rewritten slice (its
    relative-shift chains rewritten at that width); the multi-shape engine from the widest one. Fed
    the voice's own tokens filling each width, scored (the worse of stats and cond) against the raw
    dynamic slice at exact length, as notebook 02 scores its widths."""
    from ..piper import voice as piper
    from .producer import DEFAULT_RELSHIFT, both, produce
    from .study import ladder_graph
    from .tokens import pad_ids, real_tokens

    mode = mode or DEFAULT_RELSHIFT
    raw = OrtRunner(produce(voice, max(widths), mode=mode).raw)
    tokens = {w: real_tokens(voice, w) for w in widths}

    def score(w, feed, outs):
        m = both(raw.run(piper.ids_feed(tokens[w])), outs, w)
        return min(m["stats_snr_db"], m["cond_snr_db"])

    return ShapeLadder(graph=ladder_graph(mode), widths=tuple(widths),
                       shapes=lambda w: {"input": [1, w], "input_lengths": [1]},
                       single=lambda w: produce(voice, w, mode=mode).path,
                       multi=produce(voice, max(widths), mode=mode).path,
                       feed=lambda w: pad_ids(tokens[w], w), score=score)


def lever_graphs(quick: bool) -> LeverGraphs:
    """Full mode: the ladder's first two widths as one multi-shape engine (the rewrite bakes the width
    in, so the toolkit's shape re-inference fails for any two: two say it, measured also with all four,
    after 147 s instead of 54 s), and the width-64 engine quantized (rk3588, every dtype that builds, auto-hybrid and
    a search steered by SNR: its outputs are no audio)."""
    from ..piper.voice import Voice
    from .study import FULL_WIDTHS, quantization_stage

    if quick:
        return LeverGraphs()
    return LeverGraphs(shape_ladders=[shape_ladder(Voice(), FULL_WIDTHS[:2])],
                       quantization=[QuantizationPlan(lambda: quantization_stage(Voice(), width=64),
                                                      {"targets": ("rk3588",), "auto_hybrid": (0.99,),
                                                       "search": {"budget": 20}})])
