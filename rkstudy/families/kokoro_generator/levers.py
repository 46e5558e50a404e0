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
    that builds) on 8 windows of ja_medium. No search: one variant of this window is a compile of two
    minutes or more here, so its plain builds are what fits."""
    from .study import quantization_stage

    if quick:
        return LeverGraphs()
    return LeverGraphs(versions=[window_engine(136)], quantization=[QuantizationPlan(
        lambda: quantization_stage(frames=64, context=16, calibration_windows=8), {"targets": ("rk3588",)})])
