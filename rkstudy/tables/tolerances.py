"""How far a number may move between two runs and still be the same result, per kind of figure: measured by
reruns, never guessed, and kept in tolerances.csv beside this module, each row naming the runs that measured
it. `rkstudy results diff` reads it: a cell that moves by no more than one machine's reruns move it is the
same result; by no more than another machine's (across vector ISAs) on rows made on different machines, a
host change; anything else is the code's doing or unexplained.

`python -m rkstudy.tables.tolerances A B --machines "other machine" --runs "<what A and B are>"` measures two
result trees of the same code and records, per kind, the largest change it found (and how many cells of the
kind it compared), replacing the rows an earlier measurement of the same runs left.

Kinds of figure (`kind`):
* exact: counts, nodes, bytes, REGTASK lines, integers and strings; the compiler and the graph are
  deterministic, so no host moves them;
* simulator dB, fp32 dB, board dB: a dB figure by what computed it (the row's `where`; a headline by its
  name): simulator scores and fp32 exactness move differently with the CPU's kernels;
* simulator difference, fp32 difference, board difference: a largest absolute difference between two
  outputs (*max_diff, *max_abs_err ...), which sits at float rounding in an exactness check and moves by
  whole multiples of it with the kernels;
* PESQ-WB, STOI, DNSMOS: listener scores, each on its own scale;
* float: any other float, by its relative change (a table keeps six significant digits).
Times and machine figures (peak RSS, bandwidth, load) are reported, never held to a tolerance.

Standard library only.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .. import atomic

TOLERANCES = Path(__file__).with_name("tolerances.csv")
KINDS = ("exact", "simulator dB", "fp32 dB", "board dB", "simulator difference", "fp32 difference",
         "board difference", "PESQ-WB", "STOI", "DNSMOS", "float")
MACHINES = ("same machine", "other machine")
COLUMNS = ("kind", "machines", "largest_change", "cells", "moved", "largest_at", "runs")
ROUNDING = 1e-6  # relative: what writing six significant digits can move a float by
RELATIVE = ("float",)  # kinds whose change is relative to the value


@dataclass(frozen=True)
class Measured:
    """The largest change of one kind of figure over the measurements of one kind of machine pair."""

    kind: str
    machines: str
    largest: float
    cells: int
    runs: tuple[str, ...]     # the runs that measured it

    @property
    def relative(self) -> bool:
        return self.kind in RELATIVE

    def describe(self) -> str:
        size = f"{self.largest:.3g}" + (" relative" if self.relative else "")
        return f"{size} on {self.machines} ({self.cells} cells measured)"


def read(path: Path | str | None = None) -> list[dict]:
    path = path or TOLERANCES
    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    if rows and tuple(rows[0]) != COLUMNS:
        raise ValueError(f"{path}: columns {list(rows[0])}, expected {list(COLUMNS)}")
    return rows


def load(path: Path | str | None = None) -> dict[tuple[str, str], Measured]:
    """{(kind, machines): Measured}: the largest change each kind showed over every measurement recorded."""
    path = path or TOLERANCES
    out: dict[tuple[str, str], Measured] = {}
    for row in read(path) if Path(path).is_file() else []:
        key = (row["kind"], row["machines"])
        if key[0] not in KINDS or key[1] not in MACHINES:
            raise ValueError(f"{path}: kind {key[0]!r} or machines {key[1]!r} is none of {KINDS} / {MACHINES}")
        seen = out.get(key)
        largest, cells = float(row["largest_change"]), int(row["cells"])
        if seen is None:
            out[key] = Measured(*key, largest, cells, (row["runs"],))
        else:
            out[key] = Measured(*key, max(seen.largest, largest), seen.cells + cells, (*seen.runs, row["runs"]))
    return out


def allowed(measured: Mapping[tuple[str, str], Measured], kind: str, machines: str) -> float:
    """How far a `kind` figure may move between runs on `machines`: the largest change measured (a relative
    one for floats, never below what rounding to six digits moves); 0 where nothing was measured, except the
    rounding for floats. Another machine never allows less than one machine does."""
    floor = ROUNDING if kind in RELATIVE else 0.0
    same = measured.get((kind, MACHINES[0]))
    value = max(floor, same.largest if same else 0.0)
    if machines == MACHINES[1]:
        other = measured.get((kind, MACHINES[1]))
        value = max(value, other.largest if other else 0.0)
    return value


def within(size: float, limit: float) -> bool:
    """Whether a change of `size` is within `limit`, the limit being a measured change written to six
    significant digits (so the change it was measured from is within it, whatever rounding did)."""
    return size <= limit * (1 + 1e-5) + 1e-12


def change(kind: str, a: float, b: float) -> float:
    """|B - A| (relative to the larger for a relative kind); inf where one side is not finite and the other
    differs."""
    if a == b:
        return 0.0
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    if kind in RELATIVE:
        return abs(b - a) / max(abs(a), abs(b))
    return abs(b - a)


# --- measuring ------------------------------------------------------------------------------------------
def measure(a: Path, b: Path, machines: str, runs: str) -> list[dict]:
    """One row per kind: the largest change between the result trees `a` and `b` (two runs of the same
    code) over every cell `rkstudy results diff` holds to a tolerance, where it was, and how many cells of
    the kind were compared."""
    from . import diff

    if machines not in MACHINES:
        raise ValueError(f"machines={machines!r}: one of {', '.join(MACHINES)}")
    found: dict[str, dict] = {k: {"largest": 0.0, "cells": 0, "moved": 0, "at": ""} for k in KINDS}
    for table, label, column, kind, va, vb in diff.cells(a, b):
        x, y = diff.number(va), diff.number(vb)
        entry = found[kind]
        entry["cells"] += 1
        if va == vb:
            continue
        entry["moved"] += 1
        size = change(kind, x, y) if x is not None and y is not None else math.inf
        if size > entry["largest"] or not entry["at"]:
            entry["largest"], entry["at"] = size, f"{table} {label} {column}: {va} -> {vb}"
    return [{"kind": kind, "machines": machines, "largest_change": f"{e['largest']:.6g}", "cells": e["cells"],
             "moved": e["moved"], "largest_at": e["at"], "runs": runs} for kind, e in found.items() if e["cells"]]


def record(rows: Iterable[Mapping], path: Path | str | None = None) -> Path:
    """Merge measured rows into the file: rows of the same runs and machines are replaced."""
    path = path or TOLERANCES
    rows = [dict(r) for r in rows]
    replaced = {(r["runs"], r["machines"]) for r in rows}
    kept = [r for r in (read(path) if Path(path).is_file() else []) if (r["runs"], r["machines"]) not in replaced]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(sorted(kept + rows, key=lambda r: (KINDS.index(r["kind"]), r["machines"], r["runs"])))
    return atomic.write_text(Path(path), buf.getvalue())


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m rkstudy.tables.tolerances",
                                description="measure how far two runs of the same code move each kind of figure, "
                                            "and record it where `rkstudy results diff` reads its tolerances")
    p.add_argument("a", type=Path, help="a result tree (a folder of <study>/<table>.csv)")
    p.add_argument("b", type=Path, help="another run's result tree, of the same code")
    p.add_argument("--machines", required=True, choices=MACHINES, help="whether A and B ran on one machine")
    p.add_argument("--runs", required=True, help="what A and B are: commit, host CPU and ISA of each, how they ran")
    args = p.parse_args(argv)
    rows = measure(args.a, args.b, args.machines, args.runs)
    for r in rows:
        print(f"{r['kind']}: largest change {r['largest_change']} over {r['cells']} cells ({r['moved']} moved)"
              + (f", at {r['largest_at']}" if r["largest_at"] else ""))
    print(f"-> {record(rows)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
