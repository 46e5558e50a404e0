"""The pieces of the equalization measurements on the Piper decoder window (research, not a study).

The graph variants (the window as the producer makes it, and equalized by rkstudy.graph.equalize with
each scale rule), their exactness against it, and two kinds of measurement:

* off the toolkit (`sim_*`): rkstudy.graph.quantsim's model of the quantizer in fp32 onnxruntime: the
  per-channel ranges of every decoder tensor, each conv's error alone, and the walked evaluation
  audio with the whole graph or one block quantized, scored against the fp32 walk (SNR, PESQ-WB,
  STOI, log-mel distance);
* with the toolkit (`builds`): the same variants built for rk3588 (w8a8, and each decoder stage
  alone in int8 with the rest in float16: what the quantization search's first step measured),
  rk3576 (w4a16) and rk3562 (w8a16), walked in the simulator and scored by
  rkstudy.levers.quantization.bench.Bench as notebook 08 scores (its rows, recorded in the cache).

Nothing here writes a committed table: rows go to build/equalize/.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from rkstudy import cache, gates, graph
from rkstudy.graph import equalize as eq
from rkstudy.graph import quantsim
from rkstudy.paths import REPO
from rkstudy.runtime import OrtRunner

OUT = REPO / "build" / "equalize"
SAMPLES = 16  # calibration windows, evenly spread: what notebook 08's default quantized build takes
STAGES = ("/dec stage 0", "/dec stage 1", "/dec stage 2")
# label -> equalize() arguments; None: the window as the producer makes it
VARIANTS: dict[str, dict | None] = {
    "original": None,
    "equalized, activation ranges": {"method": "activations", "alpha": 1.0},
    "equalized, activations and weights": {"method": "activations", "alpha": 0.5},
    "equalized, weight ranges (data-free)": {"method": "weights"},
}
SIM_CONFIGS = (  # (label, weight bits, activation bits[, a grid per channel]); None: that side stays fp32
    ("w8a8", 8, 8), ("w8 weights only", 8, None), ("a8 activations only", None, 8), ("w8a16", 8, 16),
    ("w4a16", 4, 16))
# no toolkit option: what the activations would lose if each channel had its own grid, the most any
# per-channel rescaling can win
BOUND_CONFIGS = (("w8a8, a grid per channel", 8, 8, True), ("a8 alone, a grid per channel", None, 8, True))


def stage(voice, quick: bool = False, evaluation_texts: Sequence[str] | None = None):
    """The quantization lever's view of the 93-frame window (rkstudy.families.piper_decoder.study):
    calibration windows walked from one text, evaluation latents of two others (or `evaluation_texts`);
    quick: one text each, the evaluation cut to one window."""
    from rkstudy.families.piper_decoder.study import EVALUATION_TEXTS, quantization_stage

    if quick:
        return quantization_stage(voice, calibration_texts=("short",), evaluation_texts=("phone",),
                                  evaluation_frames=93)
    return quantization_stage(voice, evaluation_texts=tuple(evaluation_texts or EVALUATION_TEXTS))


def block_of(onnx_path: Path) -> Callable[[str], str]:
    """A node's (or tensor's) block as the quantization search groups them: each decoder stage (its
    upsampler and resblocks), conv_pre, conv_post, each flow coupling; '/' for the exporter's unnamed
    nodes (the flows' gates)."""
    from rkstudy.families.piper_decoder.study import decoder_groups
    from rkstudy.levers.quantization.tensors import module_of

    groups = decoder_groups(onnx_path)
    return lambda name: groups(module_of(name)) if module_of(name) else "/"


def calibration(st, samples: int = SAMPLES) -> list[dict]:
    """The calibration windows a default quantized build takes (evenly spread over the stage's set)."""
    from rkstudy.levers.quantization.stages import evenly

    return evenly(st.calibration, samples)


def held_out(voice, st) -> list[dict]:
    """Every window the walker feeds the engine over the evaluation latents (never calibrated on)."""
    from rkstudy.families.piper_decoder.producer import read_contract
    from rkstudy.families.piper_decoder.study import walked_windows

    return walked_windows(voice, st.evaluation, read_contract(st.onnx))


def variants(st, feeds: Sequence[dict], check: Sequence[dict],
             labels: Sequence[str] = tuple(VARIANTS)) -> dict[str, tuple[Path, eq.Equalized | None]]:
    """{label: (ONNX path, what equalize made)} for each variant; each equalized graph verified exact on
    `check` (equalize refuses otherwise) and stored in the cache by its bytes."""
    out = {}
    for label in labels:
        args = VARIANTS[label]
        if args is None:
            out[label] = (Path(st.onnx), None)
            continue
        made = eq.equalize(st.onnx, feeds, check=check, **args)
        slug = label.split(", ", 1)[1].replace(" ", "_").replace("(", "").replace(")", "")
        out[label] = (cache.cached_bytes("slices", f"{Path(st.onnx).stem}-equalized-{slug}",
                                         made.model.SerializeToString(), ".onnx"), made)
    return out


def group_rows(made: eq.Equalized, label: str) -> list[dict]:
    """What the pass equalized and skipped on the graph, one row per group a conv writes or reads."""
    return [{"variant": label, **g.row()} for g in made.groups]


def exactness_rows(made: eq.Equalized, label: str) -> list[dict]:
    return [{"variant": label, **r} for r in made.exactness]


def range_rows(path: Path, feeds: Sequence[dict], label: str, block: Callable[[str], str]) -> list[dict]:
    """Per decoder tensor: its per-channel ranges on `feeds` and the bits a per-tensor 8-bit grid leaves
    its channels (rkstudy.graph.quantsim.range_rows)."""
    model = graph.load(path)
    producers = {t: n.name for n in model.graph.node for t in n.output}
    tensors = [t for t in quantsim.activation_tensors(model) if block(producers.get(t, t)).startswith("/dec")]
    stats = eq.channel_stats(model, feeds, tensors)
    return [{"variant": label, **r} for r in quantsim.range_rows(stats, tensors, lambda t: block(producers[t]))]


def layer_rows(path: Path, feeds: Sequence[dict], label: str, block: Callable[[str], str],
               weight_bits: int = 8, activation_bits: int = 8) -> list[dict]:
    return [{"variant": label, **r} for r in quantsim.layer_errors(graph.load(path), feeds, weight_bits=weight_bits,
                                                                 activation_bits=activation_bits, block=block)]


def _walk(st, runner) -> list[np.ndarray]:
    return [np.asarray(st.walk(runner, lat), np.float32).reshape(-1) for lat in st.evaluation]


def scores(st, refs: Sequence[np.ndarray], tests: Sequence[np.ndarray]) -> dict:
    """The evaluation's score columns (per window and per utterance SNR) and a listener's (PESQ-WB, STOI,
    log-mel distance) of the test walk against the fp32 walk of the original window."""
    return {**st.score(st.evaluation, refs, tests),
            **gates.perceptual(np.concatenate(refs), np.concatenate(tests), st.rate, absolute=False)}


def sim_rows(st, paths: dict[str, Path], feeds: Sequence[dict], block: Callable[[str], str],
             blocks: Sequence[str | None] = (None, *STAGES), configs=SIM_CONFIGS, fp32: bool = True,
             progress: Callable[[str], None] = print) -> list[dict]:
    """Each variant quantized by the model (rkstudy.graph.quantsim.quantized_model: the whole graph when
    the block is None, else that block alone with the rest fp32), ranges from `feeds`, walked over the
    evaluation and scored against the original window's fp32 walk."""
    refs = _walk(st, OrtRunner(st.onnx))
    rows = []
    for label, path in paths.items():
        model = graph.load(path)
        stats = eq.channel_stats(model, feeds, quantsim.activation_tensors(model))
        if fp32:
            rows.append({"variant": label, "quantized": "none (fp32)", "config": "fp32",
                         **scores(st, refs, _walk(st, OrtRunner(model)))})
        for where in blocks:
            for config, wbits, abits, *per_channel in configs:
                progress(f"{label}: {where or 'whole graph'} {config}")
                chosen = None if where is None else (lambda name, where=where: block(name) == where)
                q = quantsim.quantized_model(model, stats, wbits, abits, chosen, per_channel=bool(per_channel))
                rows.append({"variant": label, "quantized": where or "whole graph", "config": config,
                             **scores(st, refs, _walk(st, OrtRunner(q)))})
    return rows


def bias_rows(st, path: Path, feeds: Sequence[dict], check: Sequence[dict], label: str,
              bits: Sequence[int] = (8, 4)) -> tuple[list[dict], dict[int, Path]]:
    """Bias correction of a variant for `bits`-bit weights: the per-conv rows (mean error before and after,
    on held-out `check`) and the corrected graphs, stored by their bytes."""
    rows, made = [], {}
    for b in bits:
        corrected, per = eq.correct_biases(path, feeds, weight_bits=b, check=check)
        rows += [{"variant": label, **r} for r in per]
        made[b] = cache.cached_bytes("slices", f"{Path(path).stem}-bias{b}", corrected.SerializeToString(), ".onnx")
    return rows, made


# --- with the toolkit ---------------------------------------------------------------------------------------
def builds(st, paths: dict[str, Path], plan: Sequence[tuple[str, str, str]], samples: int = SAMPLES,
           progress: Callable[[str], None] = print) -> list[dict]:
    """Notebook 08's rows for each (variant, target, setting) of `plan`: setting "fp16", a dtype ("w8a8",
    "w8a16", "w4a16": the plain quantized build), or "<block> alone" (that block in int8, every other config
    tensor in float16, on the w8a8 calibration), scored on the full evaluation; ", search" scores the
    point on the search items (what the quantization search's first step scored) and ", <algorithm>"
    calibrates with that algorithm (mmse on 4 samples, as notebook 08's grid does: it searches a scale
    per tensor)."""
    from rkstudy.levers.quantization.bench import Bench
    from rkstudy.levers.quantization.tensors import config_groups
    from rkstudy.toolkit.calibration import ALGORITHMS, Calibration

    rows = []
    benches: dict[tuple[str, str], Bench] = {}
    sessions: dict[tuple[str, str, str], object] = {}  # one calibration per variant, target and dtype
    try:
        for label, target, setting in plan:
            if (label, target) not in benches:
                benches[(label, target)] = Bench(replace(st, onnx=Path(paths[label]), name=f"{st.name}, {label}"),
                                                 target, progress=progress)
            bench = benches[(label, target)]
            if setting == "fp16":
                rows.append({"variant": label, **bench.build("fp16")})
                continue
            head, *options = setting.split(", ")
            dtype = head if head in ("w8a8", "w8a16", "w4a16") else "w8a8"
            algorithm = next((o for o in options if o in ALGORITHMS), "normal")
            quantize = Calibration(calibration(st, 4 if algorithm == "mmse" else samples), dtype=dtype,
                                   algorithm=algorithm)
            if (label, target, quantize.settings) not in sessions:
                sessions[(label, target, quantize.settings)] = bench.session(quantize)
            session = sessions[(label, target, quantize.settings)]
            if head == dtype:
                rows.append({"variant": label, **session.measure([], quantize.label)})
                continue
            block = head.removesuffix(" alone")
            which = "search" if "search" in options else "full"
            groups = config_groups(bench.stage, session.quantized())
            keep = [t for g, names in groups.items() if g != block for t in names]
            row = session.measure(keep, f"{block} alone in {quantize.label}", which=which,
                                  groups=" + ".join(g for g in groups if g != block))
            rows.append({"variant": label, **row})
    finally:
        for session in sessions.values():
            session.close()
    return rows
