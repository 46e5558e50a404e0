"""The duration encoder's measurements (host): what notebook 02 calls.

Fidelity per width in the simulator, the rewrite's cost in bytes (growth in the width), the fp16
duration drift in latent frames per chunk, and the ladder end to end. Rows carry where/target
from the runner that produced them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from tqdm.auto import tqdm

from ... import fits, gates, graph
from ...board.memory import smallest_rung
from ...cache import cache_dir, sha256_file
from ...graph.relshift import BANDED, GATHER
from ...levers.quantization.stages import evenly
from ...process import shows_progress
from ...runtime import OrtRunner
from ...tables.results import HOST
from ...toolkit.build import build_engine
from ...toolkit.engine_cache import name_key
from ...toolkit.simulator import SimulatorRunner
from ..piper import voice as piper
from .producer import SIM_GATE, EncoderSlice, both, counts_for, produce
from .seam import encoder_slice, find_encoder_seam
from .sidecar import FALLBACK, Ladder, LadderEngine
from .tokens import chunk_ids, pad_ids, real_tokens

QUICK_WIDTHS = (32, 64)
FULL_WIDTHS = (64, 96, 128, 192)
# The gather form's widths built for the size fit alone (not simulated), in a dedicated build child
# every full run: the converter's peak grows with the engine, ~4.6 GiB at 192 and ~6.3 GiB at 256 (a
# 45 s build); 320 (~11.6 GiB, ~70 s) and 384 (the reference documents' 2.9 GB engine) would pass what
# a build may take beside another study on this shared 24 GiB machine, so the growth exponents are
# fitted to the widths measured, 64 to 256.
SIZE_ONLY_WIDTHS = (256,)
REFERENCE_LADDER = (128, 192)
# The banded rewrite (relshift mode "banded") from 64 to 512; its converter stays near 1 GB, so 384
# and 512 build and simulate here. Six widths (64, 128, 256 doubling, then 320, 384, 512) fit its
# growth; 96 and 192 are measured in the gather form only (each banded width is one more build and
# simulation). Its ladder runs 128 and 256 (the study text's
# 100-character chunks are 17-225 tokens: a 512 rung would take none of them) and is planned with
# 512 on top for longer chunks (routing only).
BANDED_WIDTHS = (64, 128, 256, 320, 384, 512)
QUICK_BANDED_WIDTHS = (64, 128)
BANDED_LADDER = (128, 256)
BANDED_PLAN = (128, 256, 512)
# The encoder's size goals: (name, width, quantity, limit); measured <= limit is met. The converter
# peak is the build rows' own field (rkstudy.toolkit.build.BuildReport.row: converter_peak_mb).
TARGETS = (("rk3588 engine at width 128", 128, "engine_mb", 30.0),
           ("rk3588 engine at width 512", 512, "engine_mb", 400.0),
           ("converter peak at width 320", 320, "converter_peak_mb", 3000.0))
# Where a size row's converter peak was read: the child that built the engine and then served the
# simulator reports its VmHWM when the simulator is up, before any inference (the simulator's start
# adds ~1 MB to the build's peak); a dedicated build child reports it when it exits.
SIMULATOR_PEAK = "simulator child, before inference"
BUILD_PEAK = "dedicated build child"


def config(quick: bool) -> dict:
    """Widths and chunkings per mode. Quick (CI, 2 cores, well under 5 minutes): two narrow
    widths and short chunks. Full: the reference documents' widths up to 192 simulated, and
    SIZE_ONLY_WIDTHS built for the size fit alone (`size_only`, build_size). The full ladder text is
    chunked at 100 characters: 8 chunks of 17-225 tokens, like the reference documents' 8 chunks,
    so the {128, 192} ladder has chunks on both rungs and one above.

    The drift chunks are `drift_chunks` of the study text's chunks (cut at `chunk_chars`), spread
    evenly over their token lengths (`spread`): in full mode 12 of 52, 13 to 277 tokens, so every
    width sees 7 to 12 real chunks from its shortest to its widest fit; the sensitivity model runs
    on the same chunks (`sensitivity_chunks`), `sensitivity_draws` noise draws per chunk and SNR.

    Banded (relshift mode "banded"): quick builds and simulates 64 and 128 only and runs no banded
    ladder; full measures BANDED_WIDTHS (64 to 512) and runs the banded ladder. Every engine is built once:
    the ladder's rungs are the simulator children measure_widths kept serving (`keep`)."""
    if quick:
        return {"widths": QUICK_WIDTHS, "size_only": (), "chunk_chars": (20,), "drift_chunks": 8,
                "ladder": QUICK_WIDTHS, "ladder_chars": 20, "census_width": 64,
                "sensitivity_chunks": 3, "sensitivity_draws": 1,
                "banded_widths": QUICK_BANDED_WIDTHS, "banded_ladder": (),
                "banded_plan": QUICK_BANDED_WIDTHS, "plan_chars": (20, 100)}
    return {"widths": FULL_WIDTHS, "size_only": SIZE_ONLY_WIDTHS, "chunk_chars": (25, 40, 60, 120), "drift_chunks": 12,
            "ladder": REFERENCE_LADDER, "ladder_chars": 100, "census_width": 128,
            "sensitivity_chunks": 12, "sensitivity_draws": 3,
            "banded_widths": BANDED_WIDTHS, "banded_ladder": BANDED_LADDER,
            "banded_plan": BANDED_PLAN, "plan_chars": (100, 200, 400)}


