"""What the Qwen3 vocoder offers the shared studies that build graphs from every family (host): its 16-token
step (tiny widths) for the quantization lever.
"""

from __future__ import annotations

from ...levers import LeverGraphs, QuantizationPlan


def lever_graphs(quick: bool) -> LeverGraphs:
    """Full mode: the 16-token step at tiny widths (rk3588, every dtype that builds, auto-hybrid), calibrated
    and scored on random codes (the weights are seeded random: any codes are as good as a talker's). No
    search: its exporter names no modules, so there are no blocks to move as one."""
    from . import producer
    from .study import quantization_stage

    if quick:
        return LeverGraphs()
    step = QuantizationPlan(lambda: quantization_stage(producer.produce(16, widths="tiny").path),
                            {"targets": ("rk3588",), "auto_hybrid": (0.99,)})
    return LeverGraphs(quantization=[step])
