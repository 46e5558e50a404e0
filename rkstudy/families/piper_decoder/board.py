"""`rkstudy board run piper_decoder`: the decoder sidecar on RKNNLite.

Input: a latent file the host writes (`rkstudy piper latents --text ... -o latents.npz`), or text
synthesized up to the latent on the board itself (piper-tts + the voice); either is checked against the
engine's source voice by digest. Board side: numpy only (the job runs in the child
that rkstudy.board.run measures).
"""

from __future__ import annotations

import time
from pathlib import Path


def decode_latents(*, contract, engine: Path, cores: str, payload: dict, sidecar_class,
                   decode_kwargs: dict | None = None) -> dict:
    """In the measured child: decode every sentence's latent with `sidecar_class` (the window walk or
    the stateful step: both are built from the runner and contract and decode one (z, g) at a time);
    return the audio and what the row needs. Shared by both Piper decoder boards."""
    import numpy as np

    from ...board.gate import open_engine
    from ...board.runner import runtime_versions
    from ..piper import latents

    lat = latents.load(payload["latents"])
    runner = open_engine(engine, contract.input_names, cores=cores)
    try:
        side = sidecar_class(runner, contract, channels=lat.z[0].shape[0], hop=contract.params["hop"],
                             speaker_dims=lat.g[0].shape[0] if lat.g[0] is not None else 0)
        pcm, steps = [], 0
        t0 = time.perf_counter()
        for z, g in zip(lat.z, lat.g):
            pcm.append(side.decode(z, g, **(decode_kwargs or {})))
            steps += getattr(side, "steps", 0)
        seconds = time.perf_counter() - t0
    finally:
        runner.close()
    audio = np.concatenate(pcm)
    return {"audio": audio, "sample_rate": lat.sample_rate, "seconds": seconds,
            "audio_s": audio.size / lat.sample_rate, "where": runner.where, "target": runner.target,
            "cores": runner.cores, "runtime": runtime_versions(), "sentences": len(pcm), "steps": steps}


def decode_job(*, contract, engine: Path, cores: str, payload: dict) -> dict:
    """In the measured child: walk every sentence's latent through the engine; return the audio."""
    from .sidecar import DecoderSidecar

    out = decode_latents(contract=contract, engine=engine, cores=cores, payload=payload,
                         sidecar_class=DecoderSidecar, decode_kwargs={"progress": False})
    del out["steps"]
    return out


def text_latents(args, path: Path) -> Path:
    """Latents for `--text`, synthesized here by the voice itself (rkstudy.families.piper.boardfront),
    written to `path` with the voice's digest; the engine's contract names the seam and must come
    from this voice."""
    from ...contract import Digest, for_engine
    from ..piper import latents
    from ..piper.boardfront import latents_from_text
    from ..piper.frontend import Latent

    contract = for_engine(args.engine, family="piper_decoder", source=args.voice_onnx)
    got, front = latents_from_text(args.voice_onnx, args.text, seam_z=contract.params["seam_z"],
                                   seam_g=contract.params["seam_g"], config=args.voice_config, speaker=args.speaker)
    source = Digest.of(args.voice_onnx)
    return latents.save(path, [Latent(text=args.text, ids=ids, z=z, g=g) for ids, z, g in got],
                        source={"file": source.file, "sha256": source.sha256}, sample_rate=front.sample_rate)


def _run(args) -> int:
    import tempfile

    from ...board.run import measure, pick, require_board
    from ..piper import latents

    require_board()  # before reading any input: off a board, that is the one thing to say
    (args.engine,) = pick(args.engine, "piper_decoder")
    with tempfile.TemporaryDirectory(prefix="rkstudy-text-") as tmp:
        path = Path(args.latents).resolve() if args.latents else text_latents(args, Path(tmp) / "latents.npz")
        lat = latents.load(path)
        measure("piper_decoder", engine=args.engine, job="rkstudy.families.piper_decoder.board:decode_job",
                payload={"latents": str(path)}, cores=args.cores, audio_out=args.audio,
                outputs_out=args.outputs, results_dir=args.results, source_sha256=lat.source["sha256"],
                extra={"sentences": len(lat.z), "frames": sum(z.shape[1] for z in lat.z)})
    return 0


