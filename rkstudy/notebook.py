"""What every study notebook does the same way, once (host): show a table, show the reference
documents' figures beside ours, stamp and write tables, save figures as PNG for readers on a code
host, play short audio clips, record the headline numbers the notebook tests and the results index
read, and end with what the run shows, each statement rendered from the table row it cites.
"""

from __future__ import annotations

import json
import os
import re
import string
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import cache, gates
from .paths import REPO, results_root
from .process import shows_progress
from .tables import claims, results

CLIP_SECONDS = 5.0  # audio embedded in an executed notebook; the full render goes to the cache
MAX_STATEMENTS = 10  # a conclusion a reader takes in at once; more belongs in the tables


def shown_path(path: Path) -> Path:
    """`path` relative to the repository when it is inside it: an executed notebook is read on other
    machines, where this machine's absolute paths mean nothing."""
    # absolute, not resolved: a venv's interpreter is a symlink out of the repository, and the reader
    # wants the venv it names, not the system interpreter behind it
    try:
        return Path(os.path.abspath(path)).relative_to(REPO)
    except ValueError:
        return Path(path)


SUMMARIES = ("min", "max", "count", "sum")


@dataclass(frozen=True)
class Cite:
    """One value a statement quotes: `column` of the one row of `table` that `where` selects (column
    -> value, every pair must match; compared as text too, so 93 selects a row holding "93"), or with
    `summary` ("min", "max", "count", "sum") that summary over every row `where` selects."""
    table: str
    where: Mapping
    column: str
    summary: str | None = None

    def label(self) -> str:
        sel = ", ".join(f"{k}={v}" for k, v in self.where.items())
        what = f"{self.summary} of {self.column}" if self.summary else self.column
        return f"`{self.table}`: {sel + ', ' if sel else ''}{what}"

    def matches(self, row: Mapping) -> bool:
        return all(k in row and (row[k] == v or str(row[k]) == str(v)) for k, v in self.where.items())

    def conditions(self) -> list[str]:
        return [self.table, self.column, *(f"{k}={v}" for k, v in self.where.items())]


@dataclass(frozen=True)
class Theirs:
    """A reference figure a statement sets beside ours, by its exact text (data/reference/figures.csv):
    rendered as theirs ("98+ dB"), never typed into the prose."""
    figure: str
    study: str
    target: str | None = None

    def label(self) -> str:
        return f"the reference documents: {self.figure}" + (f" ({self.target})" if self.target else "")

    def conditions(self) -> list[str]:
        return [self.figure, self.target or ""]


def theirs(figure: str, study: str, target: str | None = None) -> Theirs:
    return Theirs(figure, study, target)


@dataclass(frozen=True)
class Statement:
    """One thing a run shows: `text` is a format string whose fields take the cited values in
    order. `full_only` says the cited rows exist only in a full run: in quick mode a missing table
    or row then renders as skipped instead of failing. `holds(*values)`, when given, says whether the
    reading the text puts on the values holds in this run; where it does not the statement is
    flagged, not shown as if it did."""
    text: str
    cites: tuple[Cite | Theirs, ...]
    full_only: bool = False
    holds: Callable[..., bool] | None = None


def typed_numbers(text: str, cites: Iterable[Cite | Theirs] = ()) -> list[str]:
    """The numbers in a statement's own words (its format fields left out) that none of its cites'
    conditions name: a quantity typed into the prose where it should be rendered from a row."""
    words = _unfilled(text).replace("…", " ")
    return claims.typed_numbers(words, [c for cite in cites for c in cite.conditions()])


def says(text: str, *cites: tuple | Cite | Theirs, full_only: bool = False,
         holds: Callable[..., bool] | None = None) -> Statement:
    """`says("worst window {:.1f} dB", ("window_sweep", {"window": 93}, "min_snr_db"))`. A number in
    `text` that is no condition of its cites (a selector value, a reference figure's text) is refused:
    a measured value is a field, filled from this run's row."""
    made = tuple(c if isinstance(c, (Cite, Theirs)) else Cite(*c) for c in cites)
    typed = typed_numbers(text, made)
    if typed:
        raise ValueError(f"statement {text!r} types {', '.join(typed)}: cite the row that holds it "
                         "(a format field) or name it in a cite's selector")
    doubled = doubled_units(text, made)
    if doubled:
        raise ValueError(f"statement {text!r} writes {', '.join(doubled)} after a reference figure that renders with "
                         "its unit already (\"0.49 dB\"): drop the unit from the text")
    return Statement(text, made, full_only, holds)


