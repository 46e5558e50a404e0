"""The duration encoder's measurements (host): what notebook 02 calls.

Fidelity per width in the simulator, the rewrite's cost in bytes (growth in the width), the fp16
duration drift in latent frames per chunk, and the ladder end to end. Rows carry where/target
from the runner that produced them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from tqdm.auto import tqdm

from ... import fits, gates, graph
from ...board.memory import smallest_rung
from ...build import build_engine
from ...cache import cache_dir, sha256_file
from ...engine import simulator_vs_fp32
from ...graph.relshift import BANDED, GATHER
from ...quantize import evenly
from ...results import HOST, STAMP, carried, read_table
from ...runtime import OrtRunner, SimulatorRunner
from ..piper import voice as piper
from .producer import SIM_GATE, EncoderSlice, both, counts_for, produce
from .seam import encoder_slice, find_encoder_seam
from .sidecar import FALLBACK, Ladder, LadderEngine
from .tokens import chunk_ids, pad_ids, real_tokens

QUICK_WIDTHS = (32, 64)
FULL_WIDTHS = (64, 96, 128, 192)
# Built for the growth fit only (no simulator run). The converter's peak RSS grows with the
# engine: ~5 GB at 192, ~6.7 GB at 256, ~12.3 GB (11.5 GiB) at 320; 384 (the seeds' 2.9 GB
# engine) would pass the ~12 GiB a build may take on this shared 24 GiB machine.
SIZE_ONLY_WIDTHS = (256, 320)
SEEDS_LADDER = (128, 192)
# The banded rewrite (relshift mode "banded") at every width up to 512; its converter stays
# near 1 GB, so 384 and 512 build and simulate here. Its ladder runs 128 and 256 (the study text's
# 100-character chunks are 17-225 tokens: a 512 rung would take none of them) and is planned with
# 512 on top for longer chunks (routing only).
BANDED_WIDTHS = (64, 96, 128, 192, 256, 320, 384, 512)
QUICK_BANDED_WIDTHS = (64, 128)
BANDED_LADDER = (128, 256)
BANDED_PLAN = (128, 256, 512)
# The encoder's size goals: (name, width, quantity, limit); measured <= limit is met. The converter
# peak column is GiB (the build child's VmHWM / 2^30); target_rows converts it to the decimal GB the
# limit is stated in.
TARGETS = (("rk3588 engine at width 128", 128, "engine_mb", 30.0),
           ("rk3588 engine at width 512", 512, "engine_mb", 400.0),
           ("converter peak at width 320", 320, "converter_peak_gb", 3.0))


def config(quick: bool) -> dict:
    """Widths and chunkings per mode. Quick (CI, 2 cores, well under 5 minutes): two narrow
    widths and short chunks. Full: the seeds' widths up to 192 simulated, wider ones (256, 320)
    measured for the size fit in an earlier run (see SIZE_ONLY_WIDTHS). The full ladder text is
    chunked at 100 characters: 8 chunks of 17-225 tokens, like the seeds' 8 chunks, so the
    {128, 192} ladder has chunks on both rungs and one above.

    Banded (relshift mode "banded"): quick builds and simulates 64 and 128 only (under two extra
    minutes) and runs no banded ladder; full measures every width to 512, each also in a
    dedicated build child for the converter's peak (the gather widths keep their simulator
    child's peak, as before), and runs the banded ladder. The gather form's
    size-only widths are not rebuilt in full mode: their rows are carried from the committed
    sizes.csv (`carried`), since a 320 rebuild peaks at ~12 GB on this shared machine."""
    if quick:
        return {"widths": QUICK_WIDTHS, "size_only": (), "carried": (), "chunk_chars": (20,),
                "ladder": QUICK_WIDTHS, "ladder_chars": 20, "census_width": 64,
                "sensitivity_chunks": 3, "sensitivity_draws": 1,
                "banded_widths": QUICK_BANDED_WIDTHS, "dedicated_builds": False, "banded_ladder": (),
                "banded_plan": QUICK_BANDED_WIDTHS, "plan_chars": (20, 100)}
    return {"widths": FULL_WIDTHS, "size_only": (), "carried": SIZE_ONLY_WIDTHS, "chunk_chars": (25, 40, 60, 120),
            "ladder": SEEDS_LADDER, "ladder_chars": 100, "census_width": 128,
            "sensitivity_chunks": 12, "sensitivity_draws": 3,
            "banded_widths": BANDED_WIDTHS, "dedicated_builds": True, "banded_ladder": BANDED_LADDER,
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
def simulate_width(voice: piper.Voice, frames: int, target: str = "rk3588",
                   counts: Sequence[int] | None = None, chunks: Sequence[Sequence[int]] = (),
                   mode: str = GATHER) -> dict:
    """Build the width-N engine (relshift `mode`) in a simulator child, run the fidelity counts
    (against the raw dynamic slice at exact length) and the given chunks (kept for the drift).

    Returns {"fidelity": rows, "size": row, "outputs": {chunk index: (stats, cond)}}.
    """
    product = produce(voice, frames, mode=mode)
    raw = OrtRunner(product.raw)
    items = [("count", n, real_tokens(voice, n)) for n in counts or counts_for(frames)]
    items += [("chunk", k, list(ids)) for k, ids in enumerate(chunks) if len(ids) <= frames]

    def run(runner, item):
        kind, n, ids = item
        got = runner.run(pad_ids(ids, frames))
        return [o[..., : len(ids)] for o in got]

    def compare(ref_unused, test, item):
        kind, n, ids = item
        m = both(raw.run(piper.ids_feed(ids)), test, len(ids))
        return {"kind": kind, "key": n, "frames": frames, "tokens": len(ids), "stats_snr_db": m["stats_snr_db"],
                "cond_snr_db": m["cond_snr_db"], "snr_db": min(m["stats_snr_db"], m["cond_snr_db"]),
                "nonfinite": gates.nonfinite_count(test[0]) + gates.nonfinite_count(test[1])}

    engine = cache_dir("engines") / product.contract.engine_name(target, sha256_file(product.path)[:12])
    sim = simulator_vs_fp32(product.path, target, items, run=run, compare=compare, keep=True, out=engine)
    fid = [{"relshift": mode} | {k: r[k] for k in ("frames", "tokens", "stats_snr_db", "cond_snr_db", "nonfinite")}
           | SIM_GATE.row(r["snr_db"]) | {"where": r["where"], "target": r["target"]}
           for r in sim.rows if r["kind"] == "count"]
    outputs = {item[1]: (out[0], out[1]) for item, out in zip(items, sim.simulator) if item[0] == "chunk"}
    return {"fidelity": fid, "size": size_row(product, sim.report), "outputs": outputs, "product": product}


def size_row(product: EncoderSlice, report, peak_from: str = "simulator child (build + inference)") -> dict:
    """`converter_peak_gb` is the peak RSS (GiB, VmHWM) of the child that built the engine; `peak_from` says
    whether that child only built (a dedicated build child) or also served the simulator."""
    c = graph.census(product.rewritten, with_axis=False)
    return {"relshift": product.contract.params["relshift"], "frames": product.frames,
            "onnx_initializer_bytes": c.initializer_bytes, "engine_bytes": report.engine_bytes,
            "build_s": round(report.seconds, 1), "regtask": report.regtask, "regtask_max": report.regtask_max,
            "converter_peak_gb": round(report.peak_rss_mb / 1024, 2), "peak_from": peak_from, "carried_from": "",
            "status": report.status, "where": report.where, "target": report.target}


def build_size(voice: piper.Voice, frames: int, target: str = "rk3588", mode: str = GATHER) -> dict:
    """Compile and report sizes only, in a dedicated build child. Always a fresh build
    (reuse=False): the converter's peak memory is part of the measurement."""
    product = produce(voice, frames, mode=mode)
    return size_row(product, build_engine(product.path, target, reuse=False), peak_from="dedicated build child")


