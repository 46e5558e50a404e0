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
  a REGTASK budget (lines and largest field value), per target. By default the budget is clean: no
  REGTASK line at all (CLEAN), the only engines the reference documents' board figures vouch for; a
  caller may allow an at-risk budget, and every row says which budget it was held to. The lines and the
  largest field value grow with the window, so the search predicts the widest window within the budget
  from a straight-line fit (rkstudy.fits) of the builds it has, then builds the predicted window and the
  next one up to confirm it: the answer is always two measured builds, one within and one over, and the
  fit only chooses which two. When today's window is itself over the budget the search goes down from it
  the same way. Builds go through rkstudy.toolkit.build.build_engine, whose cache is keyed by the ONNX
  bytes, so a window another cell has built is not built again. The engine's graph depends only on the
  window length, not on how it splits into emit and context.

Then the plan: for each SNR target, emit = largest clean window - 2 x minimum context, the compute
ratio emit / window (the reference documents' hand-picked Piper window: 45 / 93 = 0.48), and what that
window would take on the NPU per call and per emitted frame: the NPU cost model's prediction from the
window's own build (rkstudy.toolkit.cost; a prediction with its terms, not a board number).

A decoder with one walked input (Piper, Inflect) is a latent array [C, N] and a decode of it. A decoder
with several walked inputs (Kokoro: the latent and its harmonic input, each at its own rate) hands the
planner opaque latents and says how one is walked, perturbed and imitated by white noise.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from .. import fits, gates
from ..process import shows_progress
from ..tables.results import HOST
from .window import interior_windows

RF_LEVEL_DB = -120.0
CLEAN = (0, 0)   # the default budget: no REGTASK line (so no field value past the target's limit)
# A toolkit build is one child whose main thread does all the work (its other threads stay idle), so
# two builds side by side take the time of one on the two cores this project runs on.
BUILD_WORKERS = 2


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
                    perturb: Callable | None = None, n_frames: Callable | None = None,
                    reference: np.ndarray | None = None) -> dict:
    """How many latent frames before and after a perturbed frame the output changes by more than
    `level_db` relative to the output's peak. The perturbation replaces one frame with an independent
    draw of the latent's own scale (a full-scale change of one frame); the widest extent over the
    perturbed `frames` (default: three interior frames) is reported, with the latent's length beside it
    (a decoder whose normalization spans the whole input reaches every frame). `reference` is
    `decode(z)` when the caller already has it."""
    perturb, n = perturb or _replace_frame, (n_frames or _frames)(z)
    frames = list(frames) if frames is not None else [n // 4, n // 2, 3 * n // 4]
    base = decode(z) if reference is None else reference
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
                       n_frames: Callable | None = None, references: Sequence[np.ndarray] | None = None
                       ) -> float | None:
    """Worst per-window SNR of the interior windows (rkstudy.walk.window.Window.kind) of a walk (fp32, the
    dynamic graph at the window's length) against full-length decodes; None (not measured) when no latent
    has an interior window: no window scored is no evidence, never a pass. `references` are the
    full-length decodes when the caller has them (one per latent, shared by every context). A single
    latent array decodes only its interior windows, each alone: the walk's other windows are never
    scored, and an interior window holds real frames only, so its decode is the walk's own."""
    worst = None
    for i, z in enumerate(latents):
        n = (n_frames or _frames)(z)
        windows = interior_windows(n, emit, context)
        if not windows:
            continue
        full = decode(z) if references is None else references[i]
        walked = walk(z, emit, context).reshape(-1) if walk is not None else None
        for w in windows:
            a, b = w.emit_start * hop, w.emit_stop * hop
            if walked is None:
                span = w.offset * hop, (w.offset + w.emit_stop - w.emit_start) * hop
                out = decode(z[:, w.start:w.start + w.real])[span[0]:span[1]]
            else:
                out = walked[a:b]
            db = gates.snr_db(full[a:b], out)
            worst = db if worst is None else min(worst, db)
    return worst


