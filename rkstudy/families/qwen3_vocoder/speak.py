"""`rkstudy speak qwen3`: codes through the Qwen3-TTS 12 Hz speech decoder, offline or streaming, on its
plan's implementation. The weights are seeded random (the checkpoint is not obtainable here): the audio
is not speech; its timings, its first-audio time and its agreement with the CPU path are real.

The Qwen3 plan (the RKNN decoder-path document's `qwen3_tts.exec_plan`) has one component:
* speech_decoder: codes -> 24 kHz audio. CPU path: the model's own streaming step (`--model`, the fp32
  step graph stage 1 writes, `rkstudy qwen3 vocoder --skip-rknn`) in onnxruntime, offline (one walk over
  every token) or streaming (the same walk fed event by event); rknn: the step engines, with the
  document's three roles: `main` (the B = 64 step), `first` (the 16-token step that voices the first
  group while streaming, so the first audio waits for 16 tokens instead of 64) and `window` (streaming
  re-voices up to 25 tokens of left context per event from a zeroed cache, the package's own streaming
  function; naming the main engine aliases it).

The codes are a .npy `[16, T]` (what a talker wrote) or seeded random ones (any codes are as good as a
talker's for random weights). Streaming hands them over in events of `--event` tokens, as a talker would.

Board side: numpy and onnxruntime (RKNNLite, or a host runtime, for the NPU roles).
"""

from __future__ import annotations

import time
from pathlib import Path

from ...errors import EngineMismatch, InputError
from ...plan import Component, ModelPlan, Role
from .sidecar import FAMILY, LEFT_CONTEXT

MODEL = "qwen3"
WEIGHTS = "seeded random"
NOTE = ("the Qwen3 speech decoder here has seeded random weights (the checkpoint is not obtainable): its audio is "
        "not speech; its timings and its agreement with the CPU path are real")


def plan() -> ModelPlan:
    """The Qwen3 plan's schema (Family.plan of qwen3_vocoder)."""
    return ModelPlan(
        model=MODEL, option="qwen3_tts.exec_plan", title="Qwen3-TTS 12 Hz speech decoder (seeded random weights): "
        "codes -> audio", study="qwen3_vocoder", speaker="rkstudy.families.qwen3_vocoder.speak",
        components=(Component(
            "speech_decoder", "codes -> 24 kHz audio, one stateful step after another", engines=FAMILY,
            roles=(Role("main", required=True, says="the B=64 step"),
                   Role("first", says="the 16-token step for the first group while streaming"),
                   Role("window", says="a step that re-voices left context per streaming event (the main engine "
                                       "aliases it)"))),))


def add_args(p) -> None:
    from ...cliutil import positive

    p.add_argument("--model", type=Path, required=True,
                   help="the model's own step graph (fp32 ONNX written by `rkstudy qwen3 vocoder --skip-rknn`): the "
                        "CPU path; artifact names resolve in its folder")
    p.add_argument("--mode", choices=("offline", "streaming"), default="offline")
    p.add_argument("--codes", type=Path, help="codes [16, T] int64 (.npy); default: seeded random codes")
    p.add_argument("--tokens", type=positive, default=300, help="random codes: how many tokens (12.5 per second)")
    p.add_argument("--codes-seed", type=int, default=0, help="random codes: their seed")
    p.add_argument("--event", type=positive, default=12, help="streaming: tokens per event the talker hands over")
    p.add_argument("--left-context", type=int, default=LEFT_CONTEXT,
                   help=f"the window role: tokens of left context each event re-voices (default {LEFT_CONTEXT}, the "
                        "package's chunked_decode default)")


