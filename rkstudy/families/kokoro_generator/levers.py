"""What the Kokoro generator offers the shared studies that build graphs from every family (host): its W = 136
window for the toolkit-version table and the W = 64 window for the quantization lever.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...levers import LeverGraphs, QuantizationPlan
from ...levers.versions import Engine


def window_engine(frames: int = 136, targets: Sequence[str] = ("rk3588",)) -> Engine:
    """The generator engine graph at `frames` (notebook 03's producer), on stage 2's probe (the last
    window of the walk over the short utterance)."""
    from .producer import probe, produce

    produced = produce(frames)
    return Engine(f"Kokoro generator W={frames}", produced.path, probe(produced.contract), tuple(targets))


def lever_graphs(quick: bool) -> LeverGraphs:
    """Full mode: W = 136 with both toolkit versions; W = 64 (32 + 2 x 16) quantized (rk3588, every dtype
    that builds) on 4 windows of ja_medium, evenly spread: the toolkit's calibration pass costs about half a
    minute a window of this graph here (eight windows took 7.6 minutes of a full run). No search: one variant of
    this window is a compile of two minutes or more here, so its plain builds are what fits."""
    from .study import quantization_stage

    if quick:
        return LeverGraphs()
    return LeverGraphs(versions=[window_engine(136)], quantization=[QuantizationPlan(
        lambda: quantization_stage(frames=64, context=16, calibration_windows=4), {"targets": ("rk3588",)})])


# --- the NPU cost model's calibration (notebook 09) -------------------------------------------------------
CLIPPED, FOLDED, EXACT = (f"Kokoro generator W=128, {s}" for s in ("clipped sine", "folded sine",
                                                                  "exact sine (Sin on the CPU), no alpha fold"))
RUN = "Kokoro whole-text run: characters / audio / latent frames / windows of 72 emitted frames"
SINE_RATIO = "Kokoro generator ms on a 33.6 s utterance, engines interleaved: folded / clipped sine"
SHARES = "Kokoro generator graph: share of NPU time in elementwise ops / convolutions"
SIN_SHARE = "Kokoro w128 window: 48 Sin nodes on the CPU, share of window time"
WIDE = "Kokoro generator W=136, folded sine"
WIDE_RTF = "board RTF W=136 vs W=128 (14.85 s)"


def npu_cost_cases(quick: bool):
    """Full mode: the 128-frame window (28 frames of context a side) in the three sine forms the document ran
    on its board, built as it built them (rknn-toolkit2 2.3.2, rk3588), and its figures: the clipped engine's
    generator time over its 1188-frame utterance (17 windows) and per latent frame, the folded engine's
    increase over the clipped one, the exact-sine engine's Sin layers on the CPU and its whole window, and
    the shares of that graph's NPU time in elementwise layers and convolutions (the graph before the
    polynomial and the alpha fold, whose Sin layers the document ranked); and the folded W = 136 window,
    whose 15 windows the document timed against the 17 of W = 128. Quick mode offers nothing: each engine
    is a build of a minute or more."""
    from ...levers import npu_cost as cal
    from ...tables.results import reference_numbers
    from ...walk.window import plan_windows
    from . import DEFAULT_CONTEXT, DEFAULT_FRAMES
    from .generator import ENGINE, Rewrites
    from .producer import produce

    if quick:
        return cal.Cases()
    frames = int(reference_numbers("kokoro_generator", RUN)[2])
    calls = len(plan_windows(frames, DEFAULT_FRAMES - 2 * DEFAULT_CONTEXT, DEFAULT_CONTEXT))
    walk = f"{calls} windows of {DEFAULT_FRAMES} frames walk the document's {frames} latent frames"

    def engine(name, rw):
        return cal.Engine(name, lambda: produce(DEFAULT_FRAMES, DEFAULT_CONTEXT, rw).path)

    engines = [engine(CLIPPED, Rewrites(sine="clip")), engine(FOLDED, ENGINE),
               engine(EXACT, Rewrites(sine="exact", alpha_fold=False)),
               cal.Engine(WIDE, lambda: produce(136, DEFAULT_CONTEXT, ENGINE).path)]
    wide_calls = len(plan_windows(frames, 136 - 2 * DEFAULT_CONTEXT, DEFAULT_CONTEXT))
    audio_s = reference_numbers("kokoro_generator", RUN)[1]
    figures = [
        cal.Figure("kokoro-clipped-generator-ms", "kokoro_generator",
                   "RKNN generator (128-frame window, clipped sine): RTF / peak RSS / generator ms", slice(2, 3),
                   f"generator ms for {frames} latent frames", "ms", (CLIPPED,),
                   lambda p: cal.times(p[CLIPPED], calls), walk),
        cal.Figure("kokoro-clipped-ms-per-frame", "kokoro_generator",
                   "RKNN generator ms per latent frame processed (clipped sine)", slice(0, 1),
                   "generator ms per latent frame", "ms", (CLIPPED,), lambda p: cal.times(p[CLIPPED], calls / frames),
                   walk),
        cal.Figure("kokoro-folded-increase", "kokoro_generator", SINE_RATIO, slice(0, 2),
                   "folded-sine generator time over the clipped one", "%", (FOLDED, CLIPPED),
                   lambda p: cal.increase(p[FOLDED], p[CLIPPED]),
                   "the same walk for both engines, so the ratio of their window times",
                   derive=lambda v: [100 * (v[0] / v[1] - 1)]),
        cal.Figure("kokoro-sin-cpu-ms", "lint", SIN_SHARE, slice(1, 2),
                   "ms of the 48 Sin layers on the CPU, one window", "ms", (EXACT,),
                   lambda p: cal.cpu_op(p[EXACT], "Sin")),
        cal.Figure("kokoro-exact-window-ms", "lint", SIN_SHARE, slice(2, 3), "ms of one exact-sine window", "ms",
                   (EXACT,), lambda p: cal.times(p[EXACT], 1)),
        cal.Figure("kokoro-elementwise-share", "kokoro_generator", SHARES, slice(0, 1),
                   "share of the NPU's time in elementwise layers", "%", (EXACT,),
                   lambda p: cal.npu_share(p[EXACT], "elementwise"), "the exact-sine graph's NPU time"),
        cal.Figure("kokoro-conv-share", "kokoro_generator", SHARES, slice(1, 2),
                   "share of the NPU's time in convolutions", "%", (EXACT,), lambda p: cal.npu_share(p[EXACT], "conv"),
                   "the exact-sine graph's NPU time"),
        cal.Figure("kokoro-w136-saving-ms", "kokoro_generator", WIDE_RTF, slice(0, 2),
                   f"generator ms the W=136 window saves over W=128 on {frames} frames", "ms", (FOLDED, WIDE),
                   lambda p: cal.minus(cal.times(p[FOLDED], calls), cal.times(p[WIDE], wide_calls)),
                   f"{calls} windows of 128 against {wide_calls} of 136 (the folded sine, the shipping engine); their "
                   f"RTF difference is generator time over the same {audio_s:g} s",
                   derive=lambda v: [(v[1] - v[0]) * audio_s * 1e3])]
    return cal.Cases(engines, figures)
