"""`rkstudy board run qwen3_vocoder`: the vocoder sidecar on RKNNLite, offline or 16+64 streaming.

Input: codes, either a .npy `[16, T]` int64 file (what a talker wrote) or seeded random codes made
here (the weights are seeded random, so any codes are as good as a talker's). Board side: numpy
only (the job runs in the child that rkstudy.board.run measures).
"""

from __future__ import annotations

import time
from pathlib import Path

from .sidecar import FAMILY

REMAKE = "rkstudy qwen3 vocoder --codes-length 64 --skip-rknn --output qwen3_vocoder_b64.onnx"


def _load_codes(payload: dict, contract):
    import numpy as np

    from .sidecar import random_codes

    if payload.get("codes"):
        return np.load(payload["codes"])
    p = contract.params
    return random_codes(payload["tokens"], payload["seed"], codebook_size=p["codebook_size"],
                        num_quantizers=p["num_quantizers"])[0]


def decode_job(*, contract, engine: Path, cores: str, payload: dict) -> dict:
    """In the measured child: decode the codes (offline on the main engine, or streaming in events with
    the first engine for the first group); return the audio and the row."""

    from ...board.gate import open_engine
    from ...board.runner import runtime_versions
    from ...contract import for_engine
    from .sidecar import SAMPLE_RATE, VocoderSidecar, events, gather

    codes = _load_codes(payload, contract)
    runners = [open_engine(engine, contract.input_names, cores=cores)]
    first_contract = None
    if payload.get("first"):
        first_contract = for_engine(payload["first"], family=FAMILY, soc=contract.target, remake=REMAKE)
        runners.append(open_engine(payload["first"], first_contract.input_names, cores=cores))
    try:
        side = VocoderSidecar(runners[0], contract, *(runners[1:2]), first_contract)
        t0 = time.perf_counter()
        first_audio = None
        if payload["mode"] == "streaming":
            audio, first_audio = gather(side.stream(events(codes, payload["event"])), t0)
        else:
            audio = side.decode(codes)
        seconds = time.perf_counter() - t0
    finally:
        for r in runners:
            r.close()
    steps = sum(n for _, n in side.steps)
    return {"audio": audio, "sample_rate": SAMPLE_RATE, "seconds": seconds, "audio_s": audio.size / SAMPLE_RATE,
            "where": runners[0].where, "target": runners[0].target, "cores": runners[0].cores,
            "runtime": runtime_versions(),
            "row": {"mode": payload["mode"], "tokens": int(codes.shape[-1]),
                    "engines": "+".join(str(b) for b, _ in side.steps), "steps": steps,
                    "ms_per_token": round(1e3 * seconds / max(int(codes.shape[-1]), 1), 3),
                    "first_audio_s": "" if first_audio is None else round(first_audio, 4)}}


def _run(args) -> int:
    from ...board.run import measure, pick, require_board
    from ...errors import UsageError

    require_board()  # before reading any input: off a board, that is the one thing to say
    if args.mode == "streaming" and args.first is None:
        raise UsageError("--mode streaming runs the first group on the 16-token engine: pass --first ENGINE.rknn")
    (args.engine,) = pick(args.engine, FAMILY, remake=REMAKE)
    payload = {"codes": str(Path(args.codes).resolve()) if args.codes else None, "tokens": args.tokens,
               "seed": args.seed, "mode": args.mode, "event": args.event,
               "first": str(Path(args.first).resolve()) if args.first else None}
    measure(FAMILY, engine=args.engine, job="rkstudy.families.qwen3_vocoder.board:decode_job", payload=payload,
            cores=args.cores, audio_out=args.audio, outputs_out=args.outputs, results_dir=args.results,
            extra={"codes": Path(args.codes).name if args.codes else f"random seed {args.seed}"}, remake=REMAKE,
            also=[args.first] if args.first else [])  # the first engine checked too: one line, not a child's error
    return 0


def add_board(sub) -> None:
    """Register `rkstudy board run qwen3_vocoder`."""
    from ...cliutil import add_board_run_args, add_engine_arg, positive

    p = sub.add_parser(FAMILY, help="the Qwen3 vocoder step engines on RKNNLite: offline or 16+64 streaming")
    add_engine_arg(p, "the main (64-token) .rknn, its .contract.json beside it")
    p.add_argument("--first", type=Path, help="the first-group (16-token) .rknn, for --mode streaming")
    p.add_argument("--mode", choices=("offline", "streaming"), default="offline")
    p.add_argument("--codes", type=Path, help="codes [16, T] int64 (.npy); default: seeded random codes")
    p.add_argument("--tokens", type=positive, default=300, help="random codes: how many tokens (12.5 per second)")
    p.add_argument("--seed", type=int, default=0, help="random codes: their seed")
    p.add_argument("--event", type=positive, default=12, help="streaming: tokens per event the talker hands over")
    add_board_run_args(p)
    p.set_defaults(func=_run)


BUNDLE_CODES, BUNDLE_SEED = 128, 0


def bundle_part():
    """The Qwen3 vocoder in the board bundle (rkstudy.bundle): the 64-token step for every SoC beside its stage-1
    graph, seeded random codes for its board run (the weights are seeded random too), and the plan putting the
    speech decoder on the NPU. Host only."""
    from ...cliutil import BundlePart

    codes = ("--tokens", str(BUNDLE_CODES), "--seed", str(BUNDLE_SEED))
    return BundlePart(
        model="qwen3", says="Qwen3-TTS 12 Hz vocoder (seeded random weights): the 64-token step engine",
        host=(("qwen3", "vocoder", "--codes-length", "64", "--skip-rknn", "--output", "engines/qwen3/step_b64.onnx"),
              ("qwen3", "vocoder", "--onnx", "engines/qwen3/step_b64.onnx", "--target", "all", "--out",
               "engines/qwen3/")),
        board=(("board", "run", FAMILY, "--engine", "engines/qwen3/", *codes, "--audio", "qwen3.wav"),),
        plan={"speech_decoder": {"impl": "rknn", "artifacts": {"main": "{engine:qwen3_vocoder}"}}})