def model_contract(path: Path):
    """The contract the step graph carries in its metadata (read on the wire: no onnx needed)."""
    from ...contract import from_metadata
    from ...runtime import protowire

    if not path.is_file():
        raise InputError(f"no model at {path}; pass --model the fp32 step graph (`rkstudy qwen3 vocoder --skip-rknn "
                         "--output qwen3_vocoder_b64.onnx`)")
    c = from_metadata(protowire.metadata(path.read_bytes()), where=path.name,
                      remake="rkstudy qwen3 vocoder --codes-length 64 --skip-rknn --output qwen3_vocoder_b64.onnx")
    c.check_family(FAMILY)
    return c


def refuse_swapped_roles(first, main) -> None:
    """The first role is the short step that makes the first audio early; one that steps as many tokens as
    the main engine, or more, is a plan with its roles swapped (it would run, late: 13 s to first audio
    where the right way round gives 1 s)."""
    n_first, n_main = (e.contract.params["codes_length"] for e in (first, main))
    if n_first >= n_main:
        raise EngineMismatch(f"the first role's engine {first.path.name} steps {n_first} tokens and the main role's "
                             f"{main.path.name} {n_main}: the first engine is the shorter one, which makes the first "
                             f"audio early; swap them in the plan (first: the {min(n_first, n_main)}-token engine)")


def prepare(plan, args, runtime: str):
    import numpy as np

    from ...plan import engines, resolve
    from ...plan.speak import Prepared

    model = Path(args.model)
    own = model_contract(model)
    plan = resolve(plan, model.parent)
    if args.codes is not None:
        codes = np.load(args.codes)
        q = own.params["num_quantizers"]
        if codes.ndim != 2 or codes.shape[0] != q or codes.dtype.kind not in "iu":
            raise InputError(f"{args.codes} holds {codes.dtype} {codes.shape}; give integer codes [{q}, T]")
    found = {}
    choice = plan["speech_decoder"]
    if choice.npu:
        for role, paths in choice.paths.items():
            es = [engines.load(p, family=FAMILY, runtime=runtime) for p in paths]
            for e in es:
                if e.contract.source != own.source:
                    raise EngineMismatch(f"{e.path.name} was made from {e.contract.source.file} (sha256 "
                                         f"{e.contract.source.sha256[:12]}) and --model {model.name} from "
                                         f"{own.source.file} ({own.source.sha256[:12]}); make both from one decoder "
                                         f"with `{own.remake}`")
            found[f"speech_decoder.{role}"] = es
        if {"main", "first"} <= set(choice.paths):
            refuse_swapped_roles(*(found[f"speech_decoder.{r}"][0] for r in ("first", "main")))
        if "first" in choice.paths and args.mode == "offline":
            print("the first engine serves streaming only: offline decoding runs every token on the main engine")
    if "window" in choice.paths and args.mode == "streaming":
        step = found["speech_decoder.window"][0].contract.params["codes_length"]
        if args.left_context < 0 or args.left_context + args.event > step:
            from ...errors import UsageError

            raise UsageError(f"--left-context {args.left_context} with --event {args.event}: the window role re-voices "
                             f"both in one {step}-token step; give left context + event <= {step}")
    payload = {"model": str(model.resolve()), "mode": args.mode, "event": args.event, "left_context": args.left_context,
               "codes": str(Path(args.codes).resolve()) if args.codes else None, "tokens": args.tokens,
               "codes_seed": args.codes_seed, "num_quantizers": own.params["num_quantizers"],
               "codebook_size": own.params["codebook_size"]}
    row = {"weights": WEIGHTS, "mode": args.mode,
           "codes": Path(args.codes).name if args.codes else f"random seed {args.codes_seed}",
           "event": args.event if args.mode == "streaming" else "",
           "left_context": args.left_context if "window" in choice.paths and args.mode == "streaming" else ""}
    return Prepared(plan=plan, payload=payload, row=row, engines=found, notes=[NOTE])


