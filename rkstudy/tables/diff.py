"""`rkstudy results diff A B`: what moved between two result trees (the committed tables and a fresh
run of them), column by column, and whether the host, the code or nothing explains each move.

Each column gets one rule, from its name first and its values second, and the report says which:

* exact: counts, node numbers, bytes and REGTASK lines (regtask*, *nodes*, *bytes*, count(s),
  nonfinite, lines), integers and strings: the compiler and the graph are deterministic;
* dB (*_db, *_db_min ...): held to the tolerance of what computed it, the row's `where` (simulator, fp32, board);
* difference (*max_diff, *max_abs_err ...): a largest difference between two outputs, likewise;
* PESQ-WB, STOI, DNSMOS (pesq*, stoi*, dnsmos*): listener scores, each with a tolerance of its own;
* time: *_s, *_ms, *_us, seconds, minutes, rtf, the cost model's terms (*terms*) and their ratios (a
  ratio_min/ratio_max spread beside a ratio_vs_*), and a text of them that differs in its numbers only (a
  per-op time list): reported, never failed;
* machine: peak RSS, bandwidth and load figures (*peak*, *rss*, *gb_per_s*, *load*): reported, never failed;
* build: a text that differs only in the digests of the engines it names (`decoder.main=<file>.rknn:<digest>`):
  reported, never failed. rknn-toolkit2 writes uninitialized memory into the padding of an engine (two builds
  of the Kokoro W=128 generator from one graph on one host: 54,472,687 bytes each, 1,143 of them apart, in
  two runs of padding holding heap addresses), so each build's digest is its own; its bytes count stays exact;
* otherwise floats, by their relative change; a text that differs only in the floats it quotes (a lint
  finding's "max_abs=117.0775") holds them to that too, one unit of a printed last digit being rounding,
  and its integers exact;
* on tables made on different machines, a verdict on a host-timed figure (the cost model's `verdict`,
  `term` and `within_*` against a board figure: its CPU and I/O terms are this host's timings) and a count
  of such verdicts ("held-out figures within ..."): reported, since another CPU times the terms; on one
  machine they are held exact.

The tolerances are measured, not chosen (rkstudy.tables.tolerances, tolerances.csv: the largest change
each kind showed between reruns on one machine, and across machines of different vector ISAs, with the
runs that measured it). Each table's rows say which machine computed them (rkstudy.tables.results.MACHINE)
and which commit: a cell that moved by no more than one machine's reruns move it is unchanged; by no more
than another machine moves it, on tables made on different machines, a host change; past that, where the
table's producing code differs between the two commits, a code change; anything else is unexplained.
Exit 1 when a cell moved that neither the host nor the code explains.

A `value` or `measured` cell takes the rule of its row's `unit` (dB, s, ms, ms/window ...); where the
unit says nothing, a row whose label (a headline's name, a goal, a quantity) names a machine figure, a
time ("converter peak", "DRAM read", "CPU RTF", "wall", the cost model's "error ... against the board", whose
prediction carries host-timed terms) or a listener score, or whose figure or unit names
one ("piper-decoder-ms", "board ms per host ms": a prediction or a constant fed by this host's timings), has
its cells taken as that, a text quoting them too where only its numbers moved:
a headline is the same figure as the column it was read from (its name says simulator, or not). A
reference claim's `ours` takes the rule of the column it was read from (`ours_from`), and its `verdict` is
compared by kind (reproduced, differs, ...), the text that quotes ours reported.
Rows are matched by their key columns: target and where, then the fewest leading columns not named
as counts, bytes, dB, times or machine figures (a dB level the table leads with is a key) that tell
the rows apart in both trees (the order of appearance too when none does). The stamp and machine
columns are not compared cell by cell; they say what each table's rows were made with.

Standard library only (git on PATH to tell whether the code differs).
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from .. import atomic
from . import tolerances
from .results import CARRIED, MACHINE, STAMP, read_table

EXACT_NAME = re.compile(r"^regtask|nodes|bytes|(^|_)(count|counts|nonfinite|lines)($|_)")
TIME_WORDS = {"s", "ms", "us", "seconds", "minutes", "rtf",
              "terms"}  # the NPU cost model's terms, in ms ("conv 62.2 + dram 63.7 + ... + io 5.7")
MACHINE_NAME = re.compile(r"peak|rss|gb_per|load")
DIFFERENCE_NAME = re.compile(r"max_(abs_)?(diff|err)")
LISTENER = {"pesq": "PESQ-WB", "stoi": "STOI", "dnsmos": "DNSMOS"}  # a column's or a label's word -> its kind
REPORTED = ("time", "machine", "build", "crash")
# a row's label: what a headline, a goal or a quantity row says it holds
LABEL_COLUMNS = ("headline", "goal", "quantity", "label")
MACHINE_WORDS = {"peak", "rss", "bandwidth", "dram", "load", "gb/s", "mb/s"}
TIME_LABEL_WORDS = {"rtf", "wall", "seconds", "minutes", "time", "times", "ms", "us"}
# what else names a row's figure: a predicted figure's name ("piper-decoder-ms"), a row's unit
# ("board ms per host ms": a constant fitted on this host's timings moves with them)
FIGURE_COLUMNS = ("figure", "unit")
UNIT_FIRST = "; in a row whose unit is dB or a time, that rule"
IGNORED = (*STAMP, *MACHINE, CARRIED)
# a verdict on a host-timed figure (the cost model's: within the band or not, the term that carries a miss) and
# a count of such verdicts: held exact on one machine, reported across machines, whose CPUs time the terms
HOST_TIMED_VERDICT = re.compile(r"^(verdict|term|within_)")
HOST_TIMED_COUNT = re.compile(r"\bfigures (within|undecided)\b")
QUOTED_FLOATS = "the floats a text quotes"


@dataclass(frozen=True)
class Tolerance:
    kind: str   # exact, dB, PESQ-WB, STOI, DNSMOS, relative, time, machine, build, crash
    why: str    # what gave it: the name, or the values

    def describe(self) -> str:
        rule = {"dB": "dB, by what computed it", "difference": "largest difference, by what computed it",
                "relative": "relative", "time": "time, reported",
                "machine": "machine, reported", "build": "engine digest, reported", "crash": "crash signal, reported",
                "exact": "exact"}.get(self.kind, f"{self.kind}, its own")
        return f"{rule} (by {self.why})"


def number(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


_number = number


def _is_int(text: str) -> bool:
    return re.fullmatch(r"[-+]?\d+", text.strip()) is not None


def _listener(words: str) -> str | None:
    low = words.lower()
    return next((kind for word, kind in LISTENER.items() if word in low), None)


def name_rule(column: str) -> Tolerance | None:
    """The rule a column's name gives, or None when the name says nothing."""
    name = column.lower()
    words = set(column.split("_"))  # case kept: S is a sequence length, s a second
    if "db" in name.split("_"):  # snr_db, and its summaries: window_snr_db_min, window_snr_db_median
        return Tolerance("dB", "name")
    if words & TIME_WORDS or "ratio_vs" in name:
        return Tolerance("time", "name")
    if MACHINE_NAME.search(name):
        return Tolerance("machine", "name")
    if EXACT_NAME.search(name):
        return Tolerance("exact", "name")
    if DIFFERENCE_NAME.search(name):
        return Tolerance("difference", "name")
    listener = _listener(name)
    if listener:
        return Tolerance(listener, "name")
    return None


