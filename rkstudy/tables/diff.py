"""`rkstudy results diff A B`: what moved between two result trees (the committed tables and a fresh
run of them), column by column, with a tolerance by kind of quantity.

Each column gets one rule, from its name first and its values second, and the report says which:

* exact: counts, node numbers, bytes and REGTASK lines (regtask*, *nodes*, *bytes*, count(s),
  nonfinite, lines): the compiler and the graph are deterministic, so any change is a change;
* dB: *_db, within 0.5 dB (simulator scores move in the last digits between toolkit runs);
* time: *_s, *_ms, seconds, minutes, rtf and their ratios: reported, never failed;
* machine: peak RSS, bandwidth and load figures (*peak*, *rss*, *gb_per_s*, *load*): depend on the
  machine and what else ran, so reported, never failed;
* otherwise exact for strings and integers, and relative 1e-6 for floats.

A `value` or `measured` cell takes the rule of its row's `unit` (dB, s, ms, ms/window ...); where the
unit says nothing, a row whose label (a headline's name, a goal, a quantity) names a machine figure or a
time ("converter peak", "DRAM read", "CPU RTF", "wall") has its float cells reported like that column
would be: a headline is the same figure as the column it was read from. A reference claim's `ours` takes
the rule of the column it was read from (`ours_from`), and its `verdict` is compared by kind (reproduced,
differs, ...), the text that quotes ours reported.
Rows are matched by their key columns: target and where, then the fewest leading columns not named
as counts, bytes, dB, times or machine figures (a dB level the table leads with is a key) that tell
the rows apart in both trees (the order of appearance too when none does).
The stamp columns are ignored. Exit 1 when a cell under an exact, dB or relative rule moved past its
tolerance; tables, rows and columns only on one side are listed.

Standard library only.
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
from .results import STAMP, read_table

DB_TOLERANCE = 0.5
RELATIVE_TOLERANCE = 1e-6
EXACT_NAME = re.compile(r"^regtask|nodes|bytes|(^|_)(count|counts|nonfinite|lines)($|_)")
TIME_WORDS = {"s", "ms", "seconds", "minutes", "rtf"}
MACHINE_NAME = re.compile(r"peak|rss|gb_per|load")
REPORTED = ("time", "machine")
# a row's label: what a headline, a goal or a quantity row says it holds
LABEL_COLUMNS = ("headline", "goal", "quantity", "label")
MACHINE_WORDS = {"peak", "rss", "bandwidth", "dram", "load", "gb/s", "mb/s"}
TIME_LABEL_WORDS = {"rtf", "wall", "seconds", "minutes", "time", "times"}
UNIT_FIRST = "; in a row whose unit is dB or a time, that rule"


@dataclass(frozen=True)
class Tolerance:
    kind: str   # exact, dB, time, machine, relative
    why: str    # what gave it: the name, or the values

    def describe(self) -> str:
        rule = {"dB": f"dB, within {DB_TOLERANCE}", "relative": f"relative {RELATIVE_TOLERANCE:g}",
                "time": "time, reported", "machine": "machine, reported", "exact": "exact"}[self.kind]
        return f"{rule} (by {self.why})"


def _number(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def _is_int(text: str) -> bool:
    return re.fullmatch(r"[-+]?\d+", text.strip()) is not None


def name_rule(column: str) -> Tolerance | None:
    """The rule a column's name gives, or None when the name says nothing."""
    name = column.lower()
    words = set(column.split("_"))  # case kept: S is a sequence length, s a second
    if name.endswith("_db") or name == "db":
        return Tolerance("dB", "name")
    if words & TIME_WORDS or "ratio_vs" in name:
        return Tolerance("time", "name")
    if MACHINE_NAME.search(name):
        return Tolerance("machine", "name")
    if EXACT_NAME.search(name):
        return Tolerance("exact", "name")
    return None


