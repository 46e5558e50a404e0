"""`rkstudy board run piper_decoder_stateful`: the stateful decoder sidecar on RKNNLite.

Input: a latent file the host writes (`rkstudy piper latents --text ... -o latents.npz`), checked
against the engine's source voice by digest. Board side: numpy only (the job runs in the child that
rkstudy.board.run measures).
"""

from __future__ import annotations

from pathlib import Path

REMAKE = "rkstudy piper decoder --stateful --emit 45 --skip-rknn --output decoder_step.onnx"


def decode_job(*, contract, engine: Path, cores: str, payload: dict) -> dict:
    """In the measured child: step through every sentence's latent on the engine; return the audio."""
    from ..piper_decoder.board import decode_latents
    from .sidecar import StatefulDecoderSidecar

    out = decode_latents(contract=contract, engine=engine, cores=cores, payload=payload,
                         sidecar_class=StatefulDecoderSidecar)
    steps = out.pop("steps")
    out["row"] = {"emit": contract.params["emit"], "steps": steps,
                  "ms_per_step": round(1e3 * out["seconds"] / max(steps, 1), 3)}
    return out


def _run(args) -> int:
    from ...board.run import measure, pick, require_board
    from ..piper import latents

    require_board()  # before reading any input: off a board, that is the one thing to say
    (args.engine,) = pick(args.engine, "piper_decoder_stateful", remake=REMAKE)
    lat = latents.load(args.latents)
    measure("piper_decoder_stateful", engine=args.engine,
            job="rkstudy.families.piper_decoder_stateful.board:decode_job",
            payload={"latents": str(Path(args.latents).resolve())}, cores=args.cores, audio_out=args.audio,
            outputs_out=args.outputs, results_dir=args.results, source_sha256=lat.source["sha256"],
            extra={"sentences": len(lat.z), "frames": sum(z.shape[1] for z in lat.z)}, remake=REMAKE)
    return 0


def add_board(sub) -> None:
    """Register `rkstudy board run piper_decoder_stateful`."""
    from ...cliutil import add_board_run_args, add_engine_arg

    p = sub.add_parser("piper_decoder_stateful",
                       help="the stateful decoder step on RKNNLite: audio and one results row")
    add_engine_arg(p)
    p.add_argument("--latents", type=Path, required=True,
                   help="latents written on the host by `rkstudy piper latents --text ... -o latents.npz`")
    add_board_run_args(p)
    p.set_defaults(func=_run)
