"""RK201 relshift-chain: unrolled relative-position shift chains (VITS attention, window_size > 0).

The detector is rkstudy.graph.relshift.find_relshift, which proves each chain by running it on an
index probe; this rule turns its findings into lint findings.
"""

from __future__ import annotations

from ...graph.relshift import find
from .. import Hit, reference, rule

STUDY = "piper_encoder"  # where the reference documents' figures for these chains live
REWRITE = ("rewrite it exactly: rkstudy.graph.relshift.rewrite_relshift(model, mode='gather'|'banded') "
           "(the Piper encoder producer does it: `rkstudy piper encoder --voice-onnx VOICE.onnx --frames N "
           "[--relshift banded]`)")


@rule("RK201", "relshift-chain")
def relshift_chain(g):
    """Pad + Reshape + Slice relative-shift chains: garbage on the board, fine in the simulator."""
    if g.dynamic:
        return  # the chains only show at pinned shapes; RK401 asks for them
    for f in find.find_relshift(g.model):
        banded = find.plan([f], find.BANDED)[0]
        band = (f"; its table has {f.diagonals} non-zero diagonals, so mode='banded' applies"
                if banded.form == find.BANDED
                else f"; mode='banded' would keep the gather form: {banded.band_note}")
        fix = REWRITE + band if f.verified and f.rewritable else (
            f"it cannot be rewritten as is ({f.note}); fold at pinned shapes with rkstudy.graph.fold "
            "(not onnxslim given input_shapes again), lint again, or keep this layer off the NPU")
        yield Hit("error", f.nodes,
                  f"{f.scope or 'graph'}: {f.kind} chain {'+'.join(f.ops)} over [.., {f.length}, ..]",
                  why=f"{reference('attn_layers.0 alone (no rewrite) SNR vs fp32 on the board', STUDY)} "
                      f"while {reference('attn_layers.0 alone (no rewrite) SNR vs fp32 in the simulator', STUDY)}; "
                      f"{reference('rel-value chain probe: NaN values on the board', STUDY)}: the simulator "
                      "is no gate for these chains",
                  fix=fix, detail={"kind": f.kind, "length": f.length, "verified": f.verified,
                                   "rewritable": f.rewritable})
