"""The flow estimator's measurements (host): what notebook 05 calls.

Two halves. The memory model, on the reference documents' own figures (their board, their estimator): the
admit/refuse table against theirs, a fit of their context costs, and the lazy ladder walking a
sequence of requests against a model of their driver. And the DiT stand-in (random weights, its
own sizes): builds at several fixed S for rk3588 with the compiler's memory plan, simulator SNR
against fp32, and a fit of how the plan grows with S, extrapolated to where the stand-in's own
largest mapping would cross the 32-bit ceiling. Rows carry where/target from what produced them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from ... import fits
from ...board.dmesg import InitRefused
from ...board.memory import MIB, SINGLE_MAPPING_CEILING, LazyLadder, check_set, smallest_rung
from ...contract import Contract
from ...process import shows_progress
from ...tables.results import HOST
from ...toolkit.build import build_engine
from ...toolkit.convert import simulator_vs_fp32
from ...toolkit.log import layer_table, memory_plan, op_targets
from . import producer
from .reference_memory import ReferenceMemoryModel

QUICK = {"depth": 2, "sizes": {"sdpa": (64,)}, "simulate": (64,), "depth_probe": ()}
# Four S per attention form, the fewest a quadratic fit with a residual needs: from 64 (the lint study's
# graph) through the reference documents' 250 and 900 to 2000 for the fused form (far enough out that the S^2 term
# outweighs the linear one, so the fit's crossing of 2^32 is pinned by a measured point); the unfused
# form to 900, where its plan stays in one regime (past ~1000 the compiler moves its softmax to the CPU).
# Simulated at 64, 250 and 900, in the build's own child. depth_probe: one S at depth 3, to see how much
# of the plan one more block moves. Each graph is exported, folded and built once (~20 s of export and
# fold, 22-60 s of build each).
FULL = {"depth": 2, "sizes": {"sdpa": (64, 250, 900, 2000), "gated": (64, 250, 500, 900)},
        "simulate": (64, 250, 900), "depth_probe": ((3, "sdpa", 250),)}


def config(quick: bool) -> dict:
    """Quick (CI): S=64 at depth 2, built and simulated in one child. Full: four S per attention form
    (fused and unfused), one depth-3 probe, builds one at a time."""
    return QUICK if quick else FULL


# --- the memory model against the reference documents' table ----------------------------------------------------
def admit_refuse_rows(reference: ReferenceMemoryModel,
                      long_with: Sequence[Sequence[str]] = ((), ("S110",), ("S110", "S200"))) -> list[dict]:
    """Every set the reference documents initialized in one process, then every S>=900 engine alone and beside
    smaller ones: the reference documents' total and verdict (theirs) beside the model's (ours, on their costs)."""
    rows = []
    for names, total, admitted in reference.sets:
        v = check_set([reference.costs[n] for n in names], reference.budget)
        rows.append({"set": "+".join(names), "reference_total_mib": total,
                     "reference_verdict": "admit" if admitted else "refuse (-4)", "model_total_mib": v.total_mib,
                     "model_verdict": "admit" if v.admit else "refuse", "agrees": v.admit is admitted,
                     "reason": v.reason, "where": HOST.where})
    long = [n for n, c in reference.costs.items() if c.mapping_bytes]
    for big in long:
        for others in long_with:
            names = (big, *others)
            v = check_set([reference.costs[n] for n in names], reference.budget)
            rows.append({"set": "+".join(names), "reference_total_mib": "",
                         "reference_verdict": "refuse (-4): every set holding S>=900",
                         "model_total_mib": "" if v.total_mib is None else v.total_mib,
                         "model_verdict": "admit" if v.admit else "refuse", "agrees": not v.admit,
                         "reason": v.reason, "where": HOST.where})
    return rows


def reference_fit_rows(reference: ReferenceMemoryModel, dma_map_bytes: int) -> list[dict]:
    """Our fit of the reference documents' context costs at S <= their longest loadable engine, w + c S^2 (and with
    a linear term), and what the fits say: S=900 predicted, where the context meets their budget.
    Then the uint32-wrap reading of their S=900 figure: if its internal arena were the `dma_map_bytes`
    the kernel refused, a uint32 total_internal_size would report it minus 4 GiB, leaving the
    weights below (a hypothesis about their numbers that a board settles, not a measurement)."""
    pts = sorted((int(n[1:]), c.context_mib) for n, c in reference.costs.items()
                 if c.context_mib is not None and c.mapping_bytes is None)  # the engines that loaded
    S = np.array([p[0] for p in pts], float)
    y = np.array([p[1] for p in pts], float)
    rows = []
    for label, powers in (("w + c*S^2", (0, 2)), ("w + b*S + c*S^2", (0, 1, 2))):
        coef, resid = fits.polynomial(S, y, powers)
        w, c = coef[0], coef[-1]
        budget_s = fits.crossing(coef, powers, reference.budget.mib)
        rows.append({"fit": label, "points_S": "/".join(str(int(s)) for s in S),
                     "weights_mib_intercept": w, "internal_bytes_per_S2": c * MIB,
                     "max_abs_residual_mib": float(np.abs(resid).max()),
                     "max_abs_residual_pct": float(np.max(np.abs(resid) / y) * 100),
                     "predicted_S900_mib": float(sum(k * 900.0 ** p for k, p in zip(coef, powers))),
                     "S_at_budget": _blank(budget_s), "where": HOST.where})
    wrapped_mib = (dma_map_bytes % SINGLE_MAPPING_CEILING) / MIB
    rows.append({"fit": "uint32 wrap reading of S=900", "points_S": "900",
                 "weights_mib_intercept": reference.costs["S900"].context_mib - wrapped_mib,
                 "internal_bytes_per_S2": "", "max_abs_residual_mib": "", "max_abs_residual_pct": "",
                 "predicted_S900_mib": reference.costs["S900"].context_mib + SINGLE_MAPPING_CEILING / MIB,
                 "S_at_budget": "", "where": HOST.where})
    return rows


class ReferenceDriver:
    """A model of the reference documents' board: rknn_init refuses one mapping past the ceiling, or a context
    that would take the resident sum past their budget. The ladder's walk runs against it."""

    def __init__(self, reference: ReferenceMemoryModel):
        self.reference = reference
        self.resident: dict[str, float] = {}

    def loader(self, name: str):
        def load():
            cost = self.reference.costs[name]
            if (cost.own_mapping_bytes() or 0) > self.reference.budget.ceiling_bytes:
                raise InitRefused(f"rknn_init({name})", -4)
            if sum(self.resident.values()) + cost.context_mib > self.reference.budget.mib:
                raise InitRefused(f"rknn_init({name})", -4)
            self.resident[name] = cost.context_mib
            return name
        return load

    def release(self, name: str) -> None:
        self.resident.pop(name)


