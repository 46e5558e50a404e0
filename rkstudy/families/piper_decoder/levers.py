"""What the Piper decoder offers the shared studies that build graphs from every family (host): its 93-frame
window for the toolkit-version table and the quantization lever, and its unfolded slice for lint's compiler
check.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ... import graph
from ...levers import LeverGraphs, QuantizationPlan
from ...levers.versions import Engine
from ...lint.against_toolkit import TOOLKIT_FOLDS, Case
from ...targets import ALL_TARGETS, STUDIED_TARGETS
from .producer import DEFAULT_CONTEXT, DEFAULT_EMIT, decoder_graph, produce_for_voice, window_shapes


def window_engine(targets: Sequence[str] = STUDIED_TARGETS, text: str = "short") -> Engine:
    """The joe voice's decoder pinned to the 93-frame window (45 emitted + 2 x 24 context), on the
    first 93 frames of the first sentence's real latent (zero-padded, mask off, where it is shorter)."""
    from ..piper.voice import Voice, read_text
    from .study import padded_window

    voice = Voice()
    produced = produce_for_voice(voice)
    window = produced.contract.window.frames
    z = voice.latents(read_text(text))[0].z
    names = [t.name for t in produced.contract.inputs]
    x, mask = padded_window(z[:, :window], window)
    feed = {"z": x, **({"y_mask": mask} if "y_mask" in names else {})}
    return Engine(f"Piper decoder {window}-frame window", produced.save(), [feed], tuple(targets))


def lever_graphs(quick: bool) -> LeverGraphs:
    """Quick: the window quantized on one text and scored on one window of another, on rk3588: fp16, w8a8,
    the isolation of what a hybrid of every ranked layer loses, and a search of a few variants over the
    flow and the decoder as two blocks. Full: the window engine for both toolkit versions; quantized on
    every target the probe covers, the default calibration varied one setting at a time on rk3588 (algorithm, method,
    calibration samples), the ranking on two calibration samples, the isolation, the search, and its chosen
    points carried to every other target."""
    from ..piper.voice import Voice
    from .study import quantization_stage

    if quick:
        return LeverGraphs(quantization=[QuantizationPlan(lambda: quantization_stage(
            Voice(), calibration_texts=("short",), evaluation_texts=("phone",), evaluation_frames=93),
            {"targets": ("rk3588",), "dtypes": ("w8a8",), "ranking": {"samples": 1, "counts": ()},
             "isolation": True, "search": {"budget": 8, "depth": 1}})])
    # one setting varied at a time; mmse on four samples, since it searches a scale per tensor and costs
    # minutes a window where the others cost seconds
    grid = ({"algorithm": "kl_divergence"}, {"algorithm": "mmse", "samples": 4}, {"method": "layer"},
            {"samples": 4}, {"samples": 48})
    return LeverGraphs(versions=[window_engine()], quantization=[QuantizationPlan(
        lambda: quantization_stage(Voice()),
        {"targets": ALL_TARGETS, "grid": grid,
         "ranking": {"samples": 2, "counts": (64, 128, 192)}, "isolation": True,
         "search": {"budget": 24},
         "auto_hybrid": (0.99,)})])


def compiler_cases() -> list[Case]:
    """Shape plumbing on a real graph: the decoder slice pinned to its 93-frame window but not folded (24
    Shape -> ConstantOfShape chains, the plumbing the reference documents saw abort 2.3.2), and folded."""
    from ..piper.voice import Voice

    voice = Voice()
    window = DEFAULT_EMIT + 2 * DEFAULT_CONTEXT
    unfolded = decoder_graph(voice.model, voice.seam, window)
    shapes = window_shapes(unfolded, window)

    def feeds():
        z = np.random.default_rng(1).standard_normal(shapes["z"]).astype(np.float32)
        return {"z": z, "y_mask": np.ones(shapes["y_mask"], np.float32)}
    return [Case("shape chains (Shape -> ConstantOfShape)", "RK101", f"Piper decoder slice at {window}, unfolded",
                 True, lambda: unfolded, "build", TOOLKIT_FOLDS, feeds),
            Case("shape chains (Shape -> ConstantOfShape)", "RK101", f"Piper decoder slice at {window}, folded",
                 False, lambda: graph.fold(unfolded, shapes), "build", feeds=feeds)]