def carried_sizes(path, widths: Sequence[int]) -> list[dict]:
    """Gather-form size rows at `widths` from an earlier committed sizes.csv (not rebuilt here:
    the 320 build peaks at ~12 GB). Read before the run rewrites that file; rows say where they
    came from and keep the stamp of the run that built them."""
    rows = []
    for r in read_table(path):
        if int(r["frames"]) not in widths or r.get("relshift", GATHER) != GATHER:
            continue
        # converter_peak_gb is GiB (VmHWM / 2^30), as size_row writes it; a child_peak_rss_gb column is decimal GB
        peak = (float(r["converter_peak_gb"]) if r.get("converter_peak_gb")
                else round(float(r["child_peak_rss_gb"]) * 1e9 / 2**30, 2))
        rows.append({"relshift": GATHER, "frames": int(r["frames"]),
                     "onnx_initializer_bytes": int(r["onnx_initializer_bytes"]), "engine_bytes": int(r["engine_bytes"]),
                     "build_s": float(r["build_s"]), "regtask": int(r["regtask"]),
                     "regtask_max": int(r["regtask_max"]) if r.get("regtask_max") else "",
                     "converter_peak_gb": peak, "peak_from": r.get("peak_from") or "dedicated build child",
                     **carried(r, "results/piper_encoder/sizes.csv"), "status": r["status"]})
    missing = sorted(set(widths) - {r["frames"] for r in rows})
    if missing:
        raise FileNotFoundError(f"{path} has no gather rows at widths {missing}; build them with "
                                f"study.build_size(voice, N) (the 320 build peaks near 12 GB)")
    return rows


