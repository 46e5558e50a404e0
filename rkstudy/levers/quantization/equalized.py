"""Equalized before quantizing (host): one stage's quantization curve with and without cross-layer
equalization, per SoC, scored on an evaluation of its own held apart from the calibration and the search.

Why its own evaluation: the lever's rows steer and score on a few seconds of speech, where a text's own
PESQ-WB spread is larger than the 0.1 bar (up to 0.21 between texts), so the goal is judged here on
longer speech no calibration or search step has seen, on both graphs at the same settings.

The rewrite is rkstudy.graph.equalize's (`EQUALIZATION`: per-channel scales from the calibration's
activation ranges, moved through every conv -> LeakyReLU -> conv pair and every HiFi-GAN residual stream
with its upsampler), checked against float64 on calibration and held-out windows before it returns: in
fp32 the equalized graph is the original. Both graphs then go through the same Bench as every other row:

* fp16 of the original (the bar: PESQ-WB within FP16_LIKE_PESQ of it);
* every plain quantized dtype the target builds, of `dtypes`;
* on the first target, each of `blocks` alone on low-bit weights, the rest float16 (the block that breaks);
* on the first target, PATH_POINTS of the search path's points evenly spread and its cheapest point at each
  bar (the fp16 groups the lever's search chose, carried into this calibration's config), so each graph
  draws the same curve; on the other targets, the cheapest point at each bar, as the lever carries them.

`ranges` and `layers` are the quantizer's side of it off the toolkit (rkstudy.graph.quantsim): per block,
what one 8-bit grid per tensor leaves each channel, and each conv's error alone, before and after.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ... import cache, graph
from ...graph import equalize as eq
from ...graph import quantsim
from ...toolkit.calibration import Calibration
from .bench import Bench
from .curves import FP16_LIKE_PESQ, GOOD_PESQ, cheapest
from .run import at_floors, keep_for
from .search import refiner
from .stages import Stage, evenly
from .tensors import config_groups

EQUALIZATION = {"method": "activations", "alpha": 1.0}  # each channel's activation range evened out
ORIGINAL, EQUALIZED = "original", "equalized"
CALIBRATION_SAMPLES = 16  # the lever's default calibration (rkstudy.levers.quantization.run.DEFAULT_SAMPLES)
LOW_BITS = ("w8a8", "w4a16")  # plain dtypes with weights of 8 bits or fewer
PATH_POINTS = 6  # of the search path, evenly spread, beside its cheapest point at each bar: the curve's points


@dataclass
class EqualizedRun:
    """What `compare` measured: every build row (`rows`, a `graph` column naming the variant), the cheapest
    setting per SoC and graph at each bar (`cheapest`), what the pass equalized or skipped (`groups`), its
    exactness against float64 (`exactness`), the per-block activation ranges and conv errors of both graphs
    (`ranges`, `layers`), and the minutes it took."""

    stage: Stage
    rows: list[dict] = field(default_factory=list)
    cheapest: list[dict] = field(default_factory=list)
    groups: list[dict] = field(default_factory=list)
    exactness: list[dict] = field(default_factory=list)
    ranges: list[dict] = field(default_factory=list)
    layers: list[dict] = field(default_factory=list)
    minutes: float = 0.0


def equalized_graph(stage: Stage, feeds: Sequence[Mapping[str, np.ndarray]],
                    check: Sequence[Mapping[str, np.ndarray]]) -> tuple[Path, eq.Equalized]:
    """The stage's graph equalized on `feeds` (its calibration) and verified exact on `check` (equalize
    refuses otherwise), stored in the cache by its bytes."""
    made = eq.equalize(stage.onnx, feeds, check=check, **EQUALIZATION)
    path = cache.cached_bytes("slices", f"{Path(stage.onnx).stem}-equalized", made.model.SerializeToString(), ".onnx")
    return path, made


def block_of(stage: Stage) -> Callable[[str], str]:
    """A node's (or tensor's) block as the lever's search groups them; '/' where the exporter named no module."""
    from .tensors import module_of

    return lambda name: (stage.groups(module_of(name)) if stage.groups else module_of(name)) if module_of(name) else "/"


