"""The CosyVoice3 plan (the RKNN decoder-path document's `cosyvoice3.exec_plan`): one component, the flow
(the flow-matching estimator), on a ladder of per-length engines or the CPU path. The plan is checked
here like every other; the model is not obtainable (this family's estimator is a stand-in with random
weights), so there is no whole synthesis.

Board side: standard library only.
"""

from __future__ import annotations

from ...plan import Component, ModelPlan, Role


def plan() -> ModelPlan:
    """The CosyVoice3 plan's schema (Family.plan of flow_estimator)."""
    return ModelPlan(
        model="cosyvoice3", option="cosyvoice3.exec_plan", title="CosyVoice3: the flow-matching estimator",
        study="flow_estimator",
        unavailable="the CosyVoice3 model is not obtainable here (this project's estimator is a DiT stand-in with "
                    "random weights), so there is nothing to speak with; `rkstudy board memory` weighs a ladder of "
                    "its engines",
        components=(Component("flow", "the flow-matching estimator, one engine per sequence length",
                              engines="flow_estimator",
                              roles=(Role("main", required=True, ladder=True, says="per-length engines"),)),))
