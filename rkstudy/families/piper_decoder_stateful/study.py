"""The stateful Piper decoder's measurements (host): what notebook 01b calls.

Every row carries `where` and `target` from what produced its numbers (OrtRunner: fp32,
SimulatorRunner: simulator, a BuildReport: host, rkstudy.tables.results.HOST for graph counts and the
float64 reference), so a notebook never types them.

The exactness gate is float64 against float64: the step and the full-length decode, both run by
the float64 interpreter (rkstudy.graph.f64), must agree to >= 120 dB on every sample. The fp32 comparison is
recorded beside it and gated lower (STEP_GATE): onnxruntime sums a conv whose output is at most 64
samples long in another order, so a step at E < 65 cannot be bit-identical to a full-length fp32
decode, which is itself only 102-111 dB from the exact result.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from ... import gates, graph
from ...graph.delays import conv_macs, delay_table
from ...graph.f64 import F64Runner, run_f64
from ...process import shows_progress
from ...runtime import OrtRunner, Recording
from ...tables.results import HOST
from ...toolkit.build import build_engine
from ...toolkit.simulator import SimulatorRunner
from ...walk.bench import walker_overhead
from ...walk.stateful import StatefulWalker
from ..piper.voice import DecoderModel, ids_feed, seed_random_nodes
from ..piper_decoder import study as pd
from ..piper_decoder.producer import DEFAULT_CONTEXT, DEFAULT_EMIT, decoder_graph, produce_for_voice
from .producer import StatefulStep, produce_inflect_step, produce_step_for_voice, state_probe
from .sidecar import StatefulDecoderSidecar

EMITS = (16, 45, 93)
# the 120 dB exactness gate, both decodes in float64 (measured 279-289 dB)
EXACT_GATE = gates.Gate("stateful_step_vs_full_decode_float64", 120.0)
# fp32 against fp32: the measured floor is 97.3 dB (E=16); a broken cache lands below 40 dB
STEP_GATE = gates.Gate("stateful_step_vs_full_decode_fp32", 90.0)
MONOLITHIC_FRAMES = 1000   # the dynamic slice is pinned here to count its MACs per frame
WINDOW = f"window walk {DEFAULT_EMIT + 2 * DEFAULT_CONTEXT} = {DEFAULT_EMIT} + 2x{DEFAULT_CONTEXT}"
HOST_ROW = {"where": HOST.where, "target": HOST.target}


def sidecar(model: DecoderModel, runner, produced: StatefulStep) -> StatefulDecoderSidecar:
    """The stateful decoder sidecar for `model` (a Voice) over `runner`."""
    gin = produced.contract.params.get("speaker_dims", 0) if model.seam.g else 0
    return StatefulDecoderSidecar(runner, produced.contract, channels=model.channels, hop=model.hop,
                                  speaker_dims=gin)


def steps_for(voice: DecoderModel, emits=EMITS) -> dict[int, StatefulStep]:
    """The step at each E (made once; every measurement below reads these)."""
    return {e: produce_step_for_voice(voice, e) for e in emits}


def self_check(voice: DecoderModel, produced: StatefulStep, text: str = pd.SELF_CHECK_TEXT) -> dict:
    """Stage 1 gate: the fp32 step walk against a full-length fp32 decode, every sample of every
    sentence of `text` (STEP_GATE: onnxruntime's short-conv rounding, not the method, sets its level)."""
    full = pd.FullDecoder(voice.model, voice.seam)
    side = sidecar(voice, OrtRunner(produced.model), produced)
    worst = min(gates.snr_db(full.decode(lat.z, lat.g), side.decode(lat.z, lat.g)) for lat in voice.latents(text))
    return STEP_GATE.check(worst, context=f"stateful step E={produced.contract.params['emit']}, fp32, every sample")


# --- the graph: delay map, state, compute ---------------------------------------------------------
def delay_rows(produced: StatefulStep) -> list[dict]:
    """One row per conv: rate, kernel, dilation, pads, history, delay in and out."""
    return [{**r, **HOST_ROW} for r in delay_table(produced.step.delays)]


def buffer_rows(produced: StatefulStep) -> list[dict]:
    """Every history the step keeps: tensor, rate, leading dims, samples, floats, state tensor."""
    s = produced.step
    lead = lambda b: "x".join(str(d) for i, d in enumerate(b.shape) if i != b.axis)  # noqa: E731
    return [{"tensor": b.tensor, "rate": b.rate, "lead": lead(b), "history": b.history, "floats": b.floats,
             "state_tensor": s.groups[b.group].input, **HOST_ROW} for b in s.buffers]


def state_rows(steps: dict[int, StatefulStep], sample_rate: int) -> list[dict]:
    """Per E: cache size, lookahead (samples, frames, ms) and first audio (frames the walker is given
    before its first real sample, and the audio they voice)."""
    rows = []
    for e, produced in steps.items():
        p, hop = produced.contract.params, produced.contract.params["hop"]
        rows.append({"emit": e, "step_nodes": len(produced.model.graph.node), "state_floats": p["state_floats"],
                     "state_kib": p["state_floats"] * 4 / 1024, "state_tensors": len(p["state_layout"]),
                     "buffers": sum(g["buffers"] for g in p["state_layout"]),
                     "lookahead_samples": p["lookahead_samples"], "lookahead_frames": p["lookahead_frames"],
                     "lookahead_ms": 1e3 * p["lookahead_samples"] / sample_rate,
                     "first_audio_frames": p["first_audio_frames"],
                     "first_audio_ms": 1e3 * p["first_audio_frames"] * hop / sample_rate, **HOST_ROW})
    return rows


def macs_rows(voice: DecoderModel, steps: dict[int, StatefulStep]) -> list[dict]:
    """MACs per emitted frame from the graphs' conv shapes: the monolithic decode (the dynamic
    slice pinned at MONOLITHIC_FRAMES), the 93-frame window walk (45 emitted per window) and each
    step; compute ratio = monolithic / path (1.0: no wasted work)."""
    c = voice.channels
    mono = conv_macs(graph.pin_shapes(decoder_graph(voice.model, voice.seam),
                                      {"z": (1, c, MONOLITHIC_FRAMES), "y_mask": (1, 1, MONOLITHIC_FRAMES)}))
    mono /= MONOLITHIC_FRAMES
    window = conv_macs(produce_for_voice(voice).model) / DEFAULT_EMIT
    paths = [("monolithic decode", MONOLITHIC_FRAMES, mono), (WINDOW, DEFAULT_EMIT, window)]
    paths += [(f"stateful step E={e}", e, conv_macs(p.model) / e) for e, p in steps.items()]
    return [{"path": name, "emit": emit, "macs_per_frame": macs, "compute_ratio": mono / macs, **HOST_ROW}
            for name, emit, macs in paths]


def utterance_compute_rows(latents: dict, steps: dict[int, StatefulStep], macs: list[dict]) -> list[dict]:
    """Per sentence, what each path computes for the frames it voices: the window walk's calls of 93
    frames, and each step's calls of E, flush included (ceil((N x hop + lookahead) / (E x hop)) steps:
    the flush runs the lookahead's zero frames through the same engine). Ratio = monolithic MACs for
    the N frames / the path's MACs for the utterance."""
    from ...walk.window import plan_windows

    by = {r["path"]: r for r in macs}
    mono = by["monolithic decode"]["macs_per_frame"]
    rows = []
    for text, lats in latents.items():
        for k, lat in enumerate(lats):
            n = lat.frames
            calls = len(plan_windows(n, DEFAULT_EMIT, DEFAULT_CONTEXT))
            per_call = by[WINDOW]["macs_per_frame"] * DEFAULT_EMIT
            rows.append({"path": WINDOW, "text": text, "sentence": k, "frames": n, "calls": calls,
                         "frames_computed": calls * (DEFAULT_EMIT + 2 * DEFAULT_CONTEXT),
                         "compute_ratio": mono * n / (calls * per_call), **HOST_ROW})
            for e, produced in steps.items():
                p = produced.contract.params
                calls = -(-(n * p["hop"] + p["lookahead_samples"]) // (e * p["hop"]))
                per_call = by[f"stateful step E={e}"]["macs_per_frame"] * e
                rows.append({"path": f"stateful step E={e}", "text": text, "sentence": k, "frames": n, "calls": calls,
                             "frames_computed": calls * e, "compute_ratio": mono * n / (calls * per_call), **HOST_ROW})
    return rows


# --- exactness -----------------------------------------------------------------------------------
@dataclass
class Exactness:
    rows: list[dict]
    renders: dict = field(default_factory=dict)   # (emit, text, sentence) -> {fp32_full, fp32_step, f64_full, f64_step}

    def utterance_rows(self, sample_rate: int) -> list[dict]:
        """Per E and text, every sentence back to back: the fp32 step walk against the fp32 full-length decode
        by SNR and what a listener would judge (rkstudy.gates.perceptual), scored only when asked."""
        rows = []
        for e, text in dict.fromkeys((e, text) for e, text, _ in self.renders):
            parts = [r for (e2, t2, _), r in self.renders.items() if (e2, t2) == (e, text)]
            ref = np.concatenate([r["fp32_full"] for r in parts])
            test = np.concatenate([r["fp32_step"] for r in parts])
            origin = next(r for r in self.rows if r["emit"] == e and r["text"] == text)
            rows.append({"emit": e, "text": text, "sentences": len(parts),
                         "seconds_audio": round(ref.size / sample_rate, 2), "snr_db": gates.snr_db(ref, test),
                         **gates.perceptual(ref, test, sample_rate),
                         "where": origin["where"], "target": origin["target"]})
        return rows


def exactness(voice: DecoderModel, latents: dict, steps: dict[int, StatefulStep], f64: bool = True,
              progress: bool = True) -> Exactness:
    """Every sample of every sentence, at each E: the fp32 step walk against the fp32 full-length
    decode, and (with `f64`) the float64 step walk against the float64 full-length decode (the
    method alone: EXACT_GATE), with both fp32 decodes against the float64 one."""
    import torch

    torch.set_num_threads(1)
    full = pd.FullDecoder(voice.model, voice.seam)
    dynamic = decoder_graph(voice.model, voice.seam)
    refs = {}
    for text, lats in latents.items():
        for k, lat in enumerate(lats):
            refs[(text, k)] = {"fp32_full": full.decode(lat.z, lat.g)}
            if f64:
                feed = {"z": lat.z[None], "y_mask": np.ones((1, 1, lat.frames))}
                refs[(text, k)]["f64_full"] = run_f64(dynamic, feed)[0].ravel()
    out = Exactness(rows=[])
    for e, produced in tqdm(steps.items(), desc="E", disable=not shows_progress(progress)):
        w32 = sidecar(voice, OrtRunner(produced.model), produced)
        w64 = StatefulWalker(F64Runner(produced.model), produced.contract, dtype=np.float64)
        for text, lats in latents.items():
            for k, lat in enumerate(lats):
                r = dict(refs[(text, k)])
                r["fp32_step"] = w32.decode(lat.z, lat.g)
                row = {"emit": e, "text": text, "sentence": k, "frames": lat.frames, "steps": w32.steps,
                       "fp32_step_vs_full_db": gates.snr_db(r["fp32_full"], r["fp32_step"]),
                       "fp32_min_slice_db": float(np.min(gates.slice_snr_db(r["fp32_full"], r["fp32_step"]))),
                       "fp32_max_abs_err": float(np.max(np.abs(r["fp32_full"] - r["fp32_step"]))),
                       "fp32_first_256_max_err": float(np.max(np.abs(r["fp32_full"][:256] - r["fp32_step"][:256]))),
                       "fp32_last_256_max_err": float(np.max(np.abs(r["fp32_full"][-256:] - r["fp32_step"][-256:])))}
                if f64:
                    (r["f64_step"],) = w64.decode({"z": lat.z})
                    r["f64_step"] = r["f64_step"].ravel()
                    row.update({"f64_step_vs_full_db": gates.snr_db(r["f64_full"], r["f64_step"]),
                                "fp32_full_vs_f64_full_db": gates.snr_db(r["f64_full"], r["fp32_full"]),
                                "fp32_step_vs_f64_full_db": gates.snr_db(r["f64_full"], r["fp32_step"])})
                out.rows.append({**row, "where": w32.runner.where, "target": w32.runner.target})
                out.renders[(e, text, k)] = r
    return out


# --- builds and the simulator --------------------------------------------------------------------
def build_rows(voice: DecoderModel, steps: dict[int, StatefulStep], targets, progress: bool = True) -> list[dict]:
    """Each step and the 93-frame window engine (plain, as the reference documents ran it) built for each target:
    engine size, REGTASK lines and their largest value, build time."""
    window = produce_for_voice(voice)
    jobs = [(t, e, p) for t in targets for e, p in steps.items()] + [(t, None, window) for t in targets]
    rows = []
    for target, e, produced in tqdm(jobs, desc="builds", disable=not shows_progress(progress)):
        report = build_engine(produced.save(), target)
        rows.append({"graph": WINDOW if e is None else f"stateful step E={e}", "emit": e or DEFAULT_EMIT,
                     "frames_per_run": DEFAULT_EMIT + 2 * DEFAULT_CONTEXT if e is None else e,
                     "state_floats": 0 if e is None else produced.contract.params["state_floats"],
                     "engine_bytes": report.engine_bytes, **report.row()})
    return rows


def simulator_per_step(voice: DecoderModel, z: np.ndarray, produced: StatefulStep, sim) -> list[dict]:
    """The simulator fed exactly the fp32 walk's inputs and state, step by step: each row is one
    step's fp16 cost alone, over the samples of that step the walker keeps (the first step's output
    is mostly the pre-start samples it drops)."""
    rec = Recording(OrtRunner(produced.model))
    StatefulWalker(rec, produced.contract).decode({"z": z})
    c, drop, rows = produced.contract, produced.contract.params["lookahead_samples"], []
    n_out = len(c.role("walked", outputs=True))
    for k, (feed, a) in enumerate(zip(rec.feeds, rec.outputs)):
        b = sim.run(feed)
        lo = min(drop, a[0].size)
        drop -= lo
        ref, test = a[0].ravel()[lo:], b[0].ravel()[lo:]
        rows.append({"emit": c.params["emit"], "step": k, "kept_samples": ref.size,
                     "audio_snr_db": gates.snr_db(ref, test),
                     "audio_rms": float(np.sqrt(np.mean(ref.astype(np.float64) ** 2))) if ref.size else 0.0,
                     "state_snr_db": gates.snr_db(np.concatenate([x.ravel() for x in a[n_out:]]),
                                                  np.concatenate([x.ravel() for x in b[n_out:]])),
                     "where": sim.where, "target": sim.target})
    return rows


def simulator_rows(voice: DecoderModel, latents: dict, produced: StatefulStep, target: str,
                   per_step_text: str | None = None, progress: bool = True) -> dict:
    """The step engine in the simulator carrying its own state through whole utterances, against the
    fp32 step walk (the fp16 cost alone) and the fp32 full-length decode; the 93-frame window engine
    on the same latents in the same run, against its fp32 walk and the full decode (the perceptual columns,
    rkstudy.gates.perceptual, score the simulator render against the full decode: what a listener compares
    with). With `per_step_text`, its first sentence step by step too. Returns rows, per-step rows and renders."""
    full = pd.FullDecoder(voice.model, voice.seam)
    window = produce_for_voice(voice)
    fp32_step = sidecar(voice, OrtRunner(produced.model), produced)
    fp32_window = pd.sidecar(voice, OrtRunner(window.model), window.contract)
    refs = {text: np.concatenate([full.decode(lat.z, lat.g) for lat in lats]) for text, lats in latents.items()}
    out = {"rows": [], "per_step": [], "renders": {}}

    def utterances(name, sim, decode, fp32_decode):
        for text, lats in tqdm(latents.items(), desc=f"{target} {name}", disable=not shows_progress(progress),
                               leave=False):
            t0 = time.perf_counter()
            test = np.concatenate([decode(lat.z, lat.g) for lat in lats])
            seconds = time.perf_counter() - t0
            same = np.concatenate([fp32_decode(lat.z, lat.g) for lat in lats])
            out["renders"][(name, text)] = test
            out["rows"].append({"engine": name, "text": text, "sentences": len(lats),
                                "frames": sum(lat.frames for lat in lats),
                                "sim_vs_fp32_same_graph_db": gates.snr_db(same, test),
                                "sim_vs_fp32_full_db": gates.snr_db(refs[text], test),
                                **gates.slice_snr_summary(refs[text], test),
                                "best_lag": gates.best_lag(refs[text], test),
                                **gates.perceptual(refs[text], test, voice.sample_rate),
                                "simulator_s": seconds, "regtask": sim.report.regtask,
                                "where": sim.where, "target": sim.target})

    with SimulatorRunner(produced.save(), target) as sim:
        if per_step_text:
            out["per_step"] = simulator_per_step(voice, latents[per_step_text][0].z, produced, sim)
        utterances(f"stateful step E={produced.contract.params['emit']}", sim, sidecar(voice, sim, produced).decode,
                   fp32_step.decode)
    with SimulatorRunner(window.save(), target) as sim:
        side = pd.sidecar(voice, sim, window.contract)
        utterances(WINDOW, sim, lambda z, g: side.decode(z, g, progress=False),
                   lambda z, g: fp32_window.decode(z, g, progress=False))
    return out


# --- CPU cost --------------------------------------------------------------------------------------
def cpu_rtf(voice: DecoderModel, latents, produced: StatefulStep, macs: list[dict], repeats: int = 3) -> list[dict]:
    """onnxruntime on this CPU, one thread each (rkstudy.families.piper_decoder.study.CPU_THREADS), same
    latents, same run, interleaved: the monolithic decode, the 93-frame window walk and the stateful step.
    `compute_bound` is each path's MACs over the monolithic decode's for these latents, every call
    counted (the window walk's padded windows, the step's flush: utterance_compute_rows)."""
    threads = pd.CPU_THREADS
    full = pd.FullDecoder(voice.model, voice.seam, threads=threads)
    window = produce_for_voice(voice)
    side_w = pd.sidecar(voice, OrtRunner(window.model, threads=threads), window.contract)
    side_s = sidecar(voice, OrtRunner(produced.model, threads=threads), produced)
    e = produced.contract.params["emit"]
    per_utterance = utterance_compute_rows({"all": list(latents)}, {e: produced}, macs)
    frames = sum(lat.frames for lat in latents)

    def bound(path):  # each row's compute_ratio is monolithic MACs / the path's, over its own frames
        return sum(r["frames"] / r["compute_ratio"] for r in per_utterance if r["path"] == path) / frames

    paths = (("monolithic decode", lambda lat: full.decode(lat.z, lat.g), 1.0),
             (WINDOW, lambda lat: side_w.decode(lat.z, lat.g, progress=False), bound(WINDOW)),
             (f"stateful step E={e}", lambda lat: side_s.decode(lat.z, lat.g), bound(f"stateful step E={e}")))
    return pd.rtf_rows(paths, latents, voice.hop, voice.sample_rate, repeats, where=full.where, threads=threads)


class NullRunner:
    """An engine that does no work: zeros of every output's contract shape (the walker's own cost)."""

    where, target = HOST.where, HOST.target

    def __init__(self, contract):
        self.input_names = contract.input_names
        self.outputs = [np.zeros(t.shape, np.float32) for t in contract.outputs]

    def run(self, feed):
        return self.outputs


def walker_overheads(produced: StatefulStep, frames: int = DEFAULT_EMIT * 400, repeats: int = 5) -> list[dict]:
    """Per call with a null engine, same run: the stateful walker per step (cutting the flat state
    into the engine's tensors and joining it back, masks, padding, the flush) beside the window
    walker per window (rkstudy bench walker's measurement)."""
    c = produced.contract
    walker = StatefulWalker(NullRunner(c), c)
    z = np.random.default_rng(0).standard_normal((c.params["channels"], frames)).astype(np.float32)
    per = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        walker.decode({"z": z})
        per.append((time.perf_counter() - t0) / walker.steps * 1e3)
    w = walker_overhead(frames=frames, repeats=repeats)
    return [{"walker": f"stateful step E={c.params['emit']}", "calls": walker.steps, "unit": "ms/step",
             "value": float(np.median(per)), "state_floats": c.params["state_floats"], **HOST_ROW},
            {"walker": WINDOW, "calls": w["windows"], "unit": "ms/window", "value": w["value"], "state_floats": 0,
             **HOST_ROW}]


# --- why the mask, and the Inflect contract -------------------------------------------------------------
def nomask_rows(voice: DecoderModel, z: np.ndarray, emit: int = DEFAULT_EMIT) -> list[dict]:
    """The surgery without its frame masks (mask_ends=False) on the plain slice: the zero state stands
    for the zeros before frame 0, but the first step computes every tensor's pre-start positions
    itself (conv biases), and only the decoder mask zeroes them; the same at the end. fp32, against
    the full-length decode, by SNR and what a listener would judge."""
    from ...contract import step_contract
    from ...graph.stateful import make_step
    from .producer import stamped

    ref = pd.FullDecoder(voice.model, voice.seam).decode(z)
    hop, rows = voice.hop, []
    for dec_mask in (False, True):
        sliced = produce_for_voice(voice, dec_mask=dec_mask)
        step = make_step(sliced.model, ["z", "y_mask"], emit, mask_ends=False)
        keep = {k: sliced.contract.params[k] for k in ("hop", "channels", "speaker_dims")}
        c = step_contract(step, family="piper_decoder_stateful", masks=("y_mask",), source=sliced.contract.source,
                          producer="nomask_rows", params=keep)
        runner = OrtRunner(stamped(step, c).model)
        (out,) = StatefulWalker(runner, c).decode({"z": z})
        out = out.ravel()
        mid = slice(60 * hop, -60 * hop)
        rows.append({"slice": "--dec-mask" if dec_mask else "plain", "emit": emit, "frames": z.shape[1],
                     "snr_db": gates.snr_db(ref, out),
                     "first_10_frames_db": gates.snr_db(ref[:10 * hop], out[:10 * hop]),
                     "middle_db": gates.snr_db(ref[mid], out[mid]),
                     "last_10_frames_db": gates.snr_db(ref[-10 * hop:], out[-10 * hop:]),
                     **gates.perceptual(ref, out, voice.sample_rate),
                     "where": runner.where, "target": runner.target})
    return rows


def inflect_rows(voice, text: str, emits=(45, 93), seed: int = 1234) -> list[dict]:
    """The same surgery on the whole Inflect v2 decode.onnx carved from `voice` (head included,
    noise_scale a constant), on the model's own prior statistics and seeded noise: float64 step vs
    float64 full decode (the method), fp32 step vs fp32 full decode (with what a listener would judge of it)."""
    import torch

    from ..inflect_decoder import carve

    torch.set_num_threads(1)
    decode = carve.DecodeModel(carve.save_carved(voice))
    m_name, logs_name = carve.prior_statistics(voice.model, voice.seam)
    front = graph.slice_at(voice.model, voice.input_names, [m_name, logs_name])
    (ids,) = voice.sentences(text)[:1]
    m_p, logs_p = OrtRunner(seed_random_nodes(front, seed)).run({**ids_feed(ids), "scales": voice.scales})
    noise = np.random.default_rng(0).standard_normal(m_p.shape).astype(np.float32)
    frames = {"m_p": m_p[0], "logs_p": logs_p[0], "zp_noise": noise[0]}
    scale = np.array([voice.scales[0]], np.float32)
    n = m_p.shape[2]
    feed = {**{k: v[None] for k, v in frames.items()}, "noise_scale": scale, "y_mask": np.ones((1, 1, n), np.float32)}
    full32 = OrtRunner(decode.model)
    ref32 = full32.run(feed)[0].ravel()
    pinned = graph.pin_shapes(decode.model, {**{k: (1, decode.channels, n) for k in frames}, "noise_scale": (1,),
                                             "y_mask": (1, 1, n)})
    ref64 = run_f64(pinned, {**feed, "y_mask": np.ones((1, 1, n))})[0].ravel()
    rows = []
    for e in emits:
        produced = produce_inflect_step(decode, e)
        c = produced.contract
        (out32,) = StatefulWalker(OrtRunner(produced.model), c, {"noise_scale": scale}).decode(frames)
        (out64,) = StatefulWalker(F64Runner(produced.model), c, {"noise_scale": scale}, dtype=np.float64).decode(frames)
        rows.append({"graph": "Inflect v2 decode.onnx (carved, head included) + decoder mask", "emit": e, "frames": n,
                     "walked": ", ".join(t.name for t in c.role("walked")),
                     "constants": ", ".join(t.name for t in c.role("constant")),
                     "lookahead_samples": c.params["lookahead_samples"], "state_floats": c.params["state_floats"],
                     "fp32_step_vs_full_db": gates.snr_db(ref32, out32.ravel()),
                     "f64_step_vs_full_db": gates.snr_db(ref64, out64.ravel()),
                     "fp32_full_vs_f64_full_db": gates.snr_db(ref64, ref32),
                     **gates.perceptual(ref32, out32.ravel(), voice.sample_rate),
                     "where": full32.where, "target": full32.target})
    return rows


# --- quantization: the step engine calibrated on the states a real walk carries ---------------------
def step_spans(samples: int, step: int) -> list[tuple[int, int]]:
    """[start, stop) spans of one step's output (`step` samples) over an utterance of `samples`, the
    remainder joined to the last step: a window score is of a whole step's audio, never of the few
    hundred samples an utterance ends with past its last full step (end-of-utterance near-silence,
    which would score as the worst "window" of a step that is in fact as good as the rest)."""
    if samples <= 0 or step <= 0:
        raise ValueError(f"spans of {step} over {samples} samples: both must be positive")
    starts = list(range(0, max(samples - step, 0) + 1, step)) if samples >= step else [0]
    return [(lo, hi) for lo, hi in zip(starts, [*starts[1:], samples])]


def quantization_stage(voice: DecoderModel | None = None, emit: int = 45,
                       calibration_texts: Sequence[str] = pd.CALIBRATION_TEXTS,
                       evaluation_texts: Sequence[str] = pd.EVALUATION_TEXTS, calibration_steps: int | None = None,
                       search_frames: int = 135):
    """The stateful step at E = `emit` as rkstudy.levers.quantization sees it: the calibration feeds are the
    steps an fp32 walk runs over the voice's latents of `calibration_texts` (the state inputs hold
    what that walk carried, so the quantizer sees the ranges of a real history), `calibration_steps`
    of them evenly spread; the evaluation latents of `evaluation_texts` are walked with the engine
    carrying its own state, scored per step (E x hop samples, step_spans) and per utterance against the
    fp32 walk, and by ear on the audio; the search walks the last one's first `search_frames` (three steps)."""
    from ...levers.quantization.stages import Stage, evenly, held_apart, recorded_feeds, span_scores
    from ..piper.voice import Voice, read_text

    held_apart(calibration_texts, evaluation_texts)
    voice = voice or Voice()
    produced = produce_step_for_voice(voice, emit)
    onnx_path = produced.save()
    calibration = [lat for name in calibration_texts for lat in voice.latents(read_text(name))]
    evaluation = [lat for name in evaluation_texts for lat in voice.latents(read_text(name))]
    search = [replace(evaluation[-1], z=evaluation[-1].z[:, :search_frames])]

    def walk(runner, lat):
        return sidecar(voice, runner, produced).decode(lat.z, lat.g)

    step = emit * voice.hop

    def score(items, refs, tests):
        return span_scores(refs, tests, [step_spans(a.size, step) for a in refs])

    return Stage(name=f"Piper decoder stateful step E={emit}", onnx=onnx_path,
                 calibration=evenly(recorded_feeds(onnx_path, walk, calibration), calibration_steps),
                 evaluation=evaluation, search=search, walk=walk, score=score, rate=voice.sample_rate,
                 audio=lambda x: x, groups=pd.decoder_groups(onnx_path),
                 texts={"calibration": ", ".join(calibration_texts), "evaluation": ", ".join(evaluation_texts)})


def speak_step_engine(voice: DecoderModel, target: str = "rk3588", emit: int = DEFAULT_EMIT) -> Path:
    """The Piper plan's exact streaming decoder as a user makes it: the stateful step at `emit` frames, compiled
    for `target` by its stage 2 (the simulator gated against fp32 on a zero and a carried state), reused once
    made. `rkstudy speak piper` takes it as the decoder's engine and streams each chunk step by step."""
    produced = produce_step_for_voice(voice, emit)
    onnx_path = produced.save()
    return pd.compiled(onnx_path, produced.contract, target, probe=lambda c: state_probe(onnx_path, c))
