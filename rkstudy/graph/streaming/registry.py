"""The streaming rules' registry: one Rule per op family, registered for the op types it covers.

Everything the package knows about an op lives in its rule. A rule answers, about one node:

* `timing`: the time axis, rate, length and delay of its outputs, and how it reads its inputs (the
  delay map, rkstudy.graph.delays, calls it node by node);
* `step`: the node(s) the stateful step runs in its place, on the windows the reads describe
  (rkstudy.graph.stateful.make_step);
* `reads_outside`: which inputs the full graph reads past their ends, as zeros (a conv's padding),
  so that the step must see zeros there (rkstudy.graph.validity masks them);
* `zero_outside`: whether its outputs are zero outside their own length when its inputs are (then no
  mask is needed downstream);
* `needs_rewrite` / `rewrite`: whether the boundary pass (rkstudy.graph.validity) replaces it, and with
  what (a Pad that replicates or mirrors its ends);
* `f64`: its outputs in float64 (torch), what the exactness gate's interpreter (rkstudy.graph.f64) runs;
* `note`: what a census of handled ops says beside its count (a Pad's mode, a strided conv).

An op no rule covers is refused by every driver with the node's name: a rule is added, never a branch.
A new op is one module under rkstudy/graph/streaming/ (a Rule subclass listing its `ops`, with its
`timing` and its `f64`, `@register`ed), one import line in the package's __init__, and its tests
(tests/test_streaming_rules.py for its timing and step, tests/test_f64_rules.py for its float64
evaluation against onnxruntime: that test fails for a registered op it has no case for).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import onnx

from .core import Context, NotStreamable, StepContext, Timed, where

if TYPE_CHECKING:
    from .core import Builder
    from .masks import Masks

RULES: dict[str, Rule] = {}


class Rule:
    """One op family. Subclasses list their `ops` and override what differs from a time-local op run
    as it is."""

    ops: tuple[str, ...] = ()
    family = ""

    def timing(self, node: onnx.NodeProto, ctx: Context) -> Timed:
        raise NotImplementedError

    def step(self, node: onnx.NodeProto, inputs: list[str], sc: StepContext) -> None:
        """Append what the step runs for `node` (the graph's own node, unchanged) reading `inputs` (its
        inputs as the step sees them: windows of the time-carrying ones)."""
        sc.emit(node, inputs)

    def reads_outside(self, node: onnx.NodeProto, ctx: Context) -> list[int]:
        return []

    def zero_outside(self, node: onnx.NodeProto, ctx: Context, zero: set[str]) -> bool:
        return False

    def needs_rewrite(self, node: onnx.NodeProto, ctx: Context) -> bool:
        """Whether the boundary pass replaces this node (its own nodes cannot read the full decode's
        boundary from a frame mask: a Pad that replicates its ends)."""
        return False

    def rewrite(self, node: onnx.NodeProto, ctx: Context, masks: Masks, b: Builder) -> list[onnx.NodeProto]:
        """The nodes that replace this one where `needs_rewrite` says so (appended to `b`, writing its
        outputs; the boundary signals they read come from `masks`)."""
        raise NotImplementedError(f"{where(node)}: the {type(self).__name__} rule rewrites nothing")

    def f64(self, node: onnx.NodeProto, x: list, a: dict) -> list:
        """Its outputs in float64 (torch tensors, CPU) from its inputs `x` (torch tensors; None where an
        optional input is left out) and its attributes `a`."""
        raise NotImplementedError(f"{where(node)}: the {type(self).__name__} rule has no float64 evaluation")

    def note(self, node: onnx.NodeProto) -> list[str]:
        """What a census of handled ops counts about this node beside its op (a Pad's mode, a strided or
        grouped conv)."""
        return []


def register(rule: type[Rule]) -> type[Rule]:
    """Register one rule class for every op it lists (an op registered twice is a programming error)."""
    instance = rule()
    for op in rule.ops:
        if op in RULES:
            raise ValueError(f"streaming rule for {op} registered twice ({type(RULES[op]).__name__}, {rule.__name__})")
        RULES[op] = instance
    return rule


def families() -> dict[str, list[str]]:
    """{family: its ops} of every registered rule, families and ops sorted."""
    out: dict[str, list[str]] = {}
    for op, rule in sorted(RULES.items()):
        out.setdefault(rule.family, []).append(op)
    return dict(sorted(out.items()))


def rule_for(node: onnx.NodeProto) -> Rule:
    rule = RULES.get(node.op_type)
    if rule is None:
        known = "; ".join(f"{family} ({len(ops)})" for family, ops in families().items())
        raise NotStreamable(f"{where(node)}: no streaming rule for this op (rkstudy.graph.streaming has rules for "
                            f"{len(RULES)} ops by family: {known}); a rule for it is one module there")
    return rule
