"""`rkstudy board run port`: a port engine (window or stateful step) on RKNNLite over the user's
own inputs (.npz by input name). Board side: numpy only (the job runs in the child that
rkstudy.board.run measures).
"""

from __future__ import annotations

import time
from pathlib import Path


def decode_job(*, contract, engine: Path, cores: str, payload: dict) -> dict:
    """In the measured child: every utterance through the engine's walker; the first walked output
    (flattened, frame-major for a multi-channel output) is the audio."""
    import numpy as np

    from ...board.gate import open_engine
    from ...board.runner import runtime_versions
    from .sidecar import PortSidecar, input_names, load_inputs

    utterances = load_inputs(payload["inputs"], input_names(contract))
    runner = open_engine(engine, contract.input_names, cores=cores)
    try:
        side = PortSidecar(runner, contract)
        pieces, steps = [], 0
        t0 = time.perf_counter()
        for u in utterances:
            out = side.decode(u)[0]
            pieces.append(np.ascontiguousarray(out.reshape(-1, out.shape[-1]).T).reshape(-1))
            steps += side.steps
        seconds = time.perf_counter() - t0
    finally:
        runner.close()
    audio, rate = np.concatenate(pieces), contract.params["sample_rate"]
    hop = contract.params["hop"]
    return {"audio": audio, "sample_rate": rate, "seconds": seconds, "audio_s": audio.size / rate,
            "where": runner.where, "target": runner.target, "cores": runner.cores, "runtime": runtime_versions(),
            "row": {"walk": "stateful step" if contract.state else "window", "utterances": len(pieces),
                    "steps": steps, "hop": hop}}


def _run(args) -> int:
    from ...board.run import measure, pick, require_board

    require_board()  # before reading any input: off a board, that is the one thing to say
    (args.engine,) = pick(args.engine, "port")
    if not Path(args.inputs).is_file():
        from ...errors import UsageError

        raise UsageError(f"--inputs {args.inputs}: no such file")
    measure("port", engine=args.engine, job="rkstudy.families.port.board:decode_job",
            payload={"inputs": str(Path(args.inputs).resolve())}, cores=args.cores, audio_out=args.audio,
            outputs_out=args.outputs, results_dir=args.results)
    return 0


def add_board(sub) -> None:
    """Register `rkstudy board run port`."""
    from ...cliutil import add_board_run_args, add_engine_arg

    p = sub.add_parser("port", help="a `rkstudy port` engine on RKNNLite over your inputs: outputs and one row")
    add_engine_arg(p)
    p.add_argument("--inputs", type=Path, required=True, help=".npz of inputs by input name, as for `rkstudy port`")
    add_board_run_args(p, audio_help="write the first walked output here (16-bit WAV)")
    p.set_defaults(func=_run)
