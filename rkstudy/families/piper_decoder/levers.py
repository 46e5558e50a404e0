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
from .producer import DEFAULT_CONTEXT, DEFAULT_EMIT, decoder_graph, produce_for_voice, window_shapes


def window_engine(targets: Sequence[str] = ("rk3588", "rk3566"), text: str = "short") -> Engine:
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


def in_decoder(layer: dict) -> bool:
    """A compiled layer of the HiFi-GAN decoder (the audio-rate part, after the flow)."""
    return layer["layer"].startswith(("/dec/", "audio"))


def in_flow(layer: dict) -> bool:
    """A compiled layer of the flow (the latent-rate part), the inputs' reshapes left out."""
    return not in_decoder(layer) and layer["op"] != "Reshape"


def lever_graphs(quick: bool) -> LeverGraphs:
    """Quick: the window quantized on one text and scored on one window of another. Full: the window
    engine for both toolkit versions, and quantized with the 96 worst layers, each block (flow,
    decoder, all) and auto-hybrid kept in fp16."""
    from ..piper.voice import Voice
    from .study import quantization_stage

    if quick:
        return LeverGraphs(quantization=[QuantizationPlan(lambda: quantization_stage(
            Voice(), calibration_texts=("short",), evaluation_texts=("phone",), evaluation_frames=93))])
    blocks = {"flow": in_flow, "decoder": in_decoder, "all": lambda layer: True}
    return LeverGraphs(versions=[window_engine()], quantization=[QuantizationPlan(
        lambda: quantization_stage(Voice(), calibration_windows=16),
        {"hybrid_counts": (96,), "hybrid_groups": blocks, "auto_thresholds": (0.99,)})])


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