def study_text() -> str:
    """A long multi-sentence text: every shipped text back to back."""
    return " ".join(piper.read_text(name) for name in ("paragraph", "phone", "short"))


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


# --- fidelity and size per width ----------------------------------------------------------
class Reference:
    """The fp32 side of every comparison, once per chunk: the raw dynamic slice's (stats, cond) at the
    chunk's exact length, and the latent frames the voice's duration flows make of that cond at a seed.
    One per study run, shared by the fidelity rows of every width and rewrite, the drift rows and the
    sensitivity model, so no chunk's reference is computed twice."""

    def __init__(self, voice: piper.Voice):
        self.raw = OrtRunner(encoder_slice(voice.model))
        self.durations = Durations(voice)
        self._outputs: dict[tuple, list[np.ndarray]] = {}
        self._frames: dict[tuple, float] = {}

    def outputs(self, ids: Sequence[int]) -> list[np.ndarray]:
        key = tuple(ids)
        if key not in self._outputs:
            self._outputs[key] = self.raw.run(piper.ids_feed(ids))
        return self._outputs[key]

    def frames(self, ids: Sequence[int], seed: int) -> float:
        key = (tuple(ids), seed)
        if key not in self._frames:
            self._frames[key] = self.durations.frames(self.outputs(ids)[1], ids, seed)
        return self._frames[key]


# Simulator children left serving for a later step on the same engine, by (ONNX sha256, target):
# rknn-toolkit2's simulator runs only a model built in its own process (an engine loaded from the
# cache cannot be simulated), so a second step on one engine would otherwise compile it again.
_SERVING: dict[tuple[str, str], SimulatorRunner] = {}


def simulator(product: EncoderSlice, target: str = "rk3588", out=None) -> SimulatorRunner:
    """The simulator child for `product`'s engine: the one an earlier step left serving (handed over
    once; the caller closes it), else a fresh build."""
    kept = _SERVING.pop((sha256_file(product.path), target), None)
    return kept if kept is not None else SimulatorRunner(product.path, target, out=out)


def keep_serving(product: EncoderSlice, runner: SimulatorRunner) -> None:
    """Leave `runner` serving for the next simulator(product, target) call (closing one left before)."""
    key = (sha256_file(product.path), runner.target)
    if key in _SERVING and _SERVING[key] is not runner:
        _SERVING[key].close()
    _SERVING[key] = runner


def simulate_width(voice: piper.Voice, frames: int, target: str = "rk3588",
                   counts: Sequence[int] | None = None, chunks: Sequence[Sequence[int]] = (),
                   mode: str = GATHER, refs: Reference | None = None, keep: bool = False) -> dict:
    """Build the width-N engine (relshift `mode`) in a simulator child and run on it, one after
    another, the fidelity counts (against the raw dynamic slice at exact length) and the given
    chunks (their outputs kept for the drift). `keep` leaves the child serving for a later step on
    the same engine (the ladder's rungs), else it is closed here.

    Returns {"fidelity": rows, "size": row, "outputs": {chunk index: (stats, cond)}}.
    """
    product = produce(voice, frames, mode=mode)
    refs = refs or Reference(voice)
    engine = cache_dir("engines") / product.contract.engine_name(target, name_key(product.path))
    sim = simulator(product, target, out=engine)
    fid, outputs = [], {}
    try:
        for n in counts or counts_for(frames):
            ids = real_tokens(voice, n)
            test = [o[..., :n] for o in sim.run(pad_ids(ids, frames))]
            m = both(refs.outputs(ids), test, n)
            fid.append({"relshift": mode, "frames": frames, "tokens": n, "stats_snr_db": m["stats_snr_db"],
                        "cond_snr_db": m["cond_snr_db"],
                        "nonfinite": gates.nonfinite_count(test[0]) + gates.nonfinite_count(test[1]),
                        **SIM_GATE.row(min(m["stats_snr_db"], m["cond_snr_db"])),
                        "where": sim.where, "target": sim.target})
        for k, ids in enumerate(chunks):
            if len(ids) <= frames:
                stats, cond = (o[..., : len(ids)] for o in sim.run(pad_ids(ids, frames)))
                outputs[k] = (stats, cond)
    except BaseException:
        sim.close()
        raise
    if keep:
        keep_serving(product, sim)
    else:
        sim.close()
    return {"fidelity": fid, "size": size_row(product, sim.report), "outputs": outputs, "product": product}