def doubled_units(text: str, cites: Iterable[Cite | Theirs]) -> list[str]:
    """The units `text` writes right after a field filled by a reference figure (Theirs renders as value and
    unit, "0.49 dB"), which a reader would then read twice ("0.49 dB dB")."""
    parts = list(string.Formatter().parse(text))
    after = [parts[i + 1][0] if i + 1 < len(parts) else "" for i in range(len(parts))]
    fields = [literal_after for (_, field, _, _), literal_after in zip(parts, after) if field is not None]
    found = []
    for cite, literal_after in zip(cites, fields):
        if not isinstance(cite, Theirs):
            continue
        figures = [r for r in results.reference(cite.study)
                   if r["figure"] == cite.figure and (cite.target is None or r["target"] == cite.target)]
        unit = figures[0]["unit"].strip() if len(figures) == 1 else ""
        following = literal_after.lstrip()
        if unit and following.startswith(unit) and not following[len(unit):len(unit) + 1].isalnum():
            found.append(unit)
    return found


def _unfilled(text: str) -> str:
    """`text` with every format field shown as an ellipsis: a statement whose values were not measured."""
    return "".join(lit + ("…" if field is not None else "") for lit, field, _, _ in string.Formatter().parse(text))


class Rows(list):
    """The stamped rows of a table the notebook has shown: left as a cell's last value they display
    nothing more (the table is on the page; a repr of every row under it is noise to a reader)."""

    def _ipython_display_(self) -> None:
        pass


def fields(mapping: Mapping) -> str:
    """A mapping as a reader reads it, `key value, key value` (sequences joined by commas), instead of a
    Python dict's repr."""
    def shown(value):
        if isinstance(value, Mapping):
            return "{" + fields(value) + "}"
        if isinstance(value, (list, tuple)):
            return ", ".join(map(str, value)) if value else "none"
        return str(value)

    return "; ".join(f"{k} {shown(v)}" for k, v in mapping.items())


# The columns of an engine row that are the engine's own figures (its size, what the compiler logged), and the
# units a headline states them in: such a headline stands beside its engine's board risk, as a simulator score does.
ENGINE_FIGURE = re.compile(r"^(regtask|regtask_max_value|engine|engine_mb|engine_mib|engine_bytes)$")
ENGINE_UNITS = ("MB", "MiB", "bytes", "B", "lines")


def _same_number(cell, value) -> bool:
    """Whether a table cell holds `value`, compared as the table writes both (six significant digits)."""
    if isinstance(value, bool) or isinstance(cell, bool):
        return False
    try:
        a, b = float(cell), float(value)
    except (TypeError, ValueError):
        return False
    return results.as_written([{"v": a}])[0]["v"] == results.as_written([{"v": b}])[0]["v"]


def _with_risk(row: Mapping) -> dict:
    """An engine row (one with a REGTASK count) with its board-risk verdict, read from the whole row:
    a simulator SNR is never written without what the compiler logged beside it."""
    row = dict(row)
    if "regtask" in row:
        row["board_risk"] = gates.board_risk(row)
    return row


