"""Notebook 03 section 5: the compiler. One-op probes at the trunk's shapes (the two toolkit limits),
then the REGTASK sweep: each window and target built once, scored in the simulator against fp32."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from ... import gates
from ...process import shows_progress
from ...runtime import OrtRunner
from ...tables.results import HOST
from ...toolkit.build import BUILD_TIMEOUT_S, REGTASK_LIMIT, BuildReport, build_engine
from ...toolkit.log import cpu_ops, layer_table
from ...toolkit.simulator import Simulated, simulate
from ...walk.window import plan_windows
from . import frontend, generator
from .generator import ENGINE, FINE, Rewrites
from .producer import (
    DEFAULT_CONTEXT,
    DEFAULT_FRAMES,
    KokoroModel,
    Produced,
    inner_frames,
    last_window_feed,
    produce,
    window_feed,
)

PROBE_REGTASK_LIMIT = 20_000


class _Poly(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = generator.PolyphaseUp(torch.nn.ConvTranspose1d(512, 256, 20, 10, padding=5))

    def forward(self, x):
        return self.up(x)


def _conv(ch, k, d):
    return torch.nn.Conv1d(ch, ch, k, padding=d * (k - 1) // 2, dilation=d)


FINE_L, COARSE_L = FINE * DEFAULT_FRAMES + 1, 10 * DEFAULT_FRAMES
# name -> (module factory, input shape, what it shows). The shapes are the W = 128 trunk's.
PROBES = {
    "conv 128ch k11 d5, fine rate": (lambda: _conv(128, 11, 5), (1, 128, FINE_L), "split"),
    "conv 128ch k11 d5, 4001 columns": (lambda: _conv(128, 11, 5), (1, 128, 4001), "split"),
    "conv 128ch k11 d3, fine rate": (lambda: _conv(128, 11, 3), (1, 128, FINE_L), "clean"),
    "conv 128ch k9 d5, fine rate": (lambda: _conv(128, 9, 5), (1, 128, FINE_L), "clean"),
    "conv 128ch k7 d5, fine rate": (lambda: _conv(128, 7, 5), (1, 128, FINE_L), "clean"),
    "conv 128ch k11 d1, fine rate": (lambda: _conv(128, 11, 1), (1, 128, FINE_L), "clean"),
    "conv 256ch k11 d5, 10x rate": (lambda: _conv(256, 11, 5), (1, 256, COARSE_L), "split"),
    "conv 256ch k11 d3, 10x rate": (lambda: _conv(256, 11, 3), (1, 256, COARSE_L), "split"),
    "conv 256ch k7 d5, 10x rate": (lambda: _conv(256, 7, 5), (1, 256, COARSE_L), "split"),
    "conv 256ch k7 d3, 10x rate": (lambda: _conv(256, 7, 3), (1, 256, COARSE_L), "clean"),
    "conv 256ch k5 d5, 10x rate": (lambda: _conv(256, 5, 5), (1, 256, COARSE_L), "clean"),
    "conv 256ch k3 d5, 10x rate": (lambda: _conv(256, 3, 5), (1, 256, COARSE_L), "clean"),
    "split k11 d5 (6 + 5 taps), 128ch fine rate": (lambda: generator.SplitConv(_conv(128, 11, 5)), (1, 128, FINE_L),
                                                   "rewrite"),
    "split k11 d5 (6 + 5 taps), 256ch 10x rate": (lambda: generator.SplitConv(_conv(256, 11, 5)),
                                                  (1, 256, COARSE_L), "rewrite"),
    "ups.0: ConvTranspose k20 stride 10": (lambda: torch.nn.ConvTranspose1d(512, 256, 20, 10, padding=5),
                                           (1, 512, DEFAULT_FRAMES), "polyphase"),
    "ups.0 as a polyphase kernel-2 conv": (_Poly, (1, 512, DEFAULT_FRAMES), "rewrite"),
    "ups.1: ConvTranspose k12 stride 6": (lambda: torch.nn.ConvTranspose1d(256, 128, 12, 6, padding=3),
                                          (1, 256, COARSE_L), "clean"),
}
QUICK_PROBES = ("conv 256ch k11 d5, 10x rate", "split k11 d5 (6 + 5 taps), 256ch 10x rate",
                "ups.0: ConvTranspose k20 stride 10", "ups.0 as a polyphase kernel-2 conv")


def toolkit_probes(target: str = "rk3588", names: Sequence[str] | None = None, progress: bool = True) -> list[dict]:
    """One-op graphs at the trunk's shapes through the compiler: REGTASK lines and their largest value
    per shape (killed past PROBE_REGTASK_LIMIT lines), the evidence for the two toolkit rewrites."""
    import io

    from ... import cache

    rows = []
    torch.manual_seed(0)
    for name in tqdm(names or list(PROBES), desc="probes", disable=not shows_progress(progress)):
        factory, shape, verdict = PROBES[name]
        buf = io.BytesIO()
        with torch.no_grad():
            torch.onnx.export(factory().eval(), (torch.zeros(shape),), buf, input_names=["x"], output_names=["y"],
                              opset_version=17, dynamo=False)
        path = cache.cached_bytes("kokoro_probes", re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_"),
                                  buf.getvalue(), ".onnx")
        report = build_engine(path, target, regtask_limit=PROBE_REGTASK_LIMIT)
        rows.append({"probe": name, "shape": "x".join(map(str, shape)), "expected": verdict, **report.row()})
    return rows


def simulator_columns(got: np.ndarray | None, reference: np.ndarray | None) -> dict:
    """The simulator's output on one window against fp32: non-finite count, RMS, peak, SNR (empty when
    there is no output: the build failed, or the row is a build alone)."""
    if got is None:
        return dict.fromkeys(("nonfinite", "sim_rms", "fp32_rms", "sim_max_abs", "snr_vs_fp32_db"))
    finite = np.isfinite(got)
    clean = np.where(finite, got, 0.0)
    rms = lambda a: float(np.sqrt(np.mean(np.asarray(a, np.float64) ** 2)))
    return {"nonfinite": int(got.size - finite.sum()), "sim_rms": rms(clean), "fp32_rms": rms(reference),
            "sim_max_abs": float(np.max(np.abs(clean))),
            "snr_vs_fp32_db": gates.snr_db(reference, clean) if finite.all() else float("nan")}


def _cpu_ops(log: str) -> str:
    """The ops a build left on the CPU, from its verbose log's layer table ("" without a log)."""
    return cpu_ops(layer_table(Path(log).read_text(encoding="utf-8", errors="replace"))) if Path(log).is_file() else ""


