"""`rkstudy qwen3 vocoder`: the seeded Qwen3 vocoder as one streaming step of B tokens, two stages.

Importing this module is board safe (argparse only); the handlers import the host code they need.
"""

from __future__ import annotations

from pathlib import Path

from ...cliutil import add_stage_args, positive, refuse_mixed, stage2


def convert_step(onnx_path: Path, target: str | list[str], out: Path | None, as_json: bool = False,
                 toolkit: str | None = None) -> int:
    """Stage 2: read the step contract back out of the graph (restating nothing), compile, gate the
    simulator against fp32 on a zeroed-cache step and on a carried-cache step, write the compiled
    contract beside the engine."""
    from .producer import SIM_GATE, contract_row, read_contract, state_probe

    def describe(c) -> str:
        r = contract_row(c)
        return (f"{onnx_path.name}: {c.family}, step of {r['codes_length']} tokens, cache {r['cache_numel']} floats, "
                f"head dim {r['head_dim']}, KV length {r['kv_len']} ({r['num_layers']} layers x {r['num_heads']} "
                f"heads), {c.params['exporter']} export, {c.params['widths']} widths, seeded random weights")

    return stage2(onnx_path, target, out, describe=describe, remake=read_contract(onnx_path).producer,
                  probe=lambda contract: state_probe(onnx_path, contract), gate=SIM_GATE,
                  probed_on="a zeroed and a carried cache", as_json=as_json, toolkit=toolkit)


def _cmd(args) -> int:
    if args.onnx:
        return convert_step(args.onnx, args.target, args.out, args.json, args.toolkit)
    from .producer import predict_abort, produce
    from .study import self_check

    widths, exporter = args.widths or "released", args.exporter or "torchscript17"
    product = produce(args.codes_length, widths=widths, seed=args.seed, exporter=exporter,
                      output=args.output or Path(f"qwen3_vocoder_b{args.codes_length}.onnx"))
    p, k = product.contract.params, product.census
    print(f"step of {p['codes_length']} tokens: cache {p['cache_numel']} floats, head dim {p['head_dim']}, KV length "
          f"{p['kv_len']}; {k['nodes']} nodes ({p['exporter']}), Pad {k['Pad']}, Exp {k['Exp']}, Shape {k['Shape']}, "
          f"ConstantOfShape {k['ConstantOfShape']}, LayerNorm/Softmax spelt out {k['layernorm_decomposed']}/"
          f"{k['softmax_decomposed']}; abort predicted: {predict_abort(k)[1] if predict_abort(k)[0] else 'no'}")
    row = self_check(args.codes_length, widths=widths, seed=args.seed)
    print(f"self-check: stepwise ({row['schedule']}) vs one full decode {row['measured']:.1f} dB "
          f"(gate {row['threshold']} dB, torch fp32)")
    print(f"wrote {product.path}")
    return 0 if args.skip_rknn else convert_step(product.path, args.target, args.out, args.json, args.toolkit)


def add_cli(group_sub) -> None:
    """Register `rkstudy qwen3 vocoder`."""
    from . import EXPORTERS, WIDTHS

    p = group_sub.add_parser("vocoder", help="the 12 Hz speech-tokenizer decoder (seeded random weights) as one "
                             "stateful streaming step of B tokens: export, contract, census, build")
    p.add_argument("--codes-length", type=positive, default=64,
                   help="tokens per step, compiled in (64: the main engine; 16: the first-chunk engine)")
    p.add_argument("--exporter", choices=EXPORTERS,
                   help="torchscript17 (the default, builds); dynamo needs onnxscript; the others are census variants")
    p.add_argument("--widths", choices=WIDTHS,
                   help="released (the default): the released config; tiny: the architecture at toy widths (tests)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    add_stage_args(p, output_help="where stage 1 writes the step (default qwen3_vocoder_b<B>.onnx)")
    p.set_defaults(func=_cmd, validate_args=lambda a: refuse_mixed(p, a, ("exporter", "widths")))
