"""The NPU memory model on the reference documents' own table: two constraints (one mapping under the 32-bit
ceiling, the resident contexts under the per-process budget), and the lazy LRU ladder against a
fake driver that refuses what the reference documents' board refused."""

import pytest

from rkstudy.board import memory
from rkstudy.board.dmesg import InitRefused
from rkstudy.board.memory import Budget, EngineCost, LazyLadder, check_set
from rkstudy.families.flow_estimator.reference_memory import reference_memory_model

REFERENCE = reference_memory_model()
COSTS, BUDGET = REFERENCE.costs, REFERENCE.budget


def _set(names):
    return [COSTS[n] for n in names]


def test_reference_costs_are_the_reference_figures():
    ctx = {n: c.context_mib for n, c in COSTS.items()}
    assert ctx == {"S110": 786, "S200": 1129, "S250": 1426, "S400": 2615, "S500": 3752,
                   "S900": 1039, "S1100": None, "S2000": None}
    assert COSTS["S900"].mapping_bytes == 4_710_000_000
    assert COSTS["S1100"].mapping_bytes == 4_660_000_000
    assert COSTS["S2000"].mapping_bytes == 5_770_000_000
    assert all("RKNN decoder-path document, The IOVA ceiling" in c.source for c in COSTS.values())
    assert (BUDGET.mib, BUDGET.ceiling_bytes) == (3900, 2**32) and "RKNN decoder-path document" in BUDGET.source


def test_the_sets_table_is_the_reference_documents_table():
    got = {"+".join(n): (t, a) for n, t, a in REFERENCE.sets}
    assert got == {"S110+S200+S250": (3341, True), "S110+S110+S110+S110": (3144, True),
                   "S200+S200+S200": (3387, True), "S250+S250+S110": (3638, True),
                   "S110+S400": (3401, True), "S200+S400": (3744, True),
                   "S250+S400": (4041, False), "S110+S500": (4538, False)}


@pytest.mark.parametrize("names,total,admit", REFERENCE.sets,
                         ids=lambda v: "+".join(v) if isinstance(v, tuple) else None)
def test_reproduces_every_measured_set(names, total, admit):
    v = check_set(_set(names), BUDGET)
    assert v.total_mib == total  # the sums the reference documents state
    assert v.admit is admit, v.reason
    if admit:
        assert f"{'+'.join(names)}: {total:.0f} MiB of contexts fits the 3900 MiB per-process budget" in v.reason
    else:
        assert f"exceeds the 3900 MiB per-process budget by {total - 3900:.0f} MiB" in v.reason


SMALL = ["S110", "S200", "S250", "S400", "S500"]


@pytest.mark.parametrize("big", ["S900", "S1100", "S2000"])
@pytest.mark.parametrize("others", [(), ("S110",), ("S110", "S200"), ("S250", "S250"), ("S500",)])
def test_every_set_holding_a_long_engine_is_refused_for_its_own_mapping(big, others):
    v = check_set(_set((big,) + others), BUDGET)
    assert not v.admit
    assert f"{big}: its own mapping" in v.reason and "single-mapping ceiling 4294967296 B" in v.reason
    assert "per-process budget" not in v.reason  # refused alone, not for the sum


def test_s900_is_refused_although_its_context_is_small():
    v = check_set(_set(["S900", "S110"]), BUDGET)
    assert v.total_mib == 1039 + 786 < 3900  # the budget alone would admit it
    assert not v.admit and "4710000000 B (4.71 GB)" in v.reason


def test_every_engine_up_to_500_loads_alone():
    for name in SMALL:
        assert check_set([COSTS[name]], BUDGET).admit


def test_budget_bracket_matches_the_reference():
    """The reference documents' admitted/refused sets bracket the budget; their 3900 MiB is inside."""
    admitted = max(t for _, t, a in REFERENCE.sets if a)
    refused = min(t for _, t, a in REFERENCE.sets if not a)
    assert admitted <= BUDGET.mib < refused


def test_a_budget_of_ones_own():
    tight = Budget(3000, source="measured here")
    assert not check_set(_set(["S110", "S200", "S250"]), tight).admit
    assert "3000 MiB per-process budget" in check_set(_set(["S110"]), tight).reason
    assert memory.refused_alone(COSTS["S500"], tight) == ("S500: its context 3752 MiB alone exceeds the 3000 MiB "
                                                          "per-process budget")


def test_unmeasured_cost_is_an_error_that_names_the_fix():
    with pytest.raises(ValueError, match="rkstudy board memory"):
        check_set([EngineCost("new", None), COSTS["S110"]], BUDGET)


def test_smallest_rung():
    lengths = {"S110": 110, "S200": 200, "S250": 250}
    assert memory.smallest_rung(lengths, 1) == "S110"
    assert memory.smallest_rung(lengths, 110) == "S110"
    assert memory.smallest_rung(lengths, 111) == "S200"
    assert memory.smallest_rung(lengths, 251) is None
    # a plain sequence of lengths names each rung by its length (the encoder's width ladder), any order
    assert [memory.smallest_rung((128, 64, 192), n) for n in (1, 64, 65, 192, 193)] == [64, 64, 128, 192, None]


class Handle:
    def __init__(self, name, driver):
        self.name, self.driver = name, driver

    def release(self):
        self.driver.resident.pop(self.name)


