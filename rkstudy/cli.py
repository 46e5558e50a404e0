"""`rkstudy` command line: doctor, census, fold, build, bench.

Family commands (`rkstudy piper decoder`, `rkstudy inflect decoder`, ...) are added by their modules.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def parse_shapes(items: list[str] | None) -> dict[str, list[int]] | None:
    """`["z:1,192,93", "y_mask:1,1,93"]` -> `{"z": [1,192,93], ...}`."""
    if not items:
        return None
    shapes = {}
    for item in items:
        name, sep, dims = item.rpartition(":")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = [int(d) for d in dims.split(",")]
        except ValueError:
            raise SystemExit(f"--shape {item!r}: expected NAME:D0,D1,... such as z:1,192,93") from None
    return shapes


def _cmd_doctor(args) -> int:
    from . import doctor

    return doctor.main("board" if args.board else "converter")


def _cmd_census(args) -> int:
    from . import graph

    c = graph.census(args.onnx)
    print(json.dumps({**c.row(), "ops": dict(c.ops.most_common())}, indent=1))
    return 0


def _cmd_fold(args) -> int:
    import onnx

    from . import graph

    shapes = parse_shapes(args.shape) or graph.input_shapes(args.onnx)
    before = graph.census(args.onnx, with_axis=False)
    folded = graph.fold(args.onnx, shapes)
    onnx.save(folded, args.output)
    after = graph.census(folded, with_axis=False)
    print(f"{args.onnx}: {before.nodes} nodes -> {args.output}: {after.nodes} nodes "
          f"(Shape {before.hazards['Shape']} -> {after.hazards['Shape']}, "
          f"ConstantOfShape {before.hazards['ConstantOfShape']} -> {after.hazards['ConstantOfShape']})")
    return 0


def _cmd_build(args) -> int:
    from .build import build_engine

    report = build_engine(args.onnx, args.target, parse_shapes(args.shape), args.out,
                          optimization_level=args.optimization_level,
                          regtask_limit=args.regtask_limit, reuse=not args.rebuild)
    print(json.dumps({**report.row(), "engine": report.engine, "log": report.log}, indent=1))
    if not report.ok:
        print("\n".join(report.log_tail[-12:]), file=sys.stderr)
    return 0 if report.ok else 1


def _cmd_bench(args) -> int:
    from . import bench

    return bench.main(args.which)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rkstudy", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("doctor", help="environment versions, board presence, and what to fix")
    d.add_argument("--board", action="store_true", help="check the board side instead of the converter")
    d.set_defaults(func=_cmd_doctor)

    c = sub.add_parser("census", help="node/op counts, weight bytes, hazard ops, longest axis")
    c.add_argument("onnx", type=Path)
    c.set_defaults(func=_cmd_census)

    f = sub.add_parser("fold", help="pin input shapes and constant-fold with onnxslim")
    f.add_argument("onnx", type=Path)
    f.add_argument("--shape", action="append", help="NAME:D0,D1,... (repeat per input)")
    f.add_argument("--output", "-o", type=Path, required=True)
    f.set_defaults(func=_cmd_fold)

    b = sub.add_parser("build", help="compile an ONNX to .rknn in a child process, counting REGTASK")
    b.add_argument("onnx", type=Path)
    b.add_argument("--target", choices=("rk3588", "rk3566"), default="rk3588")
    b.add_argument("--shape", action="append", help="NAME:D0,D1,... (default: the graph's own)")
    b.add_argument("--out", type=Path, help="engine path (default: the cache)")
    b.add_argument("--optimization-level", type=int, default=3)
    b.add_argument("--regtask-limit", type=int, default=100_000)
    b.add_argument("--rebuild", action="store_true", help="ignore a cached engine")
    b.set_defaults(func=_cmd_build)

    # Family commands: each family module adds its own subcommand under its group.
    piper = sub.add_parser("piper", help="Piper (VITS) voice stages").add_subparsers(dest="stage", required=True)
    from .families import inflect, piper_decoder, piper_encoder

    piper_decoder.add_cli(piper)
    piper_encoder.add_cli(piper)
    inflect.add_cli(sub)

    k = sub.add_parser("bench", help="record a benchmark under results/benchmarks/")
    k.add_argument("which", choices=("walker", "make-test"))
    k.set_defaults(func=_cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    from .build import BuildFailed
    from .gates import GateFailed
    from .graph import SeamNotFound

    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except (BuildFailed, GateFailed, SeamNotFound, FileNotFoundError, ValueError, RuntimeError) as exc:
        # one clear line (the messages name the fix), not a traceback through the toolkit
        print(f"rkstudy: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
