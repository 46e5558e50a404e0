"""The streaming rules' registry: one Rule per op family, registered for the op types it covers.

A rule answers four questions about one node, each from the graph alone:

* `timing`: the time axis, rate, length and delay of its outputs, and how it reads its inputs (the
  delay map, rkstudy.graph.delays, calls it node by node);
* `step`: the node(s) the stateful step runs in its place, on the windows the reads describe
  (rkstudy.graph.stateful.make_step);
* `reads_outside`: which inputs the full graph reads past their ends, as zeros (a conv's padding),
  so that the step must see zeros there (rkstudy.graph.validity masks them);
* `zero_outside`: whether its outputs are zero outside their own length when its inputs are (then no
  mask is needed downstream).

An op no rule covers is refused by the driver with the node's name: a rule is added, never a branch.
"""

from __future__ import annotations

import onnx

from .core import Context, NotStreamable, StepContext, Timed, where

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


def register(rule: type[Rule]) -> type[Rule]:
    """Register one rule class for every op it lists (an op registered twice is a programming error)."""
    instance = rule()
    for op in rule.ops:
        if op in RULES:
            raise ValueError(f"streaming rule for {op} registered twice ({type(RULES[op]).__name__}, {rule.__name__})")
        RULES[op] = instance
    return rule


def rule_for(node: onnx.NodeProto) -> Rule:
    rule = RULES.get(node.op_type)
    if rule is None:
        raise NotStreamable(f"{where(node)}: no streaming rule for this op (rkstudy.graph.streaming has rules for "
                            "convs, pads, resampling, pointwise maths, layout moves and norms over channels)")
    return rule