class Study:
    """One notebook's study: `Study("piper_decoder", QUICK)`."""

    def __init__(self, study: str, quick: bool):
        self.study, self.quick = study, quick
        self.root = results_root(quick)
        self.tables: dict[str, tuple[list[dict], str]] = {}
        self.headline_values: dict[str, dict] = {}
        self.figures: dict[str, str] = {}  # name -> sha256 of each figure this run drew

    def __repr__(self) -> str:
        return (f"Study({self.study!r}, {'quick' if self.quick else 'full'} mode, "
                f"tables -> {shown_path(self.root / self.study)})")

    # --- showing ---------------------------------------------------------------------------
    @staticmethod
    def show(rows: Iterable[Mapping], columns: list[str] | None = None) -> None:
        from IPython.display import Markdown, display

        rows = [dict(r) for r in rows]
        if not rows:
            print("(no rows)")
            return
        hidden = (*results.STAMP[:3], *results.MACHINE)  # the same on every row of a run: the stamp says it
        display(Markdown(results.to_markdown(rows, columns or [c for c in rows[0] if c not in hidden])))

    @staticmethod
    def progress(line: str) -> None:
        """A long step's progress line (`progress=study.progress`): printed for a person at the kernel, never
        in a recorded run, whose executed notebook carries the step's one summary line instead."""
        if shows_progress():
            print(line, flush=True)

    @staticmethod
    def show_contract(contract) -> None:
        """What a stage contract says, as a reader needs it: one row per input and output tensor, and one
        line naming the window, the stage parameters, the source model and the command that makes it
        (the whole contract is in the JSON beside each engine)."""
        from IPython.display import Markdown, display

        rows = [{"tensor": t.name, "direction": direction, "shape": "x".join(map(str, t.shape)), "dtype": t.dtype,
                 "role": t.role, "frame axis": "" if t.axis is None else t.axis,
                 "axis length": "" if t.axis is None else f"{t.rate} x frames" + (f" + {t.extra}" if t.extra else "")}
                for direction, tensors in (("in", contract.inputs), ("out", contract.outputs)) for t in tensors]
        window = contract.window
        said = [f"{contract.family} {contract.stage}"]
        if window is not None:
            said.append(f"window {window.frames} frames (emit {window.emit}, context {window.context} each side, "
                        f"hop {window.hop})")
        if contract.state:
            said.append("state " + ", ".join(f"{i} -> {o}" for i, o in contract.state))
        if contract.params:
            said.append("params " + fields({k: v for k, v in contract.params.items() if v not in ("", None)}))
        said.append(f"source {contract.source.file} (sha256 {contract.source.sha256[:12]})")
        display(Markdown(results.to_markdown(rows) + "\n" + "; ".join(said) + f"; made by `{contract.producer}`"))

    def reference_figures(self, *words: str, study: str | None = None) -> None:
        """Show the reference documents' figures for this study whose text contains any of `words`
        (all of them with no words): theirs, not ours, from data/reference/figures.csv."""
        rows = [r for r in results.reference(study or self.study)
                if not words or any(w.lower() in r["figure"].lower() for w in words)]
        self.show(rows, ["figure", "value", "unit", "where", "target", "section"])

    # --- tables, figures, audio, headlines -------------------------------------------------------
    def table(self, name: str, rows: Iterable[Mapping], title: str, by=None,
              show: list[str] | bool = True) -> list[dict]:
        """Stamp `rows` (where/target from `by` or from each row) and keep them for write_tables();
        show them (the given columns, or all) unless `show=False`. A row with a REGTASK count gets
        its `board_risk` verdict (rkstudy.gates.board_risk) from everything else in the row."""
        stamped = [results.stamp(_with_risk(r), by) for r in rows]
        self.tables[name] = (stamped, title)
        if show:
            columns = show if isinstance(show, list) else None
            if columns and "board_risk" not in columns and any("board_risk" in r for r in stamped):
                columns = [*columns, "board_risk"]  # an engine row is never shown without its verdict
            self.show(stamped, columns)
        return Rows(stamped)

    def write_tables(self) -> list[Path]:
        return [results.write_table(self.study, name, rows, root=self.root, title=title)
                for name, (rows, title) in self.tables.items()]

    def figure(self, fig, name: str) -> None:
        """Save `fig` as results/<study>/figures/<name>.png, stamped by this run (the notebook still shows it
        inline); finish() records it among the study's current figures."""
        path = results.save_figure(fig, self.study, name, root=self.root)
        self.figures[name] = results.file_digest(path)

    def listen(self, pcm: np.ndarray, sample_rate: int, name: str):
        """The full render to the cache as WAV; an audio player of its first CLIP_SECONDS."""
        from IPython.display import Audio, display

        from .board.run import write_wav

        pcm = np.asarray(pcm, np.float32).ravel()
        write_wav(cache.cache_dir("audio") / f"{self.study}_{name}.wav", pcm, sample_rate)
        clip = pcm[: int(CLIP_SECONDS * sample_rate)]
        print(f"{name}: {pcm.size / sample_rate:.1f} s (player: first {clip.size / sample_rate:.1f} s)")
        display(Audio(clip, rate=sample_rate))

    def headline(self, name: str, value, unit: str = "", reference: str = "", comparable: str = "",
                 risk=None) -> None:
        """Record one headline number, with the reference figure it is shown beside (by its exact
        text) and whether the two are the same quantity under the same conditions: `"same"` or
        `"differs: <what>"` (rkstudy.tables.results.record_headlines refuses a figure without it).
        `risk` is the engine row (or rows, for a worst over a sweep) the number was measured on: its
        board-risk verdict stands in the same row (rkstudy.gates.risk_summary); a simulator headline
        without one is refused, so no simulator number is shown without what the compiler logged. An
        engine's own figure (its size, its REGTASK lines: a unit in ENGINE_UNITS, or a name saying engine or
        REGTASK) recorded without `risk` carries the verdict of the engine rows of this run that hold it
        (engine_rows_holding): an at-risk engine's size is never shown as if it were a clean one's."""
        entry = {"value": value, "unit": unit, "reference": reference, "comparable": comparable}
        if risk is None and (unit in ENGINE_UNITS or "engine" in name.lower() or "regtask" in name.lower()):
            risk = self.engine_rows_holding(value) or None
        if risk is not None:
            entry["board_risk"] = risk if isinstance(risk, str) else gates.risk_summary(risk)
        self.headline_values[name] = entry

    def engine_rows_holding(self, value) -> list[dict]:
        """The engine rows of this run's tables (rows with a REGTASK count, so a board-risk verdict) that hold
        `value` as one of the engine's own figures (ENGINE_FIGURE): the engines a size or a line count headline
        was read from, whose verdict it carries when the notebook names none (rkstudy.gates.risk_summary, the
        worst of them where several hold it)."""
        return [row for rows, _ in self.tables.values() for row in rows if "regtask" in row and "board_risk" in row
                and any(ENGINE_FIGURE.match(c) and _same_number(row[c], value) for c in row)]

    def reference_claims(self) -> list[dict]:
        """Record `reference_claims`: each of the reference documents' measured claims for this
        study (data/reference/claims.csv) beside ours, read from the tables this notebook recorded
        in this run, with its verdict. Call it after the last table, before finish(). The verdicts read
        the rows as the committed tables will hold them (rkstudy.tables.results.as_written), so the
        verdict a reader checks against a committed table is the one its written numbers give."""
        written = {n: results.as_written(t) for n, (t, _) in self.tables.items() if n != "reference_claims"}
        rows = claims.evaluate(self.study, written, self.quick)
        if not rows:
            print(f"the reference documents make no measured claim about {self.study}")
            return []
        tally = claims.counts([r["verdict"] for r in rows])
        print(", ".join(f"{n} {kind}" for kind, n in tally.items()))
        # each row keeps where the rows it read were measured (a simulator score stays a simulator row)
        return self.table("reference_claims", rows, "The reference documents' measured claims beside ours",
                          show=["claim", "theirs", "ours", "verdict"])

    def conclusions(self, statements: Iterable[Statement]) -> str:
        """The Markdown list `conclude` shows: each statement filled from this run's tables, with the
        rows it cites named after it. A cited table, row or cell that is missing (or empty) fails loudly
        (KeyError), unless the statement is `full_only` and this is a quick run: then it says it was
        skipped. A value its format cannot take fails as loudly (ValueError)."""
        statements = list(statements)
        if len(statements) > MAX_STATEMENTS:
            raise ValueError(f"{self.study}: {len(statements)} statements; a conclusion holds at most "
                             f"{MAX_STATEMENTS} (keep the rest in the tables)")
        lines = []
        for n, st in enumerate(statements, 1):
            sources = "; ".join(c.label() for c in st.cites)
            try:
                values = [self._cited(c) for c in st.cites]
            except KeyError as missing:
                if not (st.full_only and self.quick):
                    raise KeyError(f"{self.study}, statement {n} ({st.text!r}): {missing.args[0]}") from None
                lines.append(f"- *Not measured in quick mode (full run only):* {_unfilled(st.text)} ({sources})")
                continue
            try:
                text = st.text.format(*values)
            except (ValueError, TypeError, IndexError) as bad:
                raise ValueError(f"{self.study}, statement {n} ({st.text!r}) cannot take {values!r}: {bad}") from None
            if st.holds is not None and not st.holds(*values):
                lines.append(f"- **Not so in this run** (the reading this statement puts on its values fails on "
                             f"them): {text} ({sources})")
                continue
            lines.append(f"- {text} ({sources})" if sources else f"- {text}")
        return "\n".join(lines)

    def _cited(self, cite: Cite | Theirs):
        if isinstance(cite, Theirs):
            found = [r for r in results.reference(cite.study)
                     if r["figure"] == cite.figure and (cite.target is None or r["target"] == cite.target)]
            if len(found) != 1:
                raise KeyError(f"{len(found)} reference figures {cite.figure!r} for {cite.study}; name one "
                               "(its exact text, and its target where two share it)")
            return f"{found[0]['value']} {found[0]['unit']}".strip()
        if cite.table not in self.tables:
            raise KeyError(f"table {cite.table!r} was not recorded in this run (recorded: {', '.join(self.tables)})")
        rows = [r for r in self.tables[cite.table][0] if cite.matches(r)]
        if cite.summary is not None:
            if cite.summary not in SUMMARIES:
                raise KeyError(f"{cite.label()}: summary {cite.summary!r} is not one of {', '.join(SUMMARIES)}")
            if cite.summary == "count":
                return len(rows)
            cells = [r.get(cite.column) for r in rows if r.get(cite.column) not in ("", None)]
            if not cells:
                raise KeyError(f"{cite.label()} selects no row with a value")
            return {"min": min, "max": max, "sum": sum}[cite.summary](cells)
        if len(rows) != 1:
            raise KeyError(f"{cite.label()} selects {len(rows)} rows of {cite.table!r}, not one")
        if cite.column not in rows[0]:
            raise KeyError(f"{cite.label()}: {cite.table!r} has no column {cite.column!r}")
        if rows[0][cite.column] in ("", None):  # a row that records what was not measured, e.g. a skipped build
            raise KeyError(f"{cite.label()}: the cell is empty (not measured in this run)")
        return rows[0][cite.column]

    def conclude(self, statements: Iterable[Statement]) -> None:
        """Show "what this shows" (`conclusions`) as Markdown: the prose is rendered from the tables
        of this run, so it cannot drift from them."""
        from IPython.display import Markdown, display

        display(Markdown(self.conclusions(statements)))

    def finish(self) -> None:
        """Write every table, and the headlines with the figures this run drew (any other figure in the
        study's folder is then an orphan); print where they went (relative to the repository)."""
        for path in self.write_tables():
            print(shown_path(path))
        if self.headline_values or self.figures:
            print(shown_path(results.record_headlines(self.study, self.headline_values, root=self.root,
                                                      figures=self.figures)))