def column_rule(column: str, values: list[str]) -> Tolerance:
    """The name's rule for a numeric column (peak_from, a text, takes the values' rule), else the values'."""
    filled = [v for v in values if v != ""]
    by_name = name_rule(column)
    if by_name is not None and all(number(v) is not None for v in filled):
        return by_name
    if filled and all(number(v) is not None for v in filled) and not all(_is_int(v) for v in filled):
        return Tolerance("relative", "float values")
    return Tolerance("exact", "integer values" if filled and all(_is_int(v) for v in filled) else "string values")


def unit_rule(unit: str) -> Tolerance | None:
    """The rule a row's `unit` cell gives its `value`/`measured` cell."""
    first = unit.strip().split("/")[0].strip().lower()
    if first == "db":
        return Tolerance("dB", "unit")
    if first in TIME_WORDS or first in ("min", "h"):
        return Tolerance("time", "unit")
    return None


def label_rule(text: str) -> Tolerance | None:
    """The rule a row's label gives its float cells: a machine figure, a time or a listener score named in words."""
    words = set(re.findall(r"[a-z0-9/]+", text.lower()))
    if words & MACHINE_WORDS:
        return Tolerance("machine", "row label")
    if words & TIME_LABEL_WORDS:
        return Tolerance("time", "row label")
    if {"error", "board"} <= words:  # the cost model's error against a board figure: its prediction is host-timed
        return Tolerance("time", "row label")
    listener = _listener(text)
    if listener:
        return Tolerance(listener, "row label")
    if "max" in words and words & {"diff", "difference", "error"}:
        return Tolerance("difference", "row label")
    return None


