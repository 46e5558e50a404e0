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
         "search": {"budget": 24, "forward": 8},
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
