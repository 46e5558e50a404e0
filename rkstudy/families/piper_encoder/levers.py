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


# --- the NPU cost model's calibration (notebook 09) -------------------------------------------------------
BUILT_WIDTHS, WIDE = (128, 192, 256), 384
SHORT_CHUNKS = "duration stage ms: chunks of 109/115/111 tokens: ggml vs NPU n128"
LONG_CHUNKS = "duration stage ms: chunks of 285/323/373 tokens: ggml vs NPU n384"


def cpu_share_of_stage(voice, tokens: int) -> float:
    """The share of a chunk's duration stage that stays on the CPU when the encoder moves to the NPU, as this
    host's CPU path splits it: the voice's middle cut (duration flows, the duration ceiling, length regulation,
    prior sampling; rkstudy.families.piper.cuts) over the encoder cut and the middle, on `tokens` tokens of
    real text, one thread each, the fastest of rounds of both interleaved (rkstudy.toolkit.cost.fastest_of: a
    slow spell of this shared host falls on both alike)."""
    import numpy as np

    from ...toolkit.cost import fastest_of, host_session
    from ..piper.cuts import IDS, LENGTHS, SCALES, SID, voice_cuts
    from .tokens import real_tokens

    cuts = voice_cuts(voice.onnx_path)
    ids = real_tokens(voice, tokens)
    feed = {IDS: np.array([ids], np.int64), LENGTHS: np.array([len(ids)], np.int64), SCALES: voice.scales,
            SID: np.array([0], np.int64)}
    encoder, middle = host_session(cuts.encoder), host_session(cuts.middle_seeded(1234))

    def run(session):
        return session.run(None, {i.name: feed[i.name] for i in session.get_inputs()})

    stats, cond = run(encoder)
    feed.update({cuts.seams.stats: stats, cuts.seams.cond: cond})
    ms = fastest_of({"encoder": lambda: run(encoder), "middle": lambda: run(middle)})
    return ms["middle"] / (ms["encoder"] + ms["middle"])


def npu_cost_cases(quick: bool):
    """Full mode: the gather-rewritten encoder (the pull request's Toeplitz form) at 128, 192 and 256 tokens,
    built as the pull request built them (rknn-toolkit2 2.3.2, rk3588), and its two board figures, each a
    duration stage: one call of the bin's engine per chunk, plus the part of the stage that stays on the
    CPU. That part is the board's own CPU time for the whole stage (the same figure's ggml column, the same
    chunks) times the share this host's CPU path spends outside the encoder: the board's CPU, not this
    host's scaled by a factor fitted on another implementation's ops. The 384-token engine (2.9 GB of
    weights in the pull request's build, whose converter needed most of a 31 GB host at 512) is not built
    here: its prediction extrapolates every sum of the built widths' predictions as a power law of the
    width. Quick mode offers nothing."""
    from ...levers import npu_cost as cal
    from ...tables.results import reference_numbers
    from ..piper.voice import Voice
    from .producer import produce

    if quick:
        return cal.Cases()
    voice = Voice()
    names = {n: f"Piper duration encoder n{n} (gather rewrite)" for n in BUILT_WIDTHS}
    engines = [cal.Engine(names[n], lambda n=n: produce(voice, n).path) for n in BUILT_WIDTHS]
    cpu, how = {}, {}
    for figure in (SHORT_CHUNKS, LONG_CHUNKS):
        chunks = [int(n) for n in figure.split("chunks of ")[1].split(" tokens")[0].split("/")]  # the figure's own
        tokens, ggml = round(sum(chunks) / len(chunks)), sum(reference_numbers("piper_encoder", figure)[:3]) / 3
        share = cpu_share_of_stage(voice, tokens)
        cpu[figure] = share * ggml
        how[figure] = (f"the CPU part of the stage: the board's ggml stage ({ggml:.0f} ms) times this host's share "
                       f"outside the encoder at {tokens} tokens ({share:.2f})")
    wide = f"extrapolated to n{WIDE} from the built widths {', '.join(map(str, BUILT_WIDTHS))} (power law per sum)"

    return cal.Cases(engines, [
        cal.Figure("encoder-n128-ms", "piper_encoder", SHORT_CHUNKS, slice(3, 6),
                   "duration stage ms per chunk, bin 128", "ms", (names[128],),
                   lambda p: cal.times(p[names[128]], 1), "one call of the 128-token engine per chunk; "
                   + how[SHORT_CHUNKS], board_cpu_ms=cpu[SHORT_CHUNKS]),
        cal.Figure("encoder-n384-ms", "piper_encoder", LONG_CHUNKS, slice(3, 6),
                   "duration stage ms per chunk, bin 384", "ms", tuple(names.values()),
                   lambda p: cal.times(cal.extrapolated({n: p[names[n]] for n in BUILT_WIDTHS}, WIDE), 1),
                   f"one call of the 384-token engine per chunk, {wide}; " + how[LONG_CHUNKS],
                   board_cpu_ms=cpu[LONG_CHUNKS])])
