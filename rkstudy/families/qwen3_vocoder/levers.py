"""What the Qwen3 vocoder offers the shared studies that build graphs from every family (host): its 16-token
step (tiny widths) for the quantization lever.
"""

from __future__ import annotations

from ...levers import LeverGraphs, QuantizationPlan


def lever_graphs(quick: bool) -> LeverGraphs:
    """Full mode: the 16-token step at tiny widths, calibrated and scored on random codes (the weights
    are seeded random: any codes are as good as a talker's)."""
    from . import producer
    from .study import quantization_stage

    if quick:
        return LeverGraphs()
    step = QuantizationPlan(lambda: quantization_stage(producer.produce(16, widths="tiny").path),
                            {"auto_thresholds": (0.99,)})
    return LeverGraphs(quantization=[step])
