"""`rkstudy cosyvoice3 estimator`: the DiT stand-in at a fixed frame count S, two stages.

Importing this module is board safe (argparse only); the handlers import the host code they need.
"""

from __future__ import annotations

from pathlib import Path

from ...cliutil import add_stage_args, positive, refuse_mixed, stage2
from ...errors import UsageError


def convert_estimator(onnx_path: Path, target: str | list[str], out: Path | None, as_json: bool = False,
                      toolkit: str | None = None) -> int:
    """Stage 2: compile, gate the simulator against fp32 on estimator-like inputs (90% of the frames
    real), write the compiled contract beside the engine."""
    from .producer import PRODUCER, SIM_GATE, probe

    def describe(c) -> str:
        p = c.params
        return (f"{onnx_path.name}: flow_estimator stand-in, S={p['frames']}, depth {p['depth']}, "
                f"{p['attn_form']}/{p['attn_bias']} attention, {p['parameters']} parameters ({p['weights']})")

    return stage2(onnx_path, target, out, describe=describe, remake=PRODUCER, probe=probe, gate=SIM_GATE,
                  probed_on="estimator inputs", as_json=as_json, toolkit=toolkit)


def _cmd(args) -> int:
    if args.onnx:
        return convert_estimator(args.onnx, args.target, args.out, args.json, args.toolkit)
    if args.frames is None:
        raise UsageError("give --frames S (the compiled frame count) to produce an estimator graph, or "
                         "--onnx EST.onnx to convert one")
    from .producer import produce

    product = produce(args.frames, depth=args.depth, seed=args.seed, attn_form=args.attn_form,
                      attn_bias=args.attn_bias, output=args.output)
    c = product.contract
    nodes = f"{product.raw_nodes} -> "
    print(f"DiT stand-in S={args.frames}: depth {c.params['depth']}, {c.params['parameters']} parameters, "
          f"{c.params['weights']}; {nodes}{product.folded_nodes} nodes after the fold")
    print("inputs: " + ", ".join(f"{t.name} {list(t.shape)} {t.role}" for t in c.inputs))
    print(f"wrote {product.path}")
    return 0 if args.skip_rknn else convert_estimator(product.path, args.target, args.out, args.json, args.toolkit)


def add_cli(group_sub) -> None:
    """Register `rkstudy cosyvoice3 estimator`."""
    p = group_sub.add_parser("estimator", help="the flow-matching DiT estimator (a stand-in with random "
                             "weights) at a fixed frame count S: export, fold, contract, build")
    p.add_argument("--frames", type=positive, help="the compiled frame count S (for example 110, 200, 250, 500)")
    p.add_argument("--depth", type=positive, default=2,
                   help="DiT blocks (default 2; CosyVoice3 has 22, the per-block shapes are its own)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    p.add_argument("--attn-form", choices=("sdpa", "gated"), default="sdpa",
                   help="gated: a mask multiply after the softmax, which keeps the compiler from fusing attention")
    p.add_argument("--attn-bias", choices=("key", "dense"), default="key",
                   help="dense: the key mask materialized as [1,1,S,S], the shape CosyVoice's export hands attention")
    add_stage_args(p, output_help="where stage 1 writes the folded ONNX (default: the cache)")
    p.set_defaults(func=_cmd, validate_args=lambda a: refuse_mixed(p, a, ("frames",)))
