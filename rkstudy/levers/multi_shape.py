"""Multi-shape engines against single-shape ladders: rknn-toolkit2's config(dynamic_input=[...]).

A width ladder (the Piper encoder's four widths, the flow estimator's sequence buckets) is today one
engine per width. rknn-toolkit2 2.5.0 can compile several input shape sets into one engine
(`config(dynamic_input=[[shape of each input], ...])`, "experimental" in its docstring); the simulator
and RKNNLite then run it at exactly those sets and refuse any other ("The inputs[0].shape [1, 8, 24]
is not in [[1, 8, 32], [1, 8, 16]]!" in the simulator; rknn_set_input_shapes fails on a board).

Per graph this measures both forms on the same fp32 reference: engine bytes on disk, the compiler's
memory plan (internal arena and weights, from the verbose build log, which prints one plan per shape
set: the table keeps the largest, the MaxShape's, and each width's arena; the toolkit's eval_memory
says "Not support in simulator environment" off-board),
build seconds and converter peak, and simulator SNR at every width. `prefer_multi_shape` reads the
measured summary row and is what the encoder ladder asks (rkstudy.families.piper_encoder.study).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import gates
from ..cache import cache_dir, digest
from ..errors import one_line
from ..paths import RESULTS
from ..runtime import OrtRunner
from ..tables.results import HOST, read_table
from ..toolkit.log import memory_plans
from ..toolkit.simulator import SimulatorRunner

MULTI = "one multi-shape engine"
SINGLE = "single-shape engines"
# the multi-shape engine may lose this much worst-width SNR against the single engines and still win
SNR_TOLERANCE_DB = 1.0
TEXT_COLUMNS = ("graph", "widths", "multi_status", "multi_error", "choice", "why")


@dataclass
class ShapeLadder:
    """One width ladder measured both ways at `widths`: `shapes(w)` its input shapes, `single(w)` the graph a
    width-w engine is compiled from, `multi` the graph the multi-shape engine is compiled from (the
    widest single graph, or a graph with dynamic axes), `feed(w)` one input at width w and
    `score(w, feed, outputs)` the SNR in dB of those outputs against fp32."""

    graph: str
    widths: tuple[int, ...]
    shapes: Callable[[int], dict[str, list[int]]]
    single: Callable[[int], Path]
    multi: Path
    feed: Callable[[int], dict[str, np.ndarray]]
    score: Callable[[int, dict, list], float]


def _build(ladder: ShapeLadder, onnx: Path, widths: Sequence[int], target: str, folder: Path) -> tuple[dict, dict]:
    """One engine serving `widths` (one width: a single-shape build); its build row and {width: (snr,
    output shapes)} (empty when the build failed: the row's status and error are the toolkit's)."""
    many = len(widths) > 1
    kwargs = {"shape_sets": [ladder.shapes(w) for w in widths]} if many else {"shapes": ladder.shapes(widths[0])}
    out = folder / f"{'multi' if many else 'single'}-{'-'.join(map(str, widths))}.rknn"
    runner = SimulatorRunner(onnx, target, out=out, keep_failed=True, verbose=True, **kwargs)
    report = runner.report
    scores = {}
    try:
        if report.ok:
            for w in widths:
                feed = ladder.feed(w)
                outs = runner.run(feed)
                scores[w] = (ladder.score(w, feed, outs), " ".join("x".join(map(str, o.shape)) for o in outs))
    finally:
        runner.close()  # the log is complete only once the child's reader has finished
    log = Path(report.log).read_text(errors="replace") if report.log and Path(report.log).is_file() else ""
    plans = memory_plans(log)  # one per shape set, in the sets' order (largest first)
    row = {"graph": ladder.graph, "engine": MULTI if many else SINGLE, "widths": ",".join(map(str, widths)),
           "status": report.status, "engine_bytes": report.engine_bytes,
           "plan_internal_bytes": max(p.internal_bytes for p in plans) if plans else "",
           "plan_weight_bytes": max(p.weight_bytes for p in plans) if plans else "",
           "plan_internal_per_width": " ".join(f"{w}:{p.internal_bytes}" for w, p in zip(widths, plans)),
           "build_s": round(report.seconds, 1), "converter_peak_mb": round(report.peak_rss_mb, 1),
           "failed_step": report.failed_step or "", "error": one_line(report.error or "", 160),
           "built_with": report.toolkit_version, "where": HOST.where, "target": target}
    return row, scores


def compare(ladder: ShapeLadder, target: str = "rk3588", singles_after_failure: bool = False
            ) -> tuple[list[dict], list[dict]]:
    """Build rows (the multi-shape engine, then one single-shape engine per width) and SNR rows (per
    width, both forms). When the multi-shape build fails, its row (the toolkit's message) is the
    comparison's outcome and the single engines, which the graph's own study builds and scores,
    are built here only if `singles_after_failure`."""
    builds, snr = [], {}
    with tempfile.TemporaryDirectory(prefix="rkstudy-multi-shape-") as tmp:
        row, scores = _build(ladder, ladder.multi, sorted(ladder.widths, reverse=True), target, Path(tmp))
        builds.append(row)
        snr[MULTI] = scores
        snr[SINGLE] = {}
        for w in sorted(ladder.widths) if row["status"] == "ok" or singles_after_failure else ():
            row, scores = _build(ladder, ladder.single(w), [w], target, Path(tmp))
            builds.append(row)
            snr[SINGLE].update(scores)
    if not snr[MULTI] and not snr[SINGLE]:
        return builds, []
    rows = []
    for w in sorted(ladder.widths):
        m, s = snr[MULTI].get(w), snr[SINGLE].get(w)
        rows.append({"graph": ladder.graph, "width": w,
                     "multi_snr_db": round(m[0], 2) if m else "", "single_snr_db": round(s[0], 2) if s else "",
                     "multi_outputs": m[1] if m else "", "single_outputs": s[1] if s else "",
                     "where": "simulator", "target": target})
    return builds, rows


def summary(builds: Sequence[dict], snr: Sequence[dict]) -> list[dict]:
    """Per graph, the two forms side by side (the single-shape ladder's totals: every rung resident)
    and the choice `prefer_multi_shape` makes from them."""
    out = []
    for graph in dict.fromkeys(b["graph"] for b in builds):
        multi = next(b for b in builds if b["graph"] == graph and b["engine"] == MULTI)
        singles = [b for b in builds if b["graph"] == graph and b["engine"] == SINGLE]
        widths = [r for r in snr if r["graph"] == graph]
        worst = lambda key, rows=widths: _all_or_blank(min, [r[key] for r in rows])  # noqa: E731
        total = lambda key, rows=singles: _all_or_blank(sum, [r[key] for r in rows])  # noqa: E731
        row = {"graph": graph, "widths": multi["widths"], "multi_status": multi["status"],
               "multi_error": multi["error"], "multi_engine_bytes": multi["engine_bytes"],
               "single_engines": len(singles), "single_total_bytes": total("engine_bytes"),
               "multi_plan_internal_bytes": multi["plan_internal_bytes"],
               "single_plan_internal_total_bytes": total("plan_internal_bytes"),
               "multi_plan_weight_bytes": multi["plan_weight_bytes"],
               "single_plan_weight_total_bytes": total("plan_weight_bytes"),
               "multi_build_s": multi["build_s"],
               "single_build_total_s": round(t, 1) if (t := total("build_s")) != "" else "",
               "multi_converter_peak_mb": multi["converter_peak_mb"],
               "single_converter_peak_max_mb": max((b["converter_peak_mb"] for b in singles), default=""),
               "multi_worst_snr_db": worst("multi_snr_db"), "single_worst_snr_db": worst("single_snr_db")}
        choice, why = choose(row)
        out.append({**row, "choice": choice, "why": why, "where": HOST.where, "target": multi["target"]})
    return out


def _all_or_blank(fold, values: Sequence):
    """fold(values), or blank when any value is (a width or an engine that has no measurement)."""
    return fold(values) if values and all(v != "" for v in values) else ""


def choose(row: Mapping) -> tuple[str, str]:
    """(the form a ladder should use, why), from a summary row: the multi-shape engine when it built,
    runs every width within SNR_TOLERANCE_DB of the single engines' worst, and is smaller on disk
    than all of them together; else the single-shape engines."""
    if row["multi_status"] != "ok":
        return SINGLE, f"the multi-shape build failed: {row['multi_error'] or row['multi_status']}"
    if row["multi_worst_snr_db"] == "" or row["single_worst_snr_db"] == "":
        return SINGLE, "a width has no simulator SNR to compare"
    if row["multi_worst_snr_db"] < row["single_worst_snr_db"] - SNR_TOLERANCE_DB:
        return SINGLE, (f"worst-width SNR {row['multi_worst_snr_db']} dB against {row['single_worst_snr_db']} dB "
                        f"(more than {SNR_TOLERANCE_DB:g} dB lost)")
    if row["single_total_bytes"] == "" or row["multi_engine_bytes"] >= row["single_total_bytes"]:
        return SINGLE, f"{row['multi_engine_bytes']} B is not smaller than {row['single_total_bytes']} B"
    return MULTI, (f"{row['multi_engine_bytes'] / row['single_total_bytes']:.0%} of the bytes of "
                   f"{row['single_engines']} engines at worst-width SNR {row['multi_worst_snr_db']} dB "
                   f"(theirs {row['single_worst_snr_db']} dB)")


def measured(graph: str, root: Path = RESULTS) -> dict | None:
    """The committed summary row of `graph` (results/toolkit_levers/multi_shape.csv, numbers parsed),
    or None where that table or its row is not there."""
    path = Path(root) / "toolkit_levers" / "multi_shape.csv"
    if not path.is_file():
        return None
    row = next((r for r in read_table(path) if r["graph"] == graph), None)
    if row is None:
        return None

    def number(text: str):
        try:
            return float(text) if text != "" else ""
        except ValueError:
            return text

    return {k: (v if k in TEXT_COLUMNS else number(v)) for k, v in row.items()}


def prefer_multi_shape(row: Mapping | None) -> bool:
    """Whether a measured summary row (or none: no measurement) says the ladder should use one
    multi-shape engine."""
    return row is not None and choose(row)[0] == MULTI


# --- the graphs ---------------------------------------------------------------------------------
def conv_ladder(widths: Sequence[int], channels: int = 64, layers: int = 4) -> ShapeLadder:
    """A small Conv1d stack ([1, C, T] -> [1, C, T], k=5, ReLU between) with a dynamic T: the graph
    every toolkit can build at several lengths, so the lever itself is measured apart from any
    graph's baked shapes."""
    import onnx
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    path = cache_dir("multi_shape") / f"conv_c{channels}_l{layers}-{digest(channels, layers, 1)[:12]}.onnx"
    if not path.exists():
        nodes, inits, x = [], [], "x"
        for i in range(layers):
            w = rng.normal(0, (1.0 / (channels * 5)) ** 0.5, (channels, channels, 5)).astype(np.float32)
            inits.append(helper.make_tensor(f"w{i}", TensorProto.FLOAT, w.shape, w.ravel()))
            y = "y" if i == layers - 1 else f"h{i}"
            nodes.append(helper.make_node("Conv", [x, f"w{i}"], [y if i == layers - 1 else f"c{i}"], pads=[2, 2]))
            if i < layers - 1:
                nodes.append(helper.make_node("Relu", [f"c{i}"], [y]))
            x = y
        g = helper.make_graph(nodes, "conv_stack",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, "T"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, "T"])], inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
        m.ir_version = 8
        onnx.save(m, str(path))
    fp32 = OrtRunner(path)

    def feed(w):
        return {"x": np.random.default_rng(w).normal(size=(1, channels, w)).astype(np.float32)}

    return ShapeLadder(graph=f"conv stack (C={channels}, {layers} layers)", widths=tuple(widths),
                 shapes=lambda w: {"x": [1, channels, w]}, single=lambda w: path, multi=path, feed=feed,
                 score=lambda w, f, outs: gates.snr_db(fp32.run(f)[0], outs[0]))
