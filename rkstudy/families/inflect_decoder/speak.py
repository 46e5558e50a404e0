"""The Inflect v2 plan (the RKNN decoder-path document's `inflect_v2.exec_plan`): one component, the
decoder, on its window engine or the CPU path. The plan is checked here like every other; the model it
would speak with is not obtainable (this family's decode.onnx is carved from the Piper voice), so there is
no whole synthesis: `rkstudy speak piper` runs the same decoder seam on a real voice.

Board side: standard library only.
"""

from __future__ import annotations

from ...plan import Component, ModelPlan, Role


def plan() -> ModelPlan:
    """The Inflect v2 plan's schema (Family.plan of inflect_decoder)."""
    return ModelPlan(
        model="inflect", option="inflect_v2.exec_plan", title="Inflect v2: decode.onnx's decoder",
        study="inflect_decoder",
        unavailable="the Inflect v2 model is not obtainable here (this project's decode.onnx is carved from the Piper "
                    "voice, `rkstudy inflect decoder --carve`), so there is nothing to speak with; `rkstudy speak "
                    "piper` runs the same decoder seam on a real voice",
        components=(Component("decoder", "the latent -> audio, walked by window", engines="inflect_decoder",
                              roles=(Role("main", required=True, says="the window engine"),)),))