def walk_ladder(reference: ReferenceMemoryModel, rungs: Sequence[str], requests: Sequence[int]) -> list[dict]:
    """Route each request (frames) to the smallest rung that holds it; the ladder loads lazily and
    evicts least recently used. Requests past the widest rung, and rungs refused alone, take the CPU
    path. One row per request: what happened and what is resident after it."""
    driver = ReferenceDriver(reference)
    lines: list[str] = []
    ladder = LazyLadder({n: driver.loader(n) for n in rungs}, reference.costs, reference.budget,
                        cpu=lambda n: f"cpu:{n}", release=driver.release, log=lines.append)
    lengths = {n: int(n[1:]) for n in rungs}
    rows = []
    for step, frames in enumerate(requests):
        rung = smallest_rung(lengths, frames)
        before = len(ladder.events)
        if rung is None:
            ran = "cpu (past the widest rung)"
        else:
            handle = ladder.get(rung)
            ran = "cpu (refused alone)" if str(handle).startswith("cpu:") else f"npu {rung}"
        events = "; ".join(ladder.events[before:]) or ("hit" if rung else "no rung holds it")
        rows.append({"step": step, "frames": frames, "rung": rung or "", "ran": ran,
                     "events": events, "resident": "+".join(ladder.resident),
                     "resident_mib": ladder.resident_mib, "where": HOST.where})
    ladder.close()
    return rows


# --- the stand-in: builds, the compiler's memory plan, simulator SNR -----------------------------
def build_row(frames: int, *, depth: int, attn_form: str = "sdpa", simulate: bool = False,
              target: str = "rk3588") -> tuple[list[dict], Contract]:
    """Export and fold the stand-in at `frames` (the producer's cache keeps the graph), build it verbose
    and read the compiler's plan; with `simulate`, score the simulator against fp32 in the same toolkit
    child. One build per graph, kept in the shared engine and simulator cache (the lint study's placement
    of the S=64 graph reads it back). Returns the build row and (when simulated) the simulator row, and
    the graph's stage contract."""
    product = producer.produce(frames, depth=depth, attn_form=attn_form)
    sim = None
    if simulate:
        sim = simulator_vs_fp32(product.path, target, [producer.feeds(product.contract)], gate=producer.SIM_GATE,
                                cache=True, verbose=True)
        report = sim.report
    else:
        report = build_engine(product.path, target, verbose=True)
    log = Path(report.log).read_text(errors="replace") if report.log and Path(report.log).is_file() else ""
    plan, ops = memory_plan(log), op_targets(layer_table(log))
    rows = [{**product.row(), "engine_bytes": report.engine_bytes, **report.row(),
             "plan_internal_bytes": plan.internal_bytes if plan else "",
             "plan_weight_bytes": plan.weight_bytes if plan else "",
             "fused_sdpa": ops[("exSDPAttention", "NPU")],
             "cpu_ops": " ".join(sorted({op for op, where in ops if where == "CPU"}))}]
    if sim is not None:
        r = sim.rows[0]
        rows.append({"S": frames, "depth": depth, "attn": rows[0]["attn"], "valid_frames": int(frames * 0.9),
                     "snr_db": r["snr_db"], "max_diff": r["out0_max_diff"], "nonfinite": r["out0_nonfinite"],
                     "sim_run_s": round(sim.seconds[0], 2), **producer.SIM_GATE.row(r["snr_db"]),
                     "where": r["where"], "target": r["target"]})
    return rows, product.contract