def size_row(product: EncoderSlice, report, peak_from: str = SIMULATOR_PEAK) -> dict:
    """One engine's build: bytes, seconds, REGTASK lines and the converter's peak as the build rows
    report it (BuildReport.row: `converter_peak_mb`, the toolkit child's own VmHWM); `peak_from`
    says which child and when (SIMULATOR_PEAK or BUILD_PEAK); and what a call of this width's engine (a
    ladder rung) would take on the NPU: the cost model's prediction with its terms (BuildReport.row's
    npu_* columns)."""
    c = graph.census(product.rewritten, with_axis=False)
    build = report.row()
    return {"relshift": product.contract.params["relshift"], "frames": product.frames,
            "onnx_initializer_bytes": c.initializer_bytes, "engine_bytes": report.engine_bytes,
            "build_s": build["build_s"], "regtask": report.regtask, "regtask_max": report.regtask_max,
            "converter_peak_mb": build["converter_peak_mb"], "peak_from": peak_from,
            "status": report.status, **{k: v for k, v in build.items() if k.startswith("npu_")},
            "where": report.where, "target": report.target}


def build_size(voice: piper.Voice, frames: int, target: str = "rk3588", mode: str = GATHER) -> dict:
    """Compile and report sizes only, in a dedicated build child (a width measured for the size fit
    alone). Always a fresh build (reuse=False): the converter's peak memory is part of the measurement."""
    product = produce(voice, frames, mode=mode)
    return size_row(product, build_engine(product.path, target, reuse=False), peak_from=BUILD_PEAK)


def measure_widths(voice: piper.Voice, widths: Sequence[int], chunks: Sequence[tuple[str, Sequence[int]]],
                   target: str = "rk3588", mode: str = GATHER, refs: Reference | None = None,
                   keep: Sequence[int] = ()) -> dict:
    """One simulator child per width, one at a time (never two builds at once): fidelity rows,
    size rows, and each chunk's simulator outputs for the drift. The children of the widths in
    `keep` are left serving (the ladder's rungs run on them; see simulator())."""
    refs = refs or Reference(voice)
    fid, size, outputs = [], [], {}
    for frames in tqdm(sorted(widths), desc=f"widths, {mode} (build + simulate)", disable=not shows_progress()):
        got = simulate_width(voice, frames, target, chunks=[ids for _, ids in chunks], mode=mode, refs=refs,
                             keep=frames in keep)
        fid += got["fidelity"]
        size.append(got["size"])
        outputs[frames] = got["outputs"]
    return {"fidelity": fid, "size": size, "outputs": outputs}


# relshift_growth's columns: a row holds the numbers of one place (its where), the rest stay blank.
GROWTH_COLUMNS = ("relshift", "frames", "engine_bytes", "engine_mb", "onnx_initializer_bytes", "build_s", "regtask",
                  "regtask_max", "converter_peak_mb", "peak_from", "status", "sim_worst_snr_db", "sim_counts",
                  "fp32_worst_snr_db", "fp32_max_diff", "fp32_counts")


