"""What the stateful Piper step offers the shared studies that build graphs from every family (host): the E =
45 step for the quantization lever.
"""

from __future__ import annotations

from ...levers import LeverGraphs, QuantizationPlan


def lever_graphs(quick: bool) -> LeverGraphs:
    """Full mode: the step (rk3588) at every dtype that builds, calibrated on 16 steps an fp32 walk carried
    state through, and searched."""
    from ..piper.voice import Voice
    from .study import quantization_stage

    if quick:
        return LeverGraphs()
    return LeverGraphs(quantization=[QuantizationPlan(lambda: quantization_stage(Voice(), emit=45),
                                                      {"targets": ("rk3588",), "search": {"budget": 25}})])
