"""Results tables: `results/<study>/<table>.csv` plus a Markdown twin, written atomically.

Where a number came from is part of the number, so every row carries its provenance: the
rkstudy and toolkit versions that produced it, the target SoC, where it ran (fp32 reference,
the toolkit's simulator, or a board) and the date. A table is validated whole before anything
is written, and both files are swapped in with os.replace, so a failure never leaves a
half-written table behind.
"""

from __future__ import annotations

import csv
import datetime as _dt
import io
import math
import os
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Iterable, Mapping

from . import __version__

WHERE = ("fp32", "simulator", "board", "host")  # host: a CPU-side measurement that is not a decode
TARGETS = ("rk3588", "rk3566", "none")
STAMP = ("rkstudy_version", "toolkit_version", "target", "where", "date")
REPO = Path(__file__).resolve().parent.parent


def toolkit_version() -> str:
    """Version of the RKNN toolkit in this environment (host compiler, else board runtime)."""
    for dist in ("rknn-toolkit2", "rknn-toolkit-lite2"):
        try:
            return f"{dist} {metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    return "none"


def stamp(row: Mapping, *, where: str, target: str) -> dict:
    """`row` plus its provenance columns. `where` is fp32 / simulator / board / host."""
    if where not in WHERE:
        raise ValueError(f"where={where!r}: must be one of {', '.join(WHERE)}")
    if target not in TARGETS:
        raise ValueError(f"target={target!r}: must be one of {', '.join(TARGETS)} "
                         "(use 'none' for an fp32 or host row that no SoC produced)")
    return {**row, "rkstudy_version": __version__, "toolkit_version": toolkit_version(),
            "target": target, "where": where, "date": _dt.date.today().isoformat()}


def results_root(quick: bool) -> Path:
    """Where tables go: the committed `results/` in full mode, a scratch folder in quick mode
    so that a quick test run never overwrites the committed tables. RKSTUDY_RESULTS wins."""
    if os.environ.get("RKSTUDY_RESULTS"):
        return Path(os.environ["RKSTUDY_RESULTS"])
    return REPO / "results" if not quick else REPO / "build" / "quick-results"


def _fmt(value) -> str:
    if isinstance(value, float):
        if math.isinf(value) or math.isnan(value):
            return str(value)
        return f"{value:.6g}"
    return "" if value is None else str(value)


def _validate(rows: list[dict], study: str, table: str) -> list[str]:
    if not rows:
        raise ValueError(f"{study}/{table}: no rows to write; refusing to replace the table "
                         "with an empty one")
    columns = list(rows[0])
    for i, row in enumerate(rows):
        missing = [c for c in STAMP if c not in row]
        if missing:
            raise ValueError(f"{study}/{table} row {i} has no {', '.join(missing)}; "
                             "pass every row through rkstudy.results.stamp()")
        if list(row) != columns:
            raise ValueError(f"{study}/{table} row {i} has columns {list(row)}, row 0 has {columns}; "
                             "every row of a table needs the same columns in the same order")
    if any(not part or "/" in part or part.startswith(".") for part in (study, table)):
        raise ValueError(f"study {study!r} and table {table!r} must be plain names")
    return columns


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def to_markdown(rows: list[dict]) -> str:
    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_fmt(r[c]) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_table(study: str, table: str, rows: Iterable[Mapping], *, root: Path | None = None,
                title: str | None = None) -> Path:
    """Write `<root>/<study>/<table>.csv` and `.md` atomically; return the CSV path."""
    rows = [dict(r) for r in rows]
    columns = _validate(rows, study, table)
    folder = Path(root if root is not None else results_root(quick=False)) / study
    folder.mkdir(parents=True, exist_ok=True)

    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows({c: _fmt(r[c]) for c in columns} for r in rows)
    md = (f"# {title}\n\n" if title else "") + to_markdown(rows)

    staged = []
    try:
        for suffix, text in ((".csv", buf.getvalue()), (".md", md)):
            fd, tmp = tempfile.mkstemp(prefix=f".{table}", suffix=suffix, dir=folder)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a table is an ordinary file
            staged.append((tmp, folder / f"{table}{suffix}"))
        for tmp, final in staged:
            os.replace(tmp, final)
    finally:
        for tmp, _ in staged:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return folder / f"{table}.csv"


def reference(study: str) -> list[dict]:
    """The design documents' own figures for `study` (data/reference/seeds.csv), each row naming
    its seed file and section. These are the seeds' numbers, never ours: show them labelled."""
    rows = read_table(REPO / "data" / "reference" / "seeds.csv")
    return [r for r in rows if r["study"] == study]


def read_table(path: Path | str) -> list[dict]:
    """Rows of a CSV written by write_table (values as strings)."""
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))
