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


# --- the NPU cost model's calibration (notebook 09) -------------------------------------------------------
MAIN_STEP = "Qwen3 vocoder 64-token step"
STEP_TIME = "weights streamed per 64-token step / step time"
ROLES = (("qwen3-offline-ms-per-token", "offline RKNN B=64: RTF / peak RSS / decoder ms per token",
          "decoder ms per token, offline"),
         ("qwen3-streaming-ms-per-token", "streaming RKNN 16+64: wall / first audio / decoder ms per token",
          "decoder ms per token, streaming 16+64"),
         ("qwen3-window-ms-per-token",
          "streaming RKNN 16+64 window (main aliased): wall / first chunk / decoder ms per token",
          "decoder ms per token, the window role"))


def npu_cost_cases(quick: bool):
    """Full mode: the 64-token step at the released widths (seeded random weights: the engine's shape is the
    checkpoint's), built as the document built it (rknn-toolkit2 2.3.2, rk3588), the three roles' decoder ms
    per token, and the time of one 64-token step. Each role voices its tokens in 64-token steps, so each is
    predicted as the 64-token step per token. The streaming role's one 16-token first step is left out, and
    its engine is not built: no figure reads it, and its cold 2.3.2 build is about a fifth of a reproduce's
    wall on two cores. Quick mode offers nothing."""
    from ...levers import npu_cost as cal
    from .producer import produce

    if quick:
        return cal.Cases()
    main = MAIN_STEP
    engines = [cal.Engine(main, lambda: produce(64).path)]
    per_token = [cal.Figure(key, "qwen3_vocoder", figure, slice(2, 3), quantity, "ms", (main,),
                            lambda p: cal.times(p[main], 1 / 64), "the 64-token step per token")
                 for key, figure, quantity in ROLES]
    step = cal.Figure("qwen3-step-ms", "qwen3_vocoder", STEP_TIME, slice(1, 2), "ms per 64-token step", "ms", (main,),
                      lambda p: cal.times(p[main], 1), "one call of the 64-token step")
    return cal.Cases(engines, [*per_token, step])