def add_board(sub) -> None:
    """Register `rkstudy board run piper_decoder`."""
    from ...cliutil import add_board_run_args, add_engine_arg

    p = sub.add_parser("piper_decoder", help="the decoder sidecar on RKNNLite: audio and one results row")
    add_engine_arg(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--latents", type=Path,
                     help="latents written on the host by `rkstudy piper latents --text ... -o latents.npz`")
    src.add_argument("--text", help="text to speak, synthesized here up to the latent by the voice itself "
                     "(needs piper-tts and --voice-onnx)")
    p.add_argument("--voice-onnx", type=Path, help="with --text: the voice the engine was made from")
    p.add_argument("--voice-config", type=Path, help="with --text: its .onnx.json (default: beside it)")
    p.add_argument("--speaker", type=int, default=0, help="with --text: speaker id of a multi-speaker voice")
    add_board_run_args(p)
    def check(args):
        if args.text and not args.voice_onnx:
            p.error("--text needs --voice-onnx (the voice the engine was made from)")

    p.set_defaults(func=_run, validate_args=check)


BUNDLE_TEXT = "Call me at 555 0142."


def bundle_part():
    """The Piper voice in the board bundle (rkstudy.bundle): the W93 decoder for every SoC beside its stage-1 graph,
    the voice's latents of a short text (the board run's input, its gate's too: the fp32 pass runs on the board),
    the voice itself (the plan speaks with it) and the plan putting the decoder on the NPU. Host only."""
    from ...cliutil import BundlePart
    from ..piper.voice import default_voice_paths

    voice, config = default_voice_paths()
    return BundlePart(
        model="piper", says="Piper (en_US-joe-medium): the decoder window engine, gated against its fp32 graph on the "
                            "board",
        host=(("piper", "decoder", "--skip-rknn", "--output", "engines/piper/decoder_z.onnx"),
              ("piper", "decoder", "--onnx", "engines/piper/decoder_z.onnx", "--target", "all", "--out",
               "engines/piper/"),
              ("piper", "latents", "--text", BUNDLE_TEXT, "-o", "inputs/piper_latents.npz")),
        board=(("board", "run", "piper_decoder", "--engine", "engines/piper/", "--latents", "inputs/piper_latents.npz",
                "--audio", "piper.wav"),),
        plan={"decoder": {"impl": "rknn", "artifacts": {"main": "{engine:piper_decoder}"}}},
        files=((str(voice), f"voice/{Path(voice).name}"), (str(config), f"voice/{Path(config).name}")),
        board_cpu=board_cpu_factor)


# The Piper voice's real-time factor on an RK3588's CPU, onnxruntime on its cores as Piper runs it: the Paroli
# write-up (clehaxze.tw, 2023-12-24: "~0.65 on the RK3588 CPU"), a medium voice as en_US-joe-medium is
BOARD_CPU_VOICE_RTF = 0.65


def board_cpu_factor() -> tuple[float, str]:
    """How many times slower an RK3588's CPU runs onnxruntime than this host: the published RTF of a medium Piper
    voice there over this host's RTF of en_US-joe-medium (the whole voice, onnxruntime on this host's cores, the
    best of three passes over the bundle's text). Host only."""
    import time

    import numpy as np

    from ...runtime import OrtRunner
    from ..piper.voice import Voice

    voice = Voice()
    runner = OrtRunner(voice.onnx_path)
    best, samples = float("inf"), 0
    for _ in range(3):
        t0, samples = time.perf_counter(), 0
        for ids in voice.sentences(BUNDLE_TEXT * 3):
            feed = {"input": np.array([ids], np.int64), "input_lengths": np.array([len(ids)], np.int64),
                    "scales": np.array(voice.scales, np.float32)}
            samples += runner.run([feed[n] for n in runner.input_names])[0].size
        best = min(best, time.perf_counter() - t0)
    rtf = best / (samples / voice.sample_rate)
    return BOARD_CPU_VOICE_RTF / rtf, (f"the Piper voice's RTF on an RK3588's CPU, {BOARD_CPU_VOICE_RTF} (the Paroli "
                                       f"write-up), over en_US-joe-medium's {rtf:.3f} on this host")