def relshift_growth(sizes: Sequence[dict], fidelity: Sequence[dict], pads: Sequence[dict] = ()) -> list[dict]:
    """Both rewrites side by side: per (rewrite, width), one row per place that measured it, each
    stamped by what made its numbers. The build (where host): engine bytes, build seconds, REGTASK
    lines and largest value, the converter's peak; the simulator (where simulator): its worst SNR
    over the token counts, how many, and the REGTASK lines of the engine it ran (a simulator score
    is never shown without what the compiler logged); the fp32 gate (where fp32: the rewritten
    padded graph vs the exact-length raw slice): worst SNR and max |diff|. The last two only where
    measured. One size row per (rewrite, width): an engine is measured once."""
    blank = dict.fromkeys(GROWTH_COLUMNS, "")
    out, seen = [], set()
    for r in sorted(sizes, key=lambda r: (r["relshift"], r["frames"])):
        mode, frames = r["relshift"], r["frames"]
        if (mode, frames) in seen:
            raise ValueError(f"two size rows for the {mode} engine at width {frames}: measure each engine once")
        seen.add((mode, frames))
        engine = {"regtask": r["regtask"], "regtask_max": r.get("regtask_max", ""), "status": r["status"]}
        out.append({**blank, "relshift": mode, "frames": frames, "engine_bytes": r["engine_bytes"],
                    "engine_mb": round(r["engine_bytes"] / 1e6, 2),
                    "onnx_initializer_bytes": r["onnx_initializer_bytes"], "build_s": r["build_s"], **engine,
                    "converter_peak_mb": r["converter_peak_mb"], "peak_from": r["peak_from"],
                    "where": r["where"], "target": r["target"]})
        sim = [f for f in fidelity if f["relshift"] == mode and f["frames"] == frames]
        if sim:
            out.append({**blank, "relshift": mode, "frames": frames, **engine,
                        "sim_worst_snr_db": min(min(f["stats_snr_db"], f["cond_snr_db"]) for f in sim),
                        "sim_counts": len(sim), "where": sim[0]["where"], "target": sim[0]["target"]})
        fp = [p for p in pads if p.get("relshift", GATHER) == mode and p["frames"] == frames]
        if fp:
            out.append({**blank, "relshift": mode, "frames": frames,
                        "fp32_worst_snr_db": min(min(p["stats_snr_db"], p["cond_snr_db"]) for p in fp),
                        "fp32_max_diff": max(max(p["stats_max_diff"], p["cond_max_diff"]) for p in fp),
                        "fp32_counts": len(fp), "where": fp[0]["where"], "target": fp[0].get("target", "none")})
    return out


def growth_of(rows: Sequence[dict], mode: str, where: str = HOST.where) -> dict[int, dict]:
    """relshift_growth's rows of one rewrite and one place (the builds, by default), by width."""
    return {r["frames"]: r for r in rows if r["relshift"] == mode and r["where"] == where}


def relshift_growth_fit(rows: Sequence[dict], base_bytes: int) -> list[dict]:
    """Growth exponent of engine bytes in the width per rewrite (see growth_rows)."""
    out = []
    for mode in (GATHER, BANDED):
        sel = sorted((r for r in growth_of(rows, mode).values() if r["status"] == "ok"), key=lambda r: r["frames"])
        if len(sel) >= 2:
            out.append({"relshift": mode, "widths": ",".join(str(r["frames"]) for r in sel),
                        "exponent_total": growth_exponent(sel, "engine_bytes"),
                        "exponent_over_weights": growth_exponent_excess(sel, "engine_bytes", base_bytes),
                        "exponent_widest_pair": growth_exponent(sel[-2:], "engine_bytes"), "base_bytes": base_bytes,
                        "where": HOST.where})
    return out


def target_rows(rows: Sequence[dict], mode: str = BANDED, widths: Sequence[int] = (384, 512)) -> list[dict]:
    """The size goals (TARGETS) against the `mode` build rows of relshift_growth: met or missed, and by
    how much (limit − measured, negative when missed), in the unit of the column the goal reads;
    plus whether each of `widths` was built and simulated."""
    built, simulated = growth_of(rows, mode), growth_of(rows, mode, "simulator")
    out = []
    for name, frames, key, limit in TARGETS:
        value = built[frames][key] if frames in built else None
        out.append({"goal": name, "relshift": mode, "limit": limit, "measured": "" if value is None else value,
                    "unit": "MB", "met": value is not None and value <= limit,
                    "margin": "" if value is None else round(limit - value, 3),
                    "note": "" if value is not None else f"width {frames} not measured in this mode",
                    "where": HOST.where})
    for frames in widths:
        done = frames in built and built[frames]["status"] == "ok" and frames in simulated
        out.append({"goal": f"width {frames} built and simulated", "relshift": mode, "limit": "", "measured": "",
                    "unit": "", "met": done, "margin": "",
                    "note": "" if done else f"width {frames} not built and simulated in this mode",
                    "where": HOST.where})
    return out


def growth_exponent(rows: Sequence[dict], key: str) -> float:
    """Least-squares slope of log(key) against log(frames): bytes ~ N^k."""
    pts = [(r["frames"], r[key]) for r in rows if r.get(key)]
    return fits.power_law_exponent([p[0] for p in pts], [p[1] for p in pts])