def source_rule(ours_from: str) -> Tolerance | None:
    """The rule of the column a reference claim read ours from (`table.column[rows] summary`)."""
    column = ours_from.split("[")[0].split(" ")[0].rpartition(".")[2]
    return name_rule(column) if column else None


def figure_kind(rule: Tolerance, where: str) -> str:
    """The kind of figure (rkstudy.tables.tolerances.KINDS) a cell under `rule` in a row made `where` is."""
    if rule.kind in ("dB", "difference"):
        by = {"simulator": "simulator", "board": "board"}.get(where, "fp32")
        return f"{by} {rule.kind}"
    if rule.kind == "relative":
        return "float"
    if rule.kind in tolerances.KINDS:
        return rule.kind
    return "exact"


_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?|inf")


def _numbers(text: str) -> list[float]:
    return [float(x.replace(",", "")) for x in _NUMBER.findall(text)]


def _claim_kind(verdict: str) -> str:
    from .claims import kind

    try:
        return kind(verdict)
    except ValueError:
        return verdict


# --- what made each side ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Made:
    """What made one side's rows of a table: the commits, and the machines (None: not recorded)."""

    commits: frozenset[str]
    machines: frozenset[tuple] | None


def made(rows: list[dict], meta: dict | None = None) -> Made:
    """The commits and machines of a table's measured rows (a carried row was made by an earlier run);
    `meta` is a headlines.json's own stamp, for the headline table."""
    if meta is not None:
        machine = meta.get("machine")
        machines = frozenset({tuple(str(machine.get(k, "")) for k in MACHINE)}) if machine else None
        return Made(frozenset({meta.get("commit", "")}), machines)
    measured = [r for r in rows if not r.get(CARRIED)] or rows
    recorded = all(all(r.get(k) not in (None, "") for k in MACHINE) for r in measured)
    return Made(frozenset(r.get("commit", "") for r in measured),
                frozenset(tuple(str(r[k]) for k in MACHINE) for r in measured) if recorded else None)


def machine_relation(a: Made, b: Made) -> tuple[str, str]:
    """(tolerances.MACHINES entry, what differs) for two sides' machines."""
    if a.machines is None or b.machines is None:
        side = "A" if a.machines is None else "B"
        return tolerances.MACHINES[1], f"the machine is not recorded in {side} (made before rows named it)"
    if a.machines == b.machines and len(a.machines) == 1:
        cpu, isa, threads, pins = next(iter(a.machines))
        return tolerances.MACHINES[0], f"{cpu}, {isa}, {threads} threads, numerics pinned {pins}"
    if len(a.machines) == 1 and len(b.machines) == 1:
        ma, mb = next(iter(a.machines)), next(iter(b.machines))
        names = ("CPU", "vector ISA", "threads", "pinned numerics")
        return tolerances.MACHINES[1], "; ".join(f"{n} {x} -> {y}" for n, x, y in zip(names, ma, mb) if x != y)
    return tolerances.MACHINES[1], "rows of one side were made on more than one machine"


class CodeHistory:
    """Whether the code that makes a study changed between two commits (git, in `repo`)."""

    def __init__(self, repo: Path | None):
        self.repo = repo
        self._seen: dict[tuple, tuple[bool | None, str]] = {}

    def relation(self, table: str, a: Made, b: Made) -> tuple[bool | None, str]:
        """(True: the code differs, False: it is the same, None: cannot tell; what says so)."""
        if len(a.commits) != 1 or len(b.commits) != 1:
            return None, "a side was made by more than one commit"
        ca, cb = next(iter(a.commits)), next(iter(b.commits))
        if ca == cb:
            return False, f"both made at {ca}"
        key = (table.split("/")[0], table, ca, cb)
        if key not in self._seen:
            self._seen[key] = self._changed(table, ca, cb)
        return self._seen[key]

    def _changed(self, table: str, ca: str, cb: str) -> tuple[bool | None, str]:
        if self.repo is None or ca.endswith("-dirty") or cb.endswith("-dirty"):
            return None, f"made at {ca} and {cb}" + (" (a dirty tree)" if "-dirty" in ca + cb else "")
        from . import provenance

        git = provenance.Git(self.repo)
        full_a, full_b = git.resolve(ca), git.resolve(cb)
        study, _, name = table.partition("/")
        paths = provenance.producing_code(self.repo, study, name if study in ("benchmarks", "board") else None)
        if full_a is None or full_b is None or paths is None:
            return None, f"made at {ca} and {cb}, which this repository cannot compare"
        proc = git.run("diff", "--name-only", full_a, full_b, "--", *paths)
        changed = sorted(line for line in proc.stdout.splitlines() if line)
        if not changed:
            return False, f"no producing file changed between {ca} and {cb}"
        shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
        return True, f"{len(changed)} producing files changed between {ca} and {cb}: {shown}"


