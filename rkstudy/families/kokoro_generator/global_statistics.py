"""Notebook 03 section 8: every window normalized with the full-length decode's own AdaIN statistics
(fp32), and the engine that takes them as inputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import torch

from ... import gates
from ...runtime import OrtRunner, Recording
from ...toolkit.calibration import Calibration
from ...toolkit.simulator import Simulated, simulate
from ...walk.window import Rate, walk
from . import frontend, generator, head
from .generator import FINE
from .producer import DEFAULT_CONTEXT, DEFAULT_FRAMES, INPUTS, KokoroModel, full_feed, run_torch
from .rows import FP32
from .walks import full_decode


def torch_walk(trunk, utt: frontend.Utterance, frames: int, context: int) -> np.ndarray:
    """The walk of a torch trunk over `utt` at a `frames`-wide window (rkstudy.walk.window.walk), gen stitched."""
    def run(feed):
        f = {k: feed[k].reshape(1, *feed[k].shape) if feed[k].ndim == 2 else feed[k] for k in feed}
        f["style"] = utt.style
        return [run_torch(trunk, f)[0]]

    (gen,) = walk(utt.frames, run, emit=frames - 2 * context, context=context,
                  walked={"x": (utt.x[0], Rate()), "har": (utt.har[0], Rate(FINE, 1))},
                  masks={"m10": Rate(10, 0), "m60": Rate(FINE, 1)}, outputs=[Rate(FINE, 1)], progress=False)
    return gen[None]


def global_statistics(model: KokoroModel, utt: frontend.Utterance, frames: int = DEFAULT_FRAMES,
                      context: int = DEFAULT_CONTEXT) -> tuple[list[dict], dict]:
    """Measurement 6 (fp32): every window normalized with the full-length decode's own AdaIN statistics
    (recorded, then replayed in each window) against the full-length decode, beside the per-window walk, by
    SNR and what a listener would judge of the audio. Returns the rows and the renders."""
    trunk = model.trunk()
    full = full_decode(model, utt)
    items = generator.record_statistics(trunk, *(torch.from_numpy(full_feed(utt)[k]) for k in INPUTS))
    per_window = torch_walk(trunk, utt, frames, context)
    with generator.replaying(trunk, items):
        fed = torch_walk(trunk, utt, frames, context)
    a_full = head.istft(full, model.head)
    rows = []
    for name, gen in (("per-window statistics (the engine)", per_window), ("full-length statistics fed", fed)):
        a = head.istft(gen, model.head)
        rows.append({"utterance": utt.name, "frames": utt.frames, "window": frames, "context": context,
                     "statistics": name, "gen_snr_vs_full_db": gates.snr_db(full, gen),
                     "audio_snr_vs_full_db": gates.snr_db(a_full, a), "gen_max_abs": float(np.max(np.abs(gen))),
                     **gates.perceptual(a_full, a, frontend.SAMPLE_RATE), **FP32})
    return rows, {"full": full, "per_window": per_window, "fed": fed, "statistics": items}


def fed_stats_graph(model: KokoroModel, frames: int = DEFAULT_FRAMES, context: int = DEFAULT_CONTEXT) -> Path:
    """The global-statistics engine's graph: the trunk with every AdaIN's mean and 1/std as two more
    inputs (mu, rs [1, 9216, 1]), the reference documents' 7-input form; a study graph with no contract (cached)."""
    from ... import cache
    from .producer import _code_digest, export, window_shapes

    key = cache.digest(model.source.sha256, frames, "fedstats", _code_digest())

    def make(tmp: Path) -> None:
        trunk = model.trunk()
        s = sum(m.fc.out_features // 2 for m in trunk.modules() if isinstance(m, generator.AdaIN))
        shapes = {**window_shapes(frames), "mu": (1, s, 1), "rs": (1, s, 1)}
        onnx.save(export(generator.FedStatsTrunk(trunk), shapes), str(tmp))

    return cache.cached_file("kokoro", f"generator_w{frames}_fedstats", key, ".onnx", make)


def fed_stats_walk(runner, model: KokoroModel, utt: frontend.Utterance, stats, frames: int = DEFAULT_FRAMES,
                   context: int = DEFAULT_CONTEXT) -> np.ndarray:
    """The fed-statistics graph walked over `utt` through `runner` (onnxruntime or the simulator)."""
    mu, rs = generator.packed_statistics(stats)

    def run(feed):
        f = {"x": feed["x"][None], "har": feed["har"][None], "style": utt.style, "m10": feed["m10"][None],
             "m60": feed["m60"][None], "mu": mu, "rs": rs}
        return [runner.run(f)[0][0]]

    (gen,) = walk(utt.frames, run, emit=frames - 2 * context, context=context,
                  walked={"x": (utt.x[0], Rate()), "har": (utt.har[0], Rate(FINE, 1))},
                  masks={"m10": Rate(10, 0), "m60": Rate(FINE, 1)}, outputs=[Rate(FINE, 1)], progress=False)
    return gen[None]


def fed_stats_simulated(model: KokoroModel, utt: frontend.Utterance, stats, target: str = "rk3588",
                        int16_overflow: bool = False, dtype: str | None = None
                        ) -> tuple[Simulated, np.ndarray, np.ndarray | None]:
    """The fed-statistics graph walked over `utt`: in onnxruntime fp32 (which records the windows), then
    the same windows through one simulator build (the content-keyed cache: notebook 03's fp16 build
    answers notebook 08's ask for it), fp16 or, with `int16_overflow`, through the toolkit's int16 mode,
    or quantized to `dtype` ('w16a16i_dfp'), calibrated on those windows. Returns the Simulated, the fp32
    gen and the simulator's gen (None when the build failed)."""
    path = fed_stats_graph(model)
    rec = Recording(OrtRunner(path))
    fp32 = fed_stats_walk(rec, model, utt, stats)
    quantize = Calibration(rec.feeds, int16_overflow=True) if int16_overflow else \
        Calibration(rec.feeds, dtype=dtype) if dtype else None
    sim = simulate(path, target, rec.feeds, quantize=quantize)
    gen = fed_stats_walk(sim.replay(rec.input_names), model, utt, stats) if sim.outputs else None
    return sim, fp32, gen


def global_statistics_simulator(model: KokoroModel, utt: frontend.Utterance, renders: dict,
                                target: str = "rk3588") -> list[dict]:
    """What the PC simulator does with the global-statistics engine (the reference documents' board
    saturated fp16 with it): the walk in the simulator and in onnxruntime fp32, each against the
    full-length fp32 decode, with the largest |gen| and the non-finite count. `renders` is
    global_statistics()'s (the full decode and the recorded statistics)."""
    full, stats = renders["full"], renders["statistics"]
    sim, fp32, got = fed_stats_simulated(model, utt, stats, target)
    sim.report.raise_for_status()
    if got is None:
        raise RuntimeError(f"the simulator refused the global-statistics engine: {sim.inference_error}")
    a_full = head.istft(full, model.head)
    rows = []
    for name, gen, by in (("simulator", got, sim), ("onnxruntime fp32", fp32, None)):
        finite = np.isfinite(gen)
        clean = np.where(finite, gen, 0)
        rows.append({"utterance": utt.name, "frames": utt.frames, "window": DEFAULT_FRAMES, "context": DEFAULT_CONTEXT,
                     "statistics": "full-length statistics fed (7-input graph)", "runtime": name,
                     "gen_snr_vs_full_db": gates.snr_db(full, clean),
                     "audio_snr_vs_full_db": gates.snr_db(a_full, head.istft(clean, model.head)),
                     **gates.perceptual(a_full, head.istft(clean, model.head), frontend.SAMPLE_RATE),
                     "gen_max_abs": float(np.max(np.abs(gen[finite]))), "gen_nonfinite": int((~finite).sum()),
                     "regtask": sim.report.regtask if by is not None else "",
                     **({"where": by.where, "target": by.target} if by is not None else FP32)})
    return rows