# --- the NPU cost model's calibration (notebook 09) -------------------------------------------------------
WINDOW_ENGINE = "Piper decoder 93-frame window"


def speak_walk(voice, emit: int = DEFAULT_EMIT, context: int = DEFAULT_CONTEXT) -> tuple[int, int]:
    """(window calls, latent frames) of this voice walking the 443-character text cut at 60 characters, as
    `rkstudy speak piper` walks it: one latent per chunk (its sentences' ids back to back, seeded per chunk),
    each walked by the window. The document's own text is not available; ours has its length and chunking."""
    from ...runtime import OrtRunner
    from ...walk.window import plan_windows
    from ..piper.frontend import ids_feed
    from ..piper.voice import read_text, seed_random_nodes
    from .speak import chunks_of
    from .study import SPEAK_CHUNK, SPEAK_TEXT

    frames = []
    for k, (_, ids) in enumerate(chunks_of(voice.text_front, read_text(SPEAK_TEXT), SPEAK_CHUNK)):
        z = OrtRunner(seed_random_nodes(voice.front, 1234 + k)).run({**ids_feed(ids), "scales": voice.scales})[0]
        frames.append(int(z.shape[-1]))
    return sum(len(plan_windows(n, emit, context)) for n in frames), sum(frames)


def npu_cost_cases(quick: bool):
    """The 93-frame window built as the document built it (rknn-toolkit2 2.3.2, rk3588), plain and with the dec
    mask, and their board figures: the decoder's time on the 443-character text (25.18 s of audio), per
    emitted slice, and what the dec mask adds to it. Each is a window's time times the calls of the walk,
    from our text's calls per voiced frame."""
    from ...levers import npu_cost as cal
    from ...tables.results import reference_numbers
    from ..piper.voice import Voice

    voice = Voice()
    calls, frames = speak_walk(voice)
    audio_s = reference_numbers("piper_decoder", WHOLE_TEXT)[2]
    their_frames = audio_s * voice.sample_rate / voice.hop
    walk = (f"our 443-character text at chunk size 60: {calls} window calls for {frames} frames, "
            f"{calls / frames:.4f} calls per voiced frame")
    masked = f"{WINDOW_ENGINE}, dec mask"
    engines = [cal.Engine(WINDOW_ENGINE, lambda: produce_for_voice(voice).save()),
               cal.Engine(masked, lambda: produce_for_voice(voice, dec_mask=True).save())]
    per_call = calls / frames * their_frames
    return cal.Cases(engines, [
        cal.Figure("piper-decoder-ms", "piper_decoder", "RKNN decoder (93-frame window): RTF / peak RSS / decoder ms",
                   slice(2, 3), f"decoder ms for {audio_s:g} s of audio", "ms", (WINDOW_ENGINE,),
                   lambda p: cal.times(p[WINDOW_ENGINE], per_call),
                   f"{walk}; {their_frames:.0f} frames in {audio_s:g} s at {voice.sample_rate} Hz, hop {voice.hop}"),
        cal.Figure("piper-ms-per-slice", "piper_decoder", PER_SLICE, slice(1, 2), "decoder ms per emitted slice", "ms",
                   (WINDOW_ENGINE,), lambda p: cal.times(p[WINDOW_ENGINE], calls / frames), walk),
        cal.Figure("piper-dec-mask-ms", "piper_decoder", DEC_MASK, slice(0, 2),
                   f"decoder ms the dec mask adds over {audio_s:g} s of audio", "ms", (masked, WINDOW_ENGINE),
                   lambda p: cal.minus(cal.times(p[masked], per_call), cal.times(p[WINDOW_ENGINE], per_call)),
                   f"their RTF difference is decoder time over the same {audio_s:g} s text; {walk}",
                   derive=lambda v: [(v[1] - v[0]) * audio_s * 1e3])])


WHOLE_TEXT = "whole-text run: characters / chunks at --text-chunk-size 60 / audio"
PER_SLICE = "Piper decoder ms per emitted slice: ggml -> RKNN (93-slice window)"
DEC_MASK = "dec mask cost on a 443-char utterance (RTF)"