def column_rule(column: str, values: list[str]) -> Tolerance:
    """The name's rule for a numeric column (peak_from, a text, takes the values' rule), else the values'."""
    filled = [v for v in values if v != ""]
    by_name = name_rule(column)
    if by_name is not None and all(_number(v) is not None for v in filled):
        return by_name
    if filled and all(_number(v) is not None for v in filled) and not all(_is_int(v) for v in filled):
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
    """The rule a row's label gives its float cells: a machine figure or a time named in words."""
    words = set(re.findall(r"[a-z0-9/]+", text.lower()))
    if words & MACHINE_WORDS:
        return Tolerance("machine", "row label")
    if words & TIME_LABEL_WORDS:
        return Tolerance("time", "row label")
    return None


def source_rule(ours_from: str) -> Tolerance | None:
    """The rule of the column a reference claim read ours from (`table.column[rows] summary`)."""
    column = ours_from.split("[")[0].split(" ")[0].rpartition(".")[2]
    return name_rule(column) if column else None


def _numbers(text: str) -> list[float]:
    return [float(x.replace(",", "")) for x in re.findall(r"[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?|inf", text)]


def _claim_kind(verdict: str) -> str:
    from .claims import kind

    try:
        return kind(verdict)
    except ValueError:
        return verdict


def moved(rule: Tolerance, a: str, b: str) -> tuple[bool, float | None]:
    """(past tolerance, numeric change B - A or None) for one cell."""
    if a == b:
        return False, 0.0 if _number(a) is not None else None
    x, y = _number(a), _number(b)
    delta = None
    if x is not None and y is not None:
        delta = y - x if math.isfinite(x) and math.isfinite(y) else (0.0 if x == y else math.inf)
    if rule.kind in REPORTED:
        return False, delta
    if x is None or y is None:
        return True, None
    if x == y:
        return False, 0.0
    if rule.kind == "dB":
        return not (abs(delta) <= DB_TOLERANCE), delta
    if rule.kind == "relative":
        return not (abs(y - x) <= RELATIVE_TOLERANCE * max(abs(x), abs(y))), delta
    return True, delta


@dataclass
class TableDiff:
    name: str
    keys: list[str] = field(default_factory=list)
    by_order: bool = False
    rules: dict[str, Tolerance] = field(default_factory=dict)
    columns_only: dict[str, list[str]] = field(default_factory=dict)
    rows_only: dict[str, list[str]] = field(default_factory=dict)
    failures: list[tuple[str, str, str, str, str, float | None]] = field(default_factory=list)
    # (column, the rule its cells got) -> [(B - A, A, B)] for cells that changed within their tolerance
    changes: dict[tuple[str, Tolerance], list[tuple[float | None, str, str]]] = field(
        default_factory=lambda: defaultdict(list))

    @property
    def failed(self) -> bool:
        return bool(self.failures)


def _tables(root: Path) -> dict[str, list[dict]]:
    """{"study/table": rows} for every CSV under `root`, and each study's headlines as a table."""
    out = {}
    for path in sorted(Path(root).glob("*/*.csv")):
        out[f"{path.parent.name}/{path.stem}"] = read_table(path)
    for path in sorted(Path(root).glob("*/headlines.json")):
        h = json.loads(path.read_text(encoding="utf-8"))
        out[f"{path.parent.name}/headlines.json"] = [
            {"headline": name, "value": str(v["value"]), "unit": v.get("unit", ""),
             "board_risk": v.get("board_risk", "")}
            for name, v in h.get("headlines", {}).items()]
    return out


def _keys(columns: list[str], rules: dict[str, Tolerance], a: list[dict], b: list[dict]) -> tuple[list[str], bool]:
    # the SoC and the runner are part of what a row is (a sweep on two targets has two rows per width)
    candidates = [c for c in ("target", "where") if all(c in r for r in a + b)]
    # then the columns in table order (tables lead with what a row is), skipping the ones named as
    # measurements: counts, bytes, dB, times and machine figures; a dB level the table leads with is
    # what it sweeps (snr_target_db), so a key
    candidates += [c for i, c in enumerate(columns) if rules[c].why != "name" or (rules[c].kind == "dB" and i == 0)]
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


