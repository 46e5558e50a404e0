"""The Piper decoder's measurements (host): what notebook 01 calls.

Every row carries `where` and `target` from the runner that produced its numbers (OrtRunner: fp32,
SimulatorRunner: simulator, a BuildReport: host), so a notebook never types them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
from tqdm.auto import tqdm

from ... import gates, graph
from ...build import build_engine
from ...engine import simulator_vs_fp32
from ...planner import PlanTarget
from ...runtime import OrtRunner
from ...window import Window, plan_windows, window_inputs
from ..piper.voice import DecoderModel, DecoderSeam, Voice, find_decoder_seam
from .producer import DEFAULT_CONTEXT, DEFAULT_EMIT, DecoderSlice, decoder_graph, produce_for_voice
from .sidecar import DecoderSidecar

SWEEP = ((45, 5), (45, 16), (45, 24))      # paroli's 55, a middle 77, the seeds' 93
TAIL_FRAMES = (30, 47)                     # the seeds' short latents
INTERIOR_GATE = gates.Gate("interior_window_snr_fp32", 40.0)
SELF_CHECK_TEXT = "Call me at 555 0142, extension 7."


def sidecar(model: DecoderModel, runner, contract) -> DecoderSidecar:
    """The decoder sidecar for `model` (a Voice or a DecodeModel) over `runner`."""
    gin = contract.params.get("speaker_dims", 0) if model.seam.g else 0
    return DecoderSidecar(runner, contract, channels=model.channels, hop=model.hop, speaker_dims=gin)


class FullDecoder:
    """The dynamic decoder half in onnxruntime: a full-length decode, the reference for walks."""

    def __init__(self, model, seam: DecoderSeam | None = None):
        seam = seam or find_decoder_seam(model)
        self.runner = OrtRunner(decoder_graph(model, seam))
        self.where, self.target = self.runner.where, self.runner.target

    def decode(self, z: np.ndarray, g: np.ndarray | None = None) -> np.ndarray:
        feed = {"z": z[None].astype(np.float32), "y_mask": np.ones((1, 1, z.shape[1]), np.float32)}
        if g is not None:
            feed["g"] = np.asarray(g, np.float32).reshape(1, -1, 1)
        return self.runner.run(feed)[0].reshape(-1)


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


def window_sweep(model: DecoderModel, latents, configs=SWEEP, progress: bool = True) -> list[dict]:
    """fp32 walks at each emit/context against a full-length decode, one row per window."""
    full = FullDecoder(model.model, model.seam)
    refs = [full.decode(lat.z, lat.g) for lat in latents]
    rows = []
    for emit, context in tqdm(configs, desc="windows", disable=not progress):
        produced = produce_for_voice(model, emit=emit, context=context)
        runner = OrtRunner(produced.model)
        side = sidecar(model, runner, produced.contract)
        for k, (lat, ref) in enumerate(zip(latents, refs)):
            test = side.decode(lat.z, lat.g, progress=False)
            for r in per_window_rows(ref, test, lat.frames, emit, context, model.hop):
                rows.append({"window": emit + 2 * context, "emit": emit, "context": context,
                             "sentence": k, "frames": lat.frames, **r, "where": runner.where})
    return rows


def sweep_summary(rows: list[dict]) -> list[dict]:
    """Min / median per-window SNR per window size and kind."""
    out = []
    for window in sorted({r["window"] for r in rows}):
        for kind in ("interior", "end", "padded"):
            sel = [r for r in rows if r["window"] == window and r["kind"] == kind]
            if sel:
                s = [r["snr_db"] for r in sel]
                out.append({"window": window, "emit": sel[0]["emit"], "context": sel[0]["context"],
                            "kind": kind, "windows": len(s), "min_snr_db": float(np.min(s)),
                            "median_snr_db": float(np.median(s)), "max_snr_db": float(np.max(s)),
                            "where": sel[0]["where"]})
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
                         "first_snr_db": gates.snr_db(ref[: (n - 7) * hop], test[: (n - 7) * hop]),
                         "where": runner.where})
    return rows


def wrong_seam(voice: Voice, z: np.ndarray) -> dict:
    """Slice at dec.conv_pre's input and feed it the pre-flow latent: what the seeds call quiet mush."""
    seam = voice.seam
    wrong = OrtRunner(graph.slice_at(voice.model, [seam.conv_pre_input], [seam.audio]))
    right = FullDecoder(voice.model, seam).decode(z)
    bad = wrong.run([z[None]])[0].reshape(-1)
    return {"frames": z.shape[1], "seam": f"dec.conv_pre input ({seam.conv_pre_input})",
            "rms_ratio": gates.rms_ratio(right, bad), "snr_db": gates.snr_db(right, bad),
            "envelope_corr": gates.envelope_corr(right, bad, voice.sample_rate), "where": wrong.where}


