"""One stage through the whole lever (host): what notebook 08 runs per plan.

The driver of the other modules: the default calibration and its one-setting variations, the ranking, the
isolation, the search and its chosen points carried to every other target, each a row a Bench records.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ...contract import QUANTIZED_DTYPES
from ...toolkit.calibration import Calibration
from .bench import Bench
from .curves import FP16_LIKE_PESQ, GOOD_PESQ, cheapest
from .isolation import isolation
from .probe import builds
from .ranking import rank_layers, ranked_keep
from .search import FIDELITY, fidelity_of, path, refiner, search
from .shares import mac_accounting
from .stages import Stage, evenly
from .tensors import config_groups, group_macs

DEFAULT_SAMPLES = 16  # calibration samples of the default setting (evenly spread over the stage's set)


@dataclass
class StageRun:
    """What one stage's measurements produced: every full-evaluation row (`rows`: fp16, each dtype and
    calibration, auto-hybrid, the search's points re-scored on the full evaluation, their transfer to the
    other targets), the search rows (on the search items), the ranking and its curve, the isolation, the
    MAC accounting of its fp16 build, the cheapest settings per target, and the minutes it took."""

    stage: Stage
    rows: list[dict] = field(default_factory=list)
    search: list[dict] = field(default_factory=list)
    ranking: list[dict] = field(default_factory=list)
    isolation: list[dict] = field(default_factory=list)
    accounting: list[dict] = field(default_factory=list)
    cheapest: list[dict] = field(default_factory=list)
    minutes: float = 0.0


def _calibration(stage: Stage, dtype: str = "w8a8", algorithm: str = "normal", method: str = "channel",
                 samples: int | None = DEFAULT_SAMPLES) -> Calibration:
    return Calibration(evenly(stage.calibration, samples), dtype=dtype, algorithm=algorithm, method=method)


def _chosen(search_rows: Sequence[Mapping], floors: Sequence[float], metric: str, spread: int = 6) -> list[Mapping]:
    """The search points worth scoring on the full evaluation: the greedy path from the top down to the
    first point under the lowest floor, and the cheapest point at or above each floor (refined included);
    with no floors (a stage scored by SNR), `spread` points of the path evenly spread."""
    if not floors:
        return evenly(path(search_rows), spread)
    picked = []
    for r in path(search_rows):
        picked.append(r)
        if floors and isinstance(r.get(metric), (int, float)) and r[metric] < min(floors):
            break
    picked += at_floors(search_rows, floors, metric)
    out, seen = [], set()
    for r in picked:
        if r["fp16_groups"] not in seen:
            seen.add(r["fp16_groups"])
            out.append(r)
    return out


def at_floors(search_rows: Sequence[Mapping], floors: Sequence[float], metric: str) -> list[Mapping]:
    """The search's cheapest point (most MACs on low bits) at or above each floor, once each."""
    out = []
    for floor in floors:
        above = [r for r in search_rows if isinstance(r.get(metric), (int, float)) and r[metric] >= floor]
        best = max(above, key=lambda r: r.get("low_bit_mac_share") or 0.0, default=None)
        if best is not None and all(best["fp16_groups"] != r["fp16_groups"] for r in out):
            out.append(best)
    return out


def keep_for(groups: Mapping[str, Sequence[str]], refine: Callable, labels: str) -> list[str] | None:
    """The config tensors of a row's `fp16_groups` (' + '-joined labels, a refined one 'group / module'),
    in another session's groups; None when a label has no counterpart there."""
    keep = []
    for label in filter(None, labels.split(" + ")):
        if label in groups:
            keep += groups[label]
            continue
        parent, _, sub = label.partition(" / ")
        finer = refine(parent) if parent in groups else {}
        if sub not in finer:
            return None
        keep += finer[sub]
    return keep


