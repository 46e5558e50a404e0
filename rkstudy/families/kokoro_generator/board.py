"""`rkstudy board run kokoro_generator`: the generator sidecar on RKNNLite, the numpy head for audio.

Input: the file the host writes (`rkstudy kokoro inputs --text ... -o inputs.npz`): per sentence the
latent, the harmonic input and the style (and a full-length decode's frame energy for `--gain`), the
model's iSTFT constants, and the digest of the model they came from, checked against the engine's
contract. Board side: numpy only (the job runs in the child that rkstudy.board.run measures).
"""

from __future__ import annotations

import time
from pathlib import Path


def generate_job(*, contract, engine: Path, cores: str, payload: dict) -> dict:
    """In the measured child: walk every sentence through the engine, then the head; time both."""
    import numpy as np

    from ...board.gate import open_engine
    from ...board.runner import runtime_versions
    from . import head, input_file
    from .sidecar import GeneratorSidecar

    data = input_file.load(payload["inputs"])
    first = data.sentences[0]
    runner = open_engine(engine, contract.input_names, cores=cores)
    try:
        fine = (first.har.shape[1] - 1) // first.frames
        side = GeneratorSidecar(runner, contract, channels=first.x.shape[0], rows=first.har.shape[0],
                                samples_per_frame=fine * data.head.hop, overlap=payload["overlap"],
                                gain=payload["gain"])
        gens, t0 = [], time.perf_counter()
        for s in data.sentences:
            gens.append(side.generate(s.x, s.har, s.style, reference=s.energy, progress=False))
        gen_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        pcm = [head.istft(g, data.head) for g in gens]
        head_s = time.perf_counter() - t1
    finally:
        runner.close()
    audio = np.concatenate(pcm)
    frames = data.frames
    return {"audio": audio, "arrays": {f"gen_{k}": g for k, g in enumerate(gens)}, "sample_rate": data.sample_rate,
            "seconds": gen_s + head_s, "audio_s": audio.size / data.sample_rate, "where": runner.where,
            "target": runner.target, "cores": runner.cores, "runtime": runtime_versions(),
            "row": {"generator_s": round(gen_s, 4), "head_s": round(head_s, 4),
                    "generator_ms_per_frame": round(1e3 * gen_s / frames, 3)}}


def _run(args) -> int:
    from ...board.run import measure, pick, require_board
    from . import input_file

    require_board()  # before reading any input: off a board, that is the one thing to say
    (args.engine,) = pick(args.engine, "kokoro_generator")
    data = input_file.load(args.inputs)
    if args.gain and any(s.energy is None for s in data.sentences):
        from ...errors import UsageError

        raise UsageError(f"--gain needs a full-length decode's frame energy in {Path(args.inputs).name}; write it "
                         "on the host with `rkstudy kokoro inputs --gain ...`")
    measure("kokoro_generator", engine=args.engine, job="rkstudy.families.kokoro_generator.board:generate_job",
            payload={"inputs": str(Path(args.inputs).resolve()), "overlap": args.overlap, "gain": args.gain},
            cores=args.cores, audio_out=args.audio, outputs_out=args.outputs, results_dir=args.results,
            source_sha256=data.source["sha256"],
            extra={"sentences": len(data.sentences), "frames": data.frames, "overlap": args.overlap,
                   "gain": args.gain})
    return 0


def add_board(sub) -> None:
    """Register `rkstudy board run kokoro_generator`."""
    from ...cliutil import add_board_run_args, add_engine_arg

    p = sub.add_parser("kokoro_generator", help="the generator sidecar on RKNNLite: audio and one results row")
    add_engine_arg(p)
    p.add_argument("--inputs", type=Path, required=True,
                   help="written on the host by `rkstudy kokoro inputs --text ... -o inputs.npz`")
    p.add_argument("--overlap", type=int, default=0,
                   help="frames two windows share, blended with a raised cosine (default 0)")
    p.add_argument("--gain", action="store_true",
                   help="correct each window's loudness toward the full-length decode in the inputs file")
    add_board_run_args(p, audio_help="write the audio here (16-bit WAV)",
                       outputs_help="write the audio and each sentence's generator rows here (.npz)")
    p.set_defaults(func=_run, validate_args=lambda a: a.overlap >= 0 or p.error("--overlap must be 0 or more"))


BUNDLE_TEXT = "良い天気ですね。"


def bundle_part():
    """Kokoro in the board bundle (rkstudy.bundle): the default generator window for every SoC beside its stage-1
    graph, the inputs of a short text, and the plan putting the generator on the NPU. Host only."""
    from ...cliutil import BundlePart

    return BundlePart(
        model="kokoro", says="Kokoro-82M (Japanese): the generator window engine",
        host=(("kokoro", "generator", "--skip-rknn", "--output", "engines/kokoro/generator.onnx"),
              ("kokoro", "generator", "--onnx", "engines/kokoro/generator.onnx", "--target", "all", "--out",
               "engines/kokoro/"),
              ("kokoro", "inputs", "--text", BUNDLE_TEXT, "-o", "inputs/kokoro_inputs.npz")),
        board=(("board", "run", "kokoro_generator", "--engine", "engines/kokoro/", "--inputs",
                "inputs/kokoro_inputs.npz", "--audio", "kokoro.wav"),),
        plan={"generator": {"impl": "rknn", "artifacts": {"main": "{engine:kokoro_generator}"}}})