# --- whole syntheses under a component execution plan ----------------------------------------------
def compiled_for_speak(graph: Path, family: str, soc: str, convert: Callable[[Path, str, Path], int]) -> Path:
    """The engine a user ships for `graph`: `convert` (the family's stage 2: graph, soc, out -> exit code)
    compiles it beside the graph as `<graph>.<soc>.rknn`, gated, its contract beside it; one whose contract
    already matches the family and SoC is reused. Stage 2's own lines name the engine by its path on this
    machine, so they are kept back (and raised if it fails) and the engine is named by its file name."""
    import contextlib
    import io

    from .contract import for_engine
    from .errors import EngineMismatch

    engine = Path(graph).with_suffix(f".{soc}.rknn")
    try:
        for_engine(engine, family=family, soc=soc)
    except EngineMismatch:
        with contextlib.redirect_stdout(io.StringIO()) as said:
            if convert(Path(graph), soc, engine):
                raise RuntimeError(said.getvalue()) from None
        print(f"stage 2 compiled {engine.name} for {soc}")
    return engine


def speak(model: str, runs: Iterable[tuple[str, str, str | None]], *args, folder: Path | None = None
          ) -> tuple[list[dict], dict[str, tuple[np.ndarray, int]]]:
    """Each run (`path` label, plan JSON, runtime or None) as `rkstudy speak MODEL ... *args` runs it: the
    command line itself, whose child measures the synthesis (its own peak RSS, not the kernel's). Returns
    the rows, each labelled with its `path`, and each run's audio read back from the file it wrote (16-bit,
    what a listener gets), by label. A run that fails raises its one-line error."""
    import contextlib
    import io
    import json
    import tempfile

    from .cli import main
    from .plan import audio as audio_files

    folder = Path(folder or tempfile.mkdtemp(prefix=f"rkstudy-speak-{model}-"))
    rows, audio, said_before = [], {}, set()
    for label, plan, runtime in runs:
        stem = "".join(ch if ch.isalnum() else "_" for ch in label)
        wav = folder / f"{stem}.wav"
        argv = ["speak", model, "--plan", plan if isinstance(plan, str) else json.dumps(plan),
                *(["--runtime", runtime] if runtime else []), *map(str, args), "--audio", str(wav),
                "--results", str(folder / stem)]
        with contextlib.redirect_stdout(io.StringIO()) as said:
            code = main(argv)
        # what the command printed, its scratch folder named by its own files (no machine's paths); a line
        # every run prints alike (what the model is) is said once
        lines = said.getvalue().replace(f"{folder}{os.sep}", "").splitlines()
        print("".join(f"{line}\n" for line in lines if line not in said_before), end="")
        said_before.update(lines)
        if code != 0:
            raise RuntimeError(f"`rkstudy {' '.join(argv)}` failed (its error is printed above)")
        (found,) = [p for p in (folder / stem).glob("*/*.csv")]
        row = results.read_table(found)[-1]
        rows.append({"path": label, **{k: v for k, v in row.items() if k not in results.STAMP},
                     "where": row["where"], "target": row["target"]})
        audio[label] = audio_files.read(wav)
    return rows, audio