# --- one table --------------------------------------------------------------------------------------------
@dataclass
class TableDiff:
    name: str
    keys: list[str] = field(default_factory=list)
    by_order: bool = False
    rules: dict[str, Tolerance] = field(default_factory=dict)
    columns_only: dict[str, list[str]] = field(default_factory=dict)
    rows_only: dict[str, list[str]] = field(default_factory=dict)
    machines: str = tolerances.MACHINES[0]
    machines_why: str = ""
    code_differs: bool | None = False
    code_why: str = ""
    # (row, column, rule, A, B, B - A): moved past what the host explains, with no code change to explain it
    failures: list[tuple[str, str, str, str, str, float | None]] = field(default_factory=list)
    # the same for cells that moved where the producing code changed
    code_moves: list[tuple[str, str, str, str, str, float | None]] = field(default_factory=list)
    # (column, rule) -> [(B - A, A, B)]: cells that moved within their tolerance (reported) ...
    changes: dict[tuple[str, Tolerance], list[tuple[float | None, str, str]]] = field(
        default_factory=lambda: defaultdict(list))
    # ... of which these moved past one machine's reruns, within what another machine moves them
    host_moves: int = 0

    @property
    def failed(self) -> bool:
        return bool(self.failures)


def _tables(root: Path) -> dict[str, tuple[list[dict], dict | None]]:
    """{"study/table": (rows, None)} for every CSV under `root`, and each study's headlines as a table
    (with the headlines' own stamp)."""
    out: dict[str, tuple[list[dict], dict | None]] = {}
    for path in sorted(Path(root).glob("*/*.csv")):
        out[f"{path.parent.name}/{path.stem}"] = (read_table(path), None)
    for path in sorted(Path(root).glob("*/headlines.json")):
        h = json.loads(path.read_text(encoding="utf-8"))
        rows = [{"headline": name, "value": str(v["value"]), "unit": v.get("unit", ""),
                 "board_risk": v.get("board_risk", ""),
                 "where": "simulator" if "simulator" in name.lower() else "fp32"}
                for name, v in h.get("headlines", {}).items()]
        out[f"{path.parent.name}/headlines.json"] = (rows, h)
    return out


def _keys(columns: list[str], rules: dict[str, Tolerance], a: list[dict], b: list[dict]) -> tuple[list[str], bool]:
    # the SoC and the runner are part of what a row is (a sweep on two targets has two rows per width)
    candidates = [c for c in ("target", "where") if all(c in r for r in a + b)]
    # then the columns in table order (tables lead with what a row is), skipping the ones named as
    # measurements: counts, bytes, dB, times and machine figures; a dB level the table leads with is
    # what it sweeps (snr_target_db), so a key
    candidates += [c for i, c in enumerate(columns)
                   if c not in candidates and (rules[c].why != "name" or (rules[c].kind == "dB" and i == 0))]
    for n in range(len(candidates) + 1):
        keys = candidates[:n]
        if all(len({tuple(r.get(k, "") for k in keys) for r in rows}) == len(rows) for rows in (a, b)):
            return keys, False
    return candidates, True


def _keyed(rows: list[dict], keys: list[str], by_order: bool) -> dict[tuple, dict]:
    out, seen = {}, defaultdict(int)
    for r in rows:
        key = tuple(r.get(k, "") for k in keys)
        if by_order:
            seen[key] += 1
            key = (*key, f"#{seen[key]}")
        out[key] = r
    return out


def _label(keys: list[str], key: tuple) -> str:
    parts = [f"{k}={v}" for k, v in zip(keys, key)] + [str(v) for v in key[len(keys):]]
    return ", ".join(parts) or "(the one row)"


def _matched(name: str, a: list[dict], b: list[dict]):
    """(TableDiff with keys, rules and one-sided rows/columns; [(label, row A, row B)] matched, common columns)."""
    d = TableDiff(name)
    cols_a = [c for c in (a[0] if a else {}) if c not in IGNORED]
    cols_b = [c for c in (b[0] if b else {}) if c not in IGNORED]
    common = [c for c in cols_a if c in cols_b]
    d.columns_only = {side: cols for side, cols in (("A", [c for c in cols_a if c not in cols_b]),
                                                     ("B", [c for c in cols_b if c not in cols_a])) if cols}
    d.rules = {c: column_rule(c, [r[c] for r in a + b]) for c in common}
    # a spread of a ratio of times (ratio_min/ratio_max beside ratio_vs_*) is a time as the ratio is
    if any(c.startswith("ratio_vs") and d.rules[c].kind == "time" for c in common):
        d.rules.update({c: Tolerance("time", "a ratio of times") for c in common
                        if c.startswith("ratio_") and d.rules[c].kind == "relative"})
    d.keys, d.by_order = _keys(common, d.rules, a, b)
    ka, kb = _keyed(a, d.keys, d.by_order), _keyed(b, d.keys, d.by_order)
    d.rows_only = {side: [_label(d.keys, k) for k in keys] for side, keys in
                   (("A", [k for k in ka if k not in kb]), ("B", [k for k in kb if k not in ka])) if keys}
    return d, [(_label(d.keys, k), ka[k], kb[k]) for k in ka if k in kb], common