def build_row(produced: Produced, report: BuildReport, got: np.ndarray | None = None,
              reference: np.ndarray | None = None) -> dict:
    """The build row (REGTASK lines and largest value, engine size, build time, child peak), the ops
    left on the CPU, and the simulator's output `got` against onnxruntime fp32 (`reference`) on the same
    graph and window: a row with simulator columns is a simulator row, a build alone a host row."""
    c = produced.contract
    inner = c.params["inner_frames"]
    walk = generator.inner_window_starts(c.window.frames, inner, c.window.context) if c.params["max_axis"] else []
    row = {"window": c.window.frames, "fine_axis": FINE * c.window.frames + 1, "rewrites": c.params["rewrites"],
           "max_axis": c.params["max_axis"], "inner_frames": inner, "inner_windows": len(walk) or 1,
           "graph": f"in-graph walk: {len(walk)} windows of {inner}, batched" if len(walk) > 1 else "one window",
           "longest_axis": produced.census.longest_axis, **report.row(), "cpu_ops": _cpu_ops(report.log),
           **simulator_columns(got, reference)}
    row["where"], row["target"] = ("simulator" if got is not None else HOST.where), report.target
    return row


@dataclass(frozen=True)
class SweepBuild:
    """One build of the sweep: a window for a target, with its rewrites and in-graph walk."""

    frames: int
    target: str = "rk3588"
    rw: Rewrites = ENGINE
    max_axis: int | None = None
    regtask_limit: int = REGTASK_LIMIT
    timeout: float = BUILD_TIMEOUT_S  # a build past it is killed and its row says timeout (a bounded run)


