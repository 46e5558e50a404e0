"""The Piper decoder's measurements (host): what notebook 01 calls.

Every row carries `where` and `target` from the runner that produced its numbers (OrtRunner: fp32,
SimulatorRunner: simulator, a BuildReport: host), so a notebook never types them.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from ... import gates, graph
from ...graph.decmask import UPSAMPLERS
from ...lint.compiler import layer_table
from ...process import shows_progress
from ...runtime import OrtRunner
from ...toolkit.build import build_engine
from ...toolkit.convert import simulator_vs_fp32
from ...walk.planner import PlanTarget
from ...walk.window import WINDOW_KINDS, plan_windows, window_inputs
from ..piper.voice import DecoderModel, DecoderSeam, Voice, find_decoder_seam
from .producer import DEFAULT_CONTEXT, DEFAULT_EMIT, DecoderSlice, decoder_graph, produce_for_voice
from .sidecar import DecoderSidecar

SWEEP = ((45, 5), (45, 16), (45, 24))      # paroli's 55, a middle 77, the reference documents' 93
TAIL_FRAMES = (30, 47)                     # the reference documents' short latents
INTERIOR_GATE = gates.Gate("interior_window_snr_fp32", 40.0)
SELF_CHECK_TEXT = "Call me at 555 0142, extension 7."


def sidecar(model: DecoderModel, runner, contract) -> DecoderSidecar:
    """The decoder sidecar for `model` (a Voice or a DecodeModel) over `runner`."""
    gin = contract.params.get("speaker_dims", 0) if model.seam.g else 0
    return DecoderSidecar(runner, contract, channels=model.channels, hop=model.hop, speaker_dims=gin)


class FullDecoder:
    """The dynamic decoder half in onnxruntime: a full-length decode, the reference for walks."""

    def __init__(self, model, seam: DecoderSeam | None = None, threads: int | None = None):
        seam = seam or find_decoder_seam(model)
        self.runner = OrtRunner(decoder_graph(model, seam), threads=threads)
        self.where, self.target = self.runner.where, self.runner.target

    def decode(self, z: np.ndarray, g: np.ndarray | None = None) -> np.ndarray:
        feed = {"z": z[None].astype(np.float32), "y_mask": np.ones((1, 1, z.shape[1]), np.float32)}
        if g is not None:
            feed["g"] = np.asarray(g, np.float32).reshape(1, -1, 1)
        return self.runner.run(feed)[0].reshape(-1)


def per_window_rows(ref: np.ndarray, test: np.ndarray, n_frames: int, emit: int, context: int,
                    hop: int) -> list[dict]:
    """SNR of each window's emitted samples, with the window's kind (rkstudy.walk.window.Window.kind) and left
    context."""
    rows = []
    for i, w in enumerate(plan_windows(n_frames, emit, context)):
        a, b = w.emit_start * hop, w.emit_stop * hop
        rows.append({"window_index": i, "kind": w.kind(n_frames, emit + 2 * context),
                     "left_context": w.offset, "emit_frames": w.emit_stop - w.emit_start,
                     "snr_db": gates.snr_db(ref[a:b], test[a:b])})
    return rows


def window_sweep(model: DecoderModel, latents, configs=SWEEP, progress: bool = True) -> dict[str, list[dict]]:
    """fp32 walks at each emit/context against a full-length decode: `windows`, one row per window (SNR), and
    `utterances`, one row per window size over every sentence back to back (SNR and what a listener would
    judge, rkstudy.gates.perceptual: a window's few hundred milliseconds are too short for PESQ and STOI)."""
    full = FullDecoder(model.model, model.seam)
    refs = [full.decode(lat.z, lat.g) for lat in latents]
    rows, utterances = [], []
    for emit, context in tqdm(configs, desc="windows", disable=not shows_progress(progress)):
        produced = produce_for_voice(model, emit=emit, context=context)
        runner = OrtRunner(produced.model)
        side = sidecar(model, runner, produced.contract)
        tests = []
        for k, (lat, ref) in enumerate(zip(latents, refs)):
            tests.append(side.decode(lat.z, lat.g, progress=False))
            for r in per_window_rows(ref, tests[-1], lat.frames, emit, context, model.hop):
                rows.append({"window": emit + 2 * context, "emit": emit, "context": context,
                             "sentence": k, "frames": lat.frames, **r, "where": runner.where})
        ref, test = np.concatenate(refs), np.concatenate(tests)
        utterances.append({"window": emit + 2 * context, "emit": emit, "context": context,
                           "sentences": len(latents), "seconds_audio": round(ref.size / model.sample_rate, 2),
                           "snr_db": gates.snr_db(ref, test), **gates.perceptual(ref, test, model.sample_rate),
                           "where": runner.where, "target": runner.target})
    return {"windows": rows, "utterances": utterances}


def sweep_summary(rows: list[dict]) -> list[dict]:
    """Min / median per-window SNR per window size and kind."""
    out = []
    for window in sorted({r["window"] for r in rows}):
        for kind in WINDOW_KINDS:
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
    """Slice at dec.conv_pre's input and feed it the pre-flow latent: what the reference documents call quiet mush
    (scored against the right decode by SNR, envelope and what a listener would judge)."""
    seam = voice.seam
    wrong = OrtRunner(graph.slice_at(voice.model, [seam.conv_pre_input], [seam.audio]))
    right = FullDecoder(voice.model, seam).decode(z)
    bad = wrong.run([z[None]])[0].reshape(-1)
    return {"frames": z.shape[1], "seam": f"dec.conv_pre input ({seam.conv_pre_input})",
            "rms_ratio": gates.rms_ratio(right, bad), "snr_db": gates.snr_db(right, bad),
            "envelope_corr": gates.envelope_corr(right, bad, voice.sample_rate),
            **gates.perceptual(right, bad, voice.sample_rate), "where": wrong.where}


def mask_upsampler_nodes(model) -> list[str]:
    """The nodes that upsample the frame mask: the chain of Resize / ConvTranspose read from y_mask."""
    names, mask_tensors = [], {"y_mask"}
    for n in graph.load(model).graph.node:
        if n.op_type in ("Resize", "ConvTranspose") and n.input[0] in mask_tensors:
            names.append(n.name)
            mask_tensors.add(n.output[0])
    return names


def compiled_layers_of(layers, nodes: Sequence[str]) -> str:
    """What the compiler made of `nodes` (a verbose build's layer table): `count op target` per kind,
    counting the layers it inserts around a node (named after it) with it."""
    counts = Counter((layer.op, layer.target) for layer in layers
                     if any(layer.node == n or layer.node.startswith(f"{n}_") for n in nodes))
    return ", ".join(f"{k} {op} {target}" for (op, target), k in sorted(counts.items()))


def mask_upsampler(voice: Voice, z: np.ndarray, target: str, frames: int = 47) -> list[dict]:
    """The decoder mask upsampled by all-ones ConvTranspose1d vs by Resize, on a padded tail
    window: fp32 and simulator against a full-length decode, and simulator against fp32.

    Both upsample a 0/1 mask exactly, in fp32 and in fp16 alike, so wherever both lower correctly
    the two engines compute the same audio to the bit. The rows show that the switch still reaches
    the compiled graph (`slice_mask_ops`, and `compiled_mask_layers` from the verbose build's layer
    table: Resize is compiled as Resize, with layout Transposes the compiler adds) and how far
    the two outputs are apart (`*_max_abs_diff_vs_convtranspose`)."""
    ref = FullDecoder(voice.model, voice.seam).decode(z[:, :frames])
    n = frames * voice.hop
    rows, outputs = [], {}
    for upsampler in UPSAMPLERS:
        produced = produce_for_voice(voice, dec_mask=True, upsampler=upsampler)
        x, m = padded_window(z[:, :frames], produced.contract.window.frames)
        sim = simulator_vs_fp32(produced.save(), target, [{"z": x, "y_mask": m}], keep=True, verbose=True)
        fp32, simulated = sim.fp32[0][0].reshape(-1)[:n], sim.simulator[0][0].reshape(-1)[:n]
        outputs[upsampler] = (fp32, simulated)
        nodes = mask_upsampler_nodes(produced.model)
        ops = Counter(node.op_type for node in produced.model.graph.node if node.name in nodes)
        layers = layer_table(Path(sim.report.log).read_text(encoding="utf-8", errors="replace"))
        rows.append({"upsampler": upsampler, "frames": frames, "fp32_vs_full_db": gates.snr_db(ref, fp32),
                     "simulator_vs_full_db": gates.snr_db(ref, simulated),
                     "simulator_vs_fp32_db": gates.snr_db(fp32, simulated),
                     "slice_mask_ops": ", ".join(f"{k} {op}" for op, k in sorted(ops.items())),
                     "compiled_mask_layers": compiled_layers_of(layers, nodes),
                     "fp32_max_abs_diff_vs_convtranspose": float(np.max(np.abs(fp32 - outputs[UPSAMPLERS[0]][0]))),
                     "simulator_max_abs_diff_vs_convtranspose":
                         float(np.max(np.abs(simulated - outputs[UPSAMPLERS[0]][1]))),
                     "regtask": sim.report.regtask, **{k: sim.rows[0][k] for k in ("where", "target")}})
    return rows


def build_rows(model: DecoderModel, targets, *, emit: int = DEFAULT_EMIT, context: int = DEFAULT_CONTEXT,
               masks=(False, True), progress: bool = True) -> list[dict]:
    """Produce and compile the window engine for each target, plain and masked: census before
    and after the fold, and the build row (REGTASK lines and largest value, engine size, build
    time, converter peak RSS)."""
    rows = []
    jobs = [(t, m) for t in targets for m in masks]
    for target, dec_mask in tqdm(jobs, desc="builds", disable=not shows_progress(progress)):
        produced = produce_for_voice(model, emit=emit, context=context, dec_mask=dec_mask)
        report = build_engine(produced.save(), target).raise_for_status()
        rows.append({"family": produced.contract.family, "window": produced.contract.window.frames,
                     "dec_mask": dec_mask, **produced.before.row("before_"),
                     "after_nodes": produced.after.nodes, "after_Shape": produced.after.hazards["Shape"],
                     "after_ConstantOfShape": produced.after.hazards["ConstantOfShape"],
                     "weights_mb": round(produced.after.initializer_bytes / 1e6, 2), **report.row()})
    return rows


def fidelity_rows(refs, tests, sample_rate: int, latents, emit: int, context: int, hop: int):
    """Utterance rows (all metrics, the perceptual ones included: every sentence back to back) and per-window
    rows (SNR) for two renders of the same latents."""
    ref, test = np.concatenate(refs), np.concatenate(tests)
    utterance = {"sentences": len(latents), "frames": sum(lat.frames for lat in latents),
                 "seconds_audio": round(ref.size / sample_rate, 2),
                 **gates.compare(ref, test, sample_rate), **gates.perceptual(ref, test, sample_rate)}
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


# short utterances: one padded 93-frame window each, or three just over (46-113 frames with the joe voice)
SHORT_UTTERANCES = ("No.", "Hello.", "Thank you.", "See you soon.", "It is raining.", "Call me later.",
                    "Turn left here.", "Open the door.")


def dec_mask_opt_in(model: DecoderModel, latents, target: str | None, emit: int = DEFAULT_EMIT,
                    context: int = DEFAULT_CONTEXT) -> dict[str, list[dict]]:
    """Whether the decoder mask still shows once the engine's fp16 noise is in: the window engine
    without and with the mask, each walked over every latent (one simulator child each), against a
    full-length fp32 decode, and the two engines' outputs against each other. `rows`: one per latent;
    `gap_db` is masked minus unmasked, both against the full decode. The fp32_* columns are the same
    walks in onnxruntime (the mask's own effect, before any fp16 noise). `regtask` and
    `regtask_max_value` are the larger of the two engines'.

    `target=None` runs the engines in onnxruntime fp32 too (no build; where=fp32).

    `perceptual`: the same three comparisons with every latent back to back (a short utterance alone is
    under STOI's 0.4 s of speech), by SNR and what a listener would judge (rkstudy.gates.perceptual).

    Why: the reference document keeps `--dec-mask` opt-in because on short utterances the masked and
    unmasked engines agreed within 0.1 dB against the CPU decode, both at the fp16 floor, while their
    outputs differed from each other by ~60 dB."""
    full = FullDecoder(model.model, model.seam)
    refs = [full.decode(lat.z, lat.g) for lat in latents]
    fp32, engine, builds, origin = {}, {}, [], {"where": full.where, "target": full.target}
    for dec_mask in (False, True):
        produced = produce_for_voice(model, emit=emit, context=context, dec_mask=dec_mask)

        def walk(runner, lat, contract=produced.contract):
            return [sidecar(model, runner, contract).decode(lat.z, lat.g, progress=False)]

        if target is None:
            runner = OrtRunner(produced.model)
            fp32[dec_mask] = engine[dec_mask] = [walk(runner, lat)[0] for lat in latents]
            continue
        sim = simulator_vs_fp32(produced.save(), target, latents, run=walk, keep=True,
                                compare=lambda ref, test, lat: {})
        fp32[dec_mask], engine[dec_mask] = [o[0] for o in sim.fp32], [o[0] for o in sim.simulator]
        builds.append(sim.report)
        origin = {k: sim.rows[0][k] for k in ("where", "target")}
    rows = []
    for k, (lat, ref) in enumerate(zip(latents, refs)):
        masked, unmasked = gates.snr_db(ref, engine[True][k]), gates.snr_db(ref, engine[False][k])
        rows.append({"utterance": k, "text": lat.text, "frames": lat.frames,
                     "windows": len(plan_windows(lat.frames, emit, context)),
                     "masked_vs_full_db": masked, "unmasked_vs_full_db": unmasked,
                     "gap_db": 0.0 if masked == unmasked else masked - unmasked,  # inf == inf: both exact
                     "masked_vs_unmasked_db": gates.snr_db(engine[True][k], engine[False][k]),
                     "fp32_masked_vs_full_db": gates.snr_db(ref, fp32[True][k]),
                     "fp32_unmasked_vs_full_db": gates.snr_db(ref, fp32[False][k]),
                     **({"regtask": max(b.regtask for b in builds),
                         "regtask_max_value": max(b.regtask_max for b in builds)} if builds else {}),
                     **origin})
    ref = np.concatenate(refs)
    masked, unmasked = np.concatenate(engine[True]), np.concatenate(engine[False])
    pairs = (("masked engine vs full decode", ref, masked), ("unmasked engine vs full decode", ref, unmasked),
             ("masked vs unmasked engine", unmasked, masked))
    built = ({"regtask": max(b.regtask for b in builds), "regtask_max_value": max(b.regtask_max for b in builds)}
             if builds else {})
    scored = [{"comparison": name, "utterances": len(latents), "seconds_audio": round(one.size / model.sample_rate, 2),
               "snr_db": gates.snr_db(one, other), **gates.perceptual(one, other, model.sample_rate), **built, **origin}
              for name, one, other in pairs]
    return {"rows": rows, "perceptual": scored}


# CPU timings run single-threaded: two intra-op threads on the two cores of a shared host make each of
# the window walk's many short calls pay thread hand-offs the monolithic decode's one long call does not,
# so the ratio measured the machine's load (2.2 to 3.5 between repeats with two threads under load, the
# median 2.23 with one, against the 2.19 frames the walk computes per frame voiced), not the paths.
CPU_THREADS = 1


def window_compute_bound(latents, emit: int = DEFAULT_EMIT, context: int = DEFAULT_CONTEXT) -> float:
    """Frames the window walk computes per frame it voices over these latents: every call runs the whole
    window (a sentence's last window and a sentence shorter than one window are padded to it), so it is
    (emit + 2 x context) / emit only for an endless latent."""
    frames = [lat.frames for lat in latents]
    calls = sum(len(plan_windows(n, emit, context)) for n in frames)
    return calls * (emit + 2 * context) / sum(frames)


def cpu_rtf(model: DecoderModel, latents, emit: int = DEFAULT_EMIT, context: int = DEFAULT_CONTEXT,
            repeats: int = 3) -> list[dict]:
    """onnxruntime on this CPU, one thread each: the monolithic decoder vs the windowed walk, same
    latents, same run, interleaved. `compute_bound` is the frames each path computes per frame it
    voices over these latents (window_compute_bound)."""
    full = FullDecoder(model.model, model.seam, threads=CPU_THREADS)
    produced = produce_for_voice(model, emit=emit, context=context)
    side = sidecar(model, OrtRunner(produced.model, threads=CPU_THREADS), produced.contract)
    paths = (("monolithic", lambda lat: full.decode(lat.z, lat.g), 1.0),
             (f"windowed {emit}+2x{context}", lambda lat: side.decode(lat.z, lat.g, progress=False),
              window_compute_bound(latents, emit, context)))
    return rtf_rows(paths, latents, model.hop, model.sample_rate, repeats, where=full.where)


def plan_cpu_rtf(model: DecoderModel, latents, emit: int, context: int, repeats: int = 3) -> list[dict]:
    """The window plan's CPU cost, as cpu_rtf measures it: the monolithic decode, today's window
    (DEFAULT_EMIT + 2 x DEFAULT_CONTEXT) and the planned one (`emit` + 2 x `context`), interleaved,
    one thread each, each window's compute bound over these latents."""
    full = FullDecoder(model.model, model.seam, threads=CPU_THREADS)
    paths = [("monolithic", lambda lat: full.decode(lat.z, lat.g), 1.0)]
    for e, c, label in ((DEFAULT_EMIT, DEFAULT_CONTEXT, "today"), (emit, context, "planned, 80 dB")):
        produced = produce_for_voice(model, emit=e, context=c)
        side = sidecar(model, OrtRunner(produced.model, threads=CPU_THREADS), produced.contract)
        paths.append((f"windowed {e}+2x{c} ({label})", lambda lat, side=side: side.decode(lat.z, lat.g, progress=False),
                      window_compute_bound(latents, e, c)))
    return rtf_rows(paths, latents, model.hop, model.sample_rate, repeats, where=full.where)


def rtf_rows(paths, latents, hop: int, sample_rate: int, repeats: int, where: str,
             threads: int = CPU_THREADS) -> list[dict]:
    """Wall time of each (name, decode(latent), compute bound) path over `latents`, as RTF (decode
    seconds per audio second) and as a ratio to the first path (the monolithic decode).

    The paths run interleaved, repeat after repeat (A, B, A, B, ...), after one warm-up call each on the
    first latent, so a slow spell of a shared machine falls on every path alike; `ratio_vs_monolithic` is
    the median of the per-repeat ratios, with their spread (`ratio_min`, `ratio_max`) beside it, and the
    decode time each path's median. `threads` is what the caller's sessions were built with."""
    audio_s = sum(lat.frames for lat in latents) * hop / sample_rate
    for _, fn, _ in paths:  # first calls pay session and allocator set-up a later call does not
        fn(latents[0])
    times = [[] for _ in paths]
    for _ in range(repeats):
        for k, (_, fn, _) in enumerate(paths):
            t0 = time.perf_counter()
            for lat in latents:
                fn(lat)
            times[k].append(time.perf_counter() - t0)
    out = []
    for k, (name, _, bound) in enumerate(paths):
        ratios = [t / t0 for t, t0 in zip(times[k], times[0])]
        decode_s = float(np.median(times[k]))
        out.append({"path": name, "seconds_audio": round(audio_s, 2), "decode_s": round(decode_s, 3),
                    "rtf": decode_s / audio_s, "ratio_vs_monolithic": float(np.median(ratios)),
                    "ratio_min": min(ratios), "ratio_max": max(ratios), "compute_bound": bound,
                    "repeats": repeats, "threads": threads, "where": where})
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


# --- quantization: calibration and evaluation on real speech, held apart ---------------------------
CALIBRATION_TEXTS = ("paragraph",)      # the voice's own latents of these texts calibrate
EVALUATION_TEXTS = ("short", "phone")   # and these, never seen by the calibration, score


def walked_windows(model: DecoderModel, latents, contract) -> list[dict]:
    """Every window the walker feeds the engine over `latents`, as engine feeds ({z, y_mask[, g]}):
    the calibration set of a quantized build is what the engine will really see, end windows and
    padding included."""
    window, names = contract.window, [t.name for t in contract.inputs]
    feeds = []
    for lat in latents:
        for w in plan_windows(lat.frames, window.emit, window.context):
            x, m = window_inputs(lat.z, w, window.frames)
            feed = {"z": x[None], **({"y_mask": m[None]} if "y_mask" in names else {})}
            if "g" in names:
                feed["g"] = np.asarray(lat.g, np.float32).reshape(1, -1, 1)
            feeds.append(feed)
    return feeds


def decoder_groups(onnx_path) -> Callable[[str], str]:
    """How a search moves the decoder's layers (rkstudy.levers.quantization.stages.Stage.groups): each flow
    coupling on its own, and each upsampling stage of the HiFi-GAN decoder as one group (the transposed
    conv `ups.k` with the resblocks that follow it, `resblocks.{k*n .. k*n+n-1}`, n resblocks per stage,
    counted in the graph); conv_pre, conv_post and the rest at their first two levels."""
    from ...levers.quantization.tensors import first_levels, module_of

    modules = {first_levels(module_of(n.name)) for n in graph.load(onnx_path, load_external_data=False).graph.node}
    ups = sum(m.startswith("/dec/ups.") for m in modules)
    per_stage = max(1, sum(m.startswith("/dec/resblocks.") for m in modules) // max(ups, 1))

    def group(module: str) -> str:
        top = first_levels(module)
        if top.startswith("/dec/ups."):
            return f"/dec stage {top.rsplit('.', 1)[1]}"
        if top.startswith("/dec/resblocks."):
            return f"/dec stage {int(top.rsplit('.', 1)[1]) // per_stage}"
        return top
    return group


def quantization_stage(model: DecoderModel | None = None, calibration_texts: Sequence[str] = CALIBRATION_TEXTS,
                       evaluation_texts: Sequence[str] = EVALUATION_TEXTS, emit: int = DEFAULT_EMIT,
                       context: int = DEFAULT_CONTEXT, evaluation_frames: int | None = None,
                       calibration_windows: int | None = None, search_frames: int = 141):
    """The 93-frame window engine as rkstudy.levers.quantization sees it: calibration windows walked from the
    voice's latents of `calibration_texts` (`calibration_windows` of them, evenly spread, when a
    build cannot afford them all), evaluation latents of `evaluation_texts` (no text in both),
    scored per window and per utterance on the sidecar's walk, and by ear on its audio. `evaluation_frames`
    cuts each evaluation latent to its first frames (one window at the window's own length: a quick run);
    the search walks the last evaluation latent's first `search_frames` (three windows by default)."""
    from ...levers.quantization.stages import Stage, evenly, held_apart
    from ..piper.voice import read_text

    held_apart(calibration_texts, evaluation_texts)
    model = model or Voice()
    produced = produce_for_voice(model, emit=emit, context=context)
    calibration = [lat for name in calibration_texts for lat in model.latents(read_text(name))]
    evaluation = [lat for name in evaluation_texts for lat in model.latents(read_text(name))]
    if evaluation_frames:
        evaluation = [replace(lat, z=lat.z[:, :evaluation_frames]) for lat in evaluation]
    search = [replace(evaluation[-1], z=evaluation[-1].z[:, :search_frames])]

    def walk(runner, lat):
        return sidecar(model, runner, produced.contract).decode(lat.z, lat.g, progress=False)

    def score(items, refs, tests):
        utterance = gates.snr_db(np.concatenate(refs), np.concatenate(tests))
        windows = [r["snr_db"] for lat, a, b in zip(items, refs, tests)
                   for r in per_window_rows(a, b, lat.frames, emit, context, model.hop)]
        return {"windows": len(windows), "window_snr_db_min": float(np.min(windows)),
                "window_snr_db_median": float(np.median(windows)), "utterance_snr_db": utterance}

    onnx_path = produced.save()
    return Stage(name=f"Piper decoder {produced.contract.window.frames}-frame window", onnx=onnx_path,
                 calibration=evenly(walked_windows(model, calibration, produced.contract), calibration_windows),
                 evaluation=evaluation, search=search, walk=walk, score=score, rate=model.sample_rate,
                 audio=lambda x: x, groups=decoder_groups(onnx_path),
                 texts={"calibration": ", ".join(calibration_texts), "evaluation": ", ".join(evaluation_texts)})


# --- the window planner's view of this decoder ----------------------------------------------------
PLAN_TEXTS = ("short", "phone", "paragraph")


def plan_target(model: DecoderModel | None = None, latents=None, texts: Sequence[str] = PLAN_TEXTS,
                emit: int = DEFAULT_EMIT, context: int = DEFAULT_CONTEXT, dec_mask: bool = False) -> PlanTarget:
    """The decoder as rkstudy.walk.planner sees it: the dynamic full-length decode, the produced slice at
    any window length (compiled engines depend only on the length), real-speech latents from the
    shipped texts, and today's window. Each window is produced with today's context (less when the
    window is too short for it), so today's window is the very slice the study's own builds compile
    and its engine comes from the build cache instead of a second build."""
    from ..piper.voice import read_text

    model = model or Voice()
    full = FullDecoder(model.model, model.seam)
    if latents is None:
        latents = [lat.z for name in texts for lat in model.latents(read_text(name))]

    def engine(window: int):
        split = min(context, (window - 1) // 2)
        return produce_for_voice(model, emit=window - 2 * split, context=split, dec_mask=dec_mask).save()

    return PlanTarget(family=model.family, hop=model.hop, decode=full.decode, engine=engine, latents=latents,
                      default_emit=emit, default_context=context)


# --- a whole text under a component execution plan (section 11) ------------------------------------------
SPEAK_TEXT, SPEAK_CHUNK = "speak_443", 60   # 443 characters at chunk size 60, as the document's Piper run
SPEAK_LADDER, QUICK_SPEAK_LADDER = (128, 192), (128,)


def speak_engines(voice: Voice, widths: Sequence[int], target: str = "rk3588") -> dict:
    """The Piper plan's NPU artifacts as a user makes them: the produced graphs of the 93-frame decoder window
    and of the duration encoder's rungs at `widths` (from the cache the other sections fill), each compiled for
    `target` by its family's stage 2 (simulator gated against fp32, the compiled contract beside the engine,
    with the cost model's prediction per call). An engine already there with a valid contract is taken as it
    is. `--runtime onnx` runs each engine's own graph, `--runtime simulator` builds it again for its SoC. Keys:
    "decoder" and each width."""
    from ...toolkit.convert import ALIVE_GATE
    from ..piper_encoder import producer as encoder

    decoder = produce_for_voice(voice)
    produced = {"decoder": (decoder.save(), decoder.contract, None, ALIVE_GATE)}
    for width in widths:
        rung = encoder.produce(voice, width)
        produced[width] = (rung.path, rung.contract, encoder.probe, encoder.SIM_GATE)
    return {key: compiled(onnx_path, contract, target, probe=probe, gate=gate)
            for key, (onnx_path, contract, probe, gate) in produced.items()}


def compiled(onnx_path: Path, contract, target: str, *, probe=None, gate=None) -> Path:
    """The engine stage 2 makes of a produced graph for `target` (beside the graph, named by its contract and
    digest; the simulator gated against fp32 on `probe`'s inputs), or the one already there when its contract
    checks out."""
    from ...contract import for_engine
    from ...errors import EngineMismatch
    from ...toolkit.convert import ALIVE_GATE, convert
    from ...toolkit.engine_cache import name_key

    engine = onnx_path.parent / contract.engine_name(target, name_key(onnx_path))
    try:
        for_engine(engine, family=contract.family, soc=target)
    except EngineMismatch:
        engine = convert(onnx_path, target, engine, probe=probe, gate=gate or ALIVE_GATE,
                         remake=contract.producer).engine
    return engine


def chunk_quality(rows: Sequence[dict], audio: dict, cpu: str, hop: int) -> list[dict]:
    """Each plan's audio against the CPU plan's chunk by chunk (the text chunker's chunks, each decoded on its
    own): the chunk's frames in both, how far apart, and the document's figures with PESQ-WB and STOI on the
    chunk's own samples (rkstudy.plan.quality.against_cpu, shorter render's length where they differ). A whole
    utterance's SNR can hide a duration stage that moved one chunk by a frame and another back; here the chunk
    that moved is a row of its own, and the chunks that did not show the decoder alone."""
    from ...plan.quality import against_cpu

    def bounds(row: dict) -> list[tuple[int, int]]:
        frames = [int(f) for f in str(row["chunk_frames"]).split()]
        ends = np.cumsum([0] + [f * hop for f in frames])
        if ends[-1] != audio[row["path"]][0].size:
            raise ValueError(f"{row['path']}: its chunks' frames ({sum(frames)} x hop {hop}) are not its "
                             f"{audio[row['path']][0].size} samples")
        return list(zip(ends[:-1], ends[1:]))

    by_path = {r["path"]: r for r in rows}
    ref_rows, (ref, rate) = by_path[cpu], audio[cpu]
    ref_bounds = bounds(ref_rows)
    out = []
    for r in rows:
        if r["path"] == cpu:
            continue
        got = audio[r["path"]][0]
        for k, ((a, b), (c, d)) in enumerate(zip(ref_bounds, bounds(r)), start=1):
            q = against_cpu(ref[a:b], got[c:d], hop=hop, rate=rate, absolute=False)
            out.append({"path": r["path"], "chunk": k, "frames_cpu": (b - a) // hop, "frames": (d - c) // hop,
                        "frames_apart": q["frames_apart"], "snr_db": q["snr_db"],
                        "median_slice_snr_db": q["median_slice_snr_db"], "min_slice_snr_db": q["min_slice_snr_db"],
                        "best_lag": q["best_lag"], "pesq_wb": q["pesq_wb"], "stoi": q["stoi"], "runtime": r["runtime"],
                        "where": r["where"], "target": r["target"]})
    return out


def moved_chunks(chunk_rows: Sequence[dict]) -> str:
    """One sentence from the per-chunk rows: which chunks of which plan a duration stage moved, or that
    none moved."""
    moved = [r for r in chunk_rows if r["frames_apart"] != 0]
    if not moved:
        return (f"No chunk moved: in all {len(chunk_rows)} chunk rows each plan decodes the CPU plan's frames, so "
                "every difference is the decoder's.")
    said = "; ".join(f"{r['path']} chunk {r['chunk']} by {r['frames_apart']:+d} frame(s), {r['snr_db']:.1f} dB"
                     for r in moved)
    return (f"{len(moved)} of {len(chunk_rows)} chunk rows moved (the plan's duration encoder engine, run by each "
            f"row's runtime, gave them other frames): {said}; the other chunks decode the CPU plan's frames.")


def speak_plans(engines: dict, widths: Sequence[int]) -> dict[str, dict]:
    """The three plans the document's table compares, by name: the CPU path, the decoder on the NPU, and
    the decoder with the duration encoder's ladder."""
    decoder = {"decoder": {"impl": "rknn", "artifacts": {"main": str(engines["decoder"])}}}
    ladder = {"duration_encoder": {"impl": "rknn", "artifacts": {"main": ",".join(str(engines[w]) for w in widths)}}}
    return {"CPU plan": {}, "NPU decoder": decoder, "NPU decoder + encoder ladder": {**decoder, **ladder}}
