"""The user's export, checked before any surgery (host): what it must hold for a fixed window or a
stateful step to reproduce it, each refusal one line naming the cause in the export and the fix there.

* No random ops (rkstudy.graph.pitfalls.random_nodes): folding would freeze one draw into the graph and
  the compiled engine would add the same noise to every utterance; every port command refuses them.
* A frame axis that is dynamic in fact: the graph runs, under onnxruntime, at the compiled length and
  at twice it. A legacy torch.onnx export (dynamo=False) bakes the length it traced into constants
  wherever the model computes with a tensor's size (a reshape into attention windows, a view to the
  traced size), so its "dynamic" axis holds at one length only; surgery on it then fails far from the
  cause, on a tensor the boundary pass made. The two runs tell that export apart from a graph that
  does not run at all.
* Each walked output `rate x frames + extra` long with one `extra` at every length: an odd-stride
  ConvTranspose without output_padding (kernel 2s, stride s, padding ceil(s / 2)) ends 1 sample short
  at its rate, times the upsampling after it, at any length (a 24 kHz codec decoder: 8 samples short
  of 320 per frame), so the window and the step carry that tail and emit exactly the package's own
  decode. A remainder that changes with the length (a stride that does not divide the rate rounds it
  down) tiles into no fixed window or step and is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import onnx

from ...errors import InputError, UsageError
from ...graph.pitfalls import attention, random_nodes

if TYPE_CHECKING:
    from .producer import Port


def _reason(exc: Exception) -> str:
    """onnxruntime's failure as the node that failed and what it says (its source paths dropped)."""
    import re

    text = " ".join(str(exc).split())
    node = re.search(r"running (\w+) node\. Name:'([^']*)'", text)
    said = text.rsplit(" was false. ", 1)[-1] if " was false. " in text else text.rsplit("Status Message: ", 1)[-1]
    return ((f"{node.group(1)} {node.group(2)!r}: " if node else "") + said)[:140]


def refuse_random(port: Port) -> None:
    """InputError (one line) when the graph draws random numbers as it runs."""
    drawn = random_nodes(port.model)
    if not drawn:
        return
    n = drawn[0]
    more = f" (and {len(drawn) - 1} more: {', '.join(sorted({d.op_type for d in drawn[1:]}))})" if drawn[1:] else ""
    raise InputError(f"{port.path.name}: {n.op_type} {n.name!r} draws new random numbers on every run{more}; folding "
                     "would freeze one draw into the graph. Remove it from the export (switch the noise off), or "
                     "feed the noise as a graph input (--static, or --walk at its rate)")


@dataclass(frozen=True)
class Lengths:
    """Each walked output's length at each latent length the export ran at, and the remainder over
    rate x frames that follows (one per output, the same at every length)."""

    frames: tuple[int, ...]
    samples: dict[str, tuple[int, ...]]
    extra: dict[str, int]


def _feeds(port: Port, frames: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in port.shapes(frames).items()}


def _dynamic(port: Port) -> bool:
    for w in port.walked:
        vi = next(i for i in port.model.graph.input if i.name == w.name)
        if vi.type.tensor_type.shape.dim[-1].HasField("dim_value"):
            return False
    return True


