"""Quantization as a lever (host): fp16, int8, hybrid and auto-hybrid builds of one stage, scored in the
simulator against fp32 on data the calibration never saw, with the share of the stage's MACs that
runs in int8.

Why: the NPU is rated for int8, fp16 runs at a fraction of it, and a plain int8 build of a decoder can
lose it whole (the Piper decoder window at 6-8 dB against fp32). Which layers cost it is what the
toolkit's per-layer report (rknn.accuracy_analysis) says; keeping the worst of them in float16
(rkstudy.build.Calibration keep_fp16) and counting the MACs left in int8 shows how much of int8's
speed a given fidelity costs. A family supplies a Stage: its engine graph, calibration feeds from its
own real data, and evaluation items held apart from them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import cache, graph
from .build import Calibration
from .graph.delays import conv_macs_by_node
from .runtime import OrtRunner, SimulatorRunner
from .toolkit.log import IO_OPS, Layer, layer_table

CONVERT_OPS = ("exDataConvert",)  # the dtype casts a hybrid engine inserts between int8 and fp16 layers


@dataclass
class Stage:
    """One stage to quantize: its engine graph, the calibration feeds ({input: array} per sample,
    what the engine really sees), the evaluation items (never among the calibration's sources),
    `walk(runner, item) -> 1-D output` that runs an item through any runner, and `score(refs, tests)
    -> {column: value}` over all items' outputs (per window and per utterance SNR for a decoder)."""

    name: str
    onnx: Path
    calibration: list[Mapping[str, np.ndarray]]
    evaluation: list
    walk: Callable
    score: Callable[[list, list], dict]
    texts: dict = field(default_factory=dict)


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
    error that layer adds by itself."""
    from .engine import accuracy_analysis

    names = list(graph.input_shapes(stage.onnx))
    out = cache.cache_dir("analysis") / f"{stage.onnx.stem}-{target}-{calibration.key(names)}-{feed}"
    analysis = accuracy_analysis(stage.onnx, target, dict(stage.calibration[feed]), out_dir=out, quantize=calibration)
    rows = sorted(analysis.rows, key=lambda r: (not r["overflow"], r["single_cos"]))
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
          auto_thresholds: Sequence[float] = (), algorithm: str = "normal",
          progress: Callable[[str], None] | None = None) -> tuple[list[dict], list[dict]]:
    """fp16, int8 w8a8, hybrid with the `hybrid_counts` layers rank_layers puts worst kept in float16,
    and auto-hybrid at each cosine threshold, all calibrated on the stage's calibration feeds and
    scored on its evaluation items. Returns (one row per setting, the layer ranking the hybrids used)."""
    say = progress or (lambda _: None)
    fp32 = OrtRunner(stage.onnx)
    refs = [np.asarray(stage.walk(fp32, item)).reshape(-1) for item in stage.evaluation]
    plain = Calibration(stage.calibration, algorithm=algorithm)
    settings: list[tuple[str, Calibration | None]] = []
    if fp16:
        settings.append(("fp16", None))
    if int8:
        settings.append((plain.label, plain))
    ranking: list[dict] = []
    if hybrid_counts:
        say(f"{stage.name}: ranking layers (accuracy_analysis of the int8 build)")
        ranking = rank_layers(stage, target, plain)
        worst = [r["layer"] for r in ranking]
        settings += [(f"hybrid {n}", Calibration(stage.calibration, algorithm=algorithm, keep_fp16=worst[:n]))
                     for n in hybrid_counts]
    settings += [(f"auto-hybrid cos {t:g}", Calibration(stage.calibration, algorithm=algorithm, auto_hybrid_cos=t))
                 for t in auto_thresholds]
    rows = []
    for setting, quantize in settings:
        say(f"{stage.name}, {target}: {setting}")
        rows.append(measure(stage, target, quantize, refs, setting))
    return rows, ranking
