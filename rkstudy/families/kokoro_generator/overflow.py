"""Notebook 08's int16 rows: the toolkit's auto-hybrid mode for float graphs (rknn-toolkit2 >= 2.3.2:
rknn.build(do_quantization=False, dataset=..., auto_hybrid=True) computes in int16 the layers whose
range on the dataset exceeds fp16) and its 16-bit dynamic fixed point (quantized_dtype w16a16i_dfp: every
layer in int16 with a power-of-two scale per tensor) on the two Kokoro graphs that overflow fp16, beside
the project's fix (AdaIN statistics as count fractions, means never raw sums).

The fp16 rows are notebook 03's builds on the same graphs and windows, read from the content-keyed
simulator cache when 03 ran first (rkstudy.toolkit.simulator.simulate); only the int16 builds are new.
Each int16 build is calibrated on the windows it is scored on: the dataset only gives the toolkit each
layer's range, and those are the ranges these windows reach (what is asked here is whether int16 holds
these ranges at all, not how it generalises: notebook 08's quantization rows hold calibration apart).
"""

from __future__ import annotations

import numpy as np

from ... import gates
from ...runtime import OrtRunner
from ...toolkit.calibration import Calibration
from ...toolkit.simulator import simulate
from . import frontend, generator
from .compiler_sweep import SweepBuild, case_graph, probe_feed, simulate_case
from .global_statistics import fed_stats_simulated, global_statistics
from .node_ranges import FP16_MAX, node_maxima
from .producer import KokoroModel

RAW_SUMS = generator.Rewrites(stats="sum")
INT16 = "fp16 + int16 where fp16 overflows (auto-hybrid)"
DFP16 = "int16 dynamic fixed point (w16a16i_dfp)"


def _mode(calibration: Calibration | None, report) -> str:
    """fp16, or the int16 mode or dtype with the toolkit that built it."""
    if calibration is None:
        return "fp16"
    return f"{INT16 if calibration.int16_overflow else DFP16}, {report.toolkit_version}"


def _scored(got: np.ndarray | None, reference: np.ndarray) -> dict:
    if got is None:
        return {"nonfinite": None, "outputs": int(reference.size), "snr_vs_fp32_db": None, "sim_max_abs": None}
    finite = np.isfinite(got)
    clean = np.where(finite, got, 0.0)
    return {"nonfinite": int(got.size - finite.sum()), "outputs": int(got.size),
            "snr_vs_fp32_db": gates.snr_db(reference, clean) if finite.all() else float("nan"),
            "sim_max_abs": float(np.max(np.abs(clean)))}


def _row(graph: str, rewrite: str, mode: str, sim, got, reference, windows: int) -> dict:
    r = sim.report
    status = "simulator refused" if sim.inference_error else r.status
    return {"graph": graph, "statistics": rewrite, "mode": mode, "status": status, "dtype": r.dtype,
            "windows": windows, **_scored(got, reference), "fp32_max_abs": float(np.max(np.abs(reference))),
            "engine_bytes": r.engine_bytes, "build_s": round(r.seconds, 1), "regtask": r.regtask,
            "error": (sim.inference_error or r.error or "")[:300], "built_with": r.toolkit_version,
            "board": "board-only: the int16 path's speed and output on a board",
            "where": "simulator" if got is not None else "host", "target": r.target}


def int16_overflow_rows(model: KokoroModel, window_utt: frontend.Utterance, walk_utt: frontend.Utterance,
                        target: str = "rk3588") -> list[dict]:
    """One row per graph and mode: the raw-sum W = 256 graph in fp16, through the int16 mode and in
    w16a16i_dfp, the count-fraction W = 256 engine (the project's fix) in fp16, all on the last window of
    the walk over `window_utt` (notebook 03's sweep window); the global-statistics W = 128 engine in fp16,
    through the int16 mode and in w16a16i_dfp, walked over `walk_utt` (notebook 03's global-statistics
    simulator walk). Non-finite
    outputs, SNR against onnxruntime fp32 on the same graph, engine bytes and the build's outcome (its
    error when it fails)."""
    rows = []
    for rewrite, rw in (("raw sums", RAW_SUMS), ("count fractions (the project's fix)", generator.ENGINE)):
        case = SweepBuild(256, target, rw=rw)
        produced = case_graph(model, case)
        feed = probe_feed(window_utt, produced)
        reference = OrtRunner(produced.path).run(feed)[0]
        int16 = [Calibration([feed], int16_overflow=True), Calibration([feed], dtype="w16a16i_dfp")]
        for calibration in [None] + (int16 if rw == RAW_SUMS else []):
            sim = simulate_case(produced, case, [feed]) if calibration is None else \
                simulate(produced.path, target, [feed], verbose=True, quantize=calibration)
            got = sim.outputs[0][0] if sim.outputs else None
            rows.append(_row("W = 256, one window", rewrite, _mode(calibration, sim.report), sim, got, reference, 1))
    _, renders = global_statistics(model, walk_utt)
    stats = renders["statistics"]
    sim, fp32, got = fed_stats_simulated(model, walk_utt, stats, target)
    rows.append(_row("W = 128, global statistics fed (7 inputs)", "full-length statistics", "fp16", sim, got, fp32,
                     len(sim.feeds)))
    sim16, _, got16 = fed_stats_simulated(model, walk_utt, stats, target, int16_overflow=True)
    rows.append(_row("W = 128, global statistics fed (7 inputs)", "full-length statistics", f"{INT16}, "
                     f"{sim16.report.toolkit_version}", sim16, got16, fp32, len(sim16.feeds)))
    dfp, _, got_dfp = fed_stats_simulated(model, walk_utt, stats, target, dtype="w16a16i_dfp")
    rows.append(_row("W = 128, global statistics fed (7 inputs)", "full-length statistics", f"{DFP16}, "
                     f"{dfp.report.toolkit_version}", dfp, got_dfp, fp32, len(dfp.feeds)))
    return rows


def raw_sum_ranges(model: KokoroModel, utt: frontend.Utterance, frames: int = 256) -> dict:
    """fp32 only (notebook 08's quick stand-in): the raw-sum graph's node maxima at W = `frames` on the sweep
    window of `utt`: how many nodes pass the fp16 maximum (what the int16 mode has to catch) and the largest."""
    produced = case_graph(model, SweepBuild(frames, rw=RAW_SUMS))
    rows = node_maxima(produced.path, probe_feed(utt, produced))
    top = max(rows, key=lambda r: r["max_abs"])
    return {"graph": f"W = {frames}, one window", "statistics": "raw sums", "utterance": utt.name, "nodes": len(rows),
            "nodes_over_fp16": sum(r["max_abs"] > FP16_MAX for r in rows), "largest_node": top["node"],
            "largest_max_abs": top["max_abs"], "where": "fp32", "target": "none"}