ENGINE_DIGEST = re.compile(r"(\.rknn):[0-9a-f]{8,64}\b")


def _same_but_engine_digests(a: str, b: str) -> bool:
    """Whether two texts differ in the digests of the engines they name only (each build has its own: the
    toolkit's padding is uninitialized memory)."""
    return a != b and ENGINE_DIGEST.sub(r"\1:#", a) == ENGINE_DIGEST.sub(r"\1:#", b)


# how the toolkit's child died: the signal and its exit code ("crashed (SIGSEGV, exit 139) at build")
CRASH_SIGNAL = re.compile(r"\bSIG[A-Z]+\b(, exit \d+)?")


def _same_but_crash_signal(a: str, b: str) -> bool:
    """Whether two texts differ in the signal a crashed toolkit died on only: rknn-toolkit2 2.5.0 building
    w8a16 for rk3562 died on SIGSEGV in one run and on SIGABRT in the next, same host, graph and toolkit.
    That it crashes, and where, is the finding; the signal is chance."""
    return a != b and CRASH_SIGNAL.sub("SIG", a) == CRASH_SIGNAL.sub("SIG", b)


def _same_but_numbers(a: str, b: str) -> bool:
    """Whether two texts differ in their numbers only ("Slice:0.0231" and "Slice:0.0233")."""
    return _NUMBER.sub("#", a) == _NUMBER.sub("#", b)


def _cell_rule(d: TableDiff, c: str, ra: dict, rb: dict) -> Tolerance:
    rule = d.rules[c]
    if c in ("value", "measured") and "unit" in ra:
        rule = unit_rule(ra["unit"]) or rule
    label = next((ra[col] for col in LABEL_COLUMNS if col in ra), "")
    by_label = label_rule(label) if label else None
    if by_label is None:
        by_label = next((r for r in (label_rule(ra[col]) for col in FIGURE_COLUMNS if ra.get(col)) if r), None)
    if by_label is not None and rule.kind == "relative":
        rule = by_label
    elif rule.why == "string values" and _same_but_engine_digests(ra[c], rb[c]):
        rule = Tolerance("build", "engine digests only: each build's padding differs")
    elif rule.why == "string values" and _same_but_crash_signal(ra[c], rb[c]):
        rule = Tolerance("crash", "the signal a crashed toolkit died on only: it varies from run to run")
    elif rule.why == "string values" and _same_but_numbers(ra[c], rb[c]):
        # a text that quotes times (a per-op time list, a verdict quoting a predicted time) moves with them
        by_text = next((r for r in (name_rule(c), by_label) if r is not None and r.kind in REPORTED), None)
        if by_text is not None:
            rule = Tolerance(by_text.kind, f"{by_text.why}, a text of them")
        elif ra[c] != rb[c]:  # a finding quoting an fp32 maximum, say
            rule = Tolerance("relative", QUOTED_FLOATS)
    if d.machines == tolerances.MACHINES[1]:
        if (rule.kind == "exact" and rule.why == "string values" and by_label is not None and by_label.kind == "time"
                and HOST_TIMED_VERDICT.match(c)):
            rule = Tolerance("time", f"{by_label.why}, a verdict on a host-timed figure, on another machine")
        elif rule.kind == "relative" and label and HOST_TIMED_COUNT.search(label.lower()):
            rule = Tolerance("time", "row label, a count of verdicts on host-timed figures, on another machine")
    return rule


def _printed_unit(token: str) -> float:
    """One unit in the last digit a number was printed with (0.0001 for "96.1861", 1 for "117")."""
    mantissa, _, exponent = token.lower().partition("e")
    return 10.0 ** (int(exponent or 0) - len(mantissa.partition(".")[2]))


