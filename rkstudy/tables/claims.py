"""The reference documents' measured claims, each beside ours, with a verdict computed from the row it
cites (host side).

data/reference/claims.csv holds one row per claim: the study it belongs to, the reference figure by
its exact text in data/reference/figures.csv (`<text> @<target>` picks one of several with that text,
`<study>/<text>` a figure filed under another study), where ours is read (a table the study's notebook
writes, a column, a row selector and a summary), what the comparison is (`same: ...` when ours is the
same quantity under the same conditions, `differs: <what>` when not), and the rule the verdict comes
from. No verdict is typed: each is worked out from this run's row by the rule, so a measurement that
moves changes its verdict by itself.

- `tolerance`: ours lies in the band [low, high] (either end may be open; a text `low` with no `high`
  is the word ours must begin with). In the band a `same` comparison is `reproduced` and a `differs`
  comparison `consistent` (its `cause` says what the agreement means); outside it the verdict is
  `differs` with the gap, and `cause` (for a `same` comparison: why they differ) or an open question;
- `differs`: a different quantity with no band to hold it to: `differs` with ours and theirs beside
  each other and `cause`;
- `board only`: theirs was measured on a board (the figure says so), and no host measurement decides
  it; a table, when named, shows ours beside it;
- `elsewhere`: another study measures it; `table` names `<study>/<claim>`, the claim of that study
  on the same figure of the same reference document;
- `not measured`: no table of ours holds it; `cause` says why. A claim naming a table cannot be
  `not measured`: when the row exists it is measured, and a row without a value reads `not measured
  here: no value in ...` by itself.

`cause` explains; it never quotes a measured number. A value it needs is rendered from this run's
rows, `{table[column=value; ...].column}`, and a pointer to another study's claim is `{claim:<study>/<id>}`.
Which toolkit made the rows a cause reasons about is rendered too, `{toolkits:table[column=value; ...]}`
("rknn-toolkit2 2.5.0 only", from the rows' own stamps): a cause never says a version is untested, it
says which versions this run built the engine with, so it changes by itself once another is tried.
A number typed in a cause that is none of the claim's own conditions (its row selector, its figure,
its comparison) fails the spec check (`check_spec`), as does any rule the row breaks.

The table is evaluated from the rows the notebook recorded in this run, never from committed
files, so a claim cannot outlive the table it reads: a spec row naming a table, a column or a
row the study did not write fails with one line naming the claim. `quick=skipped` marks a claim
whose table or rows the notebook leaves out in quick mode; that claim reads `not measured here:
quick mode` there instead of failing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence

from ..errors import InputError
from ..paths import REFERENCE, REPO
from . import results

CLAIMS = REFERENCE / "claims.csv"
RULES = ("tolerance", "differs", "board only", "elsewhere", "not measured")
SUMMARIES = ("value", "min", "max", "range", "count")
COLUMNS = ("study", "claim", "figure", "table", "column", "rows", "summary", "unit", "comparison", "rule",
           "low", "high", "cause", "quick")
KINDS = ("reproduced", "consistent", "differs", "board only", "measured elsewhere", "not measured")
OPEN_QUESTION = "an open question: no table here explains the gap"
# {table[column=value; ...].column}: a value of this run's rows; {claim:study/id}: another claim
CELL = re.compile(r"\{(\w+)\[([^\]]*)\]\.([^{}\s]+)\}")
POINTER = re.compile(r"\{claim:([\w]+)/([\w.=+-]+)\}")
# {toolkits:table[column=value; ...]}: the toolkit versions that made the selected rows of this run
TOOLKITS = re.compile(r"\{toolkits:(\w+)\[([^\]]*)\]\}")
# a number standing alone in prose: not glued to a word (rk3588, fp16, 2x24), not part of a version
# (2.3.2), an assignment (W=136), a power (2^32), a sum (16+64) or a compound (13-bit, 47-frame)
NUMBER = re.compile(r"(?<![\w.=^/+\-])[+\-−]?\d[\d,]*(?:\.\d+)?(?![\w.^+]|-[A-Za-z])")


class ClaimError(InputError):
    """A claims.csv row that cannot be evaluated against what the notebook wrote."""


def _fix() -> str:
    return f"fix {CLAIMS.relative_to(REPO) if CLAIMS.is_relative_to(REPO) else CLAIMS}"


def _all(path=None) -> list[dict]:
    path = path or CLAIMS
    rows = results.read_table(path)
    if rows and tuple(rows[0]) != COLUMNS:
        raise ClaimError(f"{path}: columns {list(rows[0])}, expected {list(COLUMNS)}")
    return rows


def spec(study: str, path=None) -> list[dict]:
    """The claims.csv rows of `study`, in file order."""
    return [r for r in _all(path) if r["study"] == study]


def numbers_in(text: str) -> list[str]:
    """The numbers standing alone in `text` (commas and a leading sign dropped): what a reader takes for
    a quantity, as opposed to the digits of a name (rk3588, fp16, 2.3.2, W=136, 13-bit)."""
    return [m.group(0).replace(",", "").replace("−", "-").lstrip("+-") for m in NUMBER.finditer(text)]


def typed_numbers(text: str, conditions: Iterable[str] = ()) -> list[str]:
    """The numbers in `text` that none of `conditions` (the texts that define what is measured: a row
    selector, a figure, a comparison) contains: a number typed where it should have been rendered."""
    allowed = {n.replace(",", "") for c in conditions for n in re.findall(r"\d[\d,]*(?:\.\d+)?", str(c))}
    return [n for n in numbers_in(text) if n not in allowed]


def _figure(study: str, text: str, claim: str) -> dict:
    """The reference figure named by its exact text; `<text> @<target>` picks one of several
    figures with the same text (the same count for two SoCs), `<study>/<text>` one filed under
    another study (the documents' word on vocoders in general, cited by `port`)."""
    figure, _, target = text.rpartition(" @") if " @" in text else (text, "", "")
    owner, sep, rest = figure.partition("/")
    studies = {r["study"] for r in results.read_table(results.REFERENCE_FIGURES)}
    if sep and owner in studies:
        study, figure = owner, rest
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


def _picked(claim: dict, name: str, rows: Sequence[Mapping], selector_text: str, column: str | None) -> list:
    cid = claim["claim"]
    selector = _selector(selector_text, cid)
    for key in [k for k, _ in selector] + ([column] if column else []):
        if rows and key not in rows[0]:
            raise ClaimError(f"claim {cid}: table {name!r} has no column {key!r}; {_fix()}")
    return [r for r in rows if all(_matches(r[k], v) for k, v in selector)]


def _ours(claim: dict, tables: Mapping[str, Sequence[Mapping]], quick: bool):
    """(numbers to judge, what to show, the rows read) for one claim, or None when quick mode skipped it."""
    cid, name, column = claim["claim"], claim["table"], claim["column"]
    skippable = quick and claim["quick"] == "skipped"
    if name not in tables:
        if skippable:
            return None
        raise ClaimError(f"claim {cid}: table {name!r} was not written by this notebook "
                         f"(it wrote {', '.join(sorted(tables)) or 'none'}); {_fix()}")
    picked = _picked(claim, name, tables[name], claim["rows"], column if claim["summary"] != "count" else None)
    if claim["summary"] == "count":
        return [float(len(picked))], str(len(picked)), picked
    if not picked:
        if skippable:
            return None
        raise ClaimError(f"claim {cid}: no row of {name!r} matches {claim['rows']!r}; {_fix()}")
    summary = claim["summary"]
    values = [_number(r[column]) for r in picked]
    if any(v is None or v == "" for v in values):
        status = next((r.get("status") for r in picked if r.get("status")), "")
        return [], f"no value in {name}.{column}" + (f" ({status})" if status else ""), picked
    if summary == "value":
        if len(values) != 1:
            raise ClaimError(f"claim {cid}: {len(values)} rows of {name!r} match {claim['rows']!r}, "
                             "`value` needs exactly one; narrow the selector or summarise with min/max/range")
        return values, _show(values[0]), picked
    numbers = [v for v in values if isinstance(v, float) and not math.isnan(v)]
    if len(numbers) != len(values):
        raise ClaimError(f"claim {cid}: {name}.{column} is not numeric in every selected row; "
                         f"`{summary}` needs numbers")
    if summary == "min":
        return [min(numbers)], _show(min(numbers)), picked
    if summary == "max":
        return [max(numbers)], _show(max(numbers)), picked
    lo, hi = min(numbers), max(numbers)
    return [lo, hi], f"{_show(lo)} to {_show(hi)}", picked


def _bound(text: str, default: float, claim: str) -> float:
    if text.strip() == "":
        return default
    try:
        return float(text)
    except ValueError:
        raise ClaimError(f"claim {claim}: bound {text!r} is not a number") from None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def render(text: str, tables: Mapping[str, Sequence[Mapping]], claim: dict, quick: bool = False) -> str:
    """`text` with each `{table[selector].column}` filled from this run's rows (one row must match) and
    each `{claim:study/id}` named; in quick mode a cell the notebook left out reads `…`."""
    def cell(m):
        name, selector, column = m.groups()
        if name not in tables:
            if quick and claim["quick"] == "skipped":
                return "…"
            raise ClaimError(f"claim {claim['claim']}: its cause cites table {name!r}, which this notebook "
                             f"did not write; {_fix()}")
        picked = _picked(claim, name, tables[name], selector, column)
        if len(picked) != 1:
            if quick and claim["quick"] == "skipped" and not picked:
                return "…"
            raise ClaimError(f"claim {claim['claim']}: its cause cites {name}[{selector}], which selects "
                             f"{len(picked)} rows, not one; {_fix()}")
        return _show(_number(picked[0][column]))

    def toolkits(m):
        name, selector = m.groups()
        if name not in tables:
            if quick and claim["quick"] == "skipped":
                return "…"
            raise ClaimError(f"claim {claim['claim']}: its cause cites table {name!r}, which this notebook "
                             f"did not write; {_fix()}")
        picked = _picked(claim, name, tables[name], selector, "toolkit_version")
        if not picked:
            if quick and claim["quick"] == "skipped":
                return "…"
            raise ClaimError(f"claim {claim['claim']}: its cause cites {name}[{selector}], which selects no row; "
                             f"{_fix()}")
        return versions([r["toolkit_version"] for r in picked])

    text = TOOLKITS.sub(toolkits, CELL.sub(cell, text))
    return POINTER.sub(lambda m: f"{m.group(1)} claim {m.group(2)}", text)


def versions(stamps: Sequence[str]) -> str:
    """The toolkit versions in rows' stamps as a cause reads them: "rknn-toolkit2 2.5.0 only", or
    "rknn-toolkit2 2.3.2 and 2.5.0"."""
    def version(stamp: str) -> tuple:
        return tuple(int(x) if x.isdigit() else -1 for x in stamp.rpartition(" ")[2].split("."))

    found = sorted({str(s) for s in stamps}, key=lambda v: (v.rpartition(" ")[0], version(v)))
    if len(found) == 1:
        return f"{found[0]} only"
    names = {v.rpartition(" ")[0] for v in found}
    if len(names) == 1:
        tails = [v.rpartition(" ")[2] for v in found]
        return f"{names.pop()} {', '.join(tails[:-1])} and {tails[-1]}"
    return ", ".join(found[:-1]) + f" and {found[-1]}"


def _band(claim: dict):
    """(test, shown) for a tolerance claim: numbers within [low, high], or a text ours must read."""
    low, high, cid = claim["low"].strip(), claim["high"].strip(), claim["claim"]
    if low and not _is_number(low) and not high:
        word = low.lower()
        return (lambda xs: all(isinstance(x, str) and x.lower().startswith(word) for x in xs)), f"`{low}...`", None
    lo, hi = _bound(low, -math.inf, cid), _bound(high, math.inf, cid)
    return (lambda xs: all(isinstance(x, float) and lo <= x <= hi for x in xs)), f"[{_show(lo)}, {_show(hi)}]", (lo, hi)


def _verdict(claim: dict, numbers, shown: str, theirs: str, cause: str) -> str:
    rule, cid = claim["rule"], claim["claim"]
    same = claim["comparison"].startswith("same")
    if rule == "board only":
        return "board only" + (f": {cause}" if cause else "")
    if rule == "not measured":
        return f"not measured here: {cause}"
    if rule == "differs":
        return f"differs: ours {shown}, theirs {theirs}: {cause}"
    inside, band, bounds = _band(claim)
    if inside(numbers):
        return "reproduced" if same else f"consistent: ours {shown}, theirs {theirs}: {cause}"
    if bounds is None:
        return f"differs: ours {shown}, theirs {theirs}, not {band}: {cause if same and cause else OPEN_QUESTION}"
    outside = [x for x in numbers if isinstance(x, float)]
    if len(outside) != len(numbers):
        raise ClaimError(f"claim {cid}: ours ({shown}) is not a number; a numeric band needs one")
    low, high = bounds
    gap = max(low - min(outside), max(outside) - high)
    side = "below" if min(outside) < low else "above"
    where = f"{_show(gap)} {side} the band {band}"
    if same:
        return f"differs: ours {shown}, theirs {theirs}, {where}: {cause or OPEN_QUESTION}"
    # a different quantity outside the band its reading needs: that reading no longer holds
    return f"differs: ours {shown}, theirs {theirs}, {where}, the band in which {cause!r} holds: {OPEN_QUESTION}"


def check_claim(claim: dict, path=None, spec_rows: Sequence[Mapping] | None = None) -> dict:
    """The rules one claims.csv row must keep whatever the tables say (raises ClaimError naming the
    claim); returns its reference figure."""
    cid, rule, table = claim["claim"], claim["rule"], claim["table"]
    if rule not in RULES:
        raise ClaimError(f"claim {cid}: rule {rule!r} is not one of {', '.join(RULES)}")
    if claim["quick"] not in ("same", "skipped"):
        raise ClaimError(f"claim {cid}: quick {claim['quick']!r} must be `same` or `skipped`")
    if not claim["comparison"].startswith(("same", "differs: ")):
        raise ClaimError(f"claim {cid}: comparison {claim['comparison']!r} must say `same...` or `differs: <what>`")
    same = claim["comparison"].startswith("same")
    cause = claim["cause"].strip()
    banded = bool(claim["low"].strip() or claim["high"].strip())
    if rule in ("differs", "not measured") and not cause:
        raise ClaimError(f"claim {cid}: a `{rule}` verdict needs its cause")
    if rule in ("differs", "tolerance") and not table:
        raise ClaimError(f"claim {cid}: a `{rule}` verdict needs a table of ours to read; "
                         "without one the claim is `board only`, `elsewhere` or `not measured`")
    if rule == "tolerance" and not banded:
        raise ClaimError(f"claim {cid}: a `tolerance` verdict needs its band (low, high or both)")
    if rule == "tolerance" and not same and not cause:
        raise ClaimError(f"claim {cid}: a `tolerance` claim on a different quantity needs the cause that says "
                         "what ours in the band means for theirs")
    if rule == "differs" and same:
        raise ClaimError(f"claim {cid}: the same quantity is held to a band (`tolerance`), never declared `differs`")
    if rule != "tolerance" and banded:
        raise ClaimError(f"claim {cid}: a band (low/high) is read only by a `tolerance` rule, not `{rule}`")
    if rule == "not measured" and table:
        raise ClaimError(f"claim {cid}: `not measured` names table {table!r}: a claim with a table of ours is "
                         "measured (a row without a value says so by itself); give it its rule")
    ref = _figure(claim["study"], claim["figure"], cid)
    if rule == "board only" and ref["where"] != "board":
        raise ClaimError(f"claim {cid}: `board only`, but theirs was measured on {ref['where']!r}, not a board; "
                         "a host measurement can decide it")
    known = [*(spec_rows if spec_rows is not None else _all(path)), *(_all() if path and path != CLAIMS else [])]
    if rule == "elsewhere":
        study, sep, other = table.partition("/")
        rows = known
        target = next((r for r in rows if r["study"] == study and r["claim"] == other), None) if sep else None
        if target is None:
            raise ClaimError(f"claim {cid}: `elsewhere` needs table=<study>/<claim> naming a claim of another "
                             f"study; {table!r} names none")
        if target["rule"] == "elsewhere":
            raise ClaimError(f"claim {cid}: {table} is itself `elsewhere`; point at the claim that measures it")
        if _figure(target["study"], target["figure"], other)["document"] != ref["document"]:
            raise ClaimError(f"claim {cid}: {table} compares a figure of another reference document")
    for m in POINTER.finditer(cause):
        if not any(r["study"] == m.group(1) and r["claim"] == m.group(2) for r in known):
            raise ClaimError(f"claim {cid}: its cause points at {m.group(1)}/{m.group(2)}, which is no claim")
    bare = TOOLKITS.sub("", POINTER.sub("", CELL.sub("", cause)))
    cited = [m.group(2) for m in CELL.finditer(cause)] + [m.group(2) for m in TOOLKITS.finditer(cause)]
    typed = typed_numbers(bare, [claim["rows"], claim["figure"], claim["comparison"], *cited])
    if typed:
        raise ClaimError(f"claim {cid}: its cause types {', '.join(typed)}; render a measured value from its row "
                         "({table[column=value].column}) or name the condition in the comparison")
    return ref


def check_spec(path=None) -> list[dict]:
    """Every row of claims.csv against the rules that hold whatever the tables say; the rows."""
    rows, seen = _all(path), set()
    for claim in rows:
        key = (claim["study"], claim["claim"])
        if key in seen:
            raise ClaimError(f"claim {claim['claim']}: listed twice for {claim['study']} in {path or CLAIMS}")
        seen.add(key)
        check_claim(claim, path, rows)
    return rows


def evaluate(study: str, tables: Mapping[str, Sequence[Mapping]], quick: bool, path=None) -> list[dict]:
    """One row per claim of `study`: theirs, ours (read from `tables`, this run's rows by name),
    the comparison and the verdict, stamped where the rows it read were measured."""
    every = _all(path)
    out, seen = [], set()
    for claim in (r for r in every if r["study"] == study):
        cid = claim["claim"]
        if cid in seen:
            raise ClaimError(f"claim {cid}: listed twice for {study} in {path or CLAIMS}")
        seen.add(cid)
        ref = check_claim(claim, path, every)
        theirs = f"{ref['value']} {ref['unit']}".strip()
        unit = claim["unit"] or ref["unit"]
        cause = render(claim["cause"].strip(), tables, claim, quick)
        ours, source, origin = "", "", {"where": "host", "target": "none"}
        if claim["rule"] == "elsewhere":
            other_study, _, other = claim["table"].partition("/")
            verdict = f"measured in {other_study}: claim {other}" + (f"; {cause}" if cause else "")
        elif claim["table"]:
            if claim["summary"] not in SUMMARIES:
                raise ClaimError(f"claim {cid}: summary {claim['summary']!r} is not one of {', '.join(SUMMARIES)}")
            got = _ours(claim, tables, quick)
            where = f"[{claim['rows']}]" if claim["rows"] else ""
            column = "rows" if claim["summary"] == "count" else claim["column"]
            source = f"{claim['table']}.{column}{where} {claim['summary']}"
            if got is None:
                verdict = "not measured here: quick mode"
            else:
                numbers, shown, picked = got
                origin = _origin(picked)
                if not numbers:
                    verdict = f"not measured here: {shown}"
                else:
                    numeric = all(isinstance(x, float) for x in numbers)
                    ours = f"{shown} {unit}".strip() if numeric else shown
                    verdict = _verdict(claim, numbers, ours, theirs, cause)
        else:
            verdict = _verdict(claim, [], "", theirs, cause)
        out.append({"claim": cid, "figure": claim["figure"], "theirs": theirs,
                    "theirs_where": f"{ref['where']}, {ref['target']}", "ours": ours, "ours_from": source,
                    "comparison": claim["comparison"], "verdict": verdict, **origin})
    return out


def _origin(rows: Sequence[Mapping]) -> dict:
    """Where the rows a claim read were measured: their own `where`/`target` when they agree, else host."""
    wheres = {r.get("where") for r in rows}
    targets = {r.get("target") or "none" for r in rows}
    if len(wheres) != 1 or len(targets) != 1 or None in wheres:
        return {"where": "host", "target": "none"}
    return {"where": wheres.pop(), "target": targets.pop()}


def kind(verdict: str) -> str:
    """Which of KINDS a verdict is."""
    found = next((k for k in KINDS if verdict.startswith(k if k != "measured elsewhere" else "measured in ")), None)
    if found is None:
        raise ValueError(f"verdict {verdict!r} is none of {', '.join(KINDS)}")
    return found


def counts(verdicts: Sequence[str]) -> dict[str, int]:
    """How many verdicts of each kind: reproduced / consistent / differs / board only / measured
    elsewhere / not measured."""
    tally = dict.fromkeys(KINDS, 0)
    for v in verdicts:
        tally[kind(v)] += 1
    return tally
