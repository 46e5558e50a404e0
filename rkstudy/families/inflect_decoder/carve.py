"""The Inflect v2 decode.onnx contract, carved out of the Piper voice (host).

The reference documents' Inflect v2 `decode.onnx` is a VITS decoder half with a head in front of it:
`z = m_p + exp(logs) * zp_noise * noise_scale`, then the inverse flow and the decoder. The head
stays outside the engine (the runtime draws the noise and hands over the finished latent), the
window is 256 = 192 emitted + 32 context each side, and the decoder mask is on by default,
because this decoder half is unmasked and a short tail window otherwise reads its padding.

That model is not obtainable here, so `carve_decode_onnx` builds a graph with exactly that
contract from the Piper voice (the same flow and decoder, the same prior statistics), and the
shared decoder producer (rkstudy.families.piper_decoder) runs on it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from ... import cache, graph
from ...errors import EngineMismatch
from ...graph.index import Index
from ..piper.voice import DecoderModel, DecoderSeam, Voice, ids_feed, seed_random_nodes
from ..piper_decoder.producer import decoder_graph
from . import CONTEXT, EMIT  # noqa: F401 (notebook 01, lint and the tests read carve.EMIT and carve.CONTEXT)

HEAD_INPUTS = ("m_p", "logs_p", "zp_noise", "noise_scale", "y_mask")
PRODUCER = "rkstudy inflect decoder --decode-onnx decode.onnx --skip-rknn --output decoder_z.onnx"


def prior_statistics(model: onnx.ModelProto, seam: DecoderSeam) -> tuple[str, str]:
    """The tensors m_p and logs_p of `z = m_p + randn * exp(logs_p) * noise_scale` in a Piper graph."""
    producer = Index(model).producer
    add = producer[seam.z]
    for mean, noise in (add.input, reversed(add.input)):
        stack, seen = [noise], set()
        while stack:
            t = stack.pop()
            n = producer.get(t)
            if n is None or t in seen:
                continue
            seen.add(t)
            if n.op_type == "Exp":
                return mean, n.input[0]
            if n.op_type == "Mul":
                stack.extend(n.input)
    raise EngineMismatch("the latent is not m_p + noise * exp(logs_p) * scale in this graph; "
                         "carve from a Piper (VITS) voice")


def carve_decode_onnx(voice: Voice) -> onnx.ModelProto:
    """A decode.onnx of the Inflect v2 contract: (m_p, logs_p, zp_noise, noise_scale, y_mask) -> audio."""
    dec = decoder_graph(voice.model, voice.seam)
    c = voice.channels
    head = [helper.make_node("Exp", ["logs_p"], ["/head/std"], name="/head/Exp"),
            helper.make_node("Mul", ["zp_noise", "/head/std"], ["/head/noise"], name="/head/Mul"),
            helper.make_node("Mul", ["/head/noise", "noise_scale"], ["/head/scaled"], name="/head/Mul_1"),
            helper.make_node("Add", ["m_p", "/head/scaled"], ["z"], name="/head/Add")]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, c, "N"]) for n in HEAD_INPUTS[:3]]
    inputs += [helper.make_tensor_value_info("noise_scale", TensorProto.FLOAT, [1]),
               helper.make_tensor_value_info("y_mask", TensorProto.FLOAT, [1, 1, "N"])]
    g = helper.make_graph(head + list(dec.graph.node), "inflect_v2_decode", inputs, list(dec.graph.output),
                          list(dec.graph.initializer))
    model = helper.make_model(g, opset_imports=list(dec.opset_import))
    model.ir_version = dec.ir_version
    onnx.checker.check_model(model)
    return model


class DecodeModel(DecoderModel):
    """A decode.onnx, seen by the shared producer exactly as a Voice is."""

    family = "inflect_decoder"

    def __init__(self, onnx_path, sample_rate: int = 22050):
        self.onnx_path, self.sample_rate = Path(onnx_path), sample_rate

    def producer_command(self, *, emit: int, context: int, dec_mask: bool) -> str:
        return (f"rkstudy inflect decoder --decode-onnx {self.onnx_path.name} --emit {emit} --context {context}"
                f"{'' if dec_mask else ' --no-dec-mask'} --skip-rknn --output decoder_z.onnx")


def save_carved(voice: Voice) -> Path:
    """The carved decode.onnx in the cache, keyed by its bytes."""
    return cache.cached_bytes("inflect", "decode", carve_decode_onnx(voice).SerializeToString(), ".onnx")


def prior_samples(voice: Voice, text: str, seed: int = 1234, noise_scale: float | None = None) -> list[np.ndarray]:
    """The model's own prior samples z = m_p + exp(logs_p) * noise * noise_scale, one per sentence,
    with the statistics from the voice's front end and the noise from a seeded numpy generator
    (the runtime's side of the contract)."""
    from ...runtime import OrtRunner

    m_name, logs_name = prior_statistics(voice.model, voice.seam)
    front = graph.slice_at(voice.model, voice.input_names, [m_name, logs_name])
    scale = float(voice.scales[0] if noise_scale is None else noise_scale)
    rng = np.random.default_rng(seed)
    out = []
    for k, ids in enumerate(voice.sentences(text)):
        m_p, logs_p = OrtRunner(seed_random_nodes(front, seed + k)).run({**ids_feed(ids), "scales": voice.scales})
        noise = rng.standard_normal(m_p.shape).astype(np.float32)
        out.append((m_p + np.exp(logs_p) * noise * scale)[0])
    return out