def _quoted_float_pairs(a: str, b: str) -> list[tuple[str, str]]:
    """The numbers of two texts that differ in their numbers only, pair by pair, to hold to the float
    tolerance: an integer (a count, a node's index) must not move, and a float that moved by one unit of
    its printed last digit is rounding (96.1861 and 96.1862 are one value printed either side of a 5)."""
    pairs = []
    for x, y in zip(*([t.replace(",", "") for t in _NUMBER.findall(text)] for text in (a, b))):
        if x == y:
            continue
        if _is_int(x) and _is_int(y):
            pairs.append((f"integer {x}", f"integer {y}"))  # not numbers: any move is past the tolerance
        elif abs(float(x) - float(y)) > max(map(_printed_unit, (x, y))) * (1 + 1e-9):
            pairs.append((x, y))  # (1 + 1e-9): 96.1862 - 96.1861 is a hair over 1e-4 in binary
    return pairs or [("0", "0")]


def _claim_cells(column: str, ra: dict, rb: dict) -> tuple[Tolerance, list[tuple[str, str]]]:
    """A reference claim's `ours` by the rule of the column it was read from (its numbers compared under
    that rule, pair by pair), its `verdict` by kind: the verdict's text quotes ours, so it moves with it.
    Returns the rule and the (A, B) pairs to hold to it (the whole texts where numbers cannot pair)."""
    source = None
    if ra.get("ours_from") == rb.get("ours_from"):
        # the column it was read from, else the unit ours is written in ("127.4 to 131.3 dB" from `measured`)
        source = source_rule(ra.get("ours_from", "")) or unit_rule(ra.get("ours", "").rpartition(" ")[2])
    if column == "verdict":
        reported = source is not None and source.kind in REPORTED
        pair = (_claim_kind(ra[column]), _claim_kind(rb[column]))
        return Tolerance("time" if reported and pair[0] == pair[1] else "exact", "verdict kind"), [pair]
    if source is None or ra[column] == rb[column]:
        return Tolerance("exact", "string values"), [(ra[column], rb[column])]
    xa, xb = _numbers(ra[column]), _numbers(rb[column])
    if source.kind in REPORTED:
        return Tolerance(source.kind, "ours_from"), [(ra[column], rb[column])]
    if len(xa) != len(xb) or not xa:
        return Tolerance("exact", "ours_from"), [(ra[column], rb[column])]
    return Tolerance(source.kind, "ours_from"), [(repr(x), repr(y)) for x, y in zip(xa, xb)]


def compared(d: TableDiff, rows, common):
    """(label, column, rule, kind, A, B) for every matched cell held to a tolerance, and (label, column,
    rule, A, B) for every reported one (times, machine figures)."""
    held, reported = [], []
    for label, ra, rb in rows:
        where = ra.get("where", "")
        for c in common:
            if c in d.keys:
                continue
            if "ours_from" in ra and c in ("ours", "verdict"):
                rule, pairs = _claim_cells(c, ra, rb)
                if rule.kind in REPORTED:
                    reported.append((label, c, rule, ra[c], rb[c]))
                    continue
                whole = (ra[c], rb[c])
                kind = figure_kind(rule, where)
                held.append((label, c, rule, kind, *whole, pairs))
                continue
            rule = _cell_rule(d, c, ra, rb)
            if rule.kind in REPORTED:
                reported.append((label, c, rule, ra[c], rb[c]))
            else:
                pairs = _quoted_float_pairs(ra[c], rb[c]) if rule.why == QUOTED_FLOATS else [(ra[c], rb[c])]
                held.append((label, c, rule, figure_kind(rule, where), ra[c], rb[c], pairs))
    return held, reported


def _size(kind: str, a: str, b: str) -> float:
    """How far one cell moved under its kind: 0 unchanged, inf where it is not a number both sides."""
    if a == b:
        return 0.0
    x, y = number(a), number(b)
    if kind == "exact" or x is None or y is None:
        return math.inf
    return tolerances.change(kind, x, y)


def _delta(a: str, b: str) -> float | None:
    x, y = number(a), number(b)
    if x is None or y is None:
        return None
    if math.isfinite(x) and math.isfinite(y):
        return y - x
    return 0.0 if x == y else math.inf


