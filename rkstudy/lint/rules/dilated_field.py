"""RK305 dilated-conv-field: a widely dilated Conv1d over more than 64 channels whose taps x length
passes the 13-bit field.

Measured with rkstudy.toolkit.build.build_engine on rk3588 (rknn-toolkit2 2.5.0, fp16), one Conv1d
[1, C, L] -> [1, C, L] at a time (tests/test_lint_field.py rebuilds both sides of each boundary):

* the compiler lowers it through a field holding taps x length - 1: k = 7, dilation 9, 128 channels logs
  0 REGTASK lines at L = 1170 (7 x 1170 - 1 = 8189) and 16,388 at L = 1171 (largest value 0x2004 =
  7 x 1171 - 1), 28,666 at 2048 (0x37ff), 57,338 at 4096 (0x6fff): 2 x (k x L - 3) lines;
* only past 64 input channels: 65, 72, 80, 88, 96, 128 and 256 flood alike, 64 logs none (whatever its
  output channels);
* only for a reach (k - 1) x dilation of 48 or more: k = 7 at dilation 8 and 9, k = 3 at dilation 27
  flood; k = 7 at dilation 5, 6, 7 and k = 5 at dilation 9 (reach 30 to 42) log none.

A codec decoder's residual units (k = 7, dilations 1, 3, 9) meet it at the upsampler stage whose
channels are still above 64 (a 44.1 kHz DAC-style decoder of 1024 channels: 128 channels at 256
samples per frame, so any window past 4 frames). Past the REGTASK limit the build is killed; past the
field value the reference documents measured on a board (gates.KNOWN_BAD_FIELD_VALUE) the engine is
known bad. A reach between 43 and 47, and any target but rk3588, were not measured: the compiler
decides, and the finding says so.
"""

from __future__ import annotations

from collections import defaultdict

from ...gates import KNOWN_BAD_FIELD_VALUE
from ...graph import REGISTER_FIELD_MAX
from ...toolkit.build import REGTASK_LIMIT
from .. import Hit, node_name, rule

MEASURED_TARGET = "rk3588"
WIDE = 64            # input channels at or below this never flooded
REACH_CLEAN = 42     # the largest reach measured clean
REACH_FLOODS = 48    # the smallest reach measured to flood


def predicted_lines(taps: int, length: int) -> int:
    """REGTASK lines a flooding conv logs: 2 x (taps x length - 3), as measured."""
    return 2 * (taps * length - 3)


def _why() -> str:
    return ("rk3588 builds of one Conv1d, k=7 dilation 9, 128 channels: 0 REGTASK lines at 1170 samples, 16,388 at "
            "1171 (largest field value 0x2004 = 7 x 1171 - 1), 57,338 at 4096 (0x6fff); 64 input channels log none, "
            "65 flood; dilation 8 floods, 7 does not (rknn-toolkit2 2.5.0; tests/test_lint_field.py)")


@rule("RK305", "dilated-conv-field")
def dilated_conv_field(g):
    """Dilated Conv1d over > 64 channels whose taps x length - 1 passes 8191 (measured per build)."""
    groups = defaultdict(list)
    for n in g.nodes:
        if n.op_type != "Conv" or g.const(n.input[1]) is None:
            continue
        w, shape = g.const(n.input[1]), g.shape(n.input[0])
        if w.ndim != 3 or not shape or len(shape) != 3 or not shape[1] or not shape[2]:
            continue
        taps, dilation = int(w.shape[2]), int((g.attr(n, "dilations") or [1])[0])
        reach, channels, length = (taps - 1) * dilation, int(shape[1]), int(shape[2])
        value = taps * length - 1
        if value <= REGISTER_FIELD_MAX or channels <= WIDE or reach <= REACH_CLEAN:
            continue
        decides = reach < REACH_FLOODS or g.target != MEASURED_TARGET
        groups[(decides, taps, length, reach)].append((node_name(n), channels))
    # what the build is predicted to log over the whole graph, from every conv measured to flood
    total = sum(predicted_lines(taps, length) * len(found)
                for (decides, taps, length, _), found in groups.items() if not decides)
    for (decides, taps, length, reach), found in sorted(groups.items(), key=lambda kv: -kv[0][1] * kv[0][2]):
        nodes = [name for name, _ in found]
        value, lines = taps * length - 1, predicted_lines(taps, length) * len(found)
        fix = (f"narrow the window so this layer's {taps} taps x samples stays at or under {REGISTER_FIELD_MAX + 1} "
               f"(at most {(REGISTER_FIELD_MAX + 1) // taps} samples here), or bring its input to {WIDE} channels or "
               "fewer; then build and read the REGTASK count")
        where = (f"{len(nodes)} Conv node(s) of {taps} taps at reach {reach} over {max(c for _, c in found)} "
                 f"channels and {length} samples: taps x length - 1 = {value} > {REGISTER_FIELD_MAX}")
        detail = {"taps": taps, "length": length, "reach": reach, "field_value": value, "decides": decides}
        if decides:
            said = (f"a reach of {reach} lies between the {REACH_CLEAN} measured clean and the {REACH_FLOODS} measured "
                    "to flood" if reach < REACH_FLOODS else f"measured on {MEASURED_TARGET} only")
            yield Hit("warning", nodes, f"{where}; the compiler decides whether it floods ({said})", why=_why(),
                      fix=fix, detail=detail)
            continue
        killed = total > REGTASK_LIMIT
        bad = value >= KNOWN_BAD_FIELD_VALUE
        outcome = (f"the build is killed past {REGTASK_LIMIT:,} REGTASK lines (~{total:,} predicted over the graph)"
                   if killed else
                   "the field value is past the one measured bad on a board" if bad else
                   "it builds with the simulator blind to the overflow")
        yield Hit("error" if killed or bad else "warning", nodes,
                  f"{where}: ~{lines:,} REGTASK lines predicted; {outcome}", why=_why(), fix=fix,
                  detail={**detail, "predicted_lines": lines, "graph_lines": total})