def range_rows(path: Path, feeds: Sequence[Mapping[str, np.ndarray]], label: str,
               block: Callable[[str], str], blocks: Sequence[str]) -> list[dict]:
    """Per block of `blocks`: its activation tensors' per-channel ranges on `feeds`, summarised: how many
    tensors, the median over them of the largest channel's range over the median channel's (`spread`), and
    the bits one 8-bit grid per tensor leaves unused in the mean channel and the worst (rkstudy.graph.
    quantsim.range_rows)."""
    model = graph.load(path)
    producers = {t: n.name for n in model.graph.node for t in n.output}
    tensors = [t for t in quantsim.activation_tensors(model) if block(producers.get(t, t)) in blocks]
    stats = eq.channel_stats(model, feeds, tensors)
    per = quantsim.range_rows(stats, tensors, lambda t: block(producers[t]))
    out = []
    for b in blocks:
        mine = [r for r in per if r["block"] == b]
        if mine:
            out.append({"graph": label, "block": b, "tensors": len(mine),
                        "spread_median": float(np.median([r["spread"] for r in mine])),
                        "bits_lost_mean": float(np.mean([r["bits_lost_mean"] for r in mine])),
                        "bits_lost_max": float(np.max([r["bits_lost_max"] for r in mine])),
                        "where": "fp32", "target": "none"})
    return out


def layer_rows(path: Path, feeds: Sequence[Mapping[str, np.ndarray]], label: str,
               block: Callable[[str], str], blocks: Sequence[str]) -> list[dict]:
    """Per block of `blocks`: each conv run alone on its fp32 input with 8-bit per-channel weights and 8-bit
    per-tensor input and output grids (rkstudy.graph.quantsim.layer_errors), summarised by the MAC-weighted
    mean SNR of each kind of error and the worst conv's."""
    per = quantsim.layer_errors(graph.load(path), feeds, block=block)
    out = []
    for b in blocks:
        mine = [r for r in per if r["block"] == b]
        if not mine:
            continue
        w = np.array([r["macs"] for r in mine], float)
        weighted = {key: float(np.sum(np.array([min(r[key], 200.0) for r in mine]) * w) / np.sum(w))
                    for key in ("snr_weights_db", "snr_input_db", "snr_output_db", "snr_db")}  # exact: 200 dB
        worst = min(mine, key=lambda r: r["snr_db"])
        out.append({"graph": label, "block": b, "convs": len(mine), "macs": int(w.sum()),
                    **weighted,
                    "worst_conv": worst["conv"], "worst_conv_snr_db": worst["snr_db"], "where": "host",
                    "target": "none"})
    return out


def _path_points(lever_rows: Sequence[Mapping], primary: str) -> list[tuple[str, str]]:
    """(setting, fp16 groups) of every search point the lever scored on its primary target, in search order."""
    points = sorted((r for r in lever_rows if r.get("target") == primary and r.get("from_search_on")
                     and isinstance(r.get("search_step"), int)), key=lambda r: r["search_step"])
    return list(dict.fromkeys((r["setting"], r["fp16_groups"]) for r in points))


def _at_bars(lever_rows: Sequence[Mapping], primary: str) -> list[tuple[str, str]]:
    """The path points with the largest low-bit share at or above each bar on the lever's own scores on its
    primary target (what the lever carries to its other targets)."""
    mine = [r for r in lever_rows if r.get("target") == primary]
    fp16 = next((r for r in mine if r.get("dtype") == "fp16" and isinstance(r.get("pesq_wb"), (int, float))), None)
    if fp16 is None:
        return []
    search = [r for r in mine if r.get("from_search_on")]
    return [(r["setting"], r["fp16_groups"]) for r in at_floors(search, (fp16["pesq_wb"] - FP16_LIKE_PESQ, GOOD_PESQ),
                                                                "pesq_wb")]