def context_sweep(decode, latents, hop: int, contexts: Sequence[int], emit: int, kind: str, *,
                  walk: Callable | None = None, n_frames: Callable | None = None,
                  references: Sequence[np.ndarray] | None = None) -> list[dict]:
    """Worst interior-window SNR at each context (fp32), against one full-length decode per latent."""
    if references is None:
        references = [decode(z) for z in latents]
    return [{"latents": kind, "context": c, "emit": emit, "window": emit + 2 * c,
             "worst_interior_snr_db": worst_interior_snr(decode, latents, hop, emit, c, walk=walk, n_frames=n_frames,
                                                         references=references),
             "where": "fp32"}
            for c in tqdm(contexts, desc=f"contexts ({kind})", leave=False, disable=not shows_progress())]


def min_context(rows: Sequence[dict], snr_db: float, kind: str = "speech") -> int | None:
    """The smallest context whose worst interior window reaches `snr_db` (and every larger one does too);
    a context with no interior window measured (worst None) reaches nothing."""
    sel = sorted((r for r in rows if r["latents"] == kind), key=lambda r: r["context"])
    ok = [r["worst_interior_snr_db"] is not None and r["worst_interior_snr_db"] >= snr_db for r in sel]
    for i, r in enumerate(sel):
        if all(ok[i:]):
            return r["context"]
    return None


def within(report, budget: tuple[int, int]) -> bool:
    lines, value = budget
    return report.ok and report.regtask <= lines and report.regtask_max <= value


def budget_text(budget: tuple[int, int], target: str) -> str:
    """What a budget allows, in words a row carries: clean (no REGTASK line) or the at-risk lines and value."""
    lines, value = budget
    limit = gates.field_limit(target)
    if lines == 0:
        return f"clean: no REGTASK line (no field value past {target}'s limit of {limit:,})"
    return (f"at risk allowed: up to {lines:,} REGTASK lines and a largest field value of {value:,} "
            f"(field limit {limit:,}; the simulator does not model the overflow)")


def predicted_row(report) -> dict:
    """The NPU cost model's columns for a build's engine (BuildReport.prediction().row()), or the same columns
    empty with why where there is no toolkit build behind the row."""
    from ..toolkit.cost import unpredicted_row

    if report is None:
        return unpredicted_row("not built: no layer table to predict from")
    prediction = getattr(report, "prediction", None)
    return prediction().row() if prediction else unpredicted_row("no toolkit build behind this row")


@dataclass
class WindowSearch:
    """The widest window within a budget on one target: `window` (None when even the narrowest is
    over), the rows of every build and prediction the search made, `confirmed_by`, the two
    builds that bound the answer ("95 within, 96 over"; only the widest window searched when it is
    within), and `reports`, every build's report by window."""

    window: int | None
    rows: list[dict]
    confirmed_by: str
    reports: dict = field(default_factory=dict)


def _levels(budget: tuple[int, int], target: str) -> dict[str, float]:
    """What each logged quantity may reach within `budget`. A budget of no REGTASK line at all is a
    largest field value at the target's field limit (a line is logged only past it), so the value,
    not the line count, is what can be fitted there."""
    lines, value = budget
    if lines == 0:
        return {"regtask_max": float(gates.field_limit(target))}
    return {"regtask": float(lines), "regtask_max": float(value)}


def predict_widest(builds: Mapping[int, Any], budget: tuple[int, int], target: str, lo: int,
                   upper: int) -> tuple[int | None, dict[str, float], list[int]]:
    """The widest window in [lo, upper] a straight-line fit of the builds predicts within `budget`,
    the fit's REGTASK lines and largest value there, and the windows it was fitted on; None when the
    builds give no growth to fit.

    Each quantity is fitted on the two nearest builds at or above `lo` (the widest window known
    within) that logged REGTASK lines: a build that logged none says only that its field values stayed
    under the limit, and far builds may have crossed into another regime (a flood of lines). One
    such build gives a line through the origin (a field value grows with the axis it counts); a flat
    fit predicts nothing."""
    logged = sorted(w for w, r in builds.items() if w >= lo and r.ok and r.regtask > 0)[:2]
    powers = (0, 1) if len(logged) == 2 else (1,)
    lines = {q: fits.polynomial(logged, [getattr(builds[w], q) for w in logged], powers)[0] if logged else None
             for q in ("regtask", "regtask_max")}
    growing = {q: level for q, level in _levels(budget, target).items()
               if lines[q] is not None and lines[q][-1] > 0}
    if not growing:
        return None, {}, logged
    widest = upper
    for quantity, level in growing.items():
        reach = fits.crossing(lines[quantity], powers, level)  # None: the level is passed at every width
        widest = min(widest, int(np.floor(reach + 1e-6)) if reach is not None else lo)
    w = max(widest, lo)
    at = {q: float(sum(c * w ** k for c, k in zip(coef, powers))) for q, coef in lines.items()}
    return w, at, logged


