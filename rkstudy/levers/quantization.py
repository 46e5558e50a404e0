"""Quantization as a lever (host): fp16, int8, hybrid and auto-hybrid builds of one stage, scored in the
simulator against fp32 on data the calibration never saw, with the share of the stage's MACs that
runs in int8.

Why: the NPU is rated for int8, fp16 runs at a fraction of it, and a plain int8 build of a decoder can
lose it whole (the Piper decoder window at 6-8 dB against fp32). Which layers cost it is what the
toolkit's per-layer report (rknn.accuracy_analysis) says; keeping the worst of them in float16
(rkstudy.toolkit.build.Calibration keep_fp16) and counting the MACs left in int8 shows how much of int8's
speed a given fidelity costs. A family supplies a Stage: its engine graph, calibration feeds from its
own real data, and evaluation items held apart from them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import cache, gates, graph
from ..graph.delays import conv_macs_by_node
from ..runtime import OrtRunner, Recording
from ..toolkit.build import Calibration
from ..toolkit.log import IO_OPS, Layer, layer_table
from ..toolkit.simulator import SimulatorRunner

CONVERT_OPS = ("exDataConvert",)  # the dtype casts a hybrid engine inserts between int8 and fp16 layers
# what accuracy_analysis reports beside the layers: the graph's inputs and the casts at its inputs and
# outputs (an output's cast carries the output's name); no quantization config holds them
ANALYSIS_IO_OPS = ("Input",) + CONVERT_OPS


@dataclass
class Stage:
    """One stage to quantize: its engine graph, the calibration feeds ({input: array} per sample,
    what the engine really sees), the evaluation items (never among the calibration's sources),
    `walk(runner, item) -> 1-D output` that runs an item through any runner, and `score(refs, tests)
    -> {column: value}` over all items' outputs (per window and per utterance SNR for a decoder).
    `outputs` holds the last sweep's outputs per setting ("fp32" the reference), one 1-D array per
    evaluation item, for a notebook to listen to."""

    name: str
    onnx: Path
    calibration: list[Mapping[str, np.ndarray]]
    evaluation: list
    walk: Callable
    score: Callable[[list, list], dict]
    texts: dict = field(default_factory=dict)
    outputs: dict[str, list[np.ndarray]] = field(default_factory=dict)


def held_apart(calibration: Sequence[str], evaluation: Sequence[str]) -> None:
    """Refuse a quantization set-up whose calibration and evaluation share a source (a text, an
    utterance): a score on data the ranges were fitted to flatters the quantizer."""
    shared = sorted(set(calibration) & set(evaluation))
    if shared:
        raise ValueError(f"{', '.join(shared)} would both calibrate and score; hold the evaluation texts apart")


def recorded_feeds(onnx: Path, walk: Callable, items: Sequence) -> list[dict[str, np.ndarray]]:
    """Every feed `walk` hands an onnxruntime fp32 run of `onnx` over `items`, in order: a stage's
    calibration set is what its engine sees in a real walk (its windows with their padding, or its
    steps with the state the fp32 walk carried into them), not a tensor made up to fit its shapes."""
    recorder = Recording(OrtRunner(onnx))
    for item in items:
        walk(recorder, item)
    return recorder.feeds


def evenly(items: Sequence, k: int | None) -> list:
    """`k` of `items` evenly spread from first to last (all of them when k is None or covers them):
    a calibration set cut to what a build can afford still spans every sentence it was drawn from."""
    if k is None or len(items) <= k:
        return list(items)
    return [items[int(i)] for i in np.linspace(0, len(items) - 1, k).round()]


def span_scores(refs: Sequence[np.ndarray], tests: Sequence[np.ndarray],
                spans: Sequence[Sequence[tuple[int, int]]]) -> dict:
    """The score columns every stage reports: the SNR against fp32 of each window (`spans`: each
    evaluation item's [start, stop) sample ranges, one per window or step), its worst and median,
    and the SNR of all items' outputs back to back (`utterance_snr_db`)."""
    windows = [gates.snr_db(a[lo:hi], b[lo:hi]) for a, b, item in zip(refs, tests, spans) for lo, hi in item]
    return {"windows": len(windows), "window_snr_db_min": float(np.min(windows)),
            "window_snr_db_median": float(np.median(windows)),
            "utterance_snr_db": gates.snr_db(np.concatenate(refs), np.concatenate(tests))}


def _shapes(text: str) -> list[tuple[int, ...]]:
    return [tuple(int(d) for d in group.split(",") if d) for group in re.findall(r"\(([0-9,]*)\)", text)]


def layer_macs(layer: Layer) -> int:
    """Multiply-accumulates of one compiled conv layer (any op the compiler names Conv*: Conv,
    ConvAdd, ConvTanh, ConvTranspose, ...) from its table shapes, counted as
    rkstudy.graph.delays.conv_macs_by_node counts the ONNX node; 0 for any other layer."""
    if not layer.op.startswith("Conv"):
        return 0
    ins, out = _shapes(layer.inputs), _shapes(layer.output)
    if len(ins) < 2 or not out:
        return 0
    weight = ins[1]
    elements = ins[0] if layer.op.startswith("ConvTranspose") else out[0]
    return int(np.prod(elements)) * int(weight[1]) * int(np.prod(weight[2:]))


def int8_mac_share(model, layers: Sequence[Layer]) -> dict:
    """Which share of the conv MACs the compiled engine runs in int8, from its layer table (a verbose
    build). The compiler fuses, splits and renames convs (a gated conv becomes a ConvTanh and a
    ConvSigmoid named after the tensor they feed; a wide one becomes `_tile0` / `_tile1` layers over
    halves of its input channels), so each conv layer's MACs come from its own table shapes.
    `coverage` is the table's conv MACs over the graph's (rkstudy.graph.delays.conv_macs_by_node):
    1.0 when the table accounts for every conv."""
    int8, total, fp16 = 0, 0, []
    for layer in layers:
        macs = layer_macs(layer)
        if not macs:
            continue
        total += macs
        if layer.dtype == "INT8":
            int8 += macs
        else:
            fp16.append(layer.name)
    graph_macs = sum(conv_macs_by_node(graph.load(model)).values())
    return {"conv_macs": graph_macs, "int8_macs": int8, "int8_mac_share": int8 / total if total else 0.0,
            "coverage": total / graph_macs if graph_macs else 0.0, "fp16_convs": fp16}


def float16_layers(layers: Sequence[Layer]) -> list[str]:
    """The compute layers a compiled engine runs in FLOAT16 (its I/O rows and dtype casts left out)."""
    return [layer.name for layer in layers if layer.dtype == "FLOAT16" and layer.op not in IO_OPS + CONVERT_OPS]


def rank_layers(stage: Stage, target: str, calibration: Calibration, feed: int = 0) -> list[dict]:
    """The toolkit's per-layer report of the int8 build (rknn.accuracy_analysis on the simulator, fed
    calibration sample `feed`, so the evaluation data stay unseen), worst first: a layer whose range
    overflowed, then by the cosine of its output computed alone from fp32 inputs (`single_cos`), the
    error that layer adds by itself. The inputs and the casts the report lists beside the layers are
    left out: a hybrid cannot keep them in float16."""
    from ..toolkit.convert import accuracy_analysis

    names = list(graph.input_shapes(stage.onnx))
    out = cache.cache_dir("analysis") / f"{stage.onnx.stem}-{target}-{calibration.key(names)}-{feed}"
    analysis = accuracy_analysis(stage.onnx, target, dict(stage.calibration[feed]), out_dir=out, quantize=calibration)
    rows = sorted((r for r in analysis.rows if r["op"] not in ANALYSIS_IO_OPS),
                  key=lambda r: (not r["overflow"], r["single_cos"]))
    return [{"rank": i + 1, **r, "where": "simulator", "target": target} for i, r in enumerate(rows)]


def measure(stage: Stage, target: str, quantize: Calibration | None, refs: list, setting: str) -> dict:
    """Build `stage` for `target` (fp16 when `quantize` is None) with the layer table, walk every
    evaluation item through the simulator and score it against the fp32 `refs`: one row with the
    build's dtype, engine bytes, the int8 share of the conv MACs and the layers left in float16."""
    names = list(graph.input_shapes(stage.onnx))
    key = cache.digest(stage.onnx, target, quantize.key(names) if quantize else "fp16")
    out = cache.cache_dir("engines", "quantize") / f"{stage.onnx.stem}-{target}-{key}.rknn"
    with SimulatorRunner(stage.onnx, target, out=out, quantize=quantize, verbose=True) as sim:
        tests = [np.asarray(stage.walk(sim, item)).reshape(-1) for item in stage.evaluation]
        report = sim.report
    stage.outputs[setting] = tests
    layers = layer_table(Path(report.log).read_text(encoding="utf-8", errors="replace"))
    share = int8_mac_share(stage.onnx, layers)
    fp16 = float16_layers(layers)
    return {"stage": stage.name, "setting": setting, "dtype": report.dtype, **stage.score(refs, tests),
            "engine_bytes": report.engine_bytes, "int8_mac_share": round(share["int8_mac_share"], 4),
            "conv_macs": share["conv_macs"], "mac_coverage": round(share["coverage"], 4),
            "fp16_layers": len(fp16), "fp16_convs": " ".join(share["fp16_convs"]) if quantize else "",  # fp16: all
            "kept_fp16": " ".join(quantize.keep_fp16) if quantize else "",
            "calibration_samples": len(quantize.feeds) if quantize else 0, **stage.texts,
            "regtask": report.regtask, "build_s": round(report.seconds, 1), "where": sim.where, "target": target}


def sweep(stage: Stage, target: str, *, fp16: bool = True, int8: bool = True, hybrid_counts: Sequence[int] = (),
          hybrid_groups: Mapping[str, Callable[[dict], bool]] | None = None, auto_thresholds: Sequence[float] = (),
          algorithm: str = "normal", progress: Callable[[str], None] | None = None) -> tuple[list[dict], list[dict]]:
    """fp16, int8 w8a8, hybrid with the `hybrid_counts` layers rank_layers puts worst kept in float16,
    hybrid with each of `hybrid_groups` kept in float16 (label -> which rows of the ranking belong to
    it: a block of the graph, to ask which part of it costs the fidelity), and auto-hybrid at each
    cosine threshold, all calibrated on the stage's calibration feeds and scored on its evaluation
    items. Returns (one row per setting, the layer ranking the hybrids used)."""
    say = progress or (lambda _: None)
    fp32 = OrtRunner(stage.onnx)
    refs = [np.asarray(stage.walk(fp32, item)).reshape(-1) for item in stage.evaluation]
    stage.outputs["fp32"] = refs
    plain = Calibration(stage.calibration, algorithm=algorithm)
    settings: list[tuple[str, Calibration | None]] = []
    if fp16:
        settings.append(("fp16", None))
    if int8:
        settings.append((plain.label, plain))
    ranking: list[dict] = []
    if hybrid_counts or hybrid_groups:
        say(f"{stage.name}: ranking layers (accuracy_analysis of the int8 build)")
        ranking = rank_layers(stage, target, plain)
        worst = [r["layer"] for r in ranking]
        settings += [(f"hybrid {n}", Calibration(stage.calibration, algorithm=algorithm, keep_fp16=worst[:n]))
                     for n in hybrid_counts]
        settings += [(f"hybrid {label}", Calibration(stage.calibration, algorithm=algorithm,
                                                     keep_fp16=[r["layer"] for r in ranking if member(r)]))
                     for label, member in (hybrid_groups or {}).items()]
    settings += [(f"auto-hybrid cos {t:g}", Calibration(stage.calibration, algorithm=algorithm, auto_hybrid_cos=t))
                 for t in auto_thresholds]
    rows = []
    for setting, quantize in settings:
        say(f"{stage.name}, {target}: {setting}")
        rows.append(measure(stage, target, quantize, refs, setting))
    return rows, ranking


GOAL_SNR_DB, GOAL_INT8_SHARE = 35.0, 0.8  # an engine worth shipping: near fp16's fidelity at most of int8's speed


def goal_rows(rows: Sequence[Mapping], snr_db: float = GOAL_SNR_DB, share: float = GOAL_INT8_SHARE) -> list[dict]:
    """One row per stage of a sweep's rows: how close its settings came to `snr_db` worst-window SNR
    with `share` of the conv MACs in int8, from both sides (the best SNR among the settings at that
    share, the largest share among the settings at that SNR), each with the setting that got it,
    and fp16 and plain int8 beside them. A side no setting reached is left empty."""
    out = []
    for stage in dict.fromkeys(r["stage"] for r in rows):
        mine = [r for r in rows if r["stage"] == stage]
        fast = [r for r in mine if r["int8_mac_share"] >= share]
        good = [r for r in mine if r["window_snr_db_min"] >= snr_db]
        best = max(fast, key=lambda r: r["window_snr_db_min"], default=None)
        widest = max(good, key=lambda r: r["int8_mac_share"], default=None)
        plain = {r["setting"]: r["window_snr_db_min"] for r in mine if r["setting"] in ("fp16", "int8 w8a8")}
        out.append({"stage": stage, "settings": len(mine), "fp16_window_snr_db_min": plain.get("fp16", ""),
                    "int8_window_snr_db_min": plain.get("int8 w8a8", ""),
                    f"best_snr_db_at_{share:g}_int8": best["window_snr_db_min"] if best else "",
                    f"best_at_{share:g}_int8_setting": best["setting"] if best else "",
                    f"best_int8_share_at_{snr_db:g}_db": widest["int8_mac_share"] if widest else "",
                    f"best_at_{snr_db:g}_db_setting": widest["setting"] if widest else "",
                    "goal_met": bool(best and best["window_snr_db_min"] >= snr_db),
                    "where": mine[0]["where"], "target": mine[0]["target"]})
    return out
