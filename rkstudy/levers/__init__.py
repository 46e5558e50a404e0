"""The toolkit's own levers as studies (notebooks 08 and 09): what changes when the same graphs are built another
way, each lever in one module.

* versions.py: the same ONNX bytes built and simulated with every rknn-toolkit2 version this project has
  a converter environment for, side by side;
* quantization.py: fp16, int8 and hybrid builds of one stage scored against fp32 on data its calibration
  never saw, with the share of its MACs at 8 bits;
* multi_shape.py: one multi-shape engine (`config(dynamic_input=...)`) against one engine per width;
* npu_cost.py: the NPU cost model (rkstudy.toolkit.cost) held to the reference documents' board figures,
  on the engines each family offers through its `npu_cost_cases(quick)` hook (notebook 09).

The graphs come from the families through the registry: each family's `lever_graphs(quick)` hook returns
a LeverGraphs naming what it offers each lever; `collect` gathers them in registry order. Nothing here
imports a family.

Host only (the toolkit, onnx).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class QuantizationPlan:
    """One stage for the quantization lever: `make()` builds its rkstudy.levers.quantization.stages.Stage (made
    only when the sweep reaches it, so one stage's model and calibration set go before the next is made),
    and `settings` are the sweep's keyword arguments for it (hybrid counts, layer groups, thresholds)."""

    make: Callable
    settings: dict = field(default_factory=dict)


@dataclass
class LeverGraphs:
    """What one family offers the levers: engines for the version table (rkstudy.levers.versions.Engine),
    width ladders for the multi-shape lever (rkstudy.levers.multi_shape.ShapeLadder), and stages to
    quantize."""

    versions: list = field(default_factory=list)
    shape_ladders: list = field(default_factory=list)
    quantization: list[QuantizationPlan] = field(default_factory=list)

    def __add__(self, other: LeverGraphs) -> LeverGraphs:
        return LeverGraphs(self.versions + other.versions, self.shape_ladders + other.shape_ladders,
                           self.quantization + other.quantization)


def collect(quick: bool) -> LeverGraphs:
    """Every registered family's lever graphs, in registry order (each family's hook decides what a quick
    run leaves out)."""
    from ..registry import hooked

    out = LeverGraphs()
    for _, lever_graphs in hooked("lever_graphs"):
        out = out + lever_graphs(quick)
    return out