def build_ladder(cfg: dict, target: str = "rk3588") -> tuple[list[dict], list[dict], dict]:
    """Every (attention form, S) of `cfg`, one build at a time: build rows, simulator rows, and
    each graph's contract by (form, S)."""
    builds, sims, contracts = [], [], {}
    jobs = [(cfg["depth"], form, s) for form, sizes in cfg["sizes"].items() for s in sizes] + list(cfg["depth_probe"])
    for depth, form, s in tqdm(jobs, desc="stand-in builds", disable=not shows_progress()):
        rows, contracts[depth, form, s] = build_row(s, depth=depth, attn_form=form, target=target,
                                                    simulate=depth == cfg["depth"] and form == "sdpa"
                                                    and s in cfg["simulate"])
        builds.append(rows[0])
        sims += rows[1:]
    return builds, sims, contracts


# --- growth with S ------------------------------------------------------------------------------
def _blank(x: float | None) -> float | str:
    """A table cell: empty where the fit never reaches the level."""
    return "" if x is None else x


def growth_rows(builds: Sequence[dict], level_bytes: int = SINGLE_MAPPING_CEILING) -> list[dict]:
    """Least-squares fits of engine bytes, the planned internal arena and the planned weights in S,
    per attention form (linear and quadratic where the points allow), and the S at which each fit
    reaches `level_bytes`: for the internal arena, the stand-in's largest single mapping, that is
    where it would cross the 32-bit ceiling (an extrapolation past the longest build)."""
    rows = []
    for attn, depth in sorted({(b["attn"], b["depth"]) for b in builds}):
        ok = sorted((b for b in builds if (b["attn"], b["depth"]) == (attn, depth) and b["status"] == "ok"
                     and b["plan_internal_bytes"] != ""), key=lambda b: b["S"])
        S = np.array([b["S"] for b in ok], float)
        for quantity, key in (("engine bytes", "engine_bytes"), ("planned internal arena", "plan_internal_bytes"),
                              ("planned weights", "plan_weight_bytes")):
            y = np.array([b[key] for b in ok], float)
            for label, powers in (("a + b*S", (0, 1)), ("a + b*S + c*S^2", (0, 1, 2))):
                if len(S) < len(powers) + 1:
                    continue  # an exact fit through every point says nothing about the growth
                coef, resid = fits.polynomial(S, y, powers)
                rows.append({"attn": attn, "depth": depth, "quantity": quantity, "fit": label,
                             "S_points": "/".join(str(int(s)) for s in S), "a_bytes": coef[0], "b_bytes_per_S": coef[1],
                             "c_bytes_per_S2": coef[2] if len(powers) == 3 else "",
                             "max_abs_residual_bytes": float(np.abs(resid).max()),
                             "S_at_2^32_bytes": _blank(fits.crossing(coef, powers, level_bytes)),
                             "longest_S_built": int(S.max()), "where": HOST.where})
    return rows


def ceiling_estimate(growth: Sequence[dict], attn: str, depth: int) -> dict | None:
    """The quadratic fit of the planned internal arena for `attn` at `depth`, with the stand-in's
    crossing of the 32-bit ceiling (None when the points do not allow a quadratic)."""
    return next((r for r in growth if (r["attn"], r["depth"]) == (attn, depth)
                 and r["quantity"] == "planned internal arena" and r["fit"] == "a + b*S + c*S^2"), None)


def reference_cost_points(reference: ReferenceMemoryModel) -> list[tuple[int, float | None, int | None]]:
    """(S, context MiB, refused mapping bytes) per reference engine, for plotting theirs beside ours."""
    return [(int(n[1:]), c.context_mib, c.mapping_bytes) for n, c in reference.costs.items()]