def mask_upsampler(voice: Voice, z: np.ndarray, target: str, frames: int = 47) -> list[dict]:
    """The decoder mask upsampled by all-ones ConvTranspose1d vs by Resize, on a padded tail
    window: fp32 and simulator against a full-length decode, and simulator against fp32."""
    ref = FullDecoder(voice.model, voice.seam).decode(z[:, :frames])
    n = frames * voice.hop
    rows = []
    for upsampler in ("convtranspose", "resize"):
        produced = produce_for_voice(voice, dec_mask=True, upsampler=upsampler)
        x, m = padded_window(z[:, :frames], produced.contract.window.frames)
        sim = simulator_vs_fp32(produced.save(), target, [{"z": x, "y_mask": m}], keep=True)
        fp32, simulated = sim.fp32[0][0].reshape(-1)[:n], sim.simulator[0][0].reshape(-1)[:n]
        rows.append({"upsampler": upsampler, "frames": frames, "fp32_vs_full_db": gates.snr_db(ref, fp32),
                     "simulator_vs_full_db": gates.snr_db(ref, simulated),
                     "simulator_vs_fp32_db": gates.snr_db(fp32, simulated), "regtask": sim.report.regtask,
                     **{k: sim.rows[0][k] for k in ("where", "target")}})
    return rows


def build_rows(model: DecoderModel, targets, *, emit: int = DEFAULT_EMIT, context: int = DEFAULT_CONTEXT,
               masks=(False, True), progress: bool = True) -> list[dict]:
    """Produce and compile the window engine for each target, plain and masked: census before
    and after the fold, and the build row (REGTASK lines and largest value, engine size, build
    time, converter peak RSS)."""
    rows = []
    jobs = [(t, m) for t in targets for m in masks]
    for target, dec_mask in tqdm(jobs, desc="builds", disable=not progress):
        produced = produce_for_voice(model, emit=emit, context=context, dec_mask=dec_mask)
        report = build_engine(produced.save(), target).raise_for_status()
        rows.append({"family": produced.contract.family, "window": produced.contract.window.frames,
                     "dec_mask": dec_mask, **produced.before.row("before_"),
                     "after_nodes": produced.after.nodes, "after_Shape": produced.after.hazards["Shape"],
                     "after_ConstantOfShape": produced.after.hazards["ConstantOfShape"],
                     "weights_mb": round(produced.after.initializer_bytes / 1e6, 2), **report.row()})
    return rows


def fidelity_rows(refs, tests, sample_rate: int, latents, emit: int, context: int, hop: int):
    """Utterance rows (all metrics) and per-window rows for two renders of the same latents."""
    ref, test = np.concatenate(refs), np.concatenate(tests)
    utterance = {"sentences": len(latents), "frames": sum(lat.frames for lat in latents),
                 "seconds_audio": round(ref.size / sample_rate, 2),
                 **gates.compare(ref, test, sample_rate)}
    windows = []
    for k, (lat, a, b) in enumerate(zip(latents, refs, tests)):
        windows += [{"sentence": k, **r} for r in per_window_rows(a, b, lat.frames, emit, context, hop)]
    return utterance, windows


def simulator_fidelity(model: DecoderModel, latents, target: str, emit: int = DEFAULT_EMIT,
                       context: int = DEFAULT_CONTEXT, dec_mask: bool = False) -> dict:
    """The window engine in the simulator against the same walk in fp32 (the fp16 cost alone)
    and against a full-length fp32 decode (what a listener compares with). Returns the rows, the
    per-window rows and the renders, so a notebook can plot and play them."""
    produced = produce_for_voice(model, emit=emit, context=context, dec_mask=dec_mask)
    full = FullDecoder(model.model, model.seam)

    def walk(runner, lat):
        return [sidecar(model, runner, produced.contract).decode(lat.z, lat.g, progress=False)]

    sim = simulator_vs_fp32(produced.save(), target, latents, run=walk, keep=True,
                            compare=lambda ref, test, lat: {"snr_db": gates.snr_db(ref[0], test[0])})
    renders = {"full": [full.decode(lat.z, lat.g) for lat in latents],
               "fp32": [o[0] for o in sim.fp32], "simulator": [o[0] for o in sim.simulator]}
    rows, windows = [], []
    origin = {k: sim.rows[0][k] for k in ("where", "target")}
    n_windows = sum(len(plan_windows(lat.frames, emit, context)) for lat in latents)
    for ref_name in ("fp32", "full"):
        utt, per = fidelity_rows(renders[ref_name], renders["simulator"], model.sample_rate, latents,
                                 emit, context, model.hop)
        reference = "fp32 window walk" if ref_name == "fp32" else "fp32 full-length decode"
        rows.append({"reference": reference, "window": emit + 2 * context, "dec_mask": dec_mask, **utt,
                     "regtask": sim.report.regtask, "sim_s_per_window": sum(sim.seconds) / max(1, n_windows),
                     **origin})
        windows += [{"reference": reference, **r, **origin} for r in per]
    return {"rows": rows, "windows": windows, "renders": renders, "build": sim.report}


