"""A Piper voice cut at the seams its NPU stages use, without the onnx package: the CPU path of a whole
synthesis (`rkstudy speak piper`), the same bytes on the host and on a board.

    encoder: ids, lengths -> stats, cond         (the duration encoder's seam: enc_p.proj, dp.proj)
    middle:  stats, cond, ids, lengths, scales -> z, y_mask (, g)
             (the duration flows, the duration ceiling, length regulation and prior sampling: every
             random node of the voice, seeded per chunk as in rkstudy.families.piper.voice)
    decoder: z, y_mask (, g) -> audio           (the decoder seam: the inverse flow and the decoder)

The seams are found by structure on the wire (rkstudy.runtime.protowire), as the host finds them with
onnx (rkstudy.families.piper.voice.find_decoder_seam, rkstudy.families.piper_encoder.seam): the
encoder's two convs by their weights' names (piper's exporter keeps the torch parameter names), the
decoder's latent and mask as the tensors entering the /flow/ and /dec/ nodes.

Board side: standard library (the cuts are bytes onnxruntime serves).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ...errors import InputError
from ...runtime import protowire
from ...runtime.protowire import Graph

FLOW, DEC = "/flow/", "/dec/"
IDS, LENGTHS, SCALES, SID = "input", "input_lengths", "scales", "sid"


class SeamNotOnWire(InputError):
    """The graph lacks the structure a Piper (VITS) voice's seams are found by."""


@dataclass(frozen=True)
class Seams:
    """Tensor names in the voice: the encoder's outputs, the decoder's latent, mask and speaker
    embedding (empty for a single-speaker voice), and the audio."""

    stats: str
    cond: str
    z: str
    y_mask: str
    g: str
    audio: str


def _conv_reading(g: Graph, weight: str) -> str:
    conv = next((n for n in g.nodes if n.op_type == "Conv" and len(n.inputs) > 1 and n.inputs[1] == weight), None)
    if conv is None:
        raise SeamNotOnWire(f"no Conv reads {weight} in this graph; is this a Piper (VITS) voice exported by piper's "
                            "exporter?")
    return conv.outputs[0]


def decoder_seam(g: Graph) -> tuple[str, str, str]:
    """(z, y_mask, g or "") entering the decoder half: the structural search of
    rkstudy.families.piper.voice.find_decoder_seam, on the wire."""
    if not any(n.name.startswith(FLOW) for n in g.nodes) or not any(n.name.startswith(DEC) for n in g.nodes):
        raise SeamNotOnWire("no /flow/ and /dec/ nodes in this graph; is this a Piper (VITS) voice exported by "
                            "piper's exporter?")
    producer, consumers = g.producers(), g.consumers()
    downstream: set[str] = set()
    frontier = [n for n in g.nodes if n.name.startswith(FLOW) or n.name.startswith(DEC)]
    while frontier:
        n = frontier.pop()
        if n.name in downstream:
            continue
        downstream.add(n.name)
        for t in n.outputs:
            frontier.extend(consumers.get(t, []))
    entering: dict[str, list] = {}
    for n in g.nodes:
        if n.name not in downstream:
            continue
        for t in n.inputs:
            p = producer.get(t)
            if t and t not in g.initializers and (p is None or (p.name not in downstream and p.op_type != "Constant")):
                entering.setdefault(t, []).append(n)
    masks = [t for t, c in entering.items() if len(c) > 1 and all(n.op_type == "Mul" for n in c)]
    latents = [t for t, c in entering.items() if len(c) == 1 and c[0].name.startswith(FLOW) and t not in masks]
    conds = [t for t in entering if t not in masks and t not in latents]
    if len(masks) != 1 or len(latents) != 1 or len(conds) > 1:
        raise SeamNotOnWire(f"expected one latent and one mask entering the flow, found latents {latents}, masks "
                            f"{masks}, others {conds}; is this a VITS voice?")
    return latents[0], masks[0], conds[0] if conds else ""


def seams(g: Graph) -> Seams:
    z, y_mask, cond_g = decoder_seam(g)
    return Seams(stats=_conv_reading(g, "enc_p.proj.weight"), cond=_conv_reading(g, "dp.proj.weight"), z=z,
                 y_mask=y_mask, g=cond_g, audio=g.outputs[0])


@dataclass(frozen=True)
class VoiceCuts:
    """The voice's three cuts (serialized models) and the seam names they meet at."""

    seams: Seams
    encoder: bytes
    middle: bytes
    decoder: bytes

    def middle_seeded(self, seed: int) -> bytes:
        """The middle with its random nodes seeded (a fresh session of it draws the same noise every time)."""
        return protowire.seed_random_nodes(self.middle, seed)


@lru_cache(maxsize=2)
def voice_cuts(voice_onnx: Path | str) -> VoiceCuts:
    """Cut the voice at Path `voice_onnx` (read once per process and path)."""
    g = Graph(Path(voice_onnx).read_bytes())
    s = seams(g)
    encoder = protowire.cut(g, {IDS: "int64", LENGTHS: "int64"}, [s.stats, s.cond])
    middle = protowire.cut(g, {s.stats: "float32", s.cond: "float32"}, [s.z, s.y_mask] + ([s.g] if s.g else []))
    decoder = protowire.cut(g, {s.z: "float32", s.y_mask: "float32", **({s.g: "float32"} if s.g else {})}, [s.audio])
    return VoiceCuts(seams=s, encoder=encoder, middle=middle, decoder=decoder)