def growth_exponent_excess(rows: Sequence[dict], key: str, base: float) -> float:
    """Slope of log(key - base) against log(frames): the growth of what the width adds on top
    of the voice's own (width-independent) weights."""
    pts = [(r["frames"], r[key] - base) for r in rows if r.get(key) and r[key] > base]
    return fits.power_law_exponent([p[0] for p in pts], [p[1] for p in pts])


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
                    "exponent_widest_pair": growth_exponent(ok[-2:], key), "base_bytes": base,
                    "where": HOST.where})
    return out


# --- duration: stats/cond -> latent frames ------------------------------------------------
class Durations:
    """The voice after the seam, to the latent-frame total of one chunk, seeded.

    A seeded onnxruntime random node advances between runs of one session, so only a fresh
    session draws the same noise twice, and a session of the whole tail costs ~20 of its runs.
    The noise the duration flows draw (the tail's RandomNormalLike nodes) depends only on the
    chunk's length and the seed: it is drawn once per (length, seed) by a fresh seeded session of
    the random nodes and their shape inputs alone, and fed to one session of the tail whose random
    nodes are inputs. The same (cond, ids, seed) always gives the frames a fresh seeded session of
    the tail gives, and fp32, simulator and perturbed conditioning are compared under identical noise.
    """

    def __init__(self, voice: piper.Voice):
        self.voice = voice
        self.seam = find_encoder_seam(voice.model)
        inputs = [self.seam.cond, self.seam.ids, self.seam.lengths, self.seam.scales]
        tail = graph.slice_at(voice.model, inputs, [self.seam.frames])
        self._random = [n.output[0] for n in tail.graph.node if n.op_type.startswith("RandomNormal")]
        # same node order as the tail, so seed_random_nodes gives each random node the tail's seed
        self._draws = graph.slice_at(tail, inputs, self._random)
        kept = [n for n in tail.graph.node if n.output[0] not in self._random]
        del tail.graph.node[:]
        tail.graph.node.extend(kept)
        tail.graph.input.extend(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)
                                for name in self._random)
        self._fed = OrtRunner(tail)
        self._noise: dict[tuple[int, int], dict[str, np.ndarray]] = {}

    def frames(self, cond: np.ndarray, ids: Sequence[int], seed: int) -> float:
        feed = {self.seam.cond: np.ascontiguousarray(cond, np.float32), **piper.ids_feed(ids),
                self.seam.scales: self.voice.scales}
        key = (len(ids), seed)
        if key not in self._noise:
            draws = OrtRunner(piper.seed_random_nodes(self._draws, seed))
            drawn = draws.session.run(None, {k: v for k, v in feed.items() if k in draws.input_names})
            self._noise[key] = dict(zip(self._random, drawn))
        out = self._fed.session.run(None, {**feed, **self._noise[key]})
        return float(np.asarray(out[0]).ravel()[0])


def drift_rows(voice: piper.Voice, chunks: Sequence[tuple[str, Sequence[int]]],
               test_outputs: dict[int, dict[int, tuple]], seed: int = 1234, origin=None,
               refs: Reference | None = None) -> list[dict]:
    """Per chunk and width: latent frames from fp32 cond vs from the tested cond (the simulator's,
    or any perturbed conditioning) under the same seed, and (the sampling's own scale) fp32 at
    seed vs fp32 at seed+1. `origin` (a runner, or the rows' where/target) stamps the rows.
    `refs`: the fp32 side shared between calls over the same chunks (a Reference), so a second
    set of outputs (the other rewrite) costs one duration run per chunk and width."""
    refs = refs or Reference(voice)
    where = getattr(origin, "where", "simulator")
    target = getattr(origin, "target", "none")
    rows = []
    for k, (text, ids) in enumerate(chunks):
        widths = [frames for frames in sorted(test_outputs) if k in test_outputs[frames]]
        if not widths:
            continue
        ref, other = refs.frames(ids, seed), refs.frames(ids, seed + 1)
        for frames in widths:
            got = refs.durations.frames(test_outputs[frames][k][1], ids, seed)
            rows.append({"frames": frames, "chunk": k, "tokens": len(ids), "fp32_frames": ref,
                         "test_frames": got, "drift_pct": 100.0 * (got - ref) / ref,
                         "fp32_reseed_pct": 100.0 * (other - ref) / ref, "text": text[:40],
                         "where": where, "target": target})
    return rows