def compare(held_out: Stage, lever_rows: Sequence[Mapping], buildable: Mapping[str, Sequence[str]],
            targets: Sequence[str] = ("rk3588", "rk3576"), blocks: Sequence[str] = (),
            dtypes: Sequence[str] = LOW_BITS, progress: Callable[[str], None] | None = None) -> EqualizedRun:
    """Both graphs of `held_out` (its calibration, and an evaluation held apart from calibration and search)
    on each target: fp16, the plain `dtypes` the target builds (`buildable`: {target: dtypes}), on the first
    target each of `blocks` alone on low-bit weights, and the search path the lever drew from `lever_rows`
    (its primary target's points; on the others, its cheapest point at each bar), each scored on the full
    held-out evaluation; then the cheapest setting per target and graph at each bar (rkstudy.levers.
    quantization.curves.cheapest)."""
    say = progress or (lambda _: None)
    started = time.monotonic()
    run = EqualizedRun(held_out)
    feeds = evenly(held_out.calibration, CALIBRATION_SAMPLES)
    path, made = equalized_graph(held_out, feeds, check=feeds[:2])
    run.groups = [{"graph": EQUALIZED, **g.row(), "where": "host", "target": "none"} for g in made.groups]
    # the equalized graph and the original in onnxruntime fp32, each against float64
    run.exactness = [{"graph": EQUALIZED, **r, "where": "fp32", "target": "none"} for r in made.exactness]
    say(f"{held_out.name}: equalized {made.summary()['groups_equalized']} groups, "
        f"skipped {made.summary()['groups_skipped']}")
    graphs = {ORIGINAL: held_out, EQUALIZED: replace(held_out, onnx=path, outputs={})}
    block = block_of(held_out)
    studied = list(blocks) or sorted({block(n.name) for n in graph.load(held_out.onnx).graph.node} - {"/"})
    for label, stage in graphs.items():
        run.ranges += range_rows(stage.onnx, feeds, label, block, studied)
        run.layers += layer_rows(stage.onnx, feeds[:4], label, block, studied)
    primary = targets[0]
    bars = _at_bars(lever_rows, primary)
    curve = list(dict.fromkeys(evenly(_path_points(lever_rows, primary), PATH_POINTS) + bars))
    points = {target: curve if target == primary else bars for target in targets}
    for target in targets:
        fp16 = None
        rows: list[dict] = []
        for label, stage in graphs.items():
            bench = Bench(stage, target, progress=say)
            tag = (lambda setting, label=label: setting if label == ORIGINAL else f"equalized, {setting}")
            if label == ORIGINAL:
                fp16 = {**bench.build("fp16"), "graph": label}
                rows.append(fp16)
            for dtype in [d for d in dtypes if d in buildable.get(target, ())]:
                calibration = Calibration(feeds, dtype=dtype)
                with bench.session(calibration) as session:
                    rows.append({**session.measure([], tag(calibration.label)), "graph": label})
                    if dtype != "w8a8" or session.failed is not None:
                        continue
                    groups = config_groups(stage, session.quantized())
                    refine = refiner(stage, groups)
                    for b in (blocks if target == primary else ()):
                        keep = [t for g, names in groups.items() if g != b for t in names]
                        rows.append({**session.measure(keep, tag(f"{b} alone in int8"), groups=" + ".join(
                            g for g in groups if g != b)), "graph": label, "alone": b})
                    for setting, fp16_groups in points[target]:
                        keep = keep_for(groups, refine, fp16_groups)
                        if keep is not None:
                            rows.append({**session.measure(keep, tag(setting), groups=fp16_groups),
                                         "graph": label, "from_search_on": primary})
        run.rows += rows
        if fp16 is not None and fp16.get("status") == "ok":
            for label in graphs:
                mine = [r for r in rows if r["graph"] == label]
                run.cheapest += [{**r, "graph": label} for r in cheapest(mine, fp16)]
    run.minutes = round((time.monotonic() - started) / 60, 1)
    return run