def lengths(port: Port, frames: int, *, step: bool = False) -> Lengths:
    """Run the export (onnxruntime fp32, seeded random inputs) at `frames`, `frames + 1` and twice
    `frames` latent frames and read each walked output's length: InputError when it runs at some of
    `frames` and `2 x frames` but not all (a length baked in at export; the fix names the exporter, and
    for a `step`, which re-pins the graph, only the dynamo one), or at none; UsageError when an output is
    not `rate x frames` plus one fixed remainder."""
    import onnxruntime as ort

    from ...graph import slice_at

    keep = [o for o, _ in port.outputs]
    model = port.model
    if keep != [o.name for o in model.graph.output]:
        model = slice_at(model, port.walked_names + list(port.static), keep)
    attending = attention(model)
    if attending:   # each attention's scores read out beside the outputs: the span it normalises over, per length
        probed = onnx.ModelProto()
        probed.CopyFrom(model)
        probed.graph.output.extend(onnx.helper.make_tensor_value_info(a.tensor, onnx.TensorProto.FLOAT, None)
                                   for a in attending)
        model = probed
    opts = ort.SessionOptions()
    opts.log_severity_level = 4   # a length it fails at is reported in the refusal, not logged as well
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    tried = [frames, 2 * frames, frames + 1] if _dynamic(port) else [frames]
    ran, failed, spans = {}, {}, {}
    for n in tried:
        try:
            outs = session.run(keep + [a.tensor for a in attending], _feeds(port, n))
        except Exception as exc:   # onnxruntime's own error for this length: said in the refusal
            failed[n] = _reason(exc)
            continue
        ran[n] = {o: int(np.asarray(x).shape[-1]) for o, x in zip(keep, outs)}
        spans[n] = [int(np.asarray(x).shape[a.axis]) for a, x in zip(attending, outs[len(keep):])]
    name = port.path.name
    if frames not in ran:
        if attending and 2 * frames in ran:
            raise InputError(f"{name} does not run at {frames} frames ({failed[frames]}) but runs at {2 * frames}: its "
                             f"attention cuts time into windows; compile a multiple of the window (--frames)")
        if 2 * frames in ran or not _dynamic(port):
            raise InputError(f"{name} does not run at {frames} frames ({failed[frames]}); " + _reexport(frames, step))
        raise InputError(f"{name} does not run at {frames} frames ({failed[frames]}); check its inputs' shapes against "
                         "--walk and --static")
    if 2 * frames in failed:
        raise InputError(f"{name}'s frame axis is dynamic in name only: it runs at {frames} frames but not at "
                         f"{2 * frames} ({failed[2 * frames]}); " + _reexport(frames, step))
    if attending and 2 * frames in ran:
        _refuse_baked_windows(name, attending, frames, spans, step)
    counts = sorted(ran)
    samples = {o: tuple(ran[n][o] for n in counts) for o in keep}
    extra = {}
    for o, hop in port.outputs:
        got = samples[o]
        rest = {length - hop * n for n, length in zip(counts, got)}
        if len(rest) == 1:
            extra[o] = rest.pop()
            continue
        slope = (got[-1] - got[0]) / (counts[-1] - counts[0])
        said = ", ".join(f"{length} at {n} frames" for n, length in zip(counts, got))
        if slope != hop and len({length - slope * n for n, length in zip(counts, got)}) == 1:
            raise UsageError(f"--output {o}:{hop}: the graph makes {said}: {slope:g} samples per frame, not {hop}; "
                             f"give --output {o}:{slope:g}")
        raise UsageError(f"--output {o}:{hop}: the graph makes {said}, so its remainder over {hop} x frames changes "
                         "with the length (a stride that does not divide the rate rounds it); no fixed window or step "
                         "tiles it. Make the export's length rate x frames plus a constant (pad its input to a "
                         "multiple of the strides inside the model, or give the upsamplers output_padding)")
    return Lengths(tuple(counts), samples, extra)


def _refuse_baked_windows(name: str, attending, frames: int, spans: dict, step: bool) -> None:
    """InputError where an attention's span grows with the length while it attends over more than one window:
    a fixed count of windows, which a legacy export bakes from T // window at its traced length."""
    for k, a in enumerate(attending):
        short, long = spans[frames][k], spans[2 * frames][k]
        if short != long and short < frames:
            raise InputError(f"{name} attends over windows of {short} frames at {frames} frames but of {long} at "
                             f"{2 * frames} (Softmax {a.softmax!r}): a fixed count of windows, right at one length "
                             "only; " + _reexport(frames, step))


def _reexport(frames: int, step: bool) -> str:
    why = "a legacy torch.onnx export bakes its traced length into constants. "
    if step:   # a step re-pins the graph at its step size: only a truly dynamic export serves
        return why + "Re-export it with the dynamo exporter (torch.onnx.export(..., dynamo=True))"
    return why + (f"Re-export it with the dynamo exporter (torch.onnx.export(..., dynamo=True)), or export it at the "
                  f"{frames} frames you compile")
