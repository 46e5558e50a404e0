"""What one process can hold on the NPU, and a lazy ladder of engines that never asks for more.

Two constraints, not one. Both come from someone else's board measurements (the reference documents,
the RKNN decoder-path document, "The IOVA ceiling, i.e. how big an engine can be": a flow-matching DiT
estimator, fp16, on an Orange Pi 5 Plus, RK3588, 6.1.115-vendor-rk35xx); their figures are rows of
data/reference/figures.csv (study flow_estimator), read by the flow estimator family
(rkstudy.families.flow_estimator.reference_memory). This module is the generic part: the budget, a
set's verdict, the smallest-rung router and the lazy ladder.

1. The single-mapping ceiling. An engine is mapped into the NPU's I/O address space, a 32-bit
   arena on RK3588, so one mapping past ~4 GB is refused at rknn_init whatever else is resident
   ("RKNPU: failed to allocate IOVA: -12"). That is why every set holding the S=900 engine fails
   although its context reports only 1039 MiB: its own request was 4.71 GB.
2. The per-process budget. The contexts resident in one process share an aperture: the reference documents
   measured it by initializing sets in one process (110+200+250 loads, 250+400 returns -4).

The ceiling used here is 2**32 bytes, the size of a 32-bit arena. The reference documents bracket it: the
largest context that loaded alone is S=500's and the smallest refused request is S=1100's. The
budget is a measurement of one engine family on one board (Budget.reference() is theirs): pass your
own when you measured it.

Board side: standard library only.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .dmesg import InitRefused

MIB = 1 << 20
SINGLE_MAPPING_CEILING = 1 << 32  # bytes: the size of a 32-bit IOVA arena (reference: "a 32-bit arena", "~4 GB")
REFERENCE_STUDY = "flow_estimator"


@dataclass(frozen=True)
class Budget:
    """What one process may map: `mib` of resident contexts in all, and no single mapping above
    `ceiling_bytes`. `source` says whose figures these are."""

    mib: float
    ceiling_bytes: int = SINGLE_MAPPING_CEILING
    source: str = ""

    @classmethod
    def reference(cls) -> Budget:
        """The reference documents' per-process budget (their measurement, their board), with the 32-bit ceiling."""
        from ..tables.results import reference_figure

        row = reference_figure(REFERENCE_STUDY, "per-process budget of resident contexts")
        return cls(float(row["value"]), source=f"{row['document']}, {row['section']}")


@dataclass(frozen=True)
class EngineCost:
    """What one engine asks of the NPU.

    context_mib: what a resident context occupies, as the driver reports it (librknnrt
    RKNN_QUERY_MEM_SIZE, see rknnrt.engine_memory); None when nobody measured it.
    mapping_bytes: the largest single mapping the driver was asked for, when known (the byte count
    a dmesg refusal names, see dmesg.refused_bytes). Without it the context is taken as the bound
    on any one mapping.
    """

    name: str
    context_mib: float | None
    mapping_bytes: int | None = None
    source: str = ""

    def own_mapping_bytes(self) -> int | None:
        if self.mapping_bytes is not None:
            return self.mapping_bytes
        return None if self.context_mib is None else int(self.context_mib * MIB)


@dataclass(frozen=True)
class Admission:
    """Whether a set of engines can be resident in one process, and why."""

    admit: bool
    reason: str
    engines: tuple[str, ...]
    total_mib: float | None


def fmt_bytes(n: int) -> str:
    return f"{n} B ({n / 1e9:.2f} GB)"


def _fmt_mib(x: float) -> str:
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.1f}"


def refused_alone(cost: EngineCost, budget: Budget) -> str | None:
    """Why `cost` cannot be resident even alone (one line), or None when it can."""
    mapping = cost.own_mapping_bytes()
    if mapping is not None and mapping > budget.ceiling_bytes:
        return (f"{cost.name}: its own mapping {fmt_bytes(mapping)} exceeds the single-mapping ceiling "
                f"{fmt_bytes(budget.ceiling_bytes)} (32-bit IOVA arena); rknn_init refuses it whatever else "
                "is resident")
    if cost.context_mib is not None and cost.context_mib > budget.mib:
        return (f"{cost.name}: its context {_fmt_mib(cost.context_mib)} MiB alone exceeds the "
                f"{_fmt_mib(budget.mib)} MiB per-process budget")
    return None


def check_set(costs: Sequence[EngineCost], budget: Budget) -> Admission:
    """Admit or refuse a set of engines resident at once in one process.

    The single-mapping ceiling is checked first, per engine: a set holding an engine refused alone
    is refused for that engine's reason, not for its sum. Then the contexts' sum against the budget.
    """
    names = tuple(c.name for c in costs)
    known = [c.context_mib for c in costs if c.context_mib is not None]
    total = sum(known) if len(known) == len(costs) else None
    alone = [why for c in costs if (why := refused_alone(c, budget))]
    if alone:
        return Admission(False, "; ".join(dict.fromkeys(alone)), names, total)
    if total is None:
        missing = ", ".join(c.name for c in costs if c.context_mib is None)
        raise ValueError(f"no measured context cost for {missing}: measure it on the board with "
                         "`rkstudy board memory ENGINE.rknn` (or pass context_mib)")
    label = "+".join(names)
    if total > budget.mib:
        return Admission(False, f"{label}: {_fmt_mib(total)} MiB of contexts exceeds the "
                       f"{_fmt_mib(budget.mib)} MiB per-process budget by "
                       f"{_fmt_mib(total - budget.mib)} MiB (rknn_init refuses the context that "
                       "overruns)", names, total)
    return Admission(True, f"{label}: {_fmt_mib(total)} MiB of contexts fits the {_fmt_mib(budget.mib)} "
                   f"MiB per-process budget ({_fmt_mib(budget.mib - total)} MiB spare)", names, total)