class FakeDriver:
    """An aperture that refuses what the reference documents' board refused: one mapping past the ceiling, or a
    resident sum past the budget. Its refusals are independent of the ladder's model, so the tests
    also cover a model that under-reports."""

    def __init__(self, budget=3900):
        self.true = {n: c.context_mib for n, c in COSTS.items() if c.context_mib is not None}
        self.mapping = {n: c.mapping_bytes for n, c in COSTS.items() if c.mapping_bytes}
        self.budget = budget
        self.resident, self.calls = {}, []

    def loader(self, name):
        def load():
            self.calls.append(name)
            if self.mapping.get(name, 0) > memory.SINGLE_MAPPING_CEILING:
                raise InitRefused(f"rknn_init({name})", -4)
            if sum(self.resident.values()) + self.true[name] > self.budget:
                raise InitRefused(f"rknn_init({name})", -4)
            self.resident[name] = self.true[name]
            return Handle(name, self)
        return load


def _ladder(names, driver, costs=COSTS, **kw):
    lines = []
    ladder = LazyLadder({n: driver.loader(n) for n in names}, costs, BUDGET, log=lines.append, **kw)
    return ladder, lines


def test_ladder_loads_on_demand_and_keeps_what_fits():
    d = FakeDriver()
    ladder, lines = _ladder(["S110", "S200", "S250"], d)
    assert ladder.resident == [] and d.calls == []
    for n in ["S110", "S200", "S250", "S110"]:
        ladder.get(n)
    assert ladder.resident == ["S200", "S250", "S110"]  # LRU order, nothing evicted
    assert ladder.resident_mib == 3341 and d.calls == ["S110", "S200", "S250"]
    assert lines == []


def test_ladder_evicts_least_recently_used_until_the_next_fits():
    d = FakeDriver()
    ladder, lines = _ladder(["S110", "S200", "S250", "S400", "S500"], d)
    for n in ["S110", "S200", "S250"]:
        ladder.get(n)
    ladder.get("S110")  # S200 is now least recently used
    ladder.get("S400")  # 3341 + 2615 > 3900: evict S200 (2212+2615 > 3900), then S250 (786+2615)
    assert ladder.resident == ["S110", "S400"] and ladder.resident_mib == 3401
    assert ladder.events[-3:] == ["evict S200 (for S400)", "evict S250 (for S400)", "load S400"]
    ladder.get("S500")  # 3401 + 3752: evict both
    assert ladder.resident == ["S500"] and d.resident == {"S500": 3752}


def test_ladder_routes_an_engine_refused_alone_to_the_cpu_with_one_line():
    d = FakeDriver()
    cpu_made = []
    ladder, lines = _ladder(["S110", "S900"], d, cpu=lambda n: cpu_made.append(n) or f"cpu:{n}")
    ladder.get("S110")
    assert ladder.get("S900") == "cpu:S900"
    assert ladder.get("S900") == "cpu:S900"  # announced once, made once
    assert cpu_made == ["S900"] and len(lines) == 1
    assert lines[0].startswith("S900: its own mapping 4710000000 B (4.71 GB) exceeds")
    assert lines[0].endswith("-> CPU path")
    assert ladder.resident == ["S110"]  # nothing evicted for an engine that cannot fit anyway
    assert "S900" not in d.calls  # and rknn_init was never tried
    assert "single-mapping ceiling" in ladder.on_cpu("S900")


def test_ladder_without_cpu_path_raises_with_the_reason():
    ladder, lines = _ladder(["S2000"], FakeDriver())
    with pytest.raises(memory.DoesNotFit, match="S2000: its own mapping 5770000000 B"):
        ladder.get("S2000")


def test_ladder_survives_a_cost_that_under_reports():
    """The driver refuses although the model said it fits (here S900 reported 1039 MiB and no
    mapping): the ladder evicts everything, retries alone, and only then goes to the CPU."""
    d = FakeDriver()
    blind = {n: EngineCost(n, c.context_mib) for n, c in COSTS.items() if c.context_mib is not None}
    ladder, lines = _ladder(["S110", "S200", "S900"], d, costs=blind, cpu=lambda n: "cpu")
    ladder.get("S110"), ladder.get("S200")
    assert ladder.get("S900") == "cpu"
    assert d.calls == ["S110", "S200", "S900", "S900"]
    assert ladder.resident == []  # it evicted the others to try alone
    assert "refused it beside S110+S200" in lines[0]
    assert lines[1].startswith("S900: rknn_init refused it alone (rknn_init(S900) failed with code -4")


def test_ladder_retry_alone_succeeds_when_the_aperture_was_the_problem():
    d = FakeDriver(budget=3000)  # another process holds part of the aperture: the model's 3900 is optimistic
    ladder, lines = _ladder(["S110", "S200", "S250"], d)
    ladder.get("S110"), ladder.get("S200")
    ladder.get("S250")  # 786+1129+1426 = 3341 > 3000: refused beside the others, fits alone
    assert ladder.resident == ["S250"] and len(lines) == 1


def test_ladder_measures_each_cost_once_through_a_callable():
    asked = []

    def cost(name):
        asked.append(name)
        return COSTS[name]

    d = FakeDriver()
    ladder = LazyLadder({n: d.loader(n) for n in ["S110", "S200"]}, cost, BUDGET, log=lambda s: None)
    for n in ["S110", "S200", "S110", "S200"]:
        ladder.get(n)
    assert asked == ["S110", "S200"]


def test_ladder_close_releases_everything():
    d = FakeDriver()
    with LazyLadder({n: d.loader(n) for n in ["S110", "S200"]}, COSTS, BUDGET, log=lambda s: None) as ladder:
        ladder.get("S110"), ladder.get("S200")
        assert d.resident
    assert d.resident == {}


def test_ladder_unknown_name():
    ladder, _ = _ladder(["S110"], FakeDriver())
    with pytest.raises(KeyError, match="it has S110"):
        ladder.get("S111")