def largest_clean_window(engine: Callable[[int], object], target: str, budget: tuple[int, int], lo: int, hi: int,
                         build=None, known: Mapping[int, Any] | None = None, floor: int = 1) -> WindowSearch:
    """The longest window in [floor, hi] within `budget`, starting from `lo` (today's window), predicted from
    the builds so far and confirmed by building the predicted window and the next one up (predict_widest),
    the two side by side. When `lo` is over the budget the answer lies below it: the fit (or, past it,
    `floor`) finds a window within first, and the search goes on up from there; lines that do not shrink with
    the window (no fit reaches them) cost the fit's pair and the floor's, not a pair per halving.
    `known` maps windows to the reports of builds made elsewhere (used as measured, never rebuilt).
    Where the fit has nothing to go on the search steps up from the widest clean window by 1, 2, 4, ...
    frames. Once the fit has missed twice in a row on one side (a staircase of field values: flat, then a
    jump) the search stops asking it and steps up or bisects, so the worst case is a few builds more than
    bisection, never a scan. Every build and prediction is a row (`source` built, known or predicted) with
    the budget it was held to and the NPU cost model's prediction for the built engines, so a board user
    can move the budget."""
    from ..toolkit.build import build_engine

    build = build or (lambda path: build_engine(path, target))
    builds, rows, known = {}, [], dict(known or {})
    stated = budget_text(budget, target)

    def row(w, source, report=None, at=None, fitted=()):
        # source: built (by this search, through the build cache), known (made before the search: the
        # budget's build or another cell's) or predicted (the fit's lines and value; no engine)
        rows.append({"target": target, "window": w, "source": source,
                     "regtask": report.regtask if report else None,
                     "regtask_max_value": report.regtask_max if report else None,
                     "status": report.status if report else "predicted",
                     "engine_mb": round(report.engine_bytes / 1e6, 3) if report else None,
                     "predicted_regtask": round(at["regtask"]) if at else None,
                     "predicted_regtask_max_value": round(at["regtask_max"]) if at else None,
                     "fitted_on": ", ".join(map(str, fitted)),
                     "budget_lines": budget[0], "budget_value": budget[1], "budget": stated,
                     "within_budget": within(report, budget) if report else True,
                     **predicted_row(report), "where": HOST.where})

    def measure(windows: Sequence[int]) -> None:
        """Build the windows not measured yet, BUILD_WORKERS at a time (produced one at a time here:
        a producer is not safe to run twice at once)."""
        todo = [w for w in sorted(set(windows)) if w not in builds]
        for w in (w for w in todo if w in known):
            builds[w] = known[w]
            row(w, "known", known[w])
        fresh = [w for w in todo if w not in known]
        paths = [engine(w) for w in fresh]
        with ThreadPoolExecutor(max_workers=BUILD_WORKERS) as pool:
            for w, report in zip(fresh, pool.map(build, paths)):
                builds[w] = report
                row(w, "built", report)

    def bounds() -> tuple[int, int | None]:
        """The widest window within below the narrowest window over it (None: none over yet)."""
        over = min((w for w in builds if w > lo and not within(builds[w], budget)), default=None)
        return max(w for w in builds if (over is None or w < over) and within(builds[w], budget)), over

    def below(top: int) -> int | None:
        """A window within the budget below `top` (which is over): the fit's widest window within (with the
        next one up beside it), else `floor`; None when `floor` itself is over."""
        guess, at, fitted = predict_widest(builds, budget, target, floor, top - 1)
        if guess is not None:
            row(guess, "predicted", at=at, fitted=fitted)
        w = guess if guess is not None else floor
        while True:
            inside = [x for x in builds if floor <= x < top and within(builds[x], budget)]
            if inside or w is None:
                return max(inside, default=None)
            measure([x for x in (w, w + 1) if x < top])
            if not within(builds[w], budget):
                # past a missed fit, the floor: over, nothing narrower is within (one pair, where halving
                # down to it builds a pair per halving); within, the search goes up from it
                top, w = w, None if w <= floor else floor

    measure([lo] + [w for w in known if floor <= w <= hi])  # builds made elsewhere are data from the start
    if not within(builds[lo], budget):
        start = below(lo) if lo > floor else None
        if start is None:   # the narrowest window built is over: `floor` (built last by below), or `lo` itself
            return _search_result(None, rows, f"{min(lo, floor)} over", builds)
        lo = start
    step, misses = 1, (None, 0)
    while True:
        best, over = bounds()
        upper = over - 1 if over is not None else hi
        if best >= upper:
            break
        guess, at, fitted = predict_widest(builds, budget, target, best, upper) if misses[1] < 2 else (None, {}, [])
        if guess is not None:
            row(guess, "predicted", at=at, fitted=fitted)
            first = max(guess, best + 1)  # a guess already within: the next window up confirms it
            measure([w for w in (first, first + 1) if w <= upper])
            best, over = bounds()
            side = "low" if best > guess else "high" if over is not None and over <= guess else None
            # a fit that misses twice in a row on one side (a staircase of field values) is not asked again
            misses = (side, misses[1] + 1 if misses[0] == side else 1) if side else (None, 0)
        elif over is not None and misses[1] >= 2:
            measure([(best + upper + 1) // 2])
        else:
            measure([min(upper, best + step)])
            step *= 2
    confirmed = f"{best} within, {over} over" if over is not None else f"{best} within (the widest searched)"
    return _search_result(best, rows, confirmed, builds)


def _search_result(window, rows, confirmed_by, reports=None) -> WindowSearch:
    """By window; at one window in the order they happened (a prediction, then the build that checked it)."""
    return WindowSearch(window, sorted(rows, key=lambda r: r["window"]), confirmed_by, dict(reports or {}))


def plan_rows(windows: Mapping[str, int | None], sweep: Sequence[dict], snr_targets: Sequence[float],
              confirmed_by: Mapping[str, str] | None = None, budgets: Mapping[str, str] | None = None,
              reports: Mapping[str, Any] | None = None) -> list[dict]:
    """One plan per target and SNR: minimum context (speech), emit, compute ratio; white noise beside,
    the builds that confirmed the target's largest clean window and the budget it was held to (`budgets`:
    budget_text by target), and the NPU cost model's prediction for that window's engine (`reports`: its build
    by target): ms per window call, its terms, and ms per emitted frame."""
    out = []
    for target, w in windows.items():
        report = (reports or {}).get(target)
        predicted = predicted_row(report) if w is not None else predicted_row(None)
        for snr in snr_targets:
            c = min_context(sweep, snr, "speech")
            noise = min_context(sweep, snr, "white noise")
            emit = (w - 2 * c) if (w is not None and c is not None) else None
            emit = emit if emit and emit > 0 else None
            per_window = predicted["npu_ms_predicted"]
            out.append({"target": target, "snr_target_db": snr, "min_context_speech": c,
                        "min_context_white_noise": noise, "largest_clean_window": w,
                        "budget": (budgets or {}).get(target, ""),
                        "confirmed_by": (confirmed_by or {}).get(target, ""),
                        "emit": emit, "compute_ratio": (emit / w) if emit else None,
                        **predicted,
                        "npu_ms_per_emitted_frame_predicted": round(per_window / emit, 4)
                        if emit and per_window != "" else "",
                        "where": HOST.where})
    return out


def white_noise_like(latents: Sequence[np.ndarray], seed: int = 0) -> list[np.ndarray]:
    """White-noise latents of the same shapes and overall scale as the speech latents."""
    rng = np.random.default_rng(seed)
    scale = float(np.std(np.concatenate([z.ravel() for z in latents])))
    return [(rng.standard_normal(z.shape) * scale).astype(np.float32) for z in latents]


def receptive_field_rows(pt: PlanTarget, latent=None, reference: np.ndarray | None = None) -> list[dict]:
    """The receptive field of the decoder on `latent` (default: the longest of pt.latents), then of each
    of pt.variants on the same latent (rows labelled by `decode` when there are variants). `reference`
    is the decoder's full-length decode of that latent when the caller has it."""
    latent = latent if latent is not None else max(pt.latents, key=pt.n_frames or _frames)
    rf_kw = {"perturb": pt.perturb, "n_frames": pt.n_frames}
    rows = [{**receptive_field(pt.decode, latent, pt.hop, reference=reference, **rf_kw), "family": pt.family}]
    if pt.variants:
        rows = [{"decode": "as compiled", **rows[0]}]
        rows += [{"decode": name, **receptive_field(fn, latent, pt.hop, **rf_kw), "family": pt.family}
                 for name, fn in pt.variants.items()]
    return rows


def fp32_tables(pt: PlanTarget, contexts: Sequence[int] | None = None) -> dict[str, list[dict]]:
    """The planner's fp32 tables: the receptive field and the context sweep (speech and white noise),
    with one full-length decode per latent shared by the receptive field and every context."""
    n_frames = pt.n_frames or _frames
    references = [pt.decode(z) for z in pt.latents]
    longest = max(range(len(pt.latents)), key=lambda i: n_frames(pt.latents[i]))
    rf_rows = receptive_field_rows(pt, pt.latents[longest], references[longest])
    reach = max(rf_rows[0]["left_frames"], rf_rows[0]["right_frames"])
    if contexts is None:
        contexts = pt.contexts if pt.contexts is not None else range(0, reach + 9, 4)
    contexts = sorted(set(contexts) | {pt.default_context})
    noise = (pt.noise_like or (lambda latents, seed: white_noise_like(latents, seed)))(pt.latents, 0)
    walk_kw = {"walk": pt.walk, "n_frames": pt.n_frames}
    sweep = (context_sweep(pt.decode, pt.latents, pt.hop, contexts, pt.default_emit, "speech", references=references,
                           **walk_kw)
             + context_sweep(pt.decode, noise, pt.hop, contexts, pt.default_emit, "white noise", **walk_kw))
    return {"receptive_field": rf_rows, "context_sweep": sweep}


def plan(pt: PlanTarget, targets: Sequence[str], snr_targets: Sequence[float], *, contexts: Sequence[int] | None = None,
         max_window: int | None = None, budgets: dict | None = None, build=None,
         known: Mapping[tuple[int, str], Any] | None = None) -> dict[str, list[dict]]:
    """Every planner table for one decoder: receptive field, context sweep (speech and white noise),
    REGTASK candidates per target (built, known or predicted), and the plan per target and SNR target.

    The default budget per target is CLEAN: no REGTASK line. Today's window (default_emit + 2 x
    default_context) is where the search starts: up from it when it builds clean, down from it when it
    does not (no narrower than the smallest window with an emitted frame at the smallest context the SNR
    targets need, or at today's context when no context reaches them). `budgets` ({target: (lines,
    largest value)}) allows an at-risk budget instead; every row names its budget. `build(onnx_path,
    target)` replaces rkstudy.toolkit.build.build_engine; `known` maps (window, target) to the report of a
    build another cell made (the search takes it as measured, and fits from it before building anything)."""
    from ..toolkit.build import build_engine

    build = build or build_engine
    known = dict(known or {})
    tables = fp32_tables(pt, contexts)
    default_window = pt.default_emit + 2 * pt.default_context
    max_window = max_window or 2 * default_window
    contexts_needed = [c for c in (min_context(tables["context_sweep"], s) for s in snr_targets) if c is not None]
    floor = 2 * (min(contexts_needed) if contexts_needed else pt.default_context) + 1
    windows, confirmed, candidates, budget_rows, stated, reports = {}, {}, [], [], {}, {}
    for target in targets:
        budget = tuple(budgets[target]) if budgets and target in budgets else CLEAN
        stated[target] = budget_text(budget, target)
        budget_rows.append({"target": target, "budget_lines": budget[0], "budget_value": budget[1],
                            "budget": stated[target], "given": bool(budgets and target in budgets),
                            "start_window": default_window, "floor_window": floor, "where": HOST.where})
        search = largest_clean_window(pt.engine, target, budget, default_window, max_window,
                                      build=lambda path, target=target: build(path, target),
                                      known={w: r for (w, t), r in known.items() if t == target}, floor=floor)
        windows[target], confirmed[target] = search.window, search.confirmed_by
        reports[target] = search.reports.get(search.window)
        candidates += search.rows
    return {**tables, "budgets": budget_rows, "candidates": candidates,
            "plan": plan_rows(windows, tables["context_sweep"], snr_targets, confirmed, stated, reports)}
