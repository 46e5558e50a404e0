"""The search (host): which groups stay in float16, with fidelity measured after every choice.

A per-layer report ranks layers one at a time; the loss of a hybrid is not the sum of those. Each step of
the search is a quantization-session variant scored on the search items, so every choice is re-measured
rather than predicted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .bench import Session
from .stages import Stage
from .tensors import first_levels, group_macs, tensor_modules

FIDELITY = "pesq_wb"  # what the search steers by (a listener's score), and the goal is stated in
FIDELITY_CAP = 1000.0  # a fidelity past this (an identical render's infinite SNR) counts as this
SNR_FIDELITY = "utterance_snr_db"  # for a stage whose output is not audio


def fidelity_of(stage: Stage) -> str:
    return FIDELITY if stage.listens else SNR_FIDELITY


@dataclass
class Step:
    """One point of a search: the groups in float16 and the row measured for them."""

    fp16: tuple[str, ...]
    row: dict


def search(session: Session, groups: Mapping[str, Sequence[str]], *, direction: str = "backward",
           refine: Callable[[str], Mapping[str, Sequence[str]]] | None = None, floors: Sequence[float] = (),
           budget: int = 60, label: str = "search") -> list[dict]:
    """Greedy hybrid selection by measured fidelity on the stage's search items, one group at a time,
    re-measured after every choice. Groups without conv MACs (the graph's inputs and outputs, activation-
    only blocks: no graph conv writes any of their tensors) stay in float16 throughout.

    `direction` "backward" starts from every group in float16 (fp16's fidelity, up to the casts) and
    returns to low bits, each step, the group that costs the least fidelity per share of MACs it moves;
    "forward" starts from the plain quantized build (the MAC-free groups in float16) and keeps in float16,
    each step, the group that buys the most fidelity per share of MACs it takes back. Either way it is lazy
    greedy: a candidate's last measured value stands until it is the best, then it is re-measured against
    the current set (exact greedy when gains only shrink as the set grows, with far fewer builds).

    `refine(group)` gives a group's finer groups (layers before single layers): where a backward step takes
    the fidelity below one of `floors`, the finer groups of the group it moved go to low bits one at a time
    from the set before that step, each kept there while the fidelity stays at or above that floor.
    `budget` caps the variants built. One row per measured point: `search_step`, `search_move`, the groups
    in float16, `on_path` (the greedy path), `refined_for` (the floor a refined point holds)."""
    bench = session.bench
    metric = fidelity_of(bench.stage)
    every = {g: list(names) for g, names in groups.items()}
    weight = group_macs(bench.stage, every)
    rows: list[dict] = []
    spent = [0]

    def measure(fp16: Sequence[str], move: str, step: int, **extra) -> dict:
        keep = [t for g in fp16 for t in every[g]]
        before = bench.built
        row = session.measure(keep, f"{label} {step}: {move}", which="search", groups=" + ".join(fp16))
        spent[0] += bench.built - before
        row = {**row, "search": label, "direction": direction, "search_step": step, "search_move": move,
               "on_path": False, "refined_for": "", **extra}
        rows.append(row)
        return row

    def value(row: Mapping) -> float:
        """The row's fidelity, finite (an identical render's SNR is infinite: capped, so gains compare)."""
        v = row.get(metric)
        return float(np.clip(v, -FIDELITY_CAP, FIDELITY_CAP)) if isinstance(v, (int, float)) and not np.isnan(v) \
            else -FIDELITY_CAP

    def share(row: Mapping) -> float:
        return float(row.get("low_bit_mac_share") or 0.0)

    def trial_of(pick: str) -> list[str]:
        return [g for g in state if g != pick] if direction == "backward" else state + [pick]

    def best(stale: Mapping[str, float]) -> str:
        return min(stale, key=stale.get) if direction == "backward" else max(stale, key=stale.get)

    top = measure(list(every), "every group in float16", 0)
    movable = [g for g in every if weight[g] > 0]
    fixed = [g for g in every if g not in movable]
    if direction == "backward":
        state, current = list(every), top
        alone = {g: measure(trial_of(g), f"{g} alone at low bits", 0) for g in movable}
        stale = {g: (value(top) - value(alone[g])) / max(share(alone[g]) - share(top), 1e-6) for g in movable}
    else:
        state = list(fixed)
        current = measure(state, "only the groups without conv MACs in float16", 0)
        stale = {g: np.inf for g in movable}  # every candidate is measured once before one is taken
    current["on_path"] = True
    step = 0
    while stale:
        step += 1
        fresh: dict[str, dict] = {}  # candidates measured against the current set in this step
        while True:
            pick = best(stale)
            if pick in fresh or spent[0] >= budget:
                break
            row = measure(trial_of(pick), f"{pick} {'to low bits' if direction == 'backward' else 'kept in float16'}",
                          step)
            moved = abs(share(row) - share(current)) or 1e-6
            gain = value(current) - value(row) if direction == "backward" else value(row) - value(current)
            stale[pick], fresh[pick] = gain / moved, row
        if pick not in fresh:  # out of budget before this step's choice was measured
            break
        trial, row = trial_of(pick), fresh[pick]
        for floor in floors:
            if direction == "backward" and refine is not None and value(current) >= floor > value(row):
                finer = {f"{pick} / {sub}": list(names) for sub, names in refine(pick).items()}
                every.update(finer)
                held = [g for g in state if g != pick] + list(finer)
                weight.update(group_macs(bench.stage, finer))
                for sub in [f for f in finer if weight[f] > 0]:  # a block without conv MACs stays in float16
                    if spent[0] >= budget:
                        break
                    trial_row = measure([g for g in held if g != sub], f"{sub} to low bits", step,
                                        refined_for=floor)
                    if value(trial_row) >= floor:
                        held = [g for g in held if g != sub]
        state, current = trial, row
        current["on_path"] = True
        del stale[pick]
    return rows


def path(rows: Sequence[Mapping]) -> list[dict]:
    """The greedy path of a search's rows, by step."""
    return sorted([r for r in rows if r.get("on_path")], key=lambda r: r["search_step"])


def refiner(stage: Stage, groups: Mapping[str, Sequence[str]]) -> Callable[[str], dict[str, list[str]]]:
    """refine(group) for search: one of `groups`' tensors split by their module path at the first depth at
    which they fall into more than one module; a group that does not split has no finer groups."""
    modules = tensor_modules(stage.onnx, [t for names in groups.values() for t in names])

    def refine(group: str) -> dict[str, list[str]]:
        members = groups.get(group, [])
        for depth in range(1, 8):
            split: dict[str, list[str]] = {}
            for name in members:
                split.setdefault(first_levels(modules[name], depth), []).append(name)
            if len(split) > 1:
                return split
        return {}
    return refine