def diff_table(name: str, a: list[dict], b: list[dict]) -> TableDiff:
    d = TableDiff(name)
    cols_a = [c for c in (a[0] if a else {}) if c not in STAMP]
    cols_b = [c for c in (b[0] if b else {}) if c not in STAMP]
    common = [c for c in cols_a if c in cols_b]
    d.columns_only = {side: cols for side, cols in (("A", [c for c in cols_a if c not in cols_b]),
                                                     ("B", [c for c in cols_b if c not in cols_a])) if cols}
    d.rules = {c: column_rule(c, [r[c] for r in a + b]) for c in common}
    d.keys, d.by_order = _keys(common, d.rules, a, b)
    ka, kb = _keyed(a, d.keys, d.by_order), _keyed(b, d.keys, d.by_order)
    d.rows_only = {side: [_label(d.keys, k) for k in keys] for side, keys in
                   (("A", [k for k in ka if k not in kb]), ("B", [k for k in kb if k not in ka])) if keys}
    for key in (k for k in ka if k in kb):
        ra, rb = ka[key], kb[key]
        label = next((ra[c] for c in LABEL_COLUMNS if c in ra), "")
        by_label = label_rule(label) if label else None
        for c in common:
            if c in d.keys:
                continue
            rule = d.rules[c]
            if c in ("value", "measured") and "unit" in ra:
                rule = unit_rule(ra["unit"]) or rule
            if by_label is not None and rule.kind == "relative":
                rule = by_label
            if "ours_from" in ra and c in ("ours", "verdict"):
                past, delta, rule = _claim_cell(c, ra, rb)
                if past:
                    d.failures.append((_label(d.keys, key), c, rule.describe(), ra[c], rb[c], delta))
                elif ra[c] != rb[c]:
                    d.changes[(c, rule)].append((delta, ra[c], rb[c]))
                continue
            past, delta = moved(rule, ra[c], rb[c])
            if past:
                d.failures.append((_label(d.keys, key), c, rule.describe(), ra[c], rb[c], delta))
            elif ra[c] != rb[c]:
                d.changes[(c, rule)].append((delta, ra[c], rb[c]))
    return d


def _claim_cell(column: str, ra: dict, rb: dict) -> tuple[bool, float | None, Tolerance]:
    """A reference claim's `ours` by the rule of the column it was read from (its numbers compared under
    that rule), its `verdict` by kind: the verdict's text quotes ours, so it moves with it."""
    source = source_rule(ra.get("ours_from", "")) if ra.get("ours_from") == rb.get("ours_from") else None
    if column == "verdict":
        if _claim_kind(ra[column]) != _claim_kind(rb[column]):
            return True, None, Tolerance("exact", "verdict kind")
        return False, None, Tolerance("time" if source and source.kind in REPORTED else "exact", "verdict kind")
    if source is None or ra[column] == rb[column]:
        return ra[column] != rb[column], None, Tolerance("exact", "string values")
    xa, xb = _numbers(ra[column]), _numbers(rb[column])
    if source.kind in REPORTED or len(xa) != len(xb) or not xa:
        return (source.kind not in REPORTED), None, Tolerance(source.kind if source.kind in REPORTED else "exact",
                                                             "ours_from")
    rule = Tolerance(source.kind, "ours_from")
    moves = [moved(rule, repr(x), repr(y)) for x, y in zip(xa, xb)]
    return any(past for past, _ in moves), moves[0][1], rule


def diff_trees(a: Path, b: Path) -> tuple[list[TableDiff], list[str], list[str]]:
    ta, tb = _tables(a), _tables(b)
    diffs = [diff_table(name, ta[name], tb[name]) for name in ta if name in tb]
    return diffs, [n for n in ta if n not in tb], [n for n in tb if n not in ta]


def _fmt_delta(delta: float | None, a: str) -> str:
    if delta is None:
        return ""
    x = _number(a)
    rel = f" ({delta / x:+.2%})" if x and math.isfinite(delta) else ""
    return f"{delta:+.6g}{rel}"