def diff_table(name: str, a: list[dict], b: list[dict], meta_a: dict | None = None, meta_b: dict | None = None,
               history: CodeHistory | None = None, measured=None) -> TableDiff:
    measured = tolerances.load() if measured is None else measured
    d, rows, common = _matched(name, a, b)
    made_a, made_b = made(a, meta_a), made(b, meta_b)
    d.machines, d.machines_why = machine_relation(made_a, made_b)
    d.code_differs, d.code_why = (history or CodeHistory(None)).relation(name, made_a, made_b)
    held, reported = compared(d, rows, common)
    for _, c, rule, va, vb in reported:
        if va != vb:
            d.changes[(c, rule)].append((_delta(va, vb), va, vb))
    for label, c, rule, kind, va, vb, pairs in held:
        if va == vb:
            continue
        size = max(_size(kind, x, y) for x, y in pairs)
        one = tolerances.allowed(measured, kind, tolerances.MACHINES[0])
        host = tolerances.allowed(measured, kind, d.machines)
        entry = (label, c, f"{rule.describe()}, {kind}", va, vb, _delta(va, vb))
        if tolerances.within(size, one) or (tolerances.within(size, host) and d.machines == tolerances.MACHINES[1]):
            d.changes[(c, rule)].append((_delta(va, vb), va, vb))
            d.host_moves += not tolerances.within(size, one)
        elif d.code_differs:
            d.code_moves.append(entry)
        else:
            d.failures.append(entry)
    return d


def cells(a: Path, b: Path):
    """(table, row label, column, kind, A, B) for every cell of the two trees held to a tolerance (what
    rkstudy.tables.tolerances measures)."""
    ta, tb = _tables(a), _tables(b)
    for name in ta:
        if name not in tb:
            continue
        d, rows, common = _matched(name, ta[name][0], tb[name][0])
        # as diff_table holds them: on two machines, verdicts on host-timed figures are reported, not held
        d.machines, _ = machine_relation(made(ta[name][0], ta[name][1]), made(tb[name][0], tb[name][1]))
        held, _ = compared(d, rows, common)
        for label, c, _rule, kind, _a, _b, pairs in held:
            for x, y in pairs:
                yield name, label, c, kind, x, y


def diff_trees(a: Path, b: Path, repo: Path | None = None) -> tuple[list[TableDiff], list[str], list[str]]:
    ta, tb = _tables(a), _tables(b)
    history, measured = CodeHistory(repo), tolerances.load()
    diffs = [diff_table(name, ta[name][0], tb[name][0], ta[name][1], tb[name][1], history, measured)
             for name in ta if name in tb]
    return diffs, [n for n in ta if n not in tb], [n for n in tb if n not in ta]


def _fmt_delta(delta: float | None, a: str) -> str:
    if delta is None:
        return ""
    x = number(a)
    rel = f" ({delta / x:+.2%})" if x and math.isfinite(delta) else ""
    return f"{delta:+.6g}{rel}"


def _change_summary(column: str, rule: Tolerance, changes: list[tuple[float | None, str, str]]) -> str:
    numeric = [d for d, _, _ in changes if d is not None and math.isfinite(d)]
    text = f"`{column}` ({rule.describe()}): {len(changes)} row{'s' * (len(changes) > 1)} changed"
    if numeric:
        text += f", change {min(numeric):+.4g} to {max(numeric):+.4g}"
    if rule.kind in REPORTED:
        ratios = [number(b) / number(a) for _, a, b in changes
                  if number(a) and number(b) is not None and math.isfinite(number(a) or math.nan)]
        if ratios:
            text += f", B/A median {statistics.median(ratios):.3g}"
    return text


def tolerance_lines(measured=None) -> list[str]:
    """The tolerances in force, each with the runs that measured it."""
    measured = tolerances.load() if measured is None else measured
    lines = ["| kind | one machine | another machine | measured by |", "|---|---|---|---|"]
    for kind in tolerances.KINDS:
        one = tolerances.allowed(measured, kind, tolerances.MACHINES[0])
        other = tolerances.allowed(measured, kind, tolerances.MACHINES[1])
        unit = " (relative)" if kind in tolerances.RELATIVE else ""
        runs = sorted({run for m in (measured.get((kind, mm)) for mm in tolerances.MACHINES) if m for run in m.runs})
        source = "; ".join(runs) if runs else ("the six digits a table keeps" if kind in tolerances.RELATIVE else
                                               "not measured: exact")
        lines.append(f"| {kind} | {one:.3g}{unit} | {other:.3g}{unit} | {source} |")
    return lines


