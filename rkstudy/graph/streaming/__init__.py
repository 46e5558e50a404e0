"""The streaming rules: which axis of each tensor carries time, and how every op family runs as a
stateful step, one small module per family, registered, read by one driver.

Why this shape: a vocoder as its authors export it transposes around its LayerNorms, pads in edge
mode, resamples with strided and grouped convs; every such op is one rule here (its own tests in
tests/test_streaming_rules.py) instead of a branch in the driver. The driver (rkstudy.graph.delays)
walks the graph and asks each node's rule for its timing; the surgery (rkstudy.graph.stateful) asks
it for the step's nodes; the boundary pass (rkstudy.graph.validity) asks which inputs the full graph
reads past their ends, and rewrites the pads that replicate or mirror. Families:

core.py (timings, reads, the rule context) · registry.py (the registry) · conv.py (Conv, any stride) ·
resample.py (ConvTranspose) · pad.py (Pad: constant, edge, reflect) · pointwise.py · layout.py
(Transpose, Reshape, Squeeze, Unsqueeze, Slice, Split, Concat, Gather) · norm.py (norms, reductions,
softmax, MatMul and Gemm over channels; what is global over time refused) · constants.py (Constant,
Shape, ConstantOfShape: refused on the time path, evaluated away from it) · masks.py (the boundary
signals made from the frame mask).

Each rule also carries its op's float64 evaluation (what rkstudy.graph.f64 runs) and its boundary
behaviour (what rkstudy.graph.validity asks), so a new op is one module here, its import below and its
tests (registry.py says which).
"""

from . import constants, conv, layout, norm, pad, pointwise, resample  # noqa: F401  (registers the rules)
from .core import Builder, Context, ConvPlan, NotStreamable, Read, StepContext, Timed, Timing
from .registry import RULES, Rule, register, rule_for

__all__ = ["RULES", "Builder", "ConvPlan", "Context", "NotStreamable", "Read", "Rule", "StepContext", "Timed",
           "Timing", "register", "rule_for"]
