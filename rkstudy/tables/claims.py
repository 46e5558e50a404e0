"""The reference documents' measured claims, each beside ours, with a verdict (host side).

data/reference/claims.csv holds one row per claim: the study it belongs to, the reference figure
by its exact text in data/reference/figures.csv, where ours is read (a table the study's notebook
writes, a column, a row selector and a summary), what the comparison is, and the verdict rule:

- `tolerance`: `reproduced` when ours lies in [low, high], else `differs` with the gap and `cause`;
- `differs`: the pair is known not to match or not to be the same quantity; `cause` says why;
- `board only`: the claim needs a board (ours, when a table is named, is a different comparison);
- `not measured`: no table of ours holds it; `cause` says why.

The table is evaluated from the rows the notebook recorded in this run, never from committed
files, so a claim cannot outlive the table it reads: a spec row naming a table, a column or a
row the study did not write fails with one line naming the claim. `quick=skipped` marks a claim
whose table or rows the notebook leaves out in quick mode; that claim reads `not measured here:
quick mode` there instead of failing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from ..errors import InputError
from ..paths import REFERENCE, REPO
from . import results

CLAIMS = REFERENCE / "claims.csv"
RULES = ("tolerance", "differs", "board only", "not measured")
SUMMARIES = ("value", "min", "max", "range", "count")
COLUMNS = ("study", "claim", "figure", "table", "column", "rows", "summary", "unit", "comparison", "rule",
           "low", "high", "cause", "quick")
OPEN_QUESTION = "an open question: no table here explains the gap"


class ClaimError(InputError):
    """A claims.csv row that cannot be evaluated against what the notebook wrote."""


def _fix() -> str:
    return f"fix {CLAIMS.relative_to(REPO) if CLAIMS.is_relative_to(REPO) else CLAIMS}"


def spec(study: str, path=None) -> list[dict]:
    """The claims.csv rows of `study`, in file order."""
    path = path or CLAIMS
    rows = results.read_table(path)
    if rows and tuple(rows[0]) != COLUMNS:
        raise ClaimError(f"{path}: columns {list(rows[0])}, expected {list(COLUMNS)}")
    return [r for r in rows if r["study"] == study]


def _figure(study: str, text: str, claim: str) -> dict:
    """The reference figure named by its exact text; `<text> @<target>` picks one of several
    figures with the same text (the same count for two SoCs)."""
    figure, _, target = text.rpartition(" @") if " @" in text else (text, "", "")
    found = [r for r in results.reference(study) if r["figure"] == figure and (not target or r["target"] == target)]
    if len(found) != 1:
        what = "no" if not found else f"{len(found)} (add ' @<target>')"
        raise ClaimError(f"claim {claim}: {what} reference figure {text!r} for {study} in "
                         f"{results.REFERENCE_FIGURES.name}")
    return found[0]


def _selector(text: str, claim: str) -> list[tuple[str, str]]:
    pairs = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        key, sep, value = part.partition("=")
        if not sep:
            raise ClaimError(f"claim {claim}: row selector {part!r} is not column=value")
        pairs.append((key.strip(), value.strip()))
    return pairs


def _matches(value, wanted: str) -> bool:
    if str(value) == wanted or results._fmt(value) == wanted:
        return True
    try:
        return not isinstance(value, str) and float(value) == float(wanted)
    except (TypeError, ValueError):
        return False


def _number(value):
    """A float when the cell is a number ("inf" included), else the cell as it is."""
    if isinstance(value, bool):
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


def _show(value) -> str:
    """A number as a reader writes it: 62,031 lines, 0.307, 1.3e-05; anything else as it is."""
    if isinstance(value, float):
        if math.isinf(value) or math.isnan(value):
            return str(value)
        if value.is_integer() and abs(value) < 1e15:
            return f"{int(value):,}"
        if abs(value) >= 1000:
            return f"{value:,.1f}"
        return f"{value:.4g}"
    return str(value)


def _ours(claim: dict, tables: Mapping[str, Sequence[Mapping]], quick: bool):
    """(numbers to judge, what to show) for one claim, or None when quick mode skipped it."""
    cid, name, column = claim["claim"], claim["table"], claim["column"]
    skippable = quick and claim["quick"] == "skipped"
    if name not in tables:
        if skippable:
            return None
        raise ClaimError(f"claim {cid}: table {name!r} was not written by this notebook "
                         f"(it wrote {', '.join(sorted(tables)) or 'none'}); {_fix()}")
    rows = tables[name]
    selector = _selector(claim["rows"], cid)
    for key in [k for k, _ in selector] + ([column] if claim["summary"] != "count" else []):
        if rows and key not in rows[0]:
            raise ClaimError(f"claim {cid}: table {name!r} has no column {key!r}; {_fix()}")
    picked = [r for r in rows if all(_matches(r[k], v) for k, v in selector)]
    if claim["summary"] == "count":
        return [float(len(picked))], str(len(picked))
    if not picked:
        if skippable:
            return None
        raise ClaimError(f"claim {cid}: no row of {name!r} matches {claim['rows']!r}; {_fix()}")
    summary = claim["summary"]
    values = [_number(r[column]) for r in picked]
    if any(v is None or v == "" for v in values):
        status = next((r.get("status") for r in picked if r.get("status")), "")
        return [], f"no value in {name}.{column}" + (f" ({status})" if status else "")
    if summary == "value":
        if len(values) != 1:
            raise ClaimError(f"claim {cid}: {len(values)} rows of {name!r} match {claim['rows']!r}, "
                             "`value` needs exactly one; narrow the selector or summarise with min/max/range")
        return values, _show(values[0])
    numbers = [v for v in values if isinstance(v, float) and not math.isnan(v)]
    if len(numbers) != len(values):
        raise ClaimError(f"claim {cid}: {name}.{column} is not numeric in every selected row; "
                         f"`{summary}` needs numbers")
    if summary == "min":
        return [min(numbers)], _show(min(numbers))
    if summary == "max":
        return [max(numbers)], _show(max(numbers))
    lo, hi = min(numbers), max(numbers)
    return [lo, hi], f"{_show(lo)} to {_show(hi)}"


def _bound(text: str, default: float, claim: str) -> float:
    if text.strip() == "":
        return default
    try:
        return float(text)
    except ValueError:
        raise ClaimError(f"claim {claim}: bound {text!r} is not a number") from None


def _verdict(claim: dict, numbers, shown: str, theirs: str) -> str:
    rule, cause = claim["rule"], claim["cause"].strip()
    if rule == "board only":
        return "board only" + (f": {cause}" if cause else "")
    if rule == "not measured":
        return f"not measured here: {cause}"
    if rule == "differs":
        return f"differs: ours {shown}, theirs {theirs}: {cause}"
    low = _bound(claim["low"], -math.inf, claim["claim"])
    high = _bound(claim["high"], math.inf, claim["claim"])
    if all(isinstance(x, float) and low <= x <= high for x in numbers):
        return "reproduced"
    outside = [x for x in numbers if isinstance(x, float)]
    if len(outside) != len(numbers):
        raise ClaimError(f"claim {claim['claim']}: ours ({shown}) is not a number; a tolerance needs one")
    gap = max(low - min(outside), max(outside) - high)
    side = "below" if min(outside) < low else "above"
    band = f"[{_show(low)}, {_show(high)}]"
    return f"differs: ours {shown}, theirs {theirs}, {_show(gap)} {side} the band {band}: {cause or OPEN_QUESTION}"


def evaluate(study: str, tables: Mapping[str, Sequence[Mapping]], quick: bool, path=None) -> list[dict]:
    """One row per claim of `study`: theirs, ours (read from `tables`, this run's rows by name),
    the comparison and the verdict."""
    out, seen = [], set()
    for claim in spec(study, path):
        cid = claim["claim"]
        if cid in seen:
            raise ClaimError(f"claim {cid}: listed twice for {study} in {path or CLAIMS}")
        seen.add(cid)
        if claim["rule"] not in RULES:
            raise ClaimError(f"claim {cid}: rule {claim['rule']!r} is not one of {', '.join(RULES)}")
        if claim["quick"] not in ("same", "skipped"):
            raise ClaimError(f"claim {cid}: quick {claim['quick']!r} must be `same` or `skipped`")
        if claim["rule"] in ("differs", "not measured") and not claim["cause"].strip():
            raise ClaimError(f"claim {cid}: a `{claim['rule']}` verdict needs its cause")
        if claim["rule"] in ("differs", "tolerance") and not claim["table"]:
            raise ClaimError(f"claim {cid}: a `{claim['rule']}` verdict needs a table of ours to read; "
                             "without one the claim is `board only` or `not measured`")
        if not claim["comparison"].startswith(("same", "differs: ")):
            raise ClaimError(f"claim {cid}: comparison {claim['comparison']!r} must say `same...` or `differs: <what>`")
        ref = _figure(study, claim["figure"], cid)
        theirs = f"{ref['value']} {ref['unit']}".strip()
        unit = claim["unit"] or ref["unit"]
        ours, source, verdict = "", "", None
        if claim["table"]:
            if claim["summary"] not in SUMMARIES:
                raise ClaimError(f"claim {cid}: summary {claim['summary']!r} is not one of {', '.join(SUMMARIES)}")
            got = _ours(claim, tables, quick)
            where = f"[{claim['rows']}]" if claim["rows"] else ""
            column = "rows" if claim["summary"] == "count" else claim["column"]
            source = f"{claim['table']}.{column}{where} {claim['summary']}"
            if got is None:
                verdict = "not measured here: quick mode"
            elif not got[0]:
                verdict = f"not measured here: {got[1]}"
            else:
                numbers, shown = got
                numeric = all(isinstance(x, float) for x in numbers)
                ours = f"{shown} {unit}".strip() if numeric else shown
                verdict = _verdict(claim, numbers, ours, theirs)
        else:
            verdict = _verdict(claim, [], "", theirs)
        out.append({"claim": cid, "figure": claim["figure"], "theirs": theirs,
                    "theirs_where": f"{ref['where']}, {ref['target']}", "ours": ours, "ours_from": source,
                    "comparison": claim["comparison"], "verdict": verdict})
    return out


def counts(verdicts: Sequence[str]) -> dict[str, int]:
    """How many verdicts of each kind: reproduced / differs / board only / not measured."""
    kinds = {"reproduced": 0, "differs": 0, "board only": 0, "not measured": 0}
    for v in verdicts:
        kind = next((k for k in kinds if v.startswith(k)), None)
        if kind is None:
            raise ValueError(f"verdict {v!r} is none of {', '.join(kinds)}")
        kinds[kind] += 1
    return kinds
