"""The NPU cost model (rkstudy.toolkit.cost) held to the reference documents' board figures (host):
notebook 09's study.

Each family that the documents measured on a board offers, through its registry hook `npu_cost_cases(quick)`,
the engines the documents ran (built as they built them: rknn-toolkit2 2.3.2, rk3588, the core mask their
sidecars asked for) and the figures it can predict from those engines' predictions (a window's time
times the calls the document's walk makes, a ratio of two engines, a term's share). The figures are read
from data/reference/figures.csv, never typed.

FITTED names the figures the free constants are fitted on, chosen before any other figure's prediction
was computed, and at most a third of them; every other figure is held out. A held-out figure's verdict
is computed from its row: within +-25 % or not, and a miss names the term that carries the prediction.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from ..tables.results import reference_figure, reference_numbers
from ..toolkit.cost import TERMS, Basis, Constants, Prediction, fit, predict, relative_error

# The figures the three free constants are fitted on, one figure per constant where it dominates, chosen
# before any other figure was predicted:
# * the Sin layers' CPU time in the Kokoro exact-sine window: the one board figure that is a CPU term
#   alone (the runtime's operator ranking), so it sets the CPU factor and nothing else;
# * the Kokoro clipped-sine generator time: the document's own reading is that elementwise ops are most
#   of this graph's NPU time, so it sets the rate the NPU moves bytes at;
# * the duration encoder's 128-token bin: a small engine of a few hundred short layers, where the fixed
#   cost per layer weighs most, so it sets the dispatch cost.
# The Kokoro time per latent frame is the same board measurement as its generator time (divided by the
# frames), so it counts as fitted too.
FITTED = ("kokoro-sin-cpu-ms", "kokoro-clipped-generator-ms", "encoder-n128-ms")
SAME_MEASUREMENT = {"kokoro-clipped-ms-per-frame": "kokoro-clipped-generator-ms"}
# Figures the model's form was chosen against: a first form (a fitted elementwise rate, the CPU's DRAM
# ceiling for the convolutions' bytes, convolutions split over the mask's cores) missed them with these
# constants fitted, and the present form (one fitted memory rate for every NPU layer's bytes, one core,
# the encoder figure's duration flows) was chosen knowing those errors. They are shown with their errors
# and not counted as held out; the held-out figures are those no form of the model was chosen against.
SHAPED_BY = ("piper-decoder-ms", "piper-ms-per-slice", "encoder-n384-ms", "kokoro-folded-increase",
             "kokoro-exact-window-ms", "kokoro-elementwise-share", "kokoro-conv-share")
TOLERANCE = 0.25   # a held-out figure is predicted when within +-25 % of theirs
# How many times a run times its engines' CPU layers and I/O on this host (all engines together each time): the
# predictions take each op's fastest, and a verdict must hold at its slowest too (rows)
TIMINGS = 5
START = Constants(dram_share=0.2, dispatch_us=50.0, cpu_factor=2.0)   # where the fit starts


@dataclass(frozen=True)
class Engine:
    """An engine a figure reads: its name, how to make its graph, the toolkit and SoC it is built for (the
    document's), and the core mask it ran under."""

    name: str
    make: Callable[[], Path]
    toolkit: str | None = "2.3.2"
    target: str = "rk3588"
    mask: str = "0_1_2"


@dataclass(frozen=True)
class Outcome:
    """A figure's prediction in the figure's unit, and the part of it each term carries (same unit)."""

    value: float
    parts: Mapping[str, float]


@dataclass(frozen=True)
class Figure:
    """One board figure of the reference documents and how the model predicts it. `numbers` picks the
    figure's own numbers out of its value ('0.0696 / 175 MB / 1030': slice(2, 3)); several make a range."""

    key: str
    study: str
    figure: str
    numbers: slice
    quantity: str
    unit: str
    engines: tuple[str, ...]
    predict: Callable[[Mapping[str, Prediction]], Outcome]
    how: str = ""   # what the prediction assumes beyond the engines (the walk, the calls)
    derive: Callable[[list[float]], list[float]] | None = None   # their quantity from their numbers (a ratio)
    board_cpu_ms: float = 0.0   # board CPU time the figure covers beyond its engines (already the board's ms)

    def theirs(self) -> list[float]:
        picked = reference_numbers(self.study, self.figure)[self.numbers]
        return self.derive(picked) if self.derive else picked

    def outcome(self, predictions: Mapping[str, Prediction]) -> Outcome:
        """The prediction of this figure: its engines' part, plus the board CPU time it covers beyond them."""
        got = self.predict(predictions)
        return plus_cpu(got, self.board_cpu_ms) if self.board_cpu_ms else got


@dataclass
class Cases:
    """What one family offers the calibration: its engines and the figures they predict (`families`: the
    family each figure came from, by figure key, where collect() asked the families)."""

    engines: list[Engine] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    families: dict[str, str] = field(default_factory=dict)

    def __add__(self, other: Cases) -> Cases:
        return Cases(self.engines + other.engines, self.figures + other.figures, {**self.families, **other.families})


def collect(quick: bool, families: Sequence[str] | None = None) -> Cases:
    """Every registered family's cases (or those of `families`), in registry order."""
    from ..registry import hooked

    out = Cases()
    for family, cases in hooked("npu_cost_cases"):
        if families is None or family.name in families:
            c = cases(quick)
            out = out + Cases(c.engines, c.figures, {f.key: family.name for f in c.figures})
    return out


def role(key: str) -> str:
    if key in FITTED:
        return "fitted"
    if key in SAME_MEASUREMENT:
        return f"fitted (the same board measurement as {SAME_MEASUREMENT[key]})"
    if key in SHAPED_BY:
        return "seen: the model's form was chosen knowing its error"
    return "held out"


# --- parts of a prediction ---------------------------------------------------------------------------
def times(p: Prediction, calls: float) -> Outcome:
    """`calls` calls of the engine: its time and its terms, each times the calls."""
    return Outcome(p.ms * calls, {k: v * calls for k, v in p.terms.items()})


def minus(a: Outcome, b: Outcome) -> Outcome:
    """How much longer `a` takes than `b`, term by term."""
    return Outcome(a.value - b.value, {k: a.parts.get(k, 0.0) - b.parts.get(k, 0.0) for k in {**a.parts, **b.parts}})


def plus_cpu(a: Outcome, ms: float) -> Outcome:
    """`a` with `ms` more of CPU time (work the figure covers beyond the engine, already scaled to the board)."""
    return Outcome(a.value + ms, {**a.parts, "cpu": a.parts.get("cpu", 0.0) + ms})


def increase(slower: Prediction, faster: Prediction) -> Outcome:
    """How much longer one engine's call is than another's, in %, with each term's share of the difference."""
    return Outcome(100 * (slower.ms / faster.ms - 1),
                   {k: 100 * (slower.terms[k] - faster.terms[k]) / faster.ms for k in TERMS})


def npu_share(p: Prediction, kind: str) -> Outcome:
    """The share (%) of the NPU's own time (CPU layers and I/O left out) spent in one kind of layer: `conv`
    (layers with cycles: their compute, their wait for DRAM and their dispatch) or `elementwise` (layers
    with bytes and no cycles, with their dispatch)."""
    b, t, d = p.basis, p.terms, p.constants.dispatch_us / 1e3
    part = (t["conv"] + t["dram"] + b.conv_layers * d if kind == "conv"
            else t["elementwise"] + b.elementwise_layers * d)
    return Outcome(100 * part / p.npu_ms, {kind: 100 * part / p.npu_ms})


def cpu_op(p: Prediction, op: str) -> Outcome:
    """The CPU time of one op's layers (the cpu term restricted to them)."""
    ms = dict(p.basis.cpu_host_by_op).get(op, 0.0) * p.constants.cpu_factor
    return Outcome(ms, {"cpu": ms})


def extrapolated(points: Mapping[float, Prediction], x: float) -> Prediction:
    """A prediction at width `x` from predictions at other widths: every sum of the basis as a power law
    of the width through the points (least squares in log-log), as a compiled width that would not
    build here grows. The layer counts are the widest point's."""
    import numpy as np

    xs = sorted(points)
    last = points[xs[-1]]

    def grown(ys: Sequence[float]) -> float:
        if any(y <= 0 for y in ys):
            return 0.0
        k, a = np.polyfit(np.log(xs), np.log(ys), 1)
        return math.exp(a) * x ** k

    values = {}
    for f in fields(Basis):
        ys = [getattr(points[k].basis, f.name) for k in xs]
        if f.name == "conv_costs" and len({len(y) for y in ys}) == 1:   # layer by layer, the widths' layers aligned
            values[f.name] = tuple((grown([y[i][0] for y in ys]), int(grown([y[i][1] for y in ys])))
                                   for i in range(len(ys[0])))
        elif not all(isinstance(y, (int, float)) for y in ys) or f.name.endswith("layers") or f.name == "dram_gbps":
            values[f.name] = getattr(last.basis, f.name)
        else:
            values[f.name] = type(ys[-1])(grown(ys))
    return replace(last, basis=Basis(**values))


# --- the table ----------------------------------------------------------------------------------------
def predictions(cases: Cases, layers: Mapping[str, Sequence], models: Mapping[str, object] | None = None,
                constants: Constants | None = None) -> dict[str, Prediction]:
    """Each engine's prediction from its layer table (`layers` by engine name)."""
    by_name = {e.name: e for e in cases.engines}
    return {name: predict(table, by_name[name].target, by_name[name].mask, constants=constants,
                          model=(models or {}).get(name)) for name, table in layers.items()}


def fit_constants(cases: Cases, preds: Mapping[str, Prediction], fitted_on: str = "") -> Constants:
    """The constants that fit the FITTED figures best (log error, least squares)."""
    chosen = [f for f in cases.figures if f.key in FITTED]
    missing = sorted(set(FITTED) - {f.key for f in chosen})
    if missing:
        raise ValueError(f"the fitted figures {', '.join(missing)} have no case: run the full calibration")

    def residuals(c: Constants) -> list[float]:
        at = {k: p.at(c) for k, p in preds.items()}
        out = []
        for f in chosen:
            theirs = f.theirs()
            out.append(math.log(f.outcome(at).value / (sum(theirs) / len(theirs))))
        return out

    return fit(residuals, START, fitted_on=fitted_on)


def rows(cases: Cases, preds: Mapping[str, Prediction], builds: Mapping[str, str],
         slowest: Mapping[str, Prediction] | None = None) -> list[dict]:
    """One row per figure: theirs, the prediction, its error, fitted or held out, and the verdict computed
    from them (a miss names the term that carries the prediction, and by how much it would have to move
    alone). `builds` says how each engine was built. `slowest`: the same engines predicted at the slowest of
    this host's timings of their CPU layers and I/O (Run.slowest); a figure whose verdict those timings can
    turn, each engine at its fastest or its slowest, is undecided (undecided) and is not counted."""
    out = []
    for f in cases.figures:
        ref = reference_figure(f.study, f.figure)
        theirs = f.theirs()
        shown = sorted(set(theirs))
        row = {"figure": f.key, "quantity": f.quantity, "unit": f.unit,
               "theirs": f"{shown[0]:g} to {shown[-1]:g}" if len(shown) > 1 else f"{shown[0]:g}",
               "theirs_low": _round(shown[0]), "theirs_high": _round(shown[-1]),
               "role": role(f.key), "engines": "; ".join(builds.get(e, e) for e in f.engines),
               "assumes": f.how, "reference": f"{f.study}: {f.figure}", "document": ref["document"],
               "where": "host", "target": ref["target"]}
        missing = [preds[e].cannot for e in f.engines if e in preds and preds[e].ms is None]
        if missing or any(e not in preds for e in f.engines):
            out.append({**row, "predicted": "", "error_pct": "", "within_25_pct": "", "term": "",
                        **{f"part_{k}": "" for k in TERMS},
                        "verdict": "cannot speak: " + ("; ".join(missing) or "an engine was not built in this run")})
            continue
        outcome = f.outcome(preds)
        err = relative_error(outcome.value, theirs)
        term, part = max(outcome.parts.items(), key=lambda kv: abs(kv[1]))
        row.update({"predicted": _round(outcome.value), "error_pct": round(100 * err, 1),
                    "within_25_pct": abs(err) <= TOLERANCE, "term": term,
                    **{f"part_{k}": _round(outcome.parts.get(k, 0.0)) for k in TERMS}})
        row["verdict"] = verdict(err, term, part, outcome.value, theirs)
        errors = spread(f, preds, slowest, theirs) if slowest else []
        if any((abs(e) <= TOLERANCE) != row["within_25_pct"] for e in errors):
            row.update(within_25_pct="", verdict=undecided(errors, len(f.engines)))
        out.append(row)
    return out


def spread(f: Figure, fastest: Mapping[str, Prediction], slowest: Mapping[str, Prediction],
           theirs: Sequence[float]) -> list[float]:
    """The figure's relative error with each of its engines at its fastest or its slowest host timings, every
    combination: a difference of two engines moves most when one is timed fast and the other slow."""
    import itertools

    names = [e for e in dict.fromkeys(f.engines) if e in slowest and slowest[e].ms is not None]
    return [relative_error(f.outcome({**fastest, **{e: slowest[e] for e, slow in zip(names, pick) if slow}}).value,
                           theirs)
            for pick in itertools.product((False, True), repeat=len(names))]


def undecided(errors: Sequence[float], engines: int) -> str:
    """The verdict of a figure that this host's timings of its CPU layers and I/O carry across the band."""
    return (f"undecided: with {'each of its engines' if engines > 1 else 'its engine'} at the fastest or the slowest "
            f"of this host's timings of the CPU layers and I/O, the error runs {100 * min(errors):+.1f} % to "
            f"{100 * max(errors):+.1f} %, across the +-25 % band; a board run decides it")


def verdict(err: float, term: str, part: float, value: float, theirs: Sequence[float]) -> str:
    """'within +-25 %' or the miss, naming the term that carries the prediction: what that term alone would
    have to become to reach theirs."""
    if abs(err) <= TOLERANCE:
        return f"within +-25 % ({100 * err:+.1f} %)"
    target = min(theirs, key=lambda v: abs(v - value))
    need = part + (target - value)
    how = f"x{need / part:.2f}" if part and need > 0 else "cannot reach theirs alone"
    return (f"misses by {100 * err:+.1f} %: the {term} term carries {_round(part)} of the {_round(value)}; alone it "
            f"would have to move {how}")


def engine_rows(preds: Mapping[str, Prediction], builds: Mapping[str, dict]) -> list[dict]:
    """One row per engine: its build, the layer table's sums, and the prediction's terms."""
    out = []
    for name, p in preds.items():
        b = p.basis
        out.append({"engine": name, **builds.get(name, {}), "layers": b.compute_layers if b else "",
                    "conv_layers": b.conv_layers if b else "", "elementwise_layers": b.elementwise_layers if b else "",
                    "cpu_layers": b.cpu_layers if b else "", "cycles_m": round(b.cycles / 1e6, 3) if b else "",
                    "rw_mb": round(b.rw_bytes / 1e6, 2) if b else "",
                    "elementwise_mb": round(b.elementwise_bytes / 1e6, 2) if b else "",
                    "cpu_host_ms_by_op": " ".join(f"{op}:{ms:.3g}" for op, ms in b.cpu_host_by_op) if b else "",
                    **p.row(), "where": "host", "target": p.soc})
    return out


def summary(table: Sequence[Mapping]) -> dict:
    """How many held-out figures the model predicts within +-25 %, of how many it could speak for."""
    held = [r for r in table if r["role"] == "held out" and r["within_25_pct"] != ""]
    return {"held_out": len(held), "held_out_within_25_pct": sum(bool(r["within_25_pct"]) for r in held),
            "held_out_undecided": sum(r["role"] == "held out" and r["verdict"].startswith("undecided")
                                      for r in table),
            "fitted": sum(r["role"].startswith("fitted") for r in table), "figures": len(table),
            "seen": sum(r["role"].startswith("seen") for r in table),
            "worst_held_out_error_pct": max((abs(r["error_pct"]) for r in held), default=float("nan"))}


def _round(x: float) -> float:
    return round(x, 3) if abs(x) < 100 else round(x, 1)


# --- one run ------------------------------------------------------------------------------------------
@dataclass
class Run:
    """The engines built for one calibration run: their layer tables' predictions (at START; `at` moves
    them to other constants), how each was built, and what a rerun of the timings needs (each engine's
    layer table and graph index)."""

    cases: Cases
    predictions: dict[str, Prediction]
    builds: dict[str, dict]
    tables: dict[str, list] = field(default_factory=dict)
    indexes: dict[str, object] = field(default_factory=dict)
    slowest: dict[str, Prediction] = field(default_factory=dict)   # at the slowest of the host timings

    def at(self, constants: Constants) -> dict[str, Prediction]:
        return {k: p.at(constants) for k, p in self.predictions.items()}

    def slowest_at(self, constants: Constants) -> dict[str, Prediction]:
        return {k: p.at(constants) for k, p in self.slowest.items()}

    def built_as(self) -> dict[str, str]:
        """Each engine's build in a few words, for the figure rows."""
        return {k: f"{k} ({b['toolkit']}, {b['target']}, {b['layers_printed']} layers, mask {b['mask']})"
                for k, b in self.builds.items()}

    def retimed(self, names: Sequence[str]) -> dict[str, Prediction]:
        """The predictions of `names` with their CPU layers and I/O timed on this host again (the process's
        timings forgotten first): what a rerun of the calibration would time."""
        from ..toolkit import cost

        cost.forget_timings()
        by_name = {e.name: e for e in self.cases.engines}
        return {n: predict(self.tables[n], by_name[n].target, by_name[n].mask, constants=START,
                           model=self.indexes.get(n)) for n in names}


def build(quick: bool, progress: bool = True) -> Run:
    """Build every case's engine verbosely (the shared cache serves one built under the same key), read its
    layer table, and time every engine's CPU layers and I/O on this host together (cost.time_together, TIMINGS
    times): the predictions at each op's fastest time, `slowest` at its slowest."""
    from tqdm.auto import tqdm

    from .. import graph
    from ..graph.index import Index
    from ..process import shows_progress
    from ..toolkit import cost, log
    from ..toolkit.build import build_engine

    cases = collect(quick)
    run = Run(cases, {}, {})
    for e in tqdm(cases.engines, desc="engines", disable=not shows_progress(progress)):
        onnx_path = e.make()
        report = build_engine(onnx_path, e.target, verbose=True, toolkit=e.toolkit)
        table = log.layer_table(Path(report.log).read_text(encoding="utf-8", errors="replace")) if report.ok else []
        run.builds[e.name] = {"toolkit": report.toolkit_version, "target": e.target, "mask": e.mask,
                              "status": report.status, "regtask": report.regtask,
                              "engine_mb": round(report.engine_bytes / 1e6, 2), "build_s": round(report.seconds, 1),
                              "layers_printed": len(table), "cpu_ops": log.cpu_ops(table), "onnx": onnx_path.name}
        if report.ok:
            run.tables[e.name] = table
            if any(x.target == "CPU" and x.op not in log.IO_OPS for x in table):
                run.indexes[e.name] = Index.inferred(graph.load(onnx_path))
    by_name = {e.name: e for e in cases.engines}

    def predicted() -> dict[str, Prediction]:
        return {n: predict(t, by_name[n].target, by_name[n].mask, constants=START, model=run.indexes.get(n))
                for n, t in run.tables.items()}
    # every engine's host rows timed together, TIMINGS times; predicted at the slowest, then at the fastest
    fastest, slowest = cost.time_together([(t, run.indexes.get(n)) for n, t in run.tables.items()], TIMINGS)
    cost.use_timings({k: (slowest[k], how) for k, (_, how) in fastest.items()})
    run.slowest = predicted()
    cost.use_timings(fastest)
    run.predictions = predicted()
    return run


def fitted_engines(cases: Cases) -> list[str]:
    """The engines the FITTED figures read."""
    return sorted({e for f in cases.figures if f.key in FITTED for e in f.engines})


def refit(run: Run) -> Constants:
    """This run's constants: the FITTED figures fitted on this run's engines and this host's timings (full
    mode; the quick run builds no fitted engine)."""
    from ..toolkit import cost

    return fit_constants(run.cases, run.predictions, fitted_on=f"{cost.host_cpu()}: {', '.join(FITTED)}")


def calibrate(run: Run, reruns: int) -> tuple[Constants, list[dict]]:
    """The constants to commit, and the fits that measured their spread. The fitted engines' CPU layers and I/O
    are timed on this host `reruns` more times (each time forgetting the last), each timing fitted on its own
    (the spread: how far this host's timings move the constants); the committed constants are fitted on the
    fastest time of each op and shape over every timing, as each timing keeps its fastest call, and `run`'s
    predictions are moved to those timings (what record_fitted records)."""
    from ..toolkit import cost

    names = fitted_engines(run.cases)
    on = f"{cost.host_cpu()}: {', '.join(FITTED)}"

    def spread_row(preds: Mapping[str, Prediction]) -> dict:
        c = fit_constants(run.cases, preds, fitted_on=on)
        return {**c.row(), "cpu_host_ms": {n: preds[n].basis.cpu_host_ms for n in names},
                "io_host_ms": {n: preds[n].basis.io_host_ms for n in names}}

    fits, fastest = [spread_row(run.predictions)], cost.timings()
    for _ in range(reruns):
        fits.append(spread_row({**run.predictions, **run.retimed(names)}))
        for key, (ms, how) in cost.timings().items():
            if key not in fastest or ms < fastest[key][0]:
                fastest[key] = (ms, how)
    cost.use_timings(fastest)
    by_name = {e.name: e for e in run.cases.engines}
    run.predictions.update({n: predict(run.tables[n], by_name[n].target, by_name[n].mask, constants=START,
                                       model=run.indexes.get(n)) for n in names})
    return fit_constants(run.cases, run.predictions, fitted_on=on), fits


UNITS = {"dram_share": "of the SoC's DRAM bandwidth", "dispatch_us": "us per compute layer",
         "cpu_factor": "board ms per host ms"}


def constant_rows(committed: Constants, record: Path | str | None = None, this_run: Constants | None = None,
                  cases: Cases | None = None) -> list[dict]:
    """One row per free constant: the committed value (rkstudy.toolkit.cost.CALIBRATED, what every prediction
    uses), the fit of the committed inputs done again here (`refitted`, which must equal it), the range the
    calibration's timings of this host gave, each fitted on its own (`timings_low`, `timings_high`: how far a
    rerun moves it), and, where a full run refitted on its own engines and timings, that fit and its drift from
    the committed value, inside the timings' range or not. A run's own fit is shown, never used: the tables use
    the committed constants."""
    import json

    path = Path(record) if record else cost_inputs()
    saved = json.loads(path.read_text(encoding="utf-8"))
    again = fit_recorded(cases or collect_for(saved), path)
    fits = saved.get("timings", [])
    out = []
    for k, v in committed.row().items():
        spread = [r[k] for r in fits] + [v]
        row = {"constant": k, "value": v, "unit": UNITS[k], "refitted": again.row()[k],
               "agrees": math.isclose(again.row()[k], v, rel_tol=1e-3, abs_tol=1e-6),
               "timings": len(fits), "timings_low": min(spread), "timings_high": max(spread),
               "this_run": "", "drift_pct": "", "within_timings": "",
               "how": f"fitted on {committed.fitted_on} from {path.name}", "where": "host", "target": "rk3588"}
        if this_run is not None:
            mine = this_run.row()[k]
            row.update({"this_run": mine, "drift_pct": round(100 * (mine - v) / v, 1) if v else "",
                        "within_timings": min(spread) <= mine <= max(spread) or math.isclose(mine, v, abs_tol=1e-6)})
        out.append(row)
    return out


def drift(rows: Sequence[Mapping]) -> str:
    """What a full run's own fit says of the committed constants, computed from `constant_rows`."""
    moved = [r for r in rows if r["within_timings"] is False]
    if not rows or rows[0]["this_run"] == "":
        return "no refit in this run (quick mode)"
    if not moved:
        return "this run's fit lies within the range of the committed calibration's timings for every constant"
    return "drift: " + "; ".join(f"{r['constant']} {r['this_run']:.3g} against the committed {r['value']:.3g} "
                                 f"({r['drift_pct']:+} %; its timings {r['timings_low']:.3g} to "
                                 f"{r['timings_high']:.3g})" for r in moved)


# --- what the committed constants were fitted from --------------------------------------------------------
def cost_inputs() -> Path:
    from ..toolkit import cost

    return cost.FITTED_INPUTS


def record_fitted(run: Run, constants: Constants, path: Path, timings: Sequence[Mapping] = ()) -> Path:
    """Write what `constants` were fitted from: each fitted figure's engines' bases (the layer tables' sums and
    this host's CPU timings), board CPU ms and family, and the fit of each of the calibration's `timings`
    (calibrate), so a test and notebook 09 can fit them again without a toolkit or a build."""
    import json

    from .. import atomic

    chosen = [f for f in run.cases.figures if f.key in FITTED]
    engines = fitted_engines(run.cases)
    record = {"constants": constants.row(), "fitted_on": constants.fitted_on,
              "engines": {e: {"soc": run.predictions[e].soc, "mask": run.predictions[e].mask,
                              "cores": run.predictions[e].cores, "basis": asdict(run.predictions[e].basis)}
                          for e in engines},
              "board_cpu_ms": {f.key: f.board_cpu_ms for f in chosen},
              "families": {f.key: run.cases.families[f.key] for f in chosen},
              "timings": list(timings)}
    atomic.write_text(path, json.dumps(record, indent=1) + "\n")
    return path


def collect_for(record: Mapping) -> Cases:
    """The full-mode cases of the families a record's fitted figures come from (the others are not asked)."""
    return collect(False, sorted(set(record["families"].values())) if record.get("families") else None)


def fit_recorded(cases: Cases | None = None, path: Path | str | None = None) -> Constants:
    """The constants the FITTED figures give from a record of `record_fitted` (default: the committed one):
    the recorded engines' bases and board CPU times in place of this run's."""
    import json

    path = Path(path) if path else cost_inputs()
    record = json.loads(path.read_text(encoding="utf-8"))
    cases = cases or collect_for(record)
    preds = {}
    for name, e in record["engines"].items():
        b = dict(e["basis"])
        b["conv_costs"] = tuple(tuple(x) for x in b["conv_costs"])
        b["cpu_host_by_op"] = tuple(tuple(x) for x in b["cpu_host_by_op"])
        b["uncosted"] = tuple(b["uncosted"])
        preds[name] = Prediction(e["soc"], e["mask"], e["cores"], Basis(**b), START)
    figures = [replace(f, board_cpu_ms=record["board_cpu_ms"][f.key]) for f in cases.figures if f.key in FITTED]
    return fit_constants(Cases(cases.engines, figures), preds, fitted_on=record["fitted_on"])


def reference_rows(cases: Cases) -> list[dict]:
    """The reference documents' figures the calibration reads, as data/reference/figures.csv holds them (theirs,
    each once, with the study it is filed under)."""
    seen, out = set(), []
    for f in cases.figures:
        if (f.study, f.figure) not in seen:
            seen.add((f.study, f.figure))
            out.append({"study": f.study, **reference_figure(f.study, f.figure)})
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m rkstudy.levers.npu_cost [--reruns N] [--out PATH]`: build (or read from the cache) every
    full-mode engine, time this host N + 1 times, fit the constants on the fastest timings (calibrate), and
    write the record the committed constants are read from (default: rkstudy.toolkit.cost.FITTED_INPUTS).
    Adopting a new calibration is this command and a commit, never a notebook run."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m rkstudy.levers.npu_cost", description=main.__doc__)
    p.add_argument("--reruns", type=int, default=4, help="times this host is timed again (default 4)")
    p.add_argument("--out", type=Path, default=None, help="where the record goes (default: the committed one)")
    args = p.parse_args(argv)
    run = build(quick=False)
    constants, fits = calibrate(run, args.reruns)
    path = record_fitted(run, constants, args.out or cost_inputs(), fits)
    print(f"{constants.row()} (each timing's fit: {[{k: round(r[k], 4) for k in UNITS} for r in fits]}) -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