def cpu_rtf(model: DecoderModel, latents, emit: int = DEFAULT_EMIT, context: int = DEFAULT_CONTEXT,
            repeats: int = 3) -> list[dict]:
    """onnxruntime on this CPU: the monolithic decoder vs the windowed walk, same latents, same run.
    `compute_bound` is the frames each path computes per frame it voices (window / emit)."""
    full = FullDecoder(model.model, model.seam)
    produced = produce_for_voice(model, emit=emit, context=context)
    side = sidecar(model, OrtRunner(produced.model), produced.contract)
    paths = (("monolithic", lambda lat: full.decode(lat.z, lat.g), 1.0),
             (f"windowed {emit}+2x{context}", lambda lat: side.decode(lat.z, lat.g, progress=False),
              (emit + 2 * context) / emit))
    return rtf_rows(paths, latents, model.hop, model.sample_rate, repeats, where=full.where)


def rtf_rows(paths, latents, hop: int, sample_rate: int, repeats: int, where: str) -> list[dict]:
    """Median wall time over `repeats` of each (name, decode(latent), compute bound) path, as RTF
    (decode seconds per audio second) and as a ratio to the first path (the monolithic decode)."""
    audio_s = sum(lat.frames for lat in latents) * hop / sample_rate
    out = []
    for name, fn, bound in paths:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for lat in latents:
                fn(lat)
            times.append(time.perf_counter() - t0)
        rtf = float(np.median(times)) / audio_s
        out.append({"path": name, "seconds_audio": round(audio_s, 2), "decode_s": round(rtf * audio_s, 3),
                    "rtf": rtf, "ratio_vs_monolithic": rtf / out[0]["rtf"] if out else 1.0,
                    "compute_bound": bound, "where": where})
    return out


def self_check(model: DecoderModel, produced: DecoderSlice, latents) -> dict:
    """Stage 1 gate: the fp32 window walk against a full-length decode on real latents, worst
    non-padded window (a padded window is the documented tail deficit, not a stitching failure)."""
    full = FullDecoder(model.model, model.seam)
    side = sidecar(model, OrtRunner(produced.model), produced.contract)
    w = produced.contract.window
    rows = [r for lat in latents
            for r in per_window_rows(full.decode(lat.z, lat.g), side.decode(lat.z, lat.g, progress=False),
                                     lat.frames, w.emit, w.context, model.hop) if r["kind"] != "padded"]
    worst = min((r["snr_db"] for r in rows), default=float("inf"))
    return INTERIOR_GATE.check(worst, context=f"{w.frames}-frame window, worst of {len(rows)} windows")


# --- the window planner's view of this decoder ----------------------------------------------------
PLAN_TEXTS = ("short", "phone", "paragraph")


def plan_target(model: DecoderModel | None = None, latents=None, texts: Sequence[str] = PLAN_TEXTS,
                emit: int = DEFAULT_EMIT, context: int = DEFAULT_CONTEXT, dec_mask: bool = False) -> PlanTarget:
    """The decoder as rkstudy.planner sees it: the dynamic full-length decode, the produced slice at
    any window length (compiled engines depend only on the length), real-speech latents from the
    shipped texts, and today's window."""
    from ..piper.voice import read_text

    model = model or Voice()
    full = FullDecoder(model.model, model.seam)
    if latents is None:
        latents = [lat.z for name in texts for lat in model.latents(read_text(name))]

    def engine(window: int):
        return produce_for_voice(model, emit=window, context=0, dec_mask=dec_mask).save()

    return PlanTarget(family=model.family, hop=model.hop, decode=full.decode, engine=engine, latents=latents,
                      default_emit=emit, default_context=context)
