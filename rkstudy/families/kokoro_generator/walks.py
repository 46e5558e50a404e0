"""Notebook 03 sections 7 and 9: the sidecar's walk over real utterances (fp32: overlap, gain, the
per-window loudness; then the simulator against fp32 over whole utterances)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from ... import gates
from ...runtime import OrtRunner, Recording
from ...toolkit.simulator import Simulated
from ...walk.window import plan_windows
from . import frontend, head
from .generator import ENGINE, FINE, Rewrites
from .producer import KokoroModel, Produced, full_feed, run_torch
from .rows import origin as _origin
from .sidecar import GeneratorSidecar, frame_energy

OVERLAP = 16              # frames two windows share in the overlap measurement (of 72 emitted)


def sidecar(runner, contract, *, overlap: int = 0, gain: bool = False) -> GeneratorSidecar:
    return GeneratorSidecar(runner, contract, channels=contract.params["channels"], rows=contract.params["rows"],
                            samples_per_frame=contract.params["samples_per_frame"], overlap=overlap, gain=gain)


def walk_gen(side: GeneratorSidecar, utt: frontend.Utterance, reference: np.ndarray | None = None) -> np.ndarray:
    """The walked gen [1, 22, 60 N + 1] of one utterance through a sidecar."""
    return side.generate(utt.x[0], utt.har[0], utt.style[0], reference=reference, progress=False)[None]


def full_decode(model: KokoroModel, utt: frontend.Utterance, rw: Rewrites = ENGINE) -> np.ndarray:
    """The full-length fp32 decode (torch, masks all ones) that every walk is compared with."""
    return run_torch(model.trunk(rw), full_feed(utt))


# A window whose full-length decode is quieter than gates.SILENT_SLICE_DBFS is the utterance's silence (its trailing
# pause decodes to -89 dBFS and below): the walk's level against it is a ratio of two noise floors, not a loudness
# change, so the spread is taken over the audible windows and the silent ones are counted beside it.


def window_loudness(full_audio: np.ndarray, walked_audio: np.ndarray, n_frames: int, emit: int, context: int,
                    hop: int = frontend.HOP, overlap: int = 0) -> list[dict]:
    """Per window, over the frames it alone voices (its emitted span without shared frames): RMS (dB) of
    the walk minus that of the full-length decode, the SNR between the two, and whether the full-length decode
    is silent there (below gates.SILENT_SLICE_DBFS)."""
    plan = plan_windows(n_frames, emit, context, overlap)
    rows = []
    for i, w in enumerate(plan):
        a = plan[i - 1].emit_stop if i > 0 and overlap else w.emit_start
        b = plan[i + 1].emit_start if i + 1 < len(plan) and overlap else w.emit_stop
        f = np.asarray(full_audio[a * hop: b * hop], np.float64)
        t = np.asarray(walked_audio[a * hop: b * hop], np.float64)
        rf, rt = math.sqrt(np.mean(f ** 2)), math.sqrt(np.mean(t ** 2))
        rows.append({"window_index": i, "from_frame": a, "to_frame": b, "full_rms_db": 20 * math.log10(rf),
                     "walk_rms_db": 20 * math.log10(rt), "delta_db": 20 * math.log10(rt / rf),
                     "snr_db": gates.snr_db(f, t), "silent": bool(20 * math.log10(rf) < gates.SILENT_SLICE_DBFS)})
    return rows


def loudness(model: KokoroModel, utt: frontend.Utterance, produced: Produced, *, overlaps=(0, OVERLAP),
             gains=(False, True)) -> tuple[list[dict], list[dict], dict]:
    """Measurement 5: the fp32 walk (onnxruntime on the window graph) with and without `overlap` and
    `gain`, against the full-length decode; per-window loudness rows, one summary row per variant (its spread over
    the audible windows, the silent ones counted: gates.SILENT_SLICE_DBFS; and what
    a listener would judge of the whole utterance, rkstudy.gates.perceptual), and the audio of each (for the
    players)."""
    runner = OrtRunner(produced.path)
    full = full_decode(model, utt)
    a_full = head.istft(full, model.head)
    energy = frame_energy(full, FINE, model.head.bins)
    c = produced.contract
    per, summary, audio = [], [], {"full-length decode": a_full}
    for overlap in overlaps:
        for gain in gains:
            gen = walk_gen(sidecar(runner, c, overlap=overlap, gain=gain), utt, energy if gain else None)
            a = head.istft(gen, model.head)
            name = f"overlap {overlap}, gain {'on' if gain else 'off'}"
            audio[name] = a
            rows = window_loudness(a_full, a, utt.frames, c.window.emit, c.window.context, overlap=overlap)
            deltas = [r["delta_db"] for r in rows if not r["silent"]]
            per += [{"variant": name, "overlap": overlap, "gain": gain, **r, **_origin(runner)} for r in rows]
            summary.append({"utterance": utt.name, "variant": name, "overlap": overlap, "gain": gain,
                            "windows": len(rows), "silent_windows": len(rows) - len(deltas),
                            "delta_min_db": min(deltas), "delta_max_db": max(deltas),
                            "spread_db": max(deltas) - min(deltas),
                            "audio_snr_vs_full_db": gates.snr_db(a_full, a),
                            "gen_snr_vs_full_db": gates.snr_db(full, gen),
                            "max_step_walk": gates.max_step(a), "max_step_full": gates.max_step(a_full),
                            **gates.perceptual(a_full, a, frontend.SAMPLE_RATE), **_origin(runner)})
    return per, summary, audio


def short_utterance_rows(model: KokoroModel, utt: frontend.Utterance, produced: Produced,
                         lengths: Sequence[int]) -> list[dict]:
    """Latents of a few lengths cut from a real one, walked (fp32) against their own full-length decode:
    a latent that fits one window is one padded window, and exact (STOI is NaN under 0.4 s of voiced speech)."""
    runner = OrtRunner(produced.path)
    side = sidecar(runner, produced.contract)
    rows = []
    for n in lengths:
        part = _cut(utt, n)
        full, walked = full_decode(model, part), walk_gen(side, part)
        a_full, a = head.istft(full, model.head), head.istft(walked, model.head)
        rows.append({"frames": n, "window": produced.contract.window.frames,
                     "windows": len(plan_windows(n, produced.contract.window.emit, produced.contract.window.context)),
                     "gen_snr_vs_full_db": gates.snr_db(full, walked), "audio_snr_vs_full_db": gates.snr_db(a_full, a),
                     **gates.perceptual(a_full, a, frontend.SAMPLE_RATE), **_origin(runner)})
    return rows


def _cut(utt: frontend.Utterance, n: int) -> frontend.Utterance:
    """The first n frames of an utterance as an utterance of its own."""
    return replace(utt, name=f"{utt.name}[:{n}]", x=utt.x[..., :n], har=utt.har[..., : FINE * n + 1],
                   gen=utt.gen[..., : FINE * n + 1], audio=utt.audio[: frontend.HOP * n], f0=utt.f0[..., :n])




def walk_feeds(produced: Produced, utts: Sequence[frontend.Utterance]) -> list[dict]:
    """Every window the sidecar feeds the engine over these utterances (recorded on the fp32 walk: the
    windows do not depend on the engine's outputs), to simulate with one build of the engine."""
    rec = Recording(OrtRunner(produced.path))
    side = sidecar(rec, produced.contract)
    for u in utts:
        walk_gen(side, u)
    return rec.feeds


def simulator_walk_rows(model: KokoroModel, produced: Produced, sim: Simulated,
                        utts: Sequence[frontend.Utterance]) -> tuple[list[dict], list[dict], dict]:
    """The engine walked by the sidecar in the simulator (`sim`: a build simulated on walk_feeds of these
    utterances, replayed here) against the same walk in fp32 (the fp16 cost alone) and against the
    full-length fp32 decode (what a listener compares with), per window (SNR) and per utterance (SNR and what a
    listener would judge, rkstudy.gates.perceptual). Returns utterance rows, window rows and the renders."""
    c = produced.contract
    ort = OrtRunner(produced.path)
    eng = sim.replay(c.input_names)
    per_window_s = float(np.mean(sim.run_s)) if sim.run_s else float("nan")  # the simulator's own time per window
    rows, windows, renders = [], [], {}
    for u in utts:
        sim_gen = walk_gen(sidecar(eng, c), u)
        fp32, full = walk_gen(sidecar(ort, c), u), full_decode(model, u)
        a = {k: head.istft(g, model.head) for k, g in (("simulator", sim_gen), ("fp32 walk", fp32), ("full", full))}
        renders[u.name] = a
        n_win = len(plan_windows(u.frames, c.window.emit, c.window.context))
        for ref in ("fp32 walk", "full"):
            rows.append({"utterance": u.name, "frames": u.frames, "windows": n_win, "reference": ref,
                         "gen_snr_db": gates.snr_db(fp32 if ref == "fp32 walk" else full, sim_gen),
                         **gates.compare(a[ref], a["simulator"], frontend.SAMPLE_RATE),
                         **gates.perceptual(a[ref], a["simulator"], frontend.SAMPLE_RATE),
                         "sim_s_per_window": per_window_s, **_origin(eng)})
            for r in window_loudness(a[ref], a["simulator"], u.frames, c.window.emit, c.window.context):
                windows.append({"utterance": u.name, "reference": ref, **r, **_origin(eng)})
    return rows, windows, renders