def measure_widths(voice: piper.Voice, widths: Sequence[int], chunks: Sequence[tuple[str, Sequence[int]]],
                   target: str = "rk3588", mode: str = GATHER) -> dict:
    """One simulator child per width, one at a time (never two builds at once): fidelity rows,
    size rows, and each chunk's simulator outputs for the drift."""
    fid, size, outputs = [], [], {}
    for frames in tqdm(sorted(widths), desc=f"widths, {mode} (build + simulate)"):
        got = simulate_width(voice, frames, target, chunks=[ids for _, ids in chunks], mode=mode)
        fid += got["fidelity"]
        size.append(got["size"])
        outputs[frames] = got["outputs"]
    return {"fidelity": fid, "size": size, "outputs": outputs}


def measure_sizes(voice: piper.Voice, widths: Sequence[int], target: str = "rk3588", mode: str = GATHER) -> list[dict]:
    return [build_size(voice, frames, target, mode) for frames in tqdm(sorted(widths), desc=f"{mode} builds")]


def relshift_growth(sizes: Sequence[dict], fidelity: Sequence[dict], pads: Sequence[dict] = ()) -> list[dict]:
    """Both rewrites side by side, one row per (rewrite, width): engine bytes, build seconds,
    REGTASK lines, the converter's peak (a dedicated build child's where one was run, else the
    simulator child's), the simulator's worst SNR over the token counts and the fp32 gate
    (rewritten padded graph vs exact-length raw slice, worst SNR and max |diff|) where measured.
    `sizes` may hold a simulator child's row and a dedicated child's row for one width: the
    dedicated one gives the build columns."""
    by = {}
    for r in sizes:
        key = (r["relshift"], r["frames"])
        if key not in by or r["peak_from"] == "dedicated build child":
            by[key] = r
    out = []
    for (mode, frames), r in sorted(by.items()):
        sim = [min(f["stats_snr_db"], f["cond_snr_db"]) for f in fidelity
               if f["relshift"] == mode and f["frames"] == frames]
        fp = [p for p in pads if p.get("relshift", GATHER) == mode and p["frames"] == frames]
        out.append({"relshift": mode, "frames": frames, "engine_bytes": r["engine_bytes"],
                    "engine_mb": round(r["engine_bytes"] / 1e6, 2), "build_s": r["build_s"], "regtask": r["regtask"],
                    "regtask_max": r.get("regtask_max", ""), "converter_peak_gb": r["converter_peak_gb"],
                    "peak_from": r["peak_from"], "onnx_initializer_bytes": r["onnx_initializer_bytes"],
                    "sim_worst_snr_db": min(sim) if sim else "", "sim_counts": len(sim),
                    "fp32_worst_snr_db": min(min(p["stats_snr_db"], p["cond_snr_db"]) for p in fp) if fp else "",
                    "fp32_max_diff": max(max(p["stats_max_diff"], p["cond_max_diff"]) for p in fp) if fp else "",
                    "status": r["status"], "carried_from": r.get("carried_from", ""),
                    # a carried width keeps the stamp of the run that built it (rkstudy.results.stamp)
                    **{k: r[k] for k in STAMP if k in r}})
    return out