def against_cpu(rows: list[dict], audio: Mapping[str, tuple[np.ndarray, int]], cpu: str,
                hop: int | None = None, speech: bool = True) -> list[dict]:
    """The document's quality figures of every run's audio against the run labelled `cpu`, and what a
    listener would judge of it (rkstudy.plan.quality; `speech=False`: no DNSMOS, for audio that is not
    speech), one row each, stamped with the run's own where and target."""
    from .plan.quality import against_cpu as compare

    ref, rate = audio[cpu]
    return [{"path": r["path"], "plan_sha256": r["plan_sha256"], "runtime": r["runtime"],
             **compare(ref, audio[r["path"]][0], hop=hop, rate=rate, absolute=speech), "where": r["where"],
             "target": r["target"]} for r in rows if r["path"] != cpu]


# What a reader of an executed notebook must not meet: this machine's paths, a progress bar's refreshes,
# a Python container's repr or a JSON document where a table or a sentence belongs, a library's progress
# lines, and the reference documents under a name that is not theirs.
READER_PROBLEMS = {
    "an absolute path of the machine that ran it":
        re.compile(r"(?<![\w.~])/(?:tmp|home|work|root)/|site-packages/|/\.venv"),
    "a progress bar": re.compile(r"\r|\d+%\||it/s\]|s/it\]"),
    "a dict or list of dicts printed raw": re.compile(r"(?m)^\s*\[?\{'[^'\n]*': "),
    "a JSON document printed raw": re.compile(r'(?m)^[\[{]\s*\n\s+"[^"\n]*": '),
    "an exporter's progress lines": re.compile(r"(?m)^\[torch\.onnx\] .*(?:\.\.\.|✅|❌)$"),
    "the reference documents by another name": re.compile(r"(?i)\bseeds?'|\bseeds\b"),
}
# More than this many separate stdout outputs in a row in one cell: lines that trickled out while the cell worked
# (a progress log), where an executed notebook carries one summary line per long step (a run of five syntheses
# prints five).
PROGRESS_RUN = 8
# A warning as a recorded run prints it (rkstudy.process.for_readers: "UserWarning: ... (torch/onnx/utils.py:709)"),
# as Python prints it by default ("torch/onnx/utils.py:709: UserWarning: ..."), and a library logger's line in
# torch's format ("W1205 00:30:35.763000 13864 torch/onnx/...py:107] ..."). Each needs silencing at its source
# (rkstudy.process.KNOWN_WARNINGS, which says why it is harmless) or explaining; a prediction the study makes on
# purpose is no Warning class (rkstudy's AbortPredicted).
WARNING_LINES = (re.compile(r"^\w*Warning: .*\([^()\s]+:\d+\)$"), re.compile(r"^\S+?:\d+: \w*Warning: "),
                 re.compile(r"^[WE]\d{4} [\d:.]+ +\d+ \S+?:\d+\] "))