def drift_summary(rows: Sequence[dict]) -> list[dict]:
    out = []
    for frames in sorted({r["frames"] for r in rows}):
        sel = [r for r in rows if r["frames"] == frames]
        d = [r["drift_pct"] for r in sel]
        s = [r["fp32_reseed_pct"] for r in sel]
        out.append({"frames": frames, "chunks": len(d), "drift_min_pct": min(d),
                    "drift_max_pct": max(d), "drift_mean_pct": float(np.mean(d)),
                    "abs_drift_mean_pct": float(np.mean(np.abs(d))),
                    "reseed_abs_mean_pct": float(np.mean(np.abs(s))),
                    "where": sel[0]["where"], "target": sel[0]["target"]})
    return out


def drift_sensitivity(voice: piper.Voice, chunks: Sequence[tuple[str, Sequence[int]]],
                      snrs: Sequence[float] = (30, 40, 45, 50, 60), draws: int = 3,
                      seed: int = 1234, refs: Reference | None = None) -> list[dict]:
    """How much duration drift a given conditioning SNR buys: fp32 conditioning plus white
    noise scaled to each SNR, frames under the same flow seed as the clean run.

    A model, not an engine measurement (rows are `host`): it says where the simulator's
    ~63 dB and the reference documents' 40-48 dB board engines should land, since the drift is the
    duration flows integrating the conditioning error across a chunk.
    """
    refs = refs or Reference(voice)
    rng = np.random.default_rng(seed)
    rows = []
    for _, ids in tqdm(chunks, desc="drift sensitivity", disable=not shows_progress()):
        cond = refs.outputs(ids)[1]
        ref = refs.frames(ids, seed)
        power = float(np.mean(cond.astype(np.float64) ** 2))
        for snr in snrs:
            for k in range(draws):
                noise = rng.standard_normal(cond.shape) * math.sqrt(power / 10 ** (snr / 10))
                got = refs.durations.frames((cond + noise).astype(np.float32), ids, seed)
                rows.append({"snr_db": float(snr), "draw": k, "tokens": len(ids), "fp32_frames": ref,
                             "noisy_frames": got, "drift_pct": 100.0 * (got - ref) / ref, "where": HOST.where})
    return rows


def spread(chunks: Sequence, k: int) -> list:
    """`k` chunks evenly spread over a list sorted by length (short to long)."""
    return evenly(chunks, k)


def sensitivity_summary(rows: Sequence[dict]) -> list[dict]:
    out = []
    for snr in sorted({r["snr_db"] for r in rows}):
        d = [r["drift_pct"] for r in rows if r["snr_db"] == snr]
        out.append({"snr_db": snr, "runs": len(d), "drift_min_pct": min(d), "drift_max_pct": max(d),
                    "abs_drift_mean_pct": float(np.mean(np.abs(d))), "where": HOST.where})
    return out


# --- the ladder --------------------------------------------------------------------------------
def voice_channels(voice: piper.Voice) -> tuple[int, int]:
    """(stats, cond) channels of the voice: 2 x inter_channels and dp.proj's width."""
    w = {i.name: tuple(i.dims) for i in voice.model.graph.initializer}
    return 2 * voice.channels, w["dp.proj.weight"][0]


def ladder_for(voice: piper.Voice, engines: Sequence[LadderEngine], fallback=True) -> Ladder:
    """A ladder validated against `voice` (channel counts), with the fp32 encoder slice as the
    fallback above the widest rung."""
    return Ladder(engines, OrtRunner(encoder_slice(voice.model)) if fallback else None,
                  channels=voice_channels(voice),
                  remake=f"rkstudy piper encoder --voice-onnx {voice.onnx_path.name} --frames N")


def ladder_summary(rows: Sequence[dict], key: str = "lands") -> list[dict]:
    """Chunks per rung (plan rows: key `lands`; run rows: key `ran_on`), with their drift
    when the rows carry it, and, when they carry the rung's predicted NPU time per call (run_ladder's
    rows), that time and the rung's chunks' total (a prediction of the cost model, not a measurement)."""
    out = []
    for lands in sorted({r[key] for r in rows}, key=lambda s: (s == FALLBACK, len(s), s)):
        sel = [r for r in rows if r[key] == lands]
        t = [r["tokens"] for r in sel]
        row = {"lands": lands, "chunks": len(t), "tokens_min": min(t), "tokens_max": max(t)}
        if all("drift_pct" in r for r in sel):
            d = [r["drift_pct"] for r in sel]
            row.update({"drift_min_pct": min(d), "drift_max_pct": max(d)})
        if all("npu_ms_predicted" in r for r in sel):
            per_call = sel[0]["npu_ms_predicted"]
            row.update({"npu_ms_predicted": per_call,
                        "npu_ms_predicted_chunks": round(per_call * len(sel), 3) if per_call != "" else "",
                        "npu_cost_note": sel[0]["npu_cost_note"]})
        out.append({**row, "where": sel[0].get("where", HOST.where), "target": sel[0].get("target", "none")})
    return out