def run_stage(make: Callable[[], Stage], settings: Mapping, probe_rows: Sequence[Mapping],
              progress: Callable[[str], None] | None = None) -> StageRun:
    """One stage through the lever, as its family's plan says (`settings`):

    * `targets` (first: the primary) and, per target, every dtype the probe says it builds (of `dtypes`,
      when given): fp16 and each dtype's default calibration (DEFAULT_SAMPLES samples, normal, per channel);
    * on the primary, `grid`: the default w8a8 calibration varied one setting at a time (algorithm,
      method, samples), and `auto_hybrid` thresholds;
    * on the primary, `isolation` and `ranking` ({"samples", "counts"}: accuracy_analysis on that many
      calibration samples, its N worst layers kept in float16 on the search's footing), and `search`
      ({"budget", "depth", "forward"}: rkstudy.levers.quantization.search.search, backward, refined at the two PESQ
      bars; `depth` moves blocks of that many module levels instead of the stage's groups; `forward` also runs
      the forward greedy with that budget, from the plain build up), its chosen
      points re-scored on the full evaluation, the cheapest at each bar carried to every other target's
      w8a8 session;
    * the cheapest settings per target (`cheapest`) and the MAC accounting of the primary's fp16 build."""
    import time

    say = progress or (lambda _: None)
    started = time.monotonic()
    stage = make()
    run = StageRun(stage)
    targets = list(settings.get("targets", ("rk3588",)))
    primary = targets[0]
    metric = fidelity_of(stage)
    chosen: list[Mapping] = []
    carried: list[Mapping] = []
    for target in targets:
        bench = Bench(stage, target, progress=say)
        fp16 = bench.build("fp16")
        rows = [fp16]
        if target == primary and fp16.get("status") == "ok" and (report := bench.report()) is not None:
            run.accounting.append(mac_accounting(stage, report))
        floors = ([fp16[metric] - FP16_LIKE_PESQ, GOOD_PESQ] if metric == FIDELITY and
                  isinstance(fp16.get(metric), (int, float)) else [])
        for dtype in [d for d in builds(probe_rows, target) if d in settings.get("dtypes", QUANTIZED_DTYPES)]:
            calibration = _calibration(stage, dtype)
            with bench.session(calibration) as session:
                rows.append(session.measure([], calibration.label))
                if dtype != "w8a8" or session.failed is not None:
                    continue
                names = session.quantized()
                depth = (settings.get("search") or {}).get("depth")  # coarser blocks than the stage's own
                groups = config_groups(stage, names, depth=depth)
                refine = refiner(stage, groups)
                if target == primary:
                    fixed = [t for g, w in group_macs(stage, groups).items() if not w for t in groups[g]]
                    if settings.get("ranking"):
                        spec = settings["ranking"]
                        run.ranking = rank_layers(stage, target, calibration, samples=spec.get("samples", 2))
                        for n in spec.get("counts", ()):
                            n = min(n, len(run.ranking))
                            keep = ranked_keep(stage, run.ranking, names, n, fixed)
                            rows.append({**session.measure(keep, f"accuracy_analysis ranking: {n} worst in float16"),
                                         "ranked_layers": n})
                    if settings.get("isolation") and run.ranking:
                        run.isolation = isolation(session, [r["layer"] for r in run.ranking])
                    if settings.get("search"):
                        run.search = search(session, groups, refine=refine, floors=floors,
                                            budget=settings["search"].get("budget", 40))
                        if settings["search"].get("forward"):  # the same greedy from the plain build up
                            run.search += search(session, groups, direction="forward", label="forward search",
                                                 budget=settings["search"]["forward"])
                        backward = [r for r in run.search if r["search"] == "search"]
                        chosen = _chosen(backward, floors, metric)
                        carried = at_floors(backward, floors, metric)
                # the primary scores every chosen point; another target, the cheapest at each bar
                for r in chosen if target == primary else carried:
                    keep = keep_for(groups, refine, r["fp16_groups"])
                    if keep is not None:
                        rows.append({**session.measure(keep, f"search: {r['search_move']}", groups=r["fp16_groups"]),
                                     "search_step": r["search_step"], "from_search_on": primary})
        if target == primary:
            for change in settings.get("grid", ()):
                calibration = _calibration(stage, **change)
                with bench.session(calibration) as session:
                    rows.append({**session.measure([], f"{calibration.label}, {len(calibration.feeds)} samples"),
                                 "grid": ", ".join(f"{k}={v}" for k, v in change.items())})
            for threshold in settings.get("auto_hybrid", ()):
                quantize = _calibration(stage)
                quantize = Calibration(quantize.feeds, auto_hybrid_cos=threshold)
                rows.append(bench.build(f"auto-hybrid cos {threshold:g}", quantize))
        run.rows += rows
        if fp16.get("status") == "ok" and stage.listens:
            run.cheapest += cheapest(rows, fp16)
        elif fp16.get("status") == "ok":  # an encoder's statistics: no listener's bar to hold
            best = max((r for r in rows if r.get("dtype") != "fp16" and isinstance(r.get(metric), (int, float))),
                       key=lambda r: r[metric], default=None)
            run.cheapest.append({"stage": stage.name, "soc": target, "criterion": "PESQ-WB", "found": False,
                                 "why_none": "its outputs are no audio, so no listener's score applies; the best "
                                 f"quantized {metric} is {best[metric]:.1f} dB ({best['setting']})" if best else
                                 "its outputs are no audio, and no quantized setting was scored",
                                 "where": "simulator", "target": target})
    run.minutes = round((time.monotonic() - started) / 60, 1)
    return run
