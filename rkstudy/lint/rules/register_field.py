"""RK301 register-field: an axis longer than 8191 on an op the compiler tiles by register fields.

The compiler encodes tile sizes in 13-bit op-encoding fields (limit 0x1fff); past it, it logs
`REGTASK: The bit width of field value exceeds the limit` lines. A few of them are harmless, a
flood of them ruins the engine, and which one a graph gets depends on the op and its tiling, not on
the axis alone: so this rule reports the axis (the cause), and the build's REGTASK count and largest
value (rkstudy.toolkit.build.BuildReport) say which regime it is in.

Whether the long axis is the time axis is read from the graph, not assumed last: the streaming rules
track each tensor's time axis from the walked inputs (GraphView.time_axes, the same tracking the
stateful step and the contract's walked axes use), so a [B, T, C] tensor around a LayerNorm is named
by its time axis, and a reduction over the time axis (what the reference documents measured) is told
apart from one over channels.
"""

from __future__ import annotations

from collections import defaultdict

from ...graph import REGISTER_FIELD_MAX
from .. import Hit, node_name, reference, rule

# ops that move no data the NPU tiles: shape bookkeeping the compiler folds or handles as metadata
NOT_TILED = {"Shape", "Size", "Constant", "ConstantOfShape", "Identity", "Range"}
REDUCTIONS = {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceL2", "ReduceL1", "ReduceProd",
              "ReduceSumSquare", "ReduceLogSumExp", "Softmax", "LogSoftmax", "CumSum", "ArgMax", "ArgMin"}
LARGEST = "Kokoro W=256 sliced fine axis: largest node (an Add), fp32 max |x|"
FLOATS = {1, 10, 11, 16}  # float, float16, double, bfloat16


def _reduced_axes(g, n) -> list[int]:
    """The axes a reduction runs over (all spatial axes for the global pools)."""
    shape = g.shape(n.input[0]) or ()
    if n.op_type in ("GlobalAveragePool", "GlobalMaxPool"):
        return list(range(2, len(shape)))
    if n.op_type in ("Softmax", "LogSoftmax", "ArgMax", "ArgMin", "CumSum"):
        axis = g.attr(n, "axis", -1)
        if n.op_type == "CumSum" and len(n.input) > 1 and g.const(n.input[1]) is not None:
            axis = int(g.const(n.input[1]))
        return [axis % len(shape)] if shape else []
    axes = g.attr(n, "axes")
    if axes is None and len(n.input) > 1 and n.input[1] and g.const(n.input[1]) is not None:
        axes = g.const(n.input[1]).tolist()
    if axes is None:
        return list(range(len(shape)))
    return [a % len(shape) for a in axes] if shape else []


def _why() -> str:
    return (f"{reference('REGTASK lines: Kokoro generator W=512 (fine axis 30721)', 'toolchain')} with "
            f"{reference('REGTASK field value: Kokoro generator W=512', 'toolchain')}, an engine at "
            f"{reference('Kokoro W=512 engine vs CPU decode (clipped noise)', 'toolchain')}; yet "
            f"{reference('REGTASK lines: Kokoro w128 engine', 'toolchain')} measured clean on the board. Which "
            "regime a graph is in depends on the op's tiling: build it and read regtask / regtask_max_value "
            "(rkstudy build; results/toolchain/regtask.md)")


FIX = ("keep the longest axis at or under 8191: narrow the window (piper decoder: --emit/--context; encoder: "
       "--frames), or walk the long axis in windows inside the graph; a fixed-shape 1-D audio graph whose long axis "
       "only Slices and dilated Convs touch: rkstudy.graph.longaxis.long_axis_safe(model) rewrites them exactly as "
       "cropping ConvTransposes; then build and check the REGTASK count")


@rule("RK301", "register-field")
def register_field(g):
    """Axes longer than 8191 (the 13-bit field) at the pinned shapes, with their length."""
    by_length = defaultdict(list)
    reductions = defaultdict(list)
    time = g.time_axes()
    on_time: dict[int, bool] = {}
    over_time: dict[int, bool] = {}
    for n in g.nodes:
        if n.op_type in NOT_TILED or g.from_constants(n.output[0] if n.output else ""):
            continue
        longest, longest_is_time = 0, False
        for t in [*n.input, *n.output]:
            shape = g.shape(t) if t else None
            if shape and g.elem_types.get(t) in FLOATS and not g.is_const(t):
                for k, d in enumerate(shape):
                    if d and (d > longest or (d == longest and time.get(t) == k)):
                        longest, longest_is_time = d, time.get(t) == k
        if longest > REGISTER_FIELD_MAX:
            by_length[longest].append(node_name(n))
            on_time[longest] = on_time.get(longest, False) or longest_is_time
        if n.op_type in REDUCTIONS or n.op_type in ("GlobalAveragePool", "GlobalMaxPool"):
            shape = g.shape(n.input[0]) or ()
            axes = [a for a in _reduced_axes(g, n) if a < len(shape) and (shape[a] or 0) > REGISTER_FIELD_MAX]
            if axes:
                length = max(shape[a] for a in axes)
                reductions[length].append(node_name(n))
                over_time[length] = over_time.get(length, False) or time.get(n.input[0]) in axes
    for length, nodes in sorted(by_length.items(), reverse=True):
        what = "a time axis" if on_time[length] else "an axis"
        yield Hit("warning", nodes,
                  f"{len(nodes)} node(s) carry {what} of {length} (> {REGISTER_FIELD_MAX}, "
                  f"{length / (REGISTER_FIELD_MAX + 1):.2f}x the 13-bit field)",
                  why=_why(), fix=FIX,
                  detail={"axis": length, "field": REGISTER_FIELD_MAX, "time_axis": on_time[length]})
    for length, nodes in sorted(reductions.items(), reverse=True):
        what = "the time axis" if over_time[length] else "an axis"
        yield Hit("warning", nodes, f"{len(nodes)} reduction(s) over {what} of {length} (> {REGISTER_FIELD_MAX})",
                  why="the reference documents: a ReduceSum over the time axis lowers to a register field capped at "
                      "8191, and raw "
                      f"sums over a long axis leave fp16 ({reference(LARGEST)}); "
                      "lint --sample measures the range",
                  fix="normalize over the axis with GlobalAveragePool (the pooling engine's own reduction) or reduce "
                      "in windows; " + FIX, detail={"axis": length, "field": REGISTER_FIELD_MAX, "reduction": True,
                                                    "time_axis": over_time[length]})
