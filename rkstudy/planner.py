"""The window planner (host): measure a walked decoder's window instead of picking it by hand.

Three measurements, each generic over any walked decoder a family adapts (rkstudy.families: a
`planner` entry returning a PlanTarget):

* receptive field: perturb one latent frame of a real-speech latent and record how far the output
  changes, left and right, down to a relative level (-120 dB of the output's peak by default), in the
  fp32 full-length decode;
* minimum context for a target SNR: the smallest context whose interior windows reach the target
  against a full-length decode, worst window over the given latents (speech; white noise reported
  beside it, which needs more context: the planner's verdict is for speech);
* the largest window the compiler takes cleanly: the longest window whose compiled engine stays within
  a REGTASK budget (lines and largest field value), per target, by bisection with real (cached) builds.
  The engine's graph depends only on the window length, not on how it splits into emit and context.

Then the plan: for each SNR target, emit = largest clean window - 2 x minimum context, and the compute
ratio emit / window (the seeds' hand-picked Piper window: 45 / 93 = 0.48).

A decoder with one walked input (Piper, Inflect) is a latent array [C, N] and a decode of it. A decoder
with several walked inputs (Kokoro: the latent and its harmonic input, each at its own rate) hands the
planner opaque latents and says how one is walked, perturbed and imitated by white noise.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from . import gates
from .results import HOST
from .window import plan_windows, walk_windows

RF_LEVEL_DB = -120.0


@dataclass
class PlanTarget:
    """What the planner needs from a family's walked decoder.

    decode(z [C, N]) -> output [N * hop] (fp32, full length, any N: the dynamic graph);
    engine(window) -> path of the produced ONNX at that window (pinned, folded: what is compiled);
    latents: real-speech latents [C, N]; default_window: today's hand-picked window (for RTF rows).
    """

    family: str
    hop: int
    decode: Callable[[Any], np.ndarray]
    engine: Callable[[int], object]
    latents: Sequence[Any]
    default_emit: int
    default_context: int
    budgets: dict = field(default_factory=dict)  # target -> (REGTASK lines, largest field value)
    # Several walked inputs: walk(latent, emit, context) -> output [N * hop] (fp32, the walked decode),
    # perturb(latent, frame, rng) -> a latent with that frame replaced, noise_like(latents, seed) ->
    # white-noise latents, n_frames(latent) -> N. The defaults are those of one latent array [C, N].
    walk: Callable[[Any, int, int], np.ndarray] | None = None
    perturb: Callable[[Any, int, np.random.Generator], Any] | None = None
    noise_like: Callable[[Sequence[Any], int], Sequence[Any]] | None = None
    n_frames: Callable[[Any], int] | None = None
    contexts: Sequence[int] | None = None   # the context sweep's points (default: 0 .. receptive field + 8)
    # Other decodes of the same latents whose receptive field is reported beside the decoder's own
    # (Kokoro: with its normalization statistics frozen, the convolutions' reach alone).
    variants: Mapping[str, Callable[[Any], np.ndarray]] = field(default_factory=dict)


def _frames(z) -> int:
    return int(z.shape[1])


def _replace_frame(z: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """One frame replaced with an independent draw of the latent's own scale (a full-scale change)."""
    moved = z.copy()
    moved[:, k] = rng.standard_normal(z.shape[0]).astype(np.float32) * float(np.std(z))
    return moved