def reader_text(path: Path) -> list[tuple[int, str]]:
    """(cell number, text) of everything an executed notebook shows a reader: its markdown, and each
    output's streams and the richest text of its display data (a table's Markdown, not its repr)."""
    nb = json.loads(Path(path).read_text(encoding="utf-8"))
    out = []
    for n, cell in enumerate(nb.get("cells", [])):
        if cell["cell_type"] == "markdown":
            out.append((n, "".join(cell["source"])))
        for o in cell.get("outputs", []):
            if o.get("output_type") == "stream":
                out.append((n, "".join(o.get("text", ""))))
            elif "data" in o:
                data = o["data"]
                kind = next((k for k in ("text/markdown", "text/html", "text/plain") if k in data), None)
                if kind:
                    out.append((n, "".join(data[kind])))
            elif o.get("output_type") == "error":
                out.append((n, "\n".join(o.get("traceback", []))))
    return out


def progress_runs(path: Path) -> list[tuple[int, int]]:
    """(cell number, stdout outputs in a row) for every cell of an executed notebook with more than PROGRESS_RUN
    stdout outputs in a row."""
    nb = json.loads(Path(path).read_text(encoding="utf-8"))
    out = []
    for n, cell in enumerate(nb.get("cells", [])):
        run = longest = 0
        for o in cell.get("outputs", []):
            run = run + 1 if o.get("output_type") == "stream" and o.get("name") == "stdout" else 0
            longest = max(longest, run)
        if longest > PROGRESS_RUN:
            out.append((n, longest))
    return out


def warning_lines(text: str) -> list[str]:
    """The lines of `text` that are a warning (WARNING_LINES)."""
    return [line for line in text.splitlines() if any(p.search(line) for p in WARNING_LINES)]


def reader_problems(path: Path) -> list[str]:
    """One line per place an executed notebook shows a reader something READER_PROBLEMS names, a cell whose
    output is a progress log (progress_runs), and each warning it shows (warning_lines)."""
    found = []
    name = Path(path).name
    for n, text in reader_text(path):
        for what, pattern in READER_PROBLEMS.items():
            m = pattern.search(text)
            if m:
                line = text[max(0, m.start() - 40): m.end() + 40].replace("\n", " ").replace("\r", " ")
                found.append(f"{name}, cell {n}: {what}: ...{line}...")
        found += [f"{name}, cell {n}: a warning: {line[:160]}" for line in warning_lines(text)]
    found += [f"{name}, cell {n}: a progress log: {count} stdout outputs in a row (one summary line per long step "
              "belongs there; progress goes through Study.progress)" for n, count in progress_runs(path)]
    return found