def rung_predictions(engines: Sequence[LadderEngine]) -> dict[str, dict]:
    """{rung (`n<width>`): the NPU cost model's columns for a call of its engine} from each rung's build (its
    runner's report); a multi-shape engine's one layer table is its largest set's, said in the note."""
    from ...toolkit.cost import unpredicted_row

    out = {}
    for e in engines:
        report = getattr(e.runner, "report", None)
        made = report.prediction().row() if hasattr(report, "prediction") else \
            unpredicted_row("the rung's runner has no toolkit build")
        if len(e.widths) > 1 and made["npu_ms_predicted"] != "":
            made["npu_cost_note"] += f"; a multi-shape engine: the layer table of its largest set, n{max(e.widths)}"
        out.update({f"n{w}": made for w in e.widths})
    return out


def _fallback_cost() -> dict:
    from ...toolkit.cost import unpredicted_row

    return unpredicted_row("the fp32 fallback runs on this host's CPU, not on the NPU")


def ladder_plans(voice: piper.Voice, text: str, ladders: dict[str, Sequence[int]],
                 chars: Sequence[int]) -> list[dict]:
    """Routing only (no engine): for each ladder and each chunking of `text`, how many chunks land
    on an engine and how many still need the fp32 fallback."""
    out = []
    for size in chars:
        chunks = chunk_ids(voice, text, size)
        longest = max(len(ids) for _, ids in chunks)
        for name, widths in ladders.items():
            lands = [smallest_rung(widths, len(ids)) for _, ids in chunks]
            out.append({"ladder": name, "widths": ",".join(map(str, widths)), "chunk_chars": size,
                        "chunks": len(chunks), "longest_chunk_tokens": longest,
                        "on_engines": sum(w is not None for w in lands),
                        "on_fp32_fallback": sum(w is None for w in lands),
                        "where": HOST.where})
    return out


def ladder_engines(voice: piper.Voice, widths: Sequence[int], target: str = "rk3588", mode: str = GATHER,
                   multi_shape: bool = False) -> list[LadderEngine]:
    """Simulator rungs at `widths`: one engine per width (the child an earlier step left serving, else
    built one after another), or (`multi_shape`) one engine compiled from the widest slice for every
    width (config's dynamic_input), whose contract lists the widths. The caller closes each runner."""
    if not multi_shape:
        engines = []
        try:
            for w in sorted(widths):
                product = produce(voice, w, mode=mode)
                engines.append(LadderEngine(simulator(product, target), product.contract))  # a kept child if any
        except BaseException:  # a failed rung stops the rungs already serving
            for e in engines:
                e.runner.close()
            raise
        return engines
    product = produce(voice, max(widths), mode=mode)
    sets = [{"input": [1, w], "input_lengths": [1]} for w in sorted(widths, reverse=True)]
    runner = SimulatorRunner(product.path, target, shape_sets=sets)
    return [LadderEngine(runner, product.contract.with_shapes([(tuple(s["input"]), (1,)) for s in sets]))]


def ladder_graph(mode: str) -> str:
    """The encoder's row label in the multi-shape tables (rkstudy.levers.multi_shape, which the lever study
    fills from this family's `shape_ladder`): one per relative-shift rewrite."""
    return f"piper encoder ({mode} rewrite)"