def receptive_field(decode: Callable[[Any], np.ndarray], z, hop: int, *,
                    frames: Sequence[int] | None = None, level_db: float = RF_LEVEL_DB, seed: int = 0,
                    perturb: Callable | None = None, n_frames: Callable | None = None) -> dict:
    """How many latent frames before and after a perturbed frame the output changes by more than
    `level_db` relative to the output's peak. The perturbation replaces one frame with an independent
    draw of the latent's own scale (a full-scale change of one frame); the widest extent over the
    perturbed `frames` (default: three interior frames) is reported, with the latent's length beside it
    (a decoder whose normalization spans the whole input reaches every frame)."""
    perturb, n = perturb or _replace_frame, (n_frames or _frames)(z)
    frames = list(frames) if frames is not None else [n // 4, n // 2, 3 * n // 4]
    base = decode(z)
    peak = float(np.max(np.abs(base)))
    threshold = peak * 10 ** (level_db / 20)
    rng = np.random.default_rng(seed)
    left = right = 0
    for k in frames:
        changed = np.flatnonzero(np.abs(decode(perturb(z, k, rng)) - base) > threshold)
        if changed.size:
            left = max(left, k - changed[0] // hop)
            right = max(right, changed[-1] // hop - k)
    return {"left_frames": int(left), "right_frames": int(right), "level_db": level_db, "probed_frames": len(frames),
            "latent_frames": n, "where": "fp32"}


def worst_interior_snr(decode: Callable[[Any], np.ndarray], latents: Sequence[Any], hop: int,
                       emit: int, context: int, *, walk: Callable | None = None,
                       n_frames: Callable | None = None) -> float:
    """Worst per-window SNR of the interior windows of a walk (fp32, the dynamic graph at the window's
    length) against full-length decodes; inf when no latent has an interior window."""
    worst = float("inf")
    for z in latents:
        full = decode(z)
        if walk is None:
            walked = walk_windows(z, lambda x, m: decode(x * m), emit=emit, context=context, samples_per_frame=hop,
                                  progress=False)
        else:
            walked = walk(z, emit, context)
        n = (n_frames or _frames)(z)
        for w in plan_windows(n, emit, context):
            interior = w.real == emit + 2 * context and w.start > 0 and w.start + w.real < n
            if interior:
                a, b = w.emit_start * hop, w.emit_stop * hop
                worst = min(worst, gates.snr_db(full[a:b], walked.reshape(-1)[a:b]))
    return worst


def context_sweep(decode, latents, hop: int, contexts: Sequence[int], emit: int, kind: str, *,
                  walk: Callable | None = None, n_frames: Callable | None = None) -> list[dict]:
    """Worst interior-window SNR at each context (fp32)."""
    return [{"latents": kind, "context": c, "emit": emit, "window": emit + 2 * c,
             "worst_interior_snr_db": worst_interior_snr(decode, latents, hop, emit, c, walk=walk, n_frames=n_frames),
             "where": "fp32"}
            for c in tqdm(contexts, desc=f"contexts ({kind})", leave=False)]


def min_context(rows: Sequence[dict], snr_db: float, kind: str = "speech") -> int | None:
    """The smallest context whose worst interior window reaches `snr_db` (and every larger one does too)."""
    sel = sorted((r for r in rows if r["latents"] == kind), key=lambda r: r["context"])
    ok = [r["worst_interior_snr_db"] >= snr_db for r in sel]
    for i, r in enumerate(sel):
        if all(ok[i:]):
            return r["context"]
    return None


def within(report, budget: tuple[int, int]) -> bool:
    lines, value = budget
    return report.ok and report.regtask <= lines and report.regtask_max <= value


def largest_clean_window(engine: Callable[[int], object], target: str, budget: tuple[int, int], lo: int, hi: int,
                         build=None) -> tuple[int | None, list[dict]]:
    """Bisection over the window length in [lo, hi] for the longest window within `budget`; every
    candidate built (cached) is returned as a row, so a board user can move the budget."""
    from .build import build_engine

    build = build or (lambda path: build_engine(path, target))
    rows, cache = [], {}

    def clean(w: int) -> bool:
        if w not in cache:
            report = build(engine(w))
            cache[w] = within(report, budget)
            rows.append({"target": target, "window": w, "regtask": report.regtask,
                         "regtask_max_value": report.regtask_max, "status": report.status,
                         "engine_mb": round(report.engine_bytes / 1e6, 3), "budget_lines": budget[0],
                         "budget_value": budget[1], "within_budget": cache[w], "where": HOST.where})
        return cache[w]

    if not clean(lo):
        return None, rows
    if clean(hi):
        return hi, rows
    while hi - lo > 1:  # invariant: lo clean, hi not
        mid = (lo + hi) // 2
        if clean(mid):
            lo = mid
        else:
            hi = mid
    return lo, sorted(rows, key=lambda r: r["window"])


def plan_rows(windows: dict[str, int | None], sweep: Sequence[dict], snr_targets: Sequence[float]) -> list[dict]:
    """One plan per target and SNR: minimum context (speech), emit, compute ratio; white noise beside."""
    out = []
    for target, w in windows.items():
        for snr in snr_targets:
            c = min_context(sweep, snr, "speech")
            noise = min_context(sweep, snr, "white noise")
            emit = (w - 2 * c) if (w is not None and c is not None) else None
            out.append({"target": target, "snr_target_db": snr, "min_context_speech": c,
                        "min_context_white_noise": noise, "largest_clean_window": w,
                        "emit": emit if emit and emit > 0 else None,
                        "compute_ratio": (emit / w) if emit and emit > 0 else None, "where": HOST.where})
    return out


def white_noise_like(latents: Sequence[np.ndarray], seed: int = 0) -> list[np.ndarray]:
    """White-noise latents of the same shapes and overall scale as the speech latents."""
    rng = np.random.default_rng(seed)
    scale = float(np.std(np.concatenate([z.ravel() for z in latents])))
    return [(rng.standard_normal(z.shape) * scale).astype(np.float32) for z in latents]


def receptive_field_rows(pt: PlanTarget, latent=None) -> list[dict]:
    """The receptive field of the decoder on `latent` (default: the longest of pt.latents), then of each
    of pt.variants on the same latent (rows labelled by `decode` when there are variants)."""
    latent = latent if latent is not None else max(pt.latents, key=pt.n_frames or _frames)
    rf_kw = {"perturb": pt.perturb, "n_frames": pt.n_frames}
    rows = [{**receptive_field(pt.decode, latent, pt.hop, **rf_kw), "family": pt.family}]
    if pt.variants:
        rows = [{"decode": "as compiled", **rows[0]}]
        rows += [{"decode": name, **receptive_field(fn, latent, pt.hop, **rf_kw), "family": pt.family}
                 for name, fn in pt.variants.items()]
    return rows


def plan(pt: PlanTarget, targets: Sequence[str], snr_targets: Sequence[float], *, contexts: Sequence[int] | None = None,
         max_window: int | None = None, budgets: dict | None = None, build=None) -> dict[str, list[dict]]:
    """Every planner table for one decoder: receptive field, context sweep (speech and white noise),
    REGTASK candidates per target, and the plan per target and SNR target.

    The default budget per target is today's window's own build (the engine the seeds ran clean on
    a board): no more REGTASK lines and no larger field value than it logs. `build(onnx_path, target)`
    replaces rkstudy.build.build_engine (a study that has already built some windows passes them)."""
    from .build import build_engine

    build = build or build_engine
    rf_rows = receptive_field_rows(pt)
    reach = max(rf_rows[0]["left_frames"], rf_rows[0]["right_frames"])
    if contexts is None:
        contexts = pt.contexts if pt.contexts is not None else range(0, reach + 9, 4)
    contexts = sorted(set(contexts) | {pt.default_context})
    emit = pt.default_emit
    noise = (pt.noise_like or (lambda latents, seed: white_noise_like(latents, seed)))(pt.latents, 0)
    walk_kw = {"walk": pt.walk, "n_frames": pt.n_frames}
    sweep = (context_sweep(pt.decode, pt.latents, pt.hop, contexts, emit, "speech", **walk_kw)
             + context_sweep(pt.decode, noise, pt.hop, contexts, emit, "white noise", **walk_kw))
    default_window = pt.default_emit + 2 * pt.default_context
    max_window = max_window or 2 * default_window
    windows, candidates, budget_rows = {}, [], []
    for target in targets:
        if budgets and target in budgets:
            budget = budgets[target]
        else:
            report = build(pt.engine(default_window), target).raise_for_status()
            budget = (report.regtask, report.regtask_max)
        budget_rows.append({"target": target, "budget_window": default_window, "budget_lines": budget[0],
                            "budget_value": budget[1], "where": HOST.where})
        windows[target], rows = largest_clean_window(pt.engine, target, budget, default_window, max_window,
                                                     build=lambda path, target=target: build(path, target))
        candidates += rows
    return {"receptive_field": rf_rows, "context_sweep": sweep, "budgets": budget_rows,
            "candidates": candidates, "plan": plan_rows(windows, sweep, snr_targets)}
