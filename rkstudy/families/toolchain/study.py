"""The toolchain study's measurements (host): what notebook 00 calls."""

from __future__ import annotations

import numpy as np
from tqdm.auto import tqdm

from ... import gates
from ...graph import REGISTER_FIELD_MAX
from ...toolkit.build import BuildFailed, build_engine
from ...toolkit.convert import simulator_vs_fp32
from ...toolkit.probes import long_axis_probe, save_probe, vocoder_probe

SNR_GATE = gates.Gate("simulator_vs_fp32_probe", 40.0)  # the reference documents' export gates sit at 40 dB and up


def _probe_simulated(target: str, frames: int = 64, seed: int = 1):
    """The vocoder probe built for `target` (verbose) and run in the simulator and in onnxruntime on
    one input, through the shared engine and simulator cache: the build row, the simulator row and
    the lint study's placement of the same graph and input all read this one build."""
    path = save_probe(vocoder_probe(frames=frames), f"vocoder_probe_t{frames}")
    x = np.random.default_rng(seed).standard_normal((1, 16, 1, frames)).astype(np.float32)
    return simulator_vs_fp32(path, target, [{"x": x}], keep=True, cache=True, verbose=True,
                             compare=lambda ref, test, _: gates.compare(ref[0], test[0]))


def simulate_probe(target: str, frames: int = 64, seed: int = 1) -> tuple[dict, np.ndarray, np.ndarray]:
    """Build the vocoder probe for `target`, run it in the simulator and in onnxruntime on the
    same input, gate the SNR. Returns (results row, fp32 output, simulator output)."""
    sim = _probe_simulated(target, frames, seed)
    ref, test = sim.fp32[0][0].ravel(), sim.simulator[0][0].ravel()
    r = sim.rows[0]
    row = {"graph": "vocoder_probe", "frames": frames, "build_s": round(sim.report.seconds, 1),
           "regtask": sim.report.regtask,
           **{k: r[k] for k in ("snr_db", "median_slice_snr_db", "best_lag", "nonfinite", "rms_ratio")},
           **SNR_GATE.check(r["snr_db"], context=f"vocoder probe on {target}"),
           "where": r["where"], "target": r["target"]}
    return row, ref, test


def build_probe(target: str) -> dict:
    """Compile the vocoder probe to an engine file and report it (the build simulate_probe runs)."""
    report = _probe_simulated(target).report.raise_for_status()
    return {"graph": "vocoder_probe", **report.row()}


def regtask_row(length: int, target: str, channels: int = 256, simulate: bool = True) -> dict:
    """Build the long-axis probe at `length` (verbose), count the compiler's REGTASK lines and, with
    `simulate`, score the simulator against onnxruntime on the same graph, in the same child: one
    build per (length, target), kept in the shared engine and simulator cache, where the lint study's
    cases and placement of the same graphs find it.

    256 channels, because the overflow depends on the conv's tiling and not on the axis alone:
    the same 30720-frame conv at 64 channels logs nothing.
    """
    path = save_probe(long_axis_probe(length, channels=channels), f"long_axis_c{channels}_t{length}")
    sim = None
    if simulate:
        x = np.random.default_rng(0).standard_normal((1, channels, length)).astype(np.float32)
        try:
            sim = simulator_vs_fp32(path, target, [[x]], cache=True, verbose=True)
            report = sim.report
        except BuildFailed as exc:  # a REGTASK-limit kill or a timeout is a row of the sweep
            if exc.report is None:
                raise
            report = exc.report
    else:
        report = build_engine(path, target, verbose=True)
    row = {"graph": "long_axis_probe", "channels": channels, "length": length,
           "past_13_bit_field": length > REGISTER_FIELD_MAX, **report.row()}
    if simulate:
        row["simulator_snr_db"] = float("nan")  # stays nan when the build did not produce an engine
    if sim is not None:
        row["simulator_snr_db"], row["where"] = sim.rows[0]["snr_db"], sim.rows[0]["where"]
    return row


def regtask_sweep(lengths, targets, channels: int = 256, progress: bool = True) -> list[dict]:
    """regtask_row for every target and length (one build and one simulator run each)."""
    jobs = [(t, n) for t in targets for n in lengths]
    return [regtask_row(n, t, channels) for t, n in tqdm(jobs, desc="builds", disable=not progress)]
