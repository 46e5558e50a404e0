"""Results tables: `results/<study>/<table>.csv` plus a Markdown twin, written atomically, and the
headline numbers each notebook records for the generated index and the notebook tests.

Where a number came from is part of the number, so every row carries its provenance: the rkstudy
version and the git commit of the code that made it (`-dirty` when the tree had changes outside
`results/`), the toolkit version, the target SoC, where it ran and the date; a row carried from an
earlier run keeps that run's stamp and says so in `carried_from`. `where` and `target`
come from the thing that produced the numbers (a runner, a BuildReport, or rkstudy.tables.results.HOST
for a host-side computation), never from a literal typed in a notebook. The machine columns say what
the numbers were computed on (its CPU, vector ISA, thread count, and which libraries' kernels were
pinned to one code path): a number that moves on a rerun elsewhere is then told a host change from a
code change (rkstudy.tables.diff).

Board side: standard library only (plus rkstudy.atomic, paths and process).
"""

from __future__ import annotations

import csv
import datetime as _dt
import functools
import io
import json
import math
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from .. import __version__, atomic, process, targets
from ..paths import REFERENCE_FIGURES, REPO, on_board, results_root  # noqa: F401  (results_root re-exported)

# fp32: onnxruntime on the host CPU; simulator: the toolkit's PC simulator; board: RKNNLite on a
# real board; replay: the test double of RKNNLite (never a board number); host: a build, a census
# or a timing on the host that is not a decode.
WHERE = ("fp32", "simulator", "board", "replay", "host")
TARGETS = (*targets.TARGETS, "none")  # a stamp's target: an SoC, or none (fp32 on the host)
STAMP = ("rkstudy_version", "commit", "toolkit_version", "target", "where", "date")
# The machine that computed a row (rkstudy.process.machine): written after STAMP in every row stamp() makes.
# A table made before rows named their machine has none of them (`rkstudy results check` says so).
MACHINE = ("machine_cpu", "machine_isa", "machine_threads", "numerics_pinned")
# A board's numbers are the board's (its /proc under $RKSTUDY_SYSROOT); the replay double plays one.
ON_BOARD = ("board", "replay")
# The column a row carried from an earlier run names that run's table in (empty for a measured row).
CARRIED = "carried_from"


@dataclass(frozen=True)
class Origin:
    """Where a row's numbers came from, for rows no runner produced (a census, a growth fit)."""

    where: str
    target: str = "none"


HOST = Origin("host")


def toolkit_version() -> str:
    """Version of the RKNN toolkit in this environment (host compiler, else board runtime)."""
    for dist in ("rknn-toolkit2", "rknn-toolkit-lite2"):
        try:
            return f"{dist} {metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    return "none"


