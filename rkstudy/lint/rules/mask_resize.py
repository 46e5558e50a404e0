"""RK203 resize-upsample: Resize used as an upsampler, above all of a frame mask.

A decoder mask has to be upsampled with the audio (rkstudy.graph.decmask). Resize does that exactly
in fp32 and in the simulator, and wrongly on the board.
"""

from __future__ import annotations

from .. import Hit, node_name, reference, rule

MASKING = ("Mul", "Cast", "Where", "Equal", "Greater", "Less", "Not")


def _mask_like(g, node) -> bool:
    """A one-channel tensor whose every reader masks with it, or one read from an input named *mask*."""
    shape = g.shape(node.input[0])
    users = [u for o in node.output for u in g.consumers.get(o, [])]
    if shape and len(shape) >= 2 and shape[1] == 1 and users and all(u.op_type in MASKING for u in users):
        return True
    stack, seen = [node.input[0]], set()
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        if "mask" in t.lower() and t in g.inputs:
            return True
        src = g.producer.get(t)
        if src is not None and src.op_type in ("Resize", "ConvTranspose", "Cast", "Unsqueeze", "Reshape", "Identity"):
            stack.append(src.input[0])
    return False


@rule("RK203", "resize-upsample")
def resize_upsample(g):
    """Resize nodes that upsample (a mask above all): measured to fail on the board."""
    mask, other = [], []
    for n in g.nodes:
        if n.op_type != "Resize":
            continue
        src, dst = g.shape(n.input[0]), g.shape(n.output[0])
        if src and dst and src[-1] and dst[-1] and dst[-1] <= src[-1]:
            continue  # downsampling: not what was measured
        (mask if _mask_like(g, n) else other).append(node_name(n))
    why = (f"{reference('mask upsample by Resize: board', 'piper_decoder')} against "
           f"{reference('mask upsample by Resize: simulator', 'piper_decoder')}: Resize does not lower to a target the "
           "board runtime accepts, and the simulator does not show it")
    fix = ("upsample with an all-ones depthwise ConvTranspose (exact nearest, the op the decoder already runs on the "
           "NPU): rkstudy.graph.decmask.resize_to_convtranspose(model); the Piper decoder producer's --dec-mask "
           "builds its mask that way")
    if mask:
        yield Hit("error", mask, f"{len(mask)} Resize node(s) upsample a mask", why=why, fix=fix,
                  detail={"mask": True})
    if other:
        yield Hit("warning", other, f"{len(other)} Resize node(s) upsample (not a mask; measured only as one)",
                  why=why, fix=fix, detail={"mask": False})