def report(a: Path, b: Path, labels: tuple[str, str] | None = None, repo: Path | None = None) -> tuple[str, bool]:
    """The Markdown report (the trees named by `labels`, default their paths), and whether anything
    moved that neither the host nor the code explains. `repo`: the git checkout that tells whether a
    table's producing code changed between its two stamps."""
    diffs, only_a, only_b = diff_trees(a, b, repo)
    failed = [d for d in diffs if d.failed]
    n_fail = sum(len(d.failures) for d in diffs)
    n_host = sum(d.host_moves for d in diffs)
    n_code = sum(len(d.code_moves) for d in diffs)
    other = sorted({d.machines_why for d in diffs if d.machines == tolerances.MACHINES[1]})
    name_a, name_b = labels or (f"`{a}`", f"`{b}`")
    lines = [f"# Results diff: {name_a} (A) against {name_b} (B)", "",
             f"{len(diffs)} tables compared; {n_fail} cells in {len(failed)} tables moved past their tolerance"
             + (" (exit 1)." if n_fail else "."),
             f"{n_host} cells moved within what another machine moves them (host differs), {n_code} where the "
             f"producing code changed (code differs)."
             + (f" Machines: {'; '.join(other[:3])}" + (f" and {len(other) - 3} more" if len(other) > 3 else "") + "."
                if other else " Every table was made on the same machine on both sides."),
             "",
             "Tolerances, measured (rkstudy/tables/tolerances.csv): counts, nodes, bytes, REGTASK lines, integers "
             "and strings exact; each other kind by the largest change reruns showed on one machine, and across "
             "machines of different vector ISAs for tables made on different machines; times and machine figures "
             "(peak RSS, bandwidth, load) reported, never failed, as are the digests of engines (each build's "
             "padding differs); a reference claim's ours by its source column's "
             "rule, its verdict by kind. Stamp and machine columns are not compared cell by cell.", "",
             *tolerance_lines(), ""]
    if only_a:
        lines += [f"Tables only in A ({len(only_a)}): " + ", ".join(f"`{n}`" for n in only_a), ""]
    if only_b:
        lines += [f"Tables only in B ({len(only_b)}): " + ", ".join(f"`{n}`" for n in only_b), ""]
    for d in sorted(diffs, key=lambda d: (not d.failed, not d.code_moves, d.name)):
        if not (d.failures or d.code_moves or d.changes or d.rows_only or d.columns_only):
            continue
        verdict = (" — moved past tolerance" if d.failed else " — moved with the code" if d.code_moves else "")
        lines += [f"## `{d.name}`{verdict}", "",
                  "Rows matched by " + (", ".join(f"`{k}`" for k in d.keys) or "nothing (one row)")
                  + (" and their order" if d.by_order else "") + ".",
                  f"Machines: {d.machines} ({d.machines_why}). Code: "
                  + {True: "differs", False: "same", None: "cannot tell"}[d.code_differs] + f" ({d.code_why}).", ""]
        for side, cols in d.columns_only.items():
            lines.append(f"- columns only in {side}: " + ", ".join(f"`{c}`" for c in cols))
        for side, rows in d.rows_only.items():
            shown = "; ".join(rows[:10]) + (f"; and {len(rows) - 10} more" if len(rows) > 10 else "")
            lines.append(f"- rows only in {side} ({len(rows)}): {shown}")
        for (column, rule), changes in d.changes.items():
            lines.append("- " + _change_summary(column, rule, changes))
        if d.host_moves:
            lines.append(f"- {d.host_moves} of these moved past one machine's reruns, within what another machine "
                         "moves them: host differs")
        for title, entries in (("moved past tolerance, unexplained", d.failures),
                               ("moved past tolerance where the producing code changed", d.code_moves)):
            if entries:
                lines += ["", f"{title.capitalize()}:", "", "| row | column | rule | A | B | change |",
                          "|---|---|---|---|---|---|"]
                lines += [f"| {key} | `{c}` | {rule} | {va} | {vb} | {_fmt_delta(delta, va)} |"
                          for key, c, rule, va, vb, delta in entries]
        lines.append("")
    rules = ["", "## Rules by column", "", "| table | column | rule |", "|---|---|---|"]
    for d in diffs:
        for c, r in d.rules.items():
            unit_first = UNIT_FIRST if c in ("value", "measured") and "unit" in d.rules else ""
            rules.append(f"| `{d.name}` | `{c}` | {r.describe()}{unit_first}{'; a key' if c in d.keys else ''} |")
    return "\n".join(lines + rules) + "\n", bool(n_fail)


def main(a: Path, b: Path, out: Path | None = None, repo: Path | None = None) -> int:
    from ..errors import InputError
    from ..paths import REPO

    for root in (a, b):
        if not Path(root).is_dir():
            raise InputError(f"{root} is not a result tree (a folder of <study>/<table>.csv); give two folders")
    text, failed = report(Path(a), Path(b), repo=REPO if repo is None else repo)
    if out is not None:
        atomic.write_text(out, text)
        print(f"{text.splitlines()[2]} -> {out}")
    else:
        print(text, end="")
    return 1 if failed else 0