@functools.lru_cache(maxsize=1)
def commit() -> str:
    """The git commit of the code (12 hex digits), `-dirty` when tracked files outside results/
    differ from it; else `unknown (<why>)`: git's own reason (outside a git checkout, on a board
    with an installed package), or that git is not installed.

    git is told the checkout is safe: run under sudo (for the NPU load), git refuses a clone owned by
    another user ("detected dubious ownership") though it is this code's own."""
    git = ["git", "-c", f"safe.directory={REPO}"]
    try:
        head = subprocess.run([*git, "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0:
            why = (head.stderr.strip().splitlines() or ["git rev-parse failed"])[0]
            return f"unknown ({why.removeprefix('fatal: ')[:120]})"
        dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":(exclude)results"], cwd=REPO, capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown (git: {type(exc).__name__})"


def machine(where: str) -> dict:
    """The machine columns for a row made `where`: a board's (or the replay double's recorded board) from
    the board's /proc/cpuinfo, anything else from this host's (rkstudy.process.machine)."""
    return process.machine(on_board("/proc/cpuinfo") if where in ON_BOARD else "/proc/cpuinfo")


def carried(row: Mapping, source: str) -> dict:
    """The provenance of a row read back from an earlier table, to merge into the row rebuilt from
    it: `carried_from` (the first source, kept when the row was already carried) and the stamp of
    the run that measured it, which stamp() then keeps instead of this run's (its machine columns too,
    empty when that run did not record them)."""
    missing = [k for k in STAMP if not row.get(k)]
    if missing:
        raise ValueError(f"{source}: the row to carry has no {', '.join(missing)}, so no one knows which run "
                         "measured it; measure it again instead of carrying it")
    return {CARRIED: row.get(CARRIED) or source, **{k: row[k] for k in STAMP}, **{k: row.get(k, "") for k in MACHINE}}


def stamp(row: Mapping, by=None) -> dict:
    """`row` plus its provenance columns (last, in STAMP then MACHINE order).

    `where`/`target` come from `by` (a Runner, a BuildReport or an Origin such as HOST) or, when
    `by` is None, from the row itself: measurement functions copy them from the runner they used.
    `toolkit_version` is the BuildReport's own, or a row's `built_with` (a measurement of a build made
    with another toolkit environment says so), else this environment's.
    A row whose `carried_from` names an earlier table was measured by an earlier run: it keeps that
    run's stamp (see carried()), so the number stays attributed to the code that made it.
    """
    row = dict(row)
    if row.get(CARRIED):
        missing = [k for k in STAMP if not row.get(k)]
        if missing:
            raise ValueError(f"a row carried from {row[CARRIED]} has no {', '.join(missing)}: keep the stamp of "
                             "the run that measured it (merge rkstudy.tables.results.carried(old_row, source) into it)")
        where, target = row["where"], row["target"]
        kept = {key: row.pop(key) for key in STAMP}
        kept.update({key: row.pop(key, "") for key in MACHINE})
    else:
        where = by.where if by is not None else row.get("where")
        target = (getattr(by, "target", "none") if by is not None else row.get("target")) or "none"
        # the toolkit that made the number: a build's own (a second toolkit environment builds in a child
        # of another interpreter), else this environment's
        toolkit = getattr(by, "toolkit_version", None) or row.get("built_with") or toolkit_version()
        for key in (*STAMP, *MACHINE):
            row.pop(key, None)
        row.pop("built_with", None)
        kept = None
    if where not in WHERE:
        raise ValueError(f"where={where!r}: must be one of {', '.join(WHERE)} (pass the runner, "
                         "BuildReport or rkstudy.tables.results.HOST that produced the row)")
    if target not in TARGETS:
        raise ValueError(f"target={target!r}: must be one of {', '.join(TARGETS)} "
                         "(use 'none' for an fp32 or host row that no SoC produced)")
    if kept is not None:
        return {**row, **kept}
    return {**row, "rkstudy_version": __version__, "commit": commit(), "toolkit_version": toolkit,
            "target": target, "where": where, "date": _dt.date.today().isoformat(), **machine(where)}


def _fmt(value) -> str:
    if isinstance(value, float):
        if math.isinf(value) or math.isnan(value):
            return str(value)
        return f"{value:.6g}"
    return "" if value is None else str(value)


def _validate(rows: list[dict], study: str, table: str) -> list[str]:
    if any(not part or "/" in part or part.startswith(".") for part in (study, table)):
        raise ValueError(f"study {study!r} and table {table!r} must be plain names")
    if not rows:
        raise ValueError(f"{study}/{table}: no rows to write; refusing to replace the table "
                         "with an empty one")
    columns = list(rows[0])
    for i, row in enumerate(rows):
        missing = [c for c in (*STAMP, *MACHINE) if c not in row]
        if missing:
            raise ValueError(f"{study}/{table} row {i} has no {', '.join(missing)}; "
                             "pass every row through rkstudy.tables.results.stamp()")
        if list(row) != columns:
            raise ValueError(f"{study}/{table} row {i} has columns {list(row)}, row 0 has {columns}; "
                             "every row of a table needs the same columns in the same order")
    return columns


def to_markdown(rows: list[dict], columns: list[str] | None = None) -> str:
    columns = columns or list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_fmt(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_table(study: str, table: str, rows: Iterable[Mapping], *, root: Path | None = None,
                title: str | None = None) -> Path:
    """Write `<root>/<study>/<table>.csv` and `.md` atomically; return the CSV path."""
    rows = [dict(r) for r in rows]
    columns = _validate(rows, study, table)
    folder = Path(root if root is not None else results_root(quick=False)) / study
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows({c: _fmt(r[c]) for c in columns} for r in rows)
    md = (f"# {title}\n\n" if title else "") + to_markdown(rows)
    # both twins are staged before either is swapped in, so a failure leaves the old pair
    with atomic.replacing(folder / f"{table}.csv") as csv_tmp, atomic.replacing(folder / f"{table}.md") as md_tmp:
        csv_tmp.write_text(buf.getvalue(), encoding="utf-8")
        md_tmp.write_text(md, encoding="utf-8")
    return folder / f"{table}.csv"


def as_written(rows: Iterable[Mapping]) -> list[dict]:
    """`rows` as write_table puts them in the CSV (every value the string it becomes, floats to six
    significant digits): what a reader of the committed table, and every check on it, sees."""
    return [{c: _fmt(v) for c, v in r.items()} for r in rows]


def read_table(path: Path | str) -> list[dict]:
    """Rows of a CSV written by write_table (values as strings)."""
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def reference(study: str) -> list[dict]:
    """The design documents' own figures for `study` (data/reference/figures.csv), each row naming
    its reference document and section. These are the reference documents' numbers, never ours: show them labelled."""
    return [r for r in read_table(REFERENCE_FIGURES) if r["study"] == study]


def reference_numbers(study: str, figure: str) -> list[float]:
    """The numbers in a reference figure's value ("+7/+8/-6" -> [7, 8, -6]; "-21…-23" -> [-21, -23]),
    for plotting their ranges beside ours without retyping them."""
    import re

    value = reference_figure(study, figure)["value"].replace("−", "-")
    # a sign counts only where it does not follow a digit: "45.5-48.6" is a range, not 45.5 and -48.6
    return [float(x) for x in re.findall(r"(?<![\d.])[-+]?\d+(?:\.\d+)?", value)]


def reference_figure(study: str, figure: str) -> dict:
    """One reference figure by its exact `figure` text (raises, naming the file, when it is not there)."""
    for r in reference(study):
        if r["figure"] == figure:
            return r
    raise KeyError(f"no reference figure {figure!r} for {study} in {REFERENCE_FIGURES}")


# --- headline numbers (recorded by each notebook's last cell) ----------------------------------
SIMULATOR_HEADLINE = "simulator"  # a headline whose name says simulator is a simulator number
# A listener score's one unit, by the word its headline names it with: PESQ-WB and DNSMOS are mean opinion scores
# (PESQ's MOS-LQO, DNSMOS's predicted MOS, 1 to 5), STOI an index from 0 to 1 with no unit.
LISTENER_UNITS = (("dnsmos", "MOS"), ("pesq", "MOS"), ("stoi", ""))


def listener_unit(name: str, unit: str) -> str:
    """The unit of a headline that names a listener score (LISTENER_UNITS), whatever the notebook passed
    (nothing, or the same unit); another unit is refused. Other headlines keep theirs."""
    expected = next((u for word, u in LISTENER_UNITS if word in name.lower()), None)
    if expected is None or unit == expected:
        return unit
    if unit:
        raise ValueError(f"headline {name!r}: unit {unit!r}; a listener score's unit is {expected or 'none'!r} "
                         "(rkstudy.tables.results.LISTENER_UNITS)")
    return expected


def record_headlines(study: str, headlines: Mapping[str, Mapping], *, root: Path,
                     figures: Mapping[str, str] | None = None) -> Path:
    """Write `<root>/<study>/headlines.json`: {name: {value, unit, reference, comparable[, board_risk]}}
    — what the notebook tests assert (with tolerances) and what the generated index shows — with the
    run's commit and machine, and `figures`: {name: sha256} of every figure this run drew (the figures of
    the study that are current; any other PNG in its folder is an orphan). `reference`
    names the reference figure (its exact `figure` text in data/reference/figures.csv) the headline is
    shown beside, and `comparable` says whether the pair is the same quantity under the same conditions
    (`same`) or not (`differs: <what>`): a reference figure without it is refused, so the index
    never pairs two numbers without saying whether they can be compared. A simulator headline (its
    name says so) without `board_risk` is refused: the index shows the verdict in the same row."""
    clean = {}
    for name, h in headlines.items():
        value = h["value"]
        if hasattr(value, "item"):
            value = value.item()  # numpy scalars
        if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
            value = str(value)
        comparable = h.get("comparable", "")
        if h.get("reference"):
            reference_figure(study, h["reference"])  # a typo in the figure name fails here, not in the index
            if comparable != "same" and not (comparable.startswith("differs: ") and comparable[9:].strip()):
                raise ValueError(f"{study} headline {name!r}: beside reference figure {h['reference']!r} it needs "
                                 "comparable='same' or comparable='differs: <what differs>'")
        elif comparable:
            raise ValueError(f"{study} headline {name!r}: comparable={comparable!r} without a reference "
                             "figure; pass reference=<its figure> or drop comparable")
        risk = h.get("board_risk", "")
        if SIMULATOR_HEADLINE in name.lower() and not risk:
            raise ValueError(f"{study} headline {name!r} is a simulator number without a board risk; pass "
                             "risk=<the engine row or rows it was measured on> (the simulator does not see the "
                             "register-field overflow a board does)")
        clean[name] = {"value": value, "unit": listener_unit(name, h.get("unit", "")),
                       "reference": h.get("reference", ""), "comparable": comparable,
                       **({"board_risk": risk} if risk else {})}
    payload = {"study": study, "rkstudy_version": __version__, "commit": commit(),
               "date": _dt.date.today().isoformat(), "machine": machine("host"), "headlines": clean,
               "figures": dict(sorted((figures or {}).items()))}
    return atomic.write_text(Path(root) / study / "headlines.json", json.dumps(payload, indent=1) + "\n")


def read_headlines(study: str, root: Path) -> dict:
    """What record_headlines wrote for `study` under `root`: study, version, commit, date and the
    headlines (name -> value, unit, the reference figure's name)."""
    path = Path(root) / study / "headlines.json"
    if not path.is_file():
        raise FileNotFoundError(f"no headlines at {path}; run the study's notebook first")
    return json.loads(path.read_text(encoding="utf-8"))


# --- figures (results too: stamped by the run that drew them) ------------------------------------------
FIGURES = "figures"   # <root>/<study>/figures/<name>.png
# The PNG text chunks a figure carries: what drew it, when, on which machine (as a table row's stamp).
FIGURE_STAMP = ("study", "figure", "rkstudy_version", "commit", "date", *MACHINE)


def figure_stamp_of(study: str, name: str) -> dict[str, str]:
    """The stamp save_figure writes into a figure's PNG: this run's commit and machine."""
    return {"study": study, "figure": name, "rkstudy_version": __version__, "commit": commit(),
            "date": _dt.date.today().isoformat(), **{k: str(v) for k, v in machine("host").items()}}


def save_figure(fig, study: str, name: str, *, root: Path, dpi: int = 110) -> Path:
    """Write a matplotlib figure as `<root>/<study>/figures/<name>.png` (atomically), stamped in its PNG
    text chunks (figure_stamp_of) as a table row is: `rkstudy results check` refuses a figure without it."""
    path = Path(root) / study / FIGURES / f"{name}.png"
    with atomic.replacing(path) as tmp:
        fig.savefig(tmp, format="png", dpi=dpi, bbox_inches="tight", metadata=figure_stamp_of(study, name))
    return path


def file_digest(path: Path) -> str:
    """sha256 of a file's bytes (hex): what a run records of each figure it drew."""
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def figure_stamp(path: Path | str) -> dict[str, str]:
    """The text chunks (tEXt, and uncompressed iTXt) of the PNG at `path`: a figure's stamp, empty for a
    figure drawn without one (or a file that is no PNG)."""
    import struct
    import zlib

    data = Path(path).read_bytes()
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        return {}
    out, at = {}, 8
    while at + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + length]
        at += 12 + length
        if kind == b"tEXt":
            key, _, value = body.partition(b"\0")
            out[key.decode("latin-1")] = value.decode("latin-1")
        elif kind == b"iTXt":
            key, _, rest = body.partition(b"\0")
            compressed, rest = rest[0], rest[2:]
            _language, _, rest = rest.partition(b"\0")
            _translated, _, text = rest.partition(b"\0")
            out[key.decode("latin-1")] = (zlib.decompress(text) if compressed else text).decode("utf-8")
        elif kind == b"IEND":
            break
    return out
