"""The duration encoder's seam in a Piper voice (host): from the phoneme ids to enc_p.proj and dp.proj.

* stats: enc_p.proj's output [1, 2·inter_channels, N], the prior's mean and log-std;
* cond:  dp.proj's output [1, filter_channels, N], what the duration flows are conditioned on.

Why this seam: everything random and every one of the three `scales` (noise, length, noise_w)
sits strictly downstream of it (flow noise, the duration ceiling, prior sampling), so the slice is
deterministic and has no `scales` input.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from ... import graph
from ...graph.index import Index
from ..piper import voice as piper


class EncoderSeamNotFound(piper.VoiceSeamNotFound):
    """The graph has no enc_p.proj / dp.proj pair."""


@dataclass(frozen=True)
class EncoderSeam:
    """Tensor names: the voice's ids/lengths/scales inputs, the two seam outputs, and the
    duration total (sum of ceil'd durations, clipped at 1: the latent frame count)."""

    ids: str
    lengths: str
    scales: str
    stats: str
    cond: str
    frames: str


def _conv_by_weight(model: onnx.ModelProto, weight: str) -> onnx.NodeProto | None:
    return next((n for n in model.graph.node if n.op_type == "Conv" and len(n.input) > 1
                 and n.input[1] == weight), None)


def find_encoder_seam(model: onnx.ModelProto) -> EncoderSeam:
    """enc_p.proj and dp.proj found by their weights (piper's exporter keeps the torch
    parameter names as initializer names); the frame total found from the single Ceil."""
    stats, cond = _conv_by_weight(model, "enc_p.proj.weight"), _conv_by_weight(model, "dp.proj.weight")
    if stats is None or cond is None:
        raise EncoderSeamNotFound("no Conv reading enc_p.proj.weight and dp.proj.weight in this graph; "
                           "is this a Piper (VITS) voice exported by piper's exporter?")
    consumers = Index(model).consumers
    ceil = [n for n in model.graph.node if n.op_type == "Ceil"]
    if len(ceil) != 1:
        raise EncoderSeamNotFound(f"expected one Ceil (the duration ceiling), found {len(ceil)}")
    total = next((c for c in consumers.get(ceil[0].output[0], []) if c.op_type == "ReduceSum"), None)
    if total is None:
        raise EncoderSeamNotFound("the duration Ceil feeds no ReduceSum; cannot find the frame total")
    clip = next((c for c in consumers.get(total.output[0], []) if c.op_type == "Clip"), None)
    names = [i.name for i in model.graph.input]
    if names[:3] != ["input", "input_lengths", "scales"]:
        raise EncoderSeamNotFound(f"voice inputs are {names}; expected input, input_lengths, scales")
    return EncoderSeam(ids="input", lengths="input_lengths", scales="scales",
                       stats=stats.output[0], cond=cond.output[0],
                       frames=(clip or total).output[0])


def encoder_slice(model: onnx.ModelProto, seam: EncoderSeam | None = None) -> onnx.ModelProto:
    """The dynamic slice: ids + lengths -> stats, cond (the voice's own nodes, unfolded; outputs
    renamed `stats` and `cond`, the names the contract uses)."""
    seam = seam or find_encoder_seam(model)
    sliced = graph.slice_at(model, [seam.ids, seam.lengths], [seam.stats, seam.cond])
    return graph.rename(sliced, {seam.stats: "stats", seam.cond: "cond"})


def scales_downstream_only(model: onnx.ModelProto, seam: EncoderSeam | None = None) -> dict:
    """Why the slice is deterministic: no node the slice keeps reads `scales` (directly or
    through any chain) or is random. Returns the counts; raises if either is violated."""
    seam = seam or find_encoder_seam(model)
    sliced = graph.slice_at(model, [seam.ids, seam.lengths], [seam.stats, seam.cond])
    kept = {n.output[0] for n in sliced.graph.node}
    consumers = Index(model).consumers
    downstream, frontier = set(), [seam.scales]
    while frontier:
        t = frontier.pop()
        for n in consumers.get(t, []):
            if n.output[0] not in downstream:
                downstream.add(n.output[0])
                frontier.extend(n.output)
    random = [n for n in sliced.graph.node if n.op_type.startswith("Random")]
    leak = kept & downstream
    if leak or random or seam.scales in {i.name for i in sliced.graph.input}:
        raise AssertionError(f"the encoder slice is not deterministic: {len(leak)} nodes read "
                             f"scales, {len(random)} random nodes; the seam is in the wrong place")
    return {"slice_nodes": len(sliced.graph.node), "nodes_reading_scales_in_voice": len(downstream),
            "nodes_reading_scales_in_slice": 0, "random_nodes_in_slice": 0,
            "slice_inputs": ",".join(i.name for i in sliced.graph.input)}


def shapes_for(frames: int) -> dict[str, list[int]]:
    return {"input": [1, frames], "input_lengths": [1]}