def _change_summary(column: str, rule: Tolerance, changes: list[tuple[float | None, str, str]]) -> str:
    numeric = [d for d, _, _ in changes if d is not None and math.isfinite(d)]
    text = f"`{column}` ({rule.describe()}): {len(changes)} row{'s' * (len(changes) > 1)} changed"
    if numeric:
        text += f", change {min(numeric):+.4g} to {max(numeric):+.4g}"
    if rule.kind in REPORTED:
        ratios = [_number(b) / _number(a) for _, a, b in changes
                  if _number(a) and _number(b) is not None and math.isfinite(_number(a) or math.nan)]
        if ratios:
            text += f", B/A median {statistics.median(ratios):.3g}"
    return text


def report(a: Path, b: Path, labels: tuple[str, str] | None = None) -> tuple[str, bool]:
    """The Markdown report (the trees named by `labels`, default their paths), and whether anything
    moved past its tolerance."""
    diffs, only_a, only_b = diff_trees(a, b)
    failed = [d for d in diffs if d.failed]
    n_fail = sum(len(d.failures) for d in diffs)
    name_a, name_b = labels or (f"`{a}`", f"`{b}`")
    lines = [f"# Results diff: {name_a} (A) against {name_b} (B)", "",
             f"{len(diffs)} tables compared; {n_fail} cells in {len(failed)} tables moved past their tolerance"
             + (" (exit 1)." if n_fail else "."),
             f"Tolerances: counts, nodes, bytes and REGTASK lines exact; dB within {DB_TOLERANCE}; times and "
             f"machine figures (peak RSS, bandwidth, load; a headline or goal naming one) reported, never failed; "
             f"other floats relative {RELATIVE_TOLERANCE:g}; strings and integers exact; a reference claim's ours by "
             f"its source column's rule, its verdict by kind. Stamp columns ignored.", ""]
    if only_a:
        lines += [f"Tables only in A ({len(only_a)}): " + ", ".join(f"`{n}`" for n in only_a), ""]
    if only_b:
        lines += [f"Tables only in B ({len(only_b)}): " + ", ".join(f"`{n}`" for n in only_b), ""]
    for d in sorted(diffs, key=lambda d: (not d.failed, d.name)):
        if not (d.failures or d.changes or d.rows_only or d.columns_only):
            continue
        lines += [f"## `{d.name}`" + (" — moved past tolerance" if d.failed else ""), "",
                  "Rows matched by " + (", ".join(f"`{k}`" for k in d.keys) or "nothing (one row)")
                  + (" and their order" if d.by_order else "") + ".", ""]
        for side, cols in d.columns_only.items():
            lines.append(f"- columns only in {side}: " + ", ".join(f"`{c}`" for c in cols))
        for side, rows in d.rows_only.items():
            shown = "; ".join(rows[:10]) + (f"; and {len(rows) - 10} more" if len(rows) > 10 else "")
            lines.append(f"- rows only in {side} ({len(rows)}): {shown}")
        for (column, rule), changes in d.changes.items():
            lines.append("- " + _change_summary(column, rule, changes))
        if d.failures:
            lines += ["", "| row | column | rule | A | B | change |", "|---|---|---|---|---|---|"]
            lines += [f"| {key} | `{c}` | {rule} | {va} | {vb} | {_fmt_delta(delta, va)} |"
                      for key, c, rule, va, vb, delta in d.failures]
        lines.append("")
    rules = ["", "## Rules by column", "", "| table | column | rule |", "|---|---|---|"]
    for d in diffs:
        for c, r in d.rules.items():
            unit_first = UNIT_FIRST if c in ("value", "measured") and "unit" in d.rules else ""
            rules.append(f"| `{d.name}` | `{c}` | {r.describe()}{unit_first}{'; a key' if c in d.keys else ''} |")
    return "\n".join(lines + rules) + "\n", bool(n_fail)


def main(a: Path, b: Path, out: Path | None = None) -> int:
    from ..errors import InputError

    for root in (a, b):
        if not Path(root).is_dir():
            raise InputError(f"{root} is not a result tree (a folder of <study>/<table>.csv); give two folders")
    text, failed = report(Path(a), Path(b))
    if out is not None:
        atomic.write_text(out, text)
        print(f"{text.splitlines()[2]} -> {out}")
    else:
        print(text, end="")
    return 1 if failed else 0