def case_graph(model: KokoroModel, case: SweepBuild, context: int = DEFAULT_CONTEXT) -> Produced:
    return produce(case.frames, min(context, (case.frames - 1) // 2), case.rw, max_axis=case.max_axis, model=model)


def probe_feed(utt: frontend.Utterance, produced: Produced) -> dict:
    """The sweep's window: the last window of the walk over `utt` (a padded window where the engine is
    wider than the utterance)."""
    w = produced.contract.window
    return last_window_feed(utt, w.frames, w.context) if utt.frames >= w.frames else \
        window_feed(utt.x, utt.har, utt.style, 0, utt.frames, w.frames)


def simulate_case(produced: Produced, case: SweepBuild, feeds: Sequence[dict]) -> Simulated:
    """One verbose build of the case (the layer table names the CPU ops) through the content-keyed
    simulator cache (rkstudy.toolkit.simulator.simulate): any later ask for the same graph, target and
    feeds, in this notebook or another, reads the recorded outputs instead of building again."""
    return simulate(produced.path, case.target, feeds, verbose=True, regtask_limit=case.regtask_limit,
                    timeout=case.timeout)


def sweep(model: KokoroModel, cases: Sequence[SweepBuild], utt: frontend.Utterance, *, context: int = DEFAULT_CONTEXT,
          progress: bool = True, extra_feeds: dict[int, list[dict]] | None = None):
    """Build each case once and simulate it on the last window of the walk over `utt` (probe_feed), and
    for case i also on `extra_feeds[i]` (the windows of a walk, so that walk needs no second build).
    Returns the rows and each case's (produced, Simulated)."""
    rows, made = [], []
    for i, case in enumerate(tqdm(cases, desc="builds", disable=not shows_progress(progress))):
        produced = case_graph(model, case, context)
        feed = probe_feed(utt, produced)
        sim = simulate_case(produced, case, [feed, *(extra_feeds or {}).get(i, [])])
        got = sim.outputs[0][0] if sim.outputs else None
        reference = OrtRunner(produced.path).run(feed)[0] if got is not None else None
        rows.append({**build_row(produced, sim.report, got, reference), "regtask_limit": case.regtask_limit})
        if sim.inference_error:  # built, but the simulator refused to run it
            rows[-1]["error"] = sim.inference_error[:160]
        if sim.report.ok:
            rows[-1]["converter_peak_mb"] = round(sim.peak_rss_mb, 1)  # build and simulator, the child's whole life
        made.append((produced, sim))
    return rows, made


IN_GRAPH_AXIS = FINE * 134 + 1  # the in-graph window's longest axis: inner windows of 134 frames


def in_graph_pieces(model: KokoroModel, utt: frontend.Utterance, target: str = "rk3588", frames: int = 256,
                    max_axis: int = IN_GRAPH_AXIS, context: int = DEFAULT_CONTEXT) -> list[dict]:
    """Is the batched in-graph window's fp16 cost the batch or the window? The last W = `frames` window of
    the walk over `utt` three ways in the simulator, each emitted piece against onnxruntime fp32 on the same
    graph: the in-graph engine; each inner window alone through the one-window engine of the inner width;
    the one-window W = `frames` engine. The first and last are the sweep's builds on the sweep's window
    (answered by the simulator cache when the sweep ran); the inner-width engine is one more build."""
    inner = inner_frames(max_axis)
    first = plan_windows(utt.frames, frames - 2 * context, context)[-1].start  # the W = `frames` window's frame 0
    walk = generator.InGraphWalk(model.trunk(generator.ENGINE, clamp_count=True), frames, inner, context)

    def simulated(case: SweepBuild, feeds: list[dict]) -> list[tuple[np.ndarray, np.ndarray]]:
        produced = case_graph(model, case, context)
        sim = simulate_case(produced, case, feeds)
        sim.report.raise_for_status()
        if sim.inference_error:
            raise RuntimeError(f"the simulator refused {Path(produced.path).name}: {sim.inference_error}")
        ort = OrtRunner(produced.path)
        return [(ort.run(f)[0], out[0]) for f, out in zip(feeds, sim.outputs)]

    feed = last_window_feed(utt, frames, context)
    (walked,) = simulated(SweepBuild(frames, target, max_axis=max_axis), [feed])
    (whole,) = simulated(SweepBuild(frames, target), [feed])
    feeds = [window_feed(utt.x, utt.har, utt.style, first + a, inner, inner) for a in walk.starts]
    alone = dict(zip(walk.starts, simulated(SweepBuild(inner, target), feeds)))
    rows = []
    for w in walk.plan:
        last = 1 if w.emit_stop == frames else 0
        out = slice(FINE * w.emit_start, FINE * w.emit_stop + last)  # columns of the W = `frames` output
        own = slice(FINE * w.offset, FINE * (w.offset + w.emit_stop - w.emit_start) + last)  # the same in its window
        ref_in, got_in = walked[0][..., out], walked[1][..., out]
        ref_one, got_one = alone[w.start][0][..., own], alone[w.start][1][..., own]
        rows.append({"utterance": utt.name, "window": frames, "inner_frames": inner, "inner_start": w.start,
                     "emit_start": w.emit_start, "emit_stop": w.emit_stop,
                     "fp32_in_graph_vs_inner_window_db": gates.snr_db(ref_one, ref_in),
                     "sim_in_graph_db": gates.snr_db(ref_in, got_in),
                     "sim_inner_window_alone_db": gates.snr_db(ref_one, got_one),
                     f"sim_one_window_w{frames}_db": gates.snr_db(whole[0][..., out], whole[1][..., out]),
                     "where": "simulator", "target": target})
    return rows
