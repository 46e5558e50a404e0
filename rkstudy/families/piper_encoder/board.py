"""`rkstudy board run piper_encoder`: the encoder ladder on RKNNLite, per-chunk timings.

Input: the sentences' phoneme ids in a latent file the host writes (`rkstudy piper latents`), checked
against the engines' source voice by digest; chunks above the widest rung go to `--fallback` (the
fp32 encoder slice, through onnxruntime) or are refused. Board side: numpy (+ onnxruntime for the
fallback).
"""

from __future__ import annotations

import time
from pathlib import Path


def ladder_job(*, contract, engine: Path, cores: str, payload: dict) -> dict:
    """In the measured child: route every chunk through the ladder; time each."""
    import numpy as np

    from ...board.gate import open_engine
    from ...board.runner import runtime_versions
    from ...contract import for_engine
    from ...runtime import OrtRunner
    from ..piper import latents
    from .sidecar import Ladder, LadderEngine

    lat = latents.load(payload["latents"])
    runners, engines = [], []
    try:
        for path in payload["engines"]:
            c = for_engine(path, family="piper_encoder")
            runners.append(open_engine(path, c.input_names, cores=cores, shape_sets=c.shape_sets))
            engines.append(LadderEngine(runners[-1], c))
        fallback = OrtRunner(payload["fallback"]) if payload.get("fallback") else None
        ladder = Ladder(engines, fallback)
        per_chunk, arrays, t0 = [], {}, time.perf_counter()
        for k, ids in enumerate(lat.ids):
            t = time.perf_counter()
            arrays[f"stats_{k}"], arrays[f"cond_{k}"], where = ladder.run(ids)
            per_chunk.append({"tokens": len(ids), "ran_on": where, "ms": 1e3 * (time.perf_counter() - t)})
        seconds = time.perf_counter() - t0
    finally:
        for r in runners:
            r.close()
    return {"audio": np.zeros(0, np.float32), "arrays": arrays, "sample_rate": lat.sample_rate, "seconds": seconds,
            "audio_s": 0.0,
            "where": runners[0].where, "target": runners[0].target, "cores": runners[0].cores,
            "runtime": runtime_versions(),
            "row": {"ran_on": "/".join(c["ran_on"] for c in per_chunk),
                    "chunk_ms": "/".join(f"{c['ms']:.1f}" for c in per_chunk)}}


def _run(args) -> int:
    from ...board.run import measure, pick, require_board
    from ...contract import for_engine
    from ..piper import latents

    require_board()
    lat = latents.load(args.latents)
    rungs = pick(args.engine, "piper_encoder", several=True)
    first = sorted(rungs, key=lambda p: for_engine(p, family="piper_encoder").params["width"])
    # every rung is checked before the child starts (SoC, source, runtime), not only the first
    measure("piper_encoder", engine=first[0], job="rkstudy.families.piper_encoder.board:ladder_job",
            payload={"latents": str(Path(args.latents).resolve()), "engines": [str(Path(p).resolve()) for p in first],
                     "fallback": str(Path(args.fallback).resolve()) if args.fallback else None},
            cores=args.cores, outputs_out=args.outputs, results_dir=args.results, source_sha256=lat.source["sha256"],
            extra={"widths": ",".join(str(for_engine(p).params["width"]) for p in first),
                   "chunks": len(lat.ids), "tokens": sum(len(i) for i in lat.ids)}, also=first[1:])
    return 0


def add_board(sub) -> None:
    """Register `rkstudy board run piper_encoder`."""
    from ...cliutil import add_board_run_args, add_engine_arg

    p = sub.add_parser("piper_encoder", help="the encoder ladder on RKNNLite: per-chunk timings, one results row")
    add_engine_arg(p, "a ladder rung (.rknn with its .contract.json)", rungs=True)
    p.add_argument("--latents", type=Path, required=True,
                   help="the file `rkstudy piper latents` writes (its phoneme ids are the chunks)")
    p.add_argument("--fallback", type=Path, help="the fp32 encoder slice for chunks above the widest rung")
    add_board_run_args(p, audio_help=None, outputs_help="write each chunk's stats and cond here (.npz)")
    p.set_defaults(func=_run)
