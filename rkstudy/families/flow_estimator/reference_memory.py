"""The RKNN decoder-path document's measured NPU memory costs, as the memory model reads them.

That document measured a flow-matching DiT estimator (fp16, Orange Pi 5 Plus, RK3588,
6.1.115-vendor-rk35xx): the context each fixed-S engine reports, the single mappings dmesg refused,
and which sets of engines one process could initialize together. Its rows live in
data/reference/figures.csv (study flow_estimator); this module turns them into the generic model's
EngineCost and Budget (rkstudy.board.memory), so the study can check that the model admits and
refuses exactly the sets the document saw admitted and refused.

Standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...board.memory import REFERENCE_STUDY, Budget, EngineCost

_CONTEXT = re.compile(r"context per engine \(RKNN_QUERY_MEM_SIZE\) S=(\d+)")
_MAPPING = re.compile(r"refused single mapping \(dmesg\) S=(\d+)")
_SET = re.compile(r"set (admitted|refused \(-4\)) S=([\d+x]+)")
_UNITS = {"GB": 10**9, "MB": 10**6, "B": 1}


@dataclass(frozen=True)
class ReferenceMemoryModel:
    """The document's memory figures: per-engine costs (S110, S200, ...), the sets it initialized in
    one process ((engines, MiB it states, admitted?)), and its per-process budget."""

    costs: dict[str, EngineCost]
    sets: list[tuple[tuple[str, ...], float, bool]]
    budget: Budget


def _engines(text: str) -> tuple[str, ...]:
    """"110+200+250" -> (S110, S200, S250); "110x4" -> (S110,) * 4 (the document writes both)."""
    out = []
    for part in text.split("+"):
        s, _, times = part.partition("x")
        out += [f"S{int(s)}"] * (int(times) if times else 1)
    return tuple(out)


def reference_memory_model() -> ReferenceMemoryModel:
    """The document's figures from data/reference/figures.csv, each cost naming its file and section."""
    from ...tables.results import reference

    context: dict[int, tuple[float, str]] = {}
    mapping: dict[int, tuple[int, str]] = {}
    sets = []
    for r in reference(REFERENCE_STUDY):
        where = f"reference {r['document']}, {r['section']}"
        if m := _CONTEXT.fullmatch(r["figure"]):
            context[int(m.group(1))] = (float(r["value"]), where)
        elif m := _MAPPING.fullmatch(r["figure"]):
            mapping[int(m.group(1))] = (round(float(r["value"]) * _UNITS[r["unit"]]), where)
        elif m := _SET.fullmatch(r["figure"]):
            sets.append((_engines(m.group(2)), float(r["value"]), m.group(1) == "admitted"))
    costs = {}
    for s in sorted(set(context) | set(mapping)):
        ctx, src = context.get(s, (None, ""))
        mb, msrc = mapping.get(s, (None, ""))
        costs[f"S{s}"] = EngineCost(f"S{s}", ctx, mb, src or msrc)
    return ReferenceMemoryModel(costs, sets, Budget.reference())