def relshift_growth_fit(rows: Sequence[dict], base_bytes: int) -> list[dict]:
    """Growth exponent of engine bytes in the width per rewrite (see growth_rows)."""
    out = []
    for mode in (GATHER, BANDED):
        sel = sorted((r for r in rows if r["relshift"] == mode and r["status"] == "ok"), key=lambda r: r["frames"])
        if len(sel) >= 2:
            out.append({"relshift": mode, "widths": ",".join(str(r["frames"]) for r in sel),
                        "exponent_total": growth_exponent(sel, "engine_bytes"),
                        "exponent_over_weights": growth_exponent_excess(sel, "engine_bytes", base_bytes),
                        "exponent_widest_pair": growth_exponent(sel[-2:], "engine_bytes"), "base_bytes": base_bytes,
                        "where": HOST.where})
    return out


def target_rows(rows: Sequence[dict], mode: str = BANDED, widths: Sequence[int] = (384, 512)) -> list[dict]:
    """The size goals (TARGETS) against the `mode` rows: met or missed, and by how much (limit − measured,
    negative when missed); plus whether each of `widths` was built and simulated."""
    out = []
    for name, frames, key, limit in TARGETS:
        r = next((x for x in rows if x["relshift"] == mode and x["frames"] == frames), None)
        value = None if r is None else r[key]
        if value is not None and key.endswith("gb"):
            value = round(value * 2**30 / 1e9, 3)  # GiB -> GB
        out.append({"goal": name, "relshift": mode, "limit": limit, "measured": "" if value is None else value,
                    "unit": "GB" if key.endswith("gb") else "MB", "met": value is not None and value <= limit,
                    "margin": "" if value is None else round(limit - value, 3),
                    "note": "" if value is not None else f"width {frames} not measured in this mode",
                    "where": HOST.where})
    for frames in widths:
        r = next((x for x in rows if x["relshift"] == mode and x["frames"] == frames), None)
        done = r is not None and r["status"] == "ok" and r["sim_counts"] > 0
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
        runner = OrtRunner(piper.seed_random_nodes(self._tail, seed))
        out = runner.session.run(None, {self.seam.cond: np.ascontiguousarray(cond, np.float32),
                                        **piper.ids_feed(ids), self.seam.scales: self.voice.scales})
        return float(np.asarray(out[0]).ravel()[0])