def run_ladder(voice: piper.Voice, widths: Sequence[int], chunks: Sequence[tuple[str, Sequence[int]]],
               target: str = "rk3588", seed: int = 1234, mode: str = GATHER,
               choice: Mapping | None = None) -> list[dict]:
    """The sidecar end to end: simulator engines at `widths` (relshift `mode`), fp32 fallback above;
    per chunk, where it ran, stats/cond SNR against fp32, the frame drift, and what a call of its rung would
    take on the NPU (the cost model's prediction from the rung's build: rung_predictions; the fallback's row
    says it runs on the CPU). The rungs are one
    multi-shape engine when `choice` (the encoder's rkstudy.levers.multi_shape summary row; default: the
    committed one for this rewrite, notebook 08's) says so, else one engine per width."""
    from ...levers import multi_shape as ms

    choice = choice if choice is not None else ms.measured(ladder_graph(mode))
    runners = []
    try:
        engines = ladder_engines(voice, widths, target, mode, multi_shape=ms.prefer_multi_shape(choice))
        runners = [e.runner for e in engines]
        ladder = ladder_for(voice, engines)
        rungs = rung_predictions(engines)
        raw = OrtRunner(encoder_slice(voice.model))
        dur = Durations(voice)
        rows = []
        for k, (text, ids) in enumerate(tqdm(chunks, desc="ladder chunks", disable=not shows_progress())):
            stats, cond, where = ladder.run(ids)
            ref = raw.run(piper.ids_feed(ids))
            f_ref, f_got = dur.frames(ref[1], ids, seed), dur.frames(cond, ids, seed)
            origin = raw if where == FALLBACK else runners[0]
            rows.append({"relshift": mode, "chunk": k, "tokens": len(ids), "ran_on": where,
                         "stats_snr_db": gates.snr_db(ref[0], stats), "cond_snr_db": gates.snr_db(ref[1], cond),
                         "fp32_frames": f_ref, "ladder_frames": f_got,
                         "drift_pct": 100.0 * (f_got - f_ref) / f_ref, "text": text[:48],
                         **{k: v for k, v in rungs.get(where, _fallback_cost()).items()
                            if k in ("npu_ms_predicted", "npu_cost_note")},
                         "where": origin.where, "target": origin.target})
        return rows
    finally:
        for r in runners:
            r.close()


# --- quantization: one width, calibrated on the ids of real text ----------------------------------
def encoder_groups(module: str) -> str:
    """How a search moves the encoder's layers (rkstudy.levers.quantization.stages.Stage.groups): each transformer
    layer k (its attention, feed-forward and norms) as one block, the duration predictor as another, the
    rest at its first two levels."""
    from ...levers.quantization.tensors import first_levels

    parts = [p for p in module.split("/") if p]
    if parts[:2] == ["enc_p", "encoder"] and len(parts) > 2 and "." in parts[2]:
        return f"/enc_p/encoder layer {parts[2].rsplit('.', 1)[1]}"
    return first_levels(module, 1 if parts[:1] == ["dp"] else 2)


QUANT_CALIBRATION_TEXTS = ("paragraph",)
QUANT_EVALUATION_TEXTS = ("short", "phone")


def quantization_stage(voice: piper.Voice | None = None, width: int = 64,
                       calibration_texts: Sequence[str] = QUANT_CALIBRATION_TEXTS,
                       evaluation_texts: Sequence[str] = QUANT_EVALUATION_TEXTS, chunk_chars: int = 25,
                       calibration_chunks: int | None = None):
    """The width-`width` encoder as rkstudy.levers.quantization sees it: the calibration feeds are the padded
    phoneme ids of `calibration_texts` chunked at `chunk_chars` characters as the runtime chunks
    them (chunks wider than the engine left out; `calibration_chunks` of them evenly spread), the
    evaluation chunks come from `evaluation_texts` (no text in both). Each chunk is scored on its
    real tokens, stats and cond each a window of its own (the durations come from cond, the
    decoder's latent from stats); the utterance column is every chunk's outputs back to back."""
    from ...levers.quantization.stages import Stage, held_apart, span_scores

    held_apart(calibration_texts, evaluation_texts)
    voice = voice or piper.Voice()
    product = produce(voice, width)

    def chunks(names):
        return [ids for name in names for _, ids in chunk_ids(voice, piper.read_text(name), chunk_chars)
                if len(ids) <= width]

    evaluation = chunks(evaluation_texts)
    sizes = {}

    def walk(runner, ids):
        stats, cond = (o[..., : len(ids)] for o in runner.run(pad_ids(ids, width))[:2])
        sizes[len(ids)] = stats.size
        return np.concatenate([stats.ravel(), cond.ravel()])

    def score(items, refs, tests):
        return span_scores(refs, tests, [[(0, sizes[len(ids)]), (sizes[len(ids)], a.size)]
                                         for ids, a in zip(items, refs)])

    # stats and cond are no audio: scored by SNR, and searched on it; the groups are the encoder's layers
    return Stage(name=f"Piper encoder width {width}", onnx=product.path,
                 calibration=[pad_ids(ids, width) for ids in evenly(chunks(calibration_texts), calibration_chunks)],
                 evaluation=evaluation, search=evaluation[:2], walk=walk, score=score,
                 groups=encoder_groups,
                 texts={"calibration": ", ".join(calibration_texts), "evaluation": ", ".join(evaluation_texts)})