def smallest_rung(lengths: Mapping[Any, int] | Iterable[int], n: int) -> Any:
    """The engine with the smallest compiled length that holds `n` frames (or tokens), or None past
    the widest (RKNN shapes are fixed, so a longer input has no engine and goes to the CPU path).

    `lengths` maps each engine's name to its compiled length; a plain sequence of lengths names each
    engine by its length (the Piper encoder's width ladder)."""
    rungs = lengths.items() if isinstance(lengths, Mapping) else ((length, length) for length in lengths)
    fits = [(length, name) for name, length in rungs if length >= n]
    return min(fits)[1] if fits else None


class DoesNotFit(RuntimeError):
    """An engine that cannot be resident even alone, and the ladder has no CPU path for it."""


def _release(handle: Any) -> None:
    for method in ("release", "close"):
        if callable(getattr(handle, method, None)):
            getattr(handle, method)()
            return


def _stderr_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class LazyLadder:
    """Engines loaded on demand; the least recently used is evicted when the next would not fit.

    loaders: name -> a callable returning a loaded handle (a fake in tests; on a board
    `lambda: BoardRunner(path, names)`, rkstudy.board.runner). It raises dmesg.InitRefused when
    the driver refuses.
    cost: name -> EngineCost, as a mapping or a callable (on a board, measured once per engine with
    rknnrt.engine_memory, a COLLECT_MODEL_INFO_ONLY init: no network built).
    budget: Budget.reference() or the one measured on your board.
    cpu: name -> the CPU-path handle for an engine that cannot be resident even alone; each such
    engine is announced once through `log`, in one line that says why. Without `cpu`, get() raises
    DoesNotFit with that line.

    A refusal the model did not predict (a cost that under-reports, another process holding part of
    the aperture) is handled the same way the budget is: everything resident is evicted and the
    engine is tried once alone; refused alone, it goes to the CPU path.
    """

    def __init__(self, loaders: Mapping[str, Callable[[], Any]],
                 cost: Mapping[str, EngineCost] | Callable[[str], EngineCost], budget: Budget, *,
                 cpu: Callable[[str], Any] | None = None, release: Callable[[Any], None] = _release,
                 log: Callable[[str], None] = _stderr_line):
        self._loaders = dict(loaders)
        self._cost_of = cost.__getitem__ if isinstance(cost, Mapping) else cost
        self._costs: dict[str, EngineCost] = {}
        self.budget = budget
        self._cpu_factory = cpu
        self._release = release
        self._log = log
        self._resident: OrderedDict[str, Any] = OrderedDict()
        self._on_cpu: dict[str, tuple[Any, str]] = {}
        self.events: list[str] = []  # load / evict / cpu, in order: what a test or a log asserts on

    def cost(self, name: str) -> EngineCost:
        if name not in self._costs:
            if name not in self._loaders:
                raise KeyError(f"no engine named {name!r} in this ladder; it has "
                               f"{', '.join(self._loaders)}")
            cost = self._cost_of(name)
            if cost.context_mib is None and refused_alone(cost, self.budget) is None:
                raise ValueError(f"no measured context cost for {name}: measure it with "
                                 "`rkstudy board memory ENGINE.rknn` before adding it to a ladder")
            self._costs[name] = cost
        return self._costs[name]

    @property
    def resident(self) -> list[str]:
        """Resident engines, least recently used first."""
        return list(self._resident)

    @property
    def resident_mib(self) -> float:
        return sum(self._costs[n].context_mib for n in self._resident)

    def on_cpu(self, name: str) -> str | None:
        """Why `name` runs on the CPU path, or None if it does not (or was never asked for)."""
        return self._on_cpu[name][1] if name in self._on_cpu else None

    def get(self, name: str) -> Any:
        """The handle for `name`: resident, loaded now (evicting as needed), or the CPU path."""
        if name in self._resident:
            self._resident.move_to_end(name)
            return self._resident[name]
        if name in self._on_cpu:
            return self._on_cpu[name][0]
        cost = self.cost(name)
        why = refused_alone(cost, self.budget)
        if why:
            return self._to_cpu(name, why)
        while self._resident and self.resident_mib + cost.context_mib > self.budget.mib:
            self._evict(next(iter(self._resident)), for_=name)
        try:
            handle = self._loaders[name]()
        except InitRefused as exc:
            if not self._resident:
                return self._to_cpu(name, f"{name}: rknn_init refused it alone ({exc})")
            self._log(f"{name}: rknn_init refused it beside {'+'.join(self._resident)} ({exc}); "
                      "evicting all and retrying alone")
            for other in list(self._resident):
                self._evict(other, for_=name)
            try:
                handle = self._loaders[name]()
            except InitRefused as again:
                return self._to_cpu(name, f"{name}: rknn_init refused it alone ({again})")
        self._resident[name] = handle
        self.events.append(f"load {name}")
        return handle

    def _evict(self, name: str, for_: str) -> None:
        self._release(self._resident.pop(name))
        self.events.append(f"evict {name} (for {for_})")

    def _to_cpu(self, name: str, why: str) -> Any:
        line = f"{why} -> CPU path"
        self.events.append(f"cpu {name}")
        if self._cpu_factory is None:
            self._log(line)
            raise DoesNotFit(line)
        self._on_cpu[name] = (self._cpu_factory(name), why)
        self._log(line)
        return self._on_cpu[name][0]

    def close(self) -> None:
        for name in list(self._resident):
            self._release(self._resident.pop(name))
        for handle, _ in self._on_cpu.values():
            _release(handle)
        self._on_cpu.clear()

    def __enter__(self) -> LazyLadder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