def drift_rows(voice: piper.Voice, chunks: Sequence[tuple[str, Sequence[int]]],
               test_outputs: dict[int, dict[int, tuple]], seed: int = 1234, origin=None,
               refs: dict | None = None) -> list[dict]:
    """Per chunk and width: latent frames from fp32 cond vs from the tested cond (the simulator's,
    or any perturbed conditioning) under the same seed, and (the sampling's own scale) fp32 at
    seed vs fp32 at seed+1. `origin` (a runner, or the rows' where/target) stamps the rows.
    `refs`: a dict shared between calls over the same chunks (the fp32 frames per chunk), so a
    second set of outputs (the other rewrite) costs one duration run per chunk and width."""
    raw = OrtRunner(encoder_slice(voice.model))
    dur = Durations(voice)
    where = getattr(origin, "where", "simulator")
    target = getattr(origin, "target", "none")
    refs = {} if refs is None else refs
    rows = []
    for k, (text, ids) in enumerate(chunks):
        if not any(k in test_outputs[frames] for frames in test_outputs):
            continue
        key = (tuple(ids), seed)
        if key not in refs:
            cond = raw.run(piper.ids_feed(ids))[1]
            refs[key] = (dur.frames(cond, ids, seed), dur.frames(cond, ids, seed + 1))
        ref, other = refs[key]
        for frames in sorted(test_outputs):
            if k not in test_outputs[frames]:
                continue
            got = dur.frames(test_outputs[frames][k][1], ids, seed)
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
                      seed: int = 1234) -> list[dict]:
    """How much duration drift a given conditioning SNR buys: fp32 conditioning plus white
    noise scaled to each SNR, frames under the same flow seed as the clean run.

    A model, not an engine measurement (rows are `host`): it says where the simulator's
    ~63 dB and the seeds' 40-48 dB board engines should land, since the drift is the duration
    flows integrating the conditioning error across a chunk.
    """
    raw = OrtRunner(encoder_slice(voice.model))
    dur = Durations(voice)
    rng = np.random.default_rng(seed)
    rows = []
    for _, ids in tqdm(chunks, desc="drift sensitivity"):
        cond = raw.run(piper.ids_feed(ids))[1]
        ref = dur.frames(cond, ids, seed)
        power = float(np.mean(cond.astype(np.float64) ** 2))
        for snr in snrs:
            for k in range(draws):
                noise = rng.standard_normal(cond.shape) * math.sqrt(power / 10 ** (snr / 10))
                got = dur.frames((cond + noise).astype(np.float32), ids, seed)
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
    when the rows carry it."""
    out = []
    for lands in sorted({r[key] for r in rows}, key=lambda s: (s == FALLBACK, len(s), s)):
        sel = [r for r in rows if r[key] == lands]
        t = [r["tokens"] for r in sel]
        row = {"lands": lands, "chunks": len(t), "tokens_min": min(t), "tokens_max": max(t)}
        if all("drift_pct" in r for r in sel):
            d = [r["drift_pct"] for r in sel]
            row.update({"drift_min_pct": min(d), "drift_max_pct": max(d)})
        out.append({**row, "where": sel[0].get("where", HOST.where), "target": sel[0].get("target", "none")})
    return out


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


def run_ladder(voice: piper.Voice, widths: Sequence[int], chunks: Sequence[tuple[str, Sequence[int]]],
               target: str = "rk3588", seed: int = 1234, mode: str = GATHER) -> list[dict]:
    """The sidecar end to end: simulator engines at `widths` (relshift `mode`, built one after
    another), fp32 fallback above; per chunk, where it ran, stats/cond SNR against fp32 and the
    frame drift."""
    runners = []
    try:
        engines = []
        for w in sorted(widths):
            product = produce(voice, w, mode=mode)
            runner = SimulatorRunner(product.path, target)
            runners.append(runner)
            engines.append(LadderEngine(runner, product.contract))
        ladder = ladder_for(voice, engines)
        raw = OrtRunner(encoder_slice(voice.model))
        dur = Durations(voice)
        rows = []
        for k, (text, ids) in enumerate(tqdm(chunks, desc="ladder chunks")):
            stats, cond, where = ladder.run(ids)
            ref = raw.run(piper.ids_feed(ids))
            f_ref, f_got = dur.frames(ref[1], ids, seed), dur.frames(cond, ids, seed)
            origin = raw if where == FALLBACK else runners[0]
            rows.append({"relshift": mode, "chunk": k, "tokens": len(ids), "ran_on": where,
                         "stats_snr_db": gates.snr_db(ref[0], stats), "cond_snr_db": gates.snr_db(ref[1], cond),
                         "fp32_frames": f_ref, "ladder_frames": f_got,
                         "drift_pct": 100.0 * (f_got - f_ref) / f_ref, "text": text[:48],
                         "where": origin.where, "target": origin.target})
        return rows
    finally:
        for r in runners:
            r.close()


# --- quantization: one width, calibrated on the ids of real text ----------------------------------
QUANT_CALIBRATION_TEXTS = ("paragraph",)
QUANT_EVALUATION_TEXTS = ("short", "phone")


def quantization_stage(voice: piper.Voice | None = None, width: int = 64,
                       calibration_texts: Sequence[str] = QUANT_CALIBRATION_TEXTS,
                       evaluation_texts: Sequence[str] = QUANT_EVALUATION_TEXTS, chunk_chars: int = 25,
                       calibration_chunks: int | None = None):
    """The width-`width` encoder as rkstudy.quantize sees it: the calibration feeds are the padded
    phoneme ids of `calibration_texts` chunked at `chunk_chars` characters as the runtime chunks
    them (chunks wider than the engine left out; `calibration_chunks` of them evenly spread), the
    evaluation chunks come from `evaluation_texts` (no text in both). Each chunk is scored on its
    real tokens, stats and cond each a window of its own (the durations come from cond, the
    decoder's latent from stats); the utterance column is every chunk's outputs back to back."""
    from ...quantize import Stage, span_scores
    from ..piper_decoder.study import held_apart

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

    def score(refs, tests):
        return span_scores(refs, tests, [[(0, sizes[len(ids)]), (sizes[len(ids)], a.size)]
                                         for ids, a in zip(evaluation, refs)])

    return Stage(name=f"Piper encoder width {width}", onnx=product.path,
                 calibration=[pad_ids(ids, width) for ids in evenly(chunks(calibration_texts), calibration_chunks)],
                 evaluation=evaluation, walk=walk, score=score,
                 texts={"calibration": ", ".join(calibration_texts), "evaluation": ", ".join(evaluation_texts)})