def job(payload: dict) -> dict:
    """In the measured child: the steps loaded, then the codes decoded offline or as a stream of events."""
    import numpy as np

    from ...plan.engines import calls_now, children_peak_rss_mb, contract_of, open_runner, place, predicted_on_npu
    from ...plan.stream import sink_for
    from ...runtime import OrtRunner
    from .sidecar import SAMPLE_RATE, VocoderSidecar, events, gather, random_codes

    plan, runtime, cores = payload["plan"]["speech_decoder"], payload["runtime"], payload["cores"]
    if payload["codes"]:
        codes = np.load(payload["codes"])
    else:
        codes = random_codes(payload["tokens"], payload["codes_seed"], codebook_size=payload["codebook_size"],
                             num_quantizers=payload["num_quantizers"])[0]
    sink = sink_for(payload, SAMPLE_RATE)
    t_load = time.perf_counter()
    opened: dict[str, tuple] = {}
    runners = []
    try:
        if plan["impl"] == "rknn":
            for role, (e,) in plan["engines"].items():
                same = next((r for r, (_, p) in opened.items() if p == e["path"]), None)
                if same is not None:  # a role naming an engine already open aliases it
                    opened[role] = opened[same]
                    continue
                runners.append(open_runner(e, runtime, cores))
                opened[role] = (runners[-1], e["path"])
            contracts = {role: contract_of(path) for role, (_, path) in opened.items()}
            main = (opened["main"][0], contracts["main"])
        else:
            main = (OrtRunner(payload["model"]), contract_of(payload["model"]))
        first = (opened["first"][0], contracts["first"]) if "first" in opened else (None, None)
        side = VocoderSidecar(main[0], main[1], *first)
        window = VocoderSidecar(opened["window"][0], contracts["window"]) if "window" in opened else None
        load_s = time.perf_counter() - t_load

        first_audio = None
        arrived_at, t0 = time.time(), time.perf_counter()   # the codes arrive: first audio counts from here
        if payload["mode"] == "streaming":
            chunks = events(codes, payload["event"])
            stream = (window.window_stream(chunks, payload["left_context"]) if window is not None
                      else side.stream(chunks))
            first_calls: dict = {}

            def out(pcm):  # the calls made before the first sample leaves price the NPU's first audio
                if not first_calls and pcm.size:
                    first_calls.update(calls_now({"speech_decoder": runners}))
                sink.write(pcm)

            audio, first_audio = gather(stream, t0, out)
        else:
            audio = side.decode(codes)
            sink.write(audio)
            first_calls = calls_now({"speech_decoder": runners})   # offline: the first sample leaves with the last
        wall_s = time.perf_counter() - t0
        if first_audio is None:  # offline: the first sample leaves with the last
            first_audio = wall_s
        used = window if (window is not None and payload["mode"] == "streaming") else side
        steps = " + ".join(f"{b}x{n}" for b, n in used.steps) if used is side else \
            f"{used.main.emit}x{-(-codes.shape[-1] // payload['event'])}"
        where, target = (runners[0].where, runners[0].target) if runners else place()
        versions = None
        if runners and runtime == "rknnlite":
            from ...board.runner import runtime_versions

            versions = runtime_versions()
    finally:
        for r in runners:
            r.close()
    tokens = int(codes.shape[-1])
    if audio.size == 0:
        raise EngineMismatch("the decoder returned no audio for these codes")
    return {"audio": audio, "sample_rate": SAMPLE_RATE, "wall_s": wall_s, "load_s": load_s,
            "ms": {"speech_decoder": 1e3 * wall_s}, "first_audio_s": first_audio,
            "first_audio_at": arrived_at + first_audio,
            "where": where, "target": target,
            "npu_predicted": predicted_on_npu({"speech_decoder": runners}, runtime, cores, first_calls or None),
            "simulator_peak_rss_mb": children_peak_rss_mb({"speech_decoder": runners}),
            "runtime": versions, "cores": getattr(runners[0], "cores", "") if runners else "",
            "row": {"tokens": tokens, "steps": steps, "ms_per_token": round(1e3 * wall_s / tokens, 3)}}
