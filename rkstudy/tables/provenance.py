"""`rkstudy results check`: is every committed number traceable to the code at HEAD?

A table is only worth committing when its rows say which commit made them and that commit's code
is still the code that would make them. The check reads every `results/<study>/*.csv` (and each
study's headlines.json) and fails on:

* unstamped: a table, or a row, without the stamp columns (rkstudy.tables.results.STAMP);
* dirty: a `-dirty` commit (made from a tree with uncommitted code);
* unknown-commit / not-ancestor: a commit the repository does not have, or one HEAD does not descend from;
* mixed-commits: one study stamped by more than one commit (rows carried from an earlier run, which
  say so in `carried_from`, are excepted: their commit is still checked);
* stale: the study's producing code (its family folder, the rkstudy modules it imports, its
  notebook, data/) changed between its stamp and HEAD;
* no-producer: a study folder no notebook or benchmark writes;
* where: a `where`/`target` that cannot be what made the number (a simulator score in a host or fp32
  row, an fp32 row with a target, a simulator row without one, a board row outside results/board/);
* unit: a value whose scale disagrees with its unit (two columns for one quantity in different
  units that do not convert into each other; a `unit` cell naming another unit than the column the
  value came from);
* no-machine: a table, or a row, that does not say which machine computed it (CPU, vector ISA,
  threads, pinned numerics; rkstudy.tables.results.MACHINE): made before rows named their machine, so
  a value that moves on a rerun cannot be told a host change from a code change;
* figure-unstamped / figure-stale / figure-orphan / figure-missing: a figure under
  `<study>/figures/` is a result too. Its PNG must carry the stamp of the run that drew it, that run
  must be the one that made the study's headlines (which list every figure it drew, with its sha256),
  and a figure the study's last run did not draw (or, for a run that listed none, that no notebook of
  the study names) is an orphan `make reproduce` removes.

Host and board side: standard library only (git on PATH).
"""

from __future__ import annotations

import ast
import csv
import json
import math
import re
import subprocess
from collections import defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from .results import CARRIED, FIGURES, MACHINE, STAMP, TARGETS, WHERE, figure_stamp

# Tables that no notebook writes: the benchmarks, each made by its own module.
BENCHMARKS = {"walker": "rkstudy/walk/bench.py", "make_test": "rkstudy/tables/bench.py",
              "test_fast": "rkstudy/tables/tier_bench.py",
              "reproduce": "rkstudy/tables/reproduce.py"}
# Rows appended one run at a time by `rkstudy board run <family>`: each row is its own run.
BOARD = "board"

# What the simulator measured: sim_* and simulator_* (its scores, output statistics, non-finite
# counts, run times), but not sim_counts, how many inputs were simulated (0 when none was).
SIMULATOR_COLUMN = re.compile(r"^(sim|simulator)_(?!counts$)\w+$")
# Unit suffixes by dimension, as a factor to the dimension's base unit (bytes, seconds).
UNIT_SUFFIX = {"bytes": ("bytes", 1.0), "gb": ("bytes", 1e9), "gib": ("bytes", 2.0**30), "mb": ("bytes", 1e6),
               "mib": ("bytes", 2.0**20), "s": ("seconds", 1.0), "ms": ("seconds", 1e-3)}
# How a `unit` cell spells the unit of a column suffix.
UNIT_NAME = {"gb": "GB", "gib": "GiB", "mb": "MB", "mib": "MiB", "s": "s", "ms": "ms", "db": "dB"}
STUDY_CALL = re.compile(r"""\bStudy\(\s*["']([A-Za-z0-9_]+)["']""")


@dataclass(frozen=True)
class Problem:
    kind: str
    path: str                     # repository-relative table (or study folder)
    message: str
    files: tuple[str, ...] = field(default=())  # for stale: the producing files that changed

    def line(self) -> str:
        return f"{self.path}: {self.kind}: {self.message}"

    def to_json(self) -> dict:
        out = {"kind": self.kind, "path": self.path, "message": self.message}
        if self.files:
            out["files"] = list(self.files)
        return out


# --- git -------------------------------------------------------------------------------------------
class Git:
    def __init__(self, repo: Path):
        self.repo = Path(repo)
        self._resolved: dict[str, str | None] = {}

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=self.repo, capture_output=True, text=True, timeout=60)

    def resolve(self, commit: str) -> str | None:
        """The full hash of `commit`, or None when the repository has no such commit."""
        if commit not in self._resolved:
            ok = re.fullmatch(r"[0-9a-f]{7,40}", commit) is not None
            proc = self.run("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}") if ok else None
            self._resolved[commit] = proc.stdout.strip() if proc is not None and proc.returncode == 0 else None
        return self._resolved[commit]

    def is_ancestor(self, full: str) -> bool:
        return self.run("merge-base", "--is-ancestor", full, "HEAD").returncode == 0

    def changed(self, full: str, paths: list[str]) -> list[str]:
        if not paths:
            return []
        proc = self.run("diff", "--name-only", full, "HEAD", "--", *paths)
        return sorted(line for line in proc.stdout.splitlines() if line)


# --- producing code -----------------------------------------------------------------------------------
def code_cells(notebook: Path) -> list[str]:
    """The code cells of a notebook, without IPython magics (which ast cannot parse)."""
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    cells = []
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "code":
            src = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
            cells.append("\n".join(line for line in src.splitlines() if not line.lstrip().startswith(("%", "!"))))
    return cells


def notebook_studies(repo: Path) -> dict[str, list[str]]:
    """{study: [notebooks/<file>, ...]}: the notebooks whose code makes `Study("<study>", ...)`."""
    out: dict[str, list[str]] = defaultdict(list)
    for nb in sorted((Path(repo) / "notebooks").glob("*.ipynb")):
        for cell in code_cells(nb):
            for study in STUDY_CALL.findall(cell):
                if f"notebooks/{nb.name}" not in out[study]:
                    out[study].append(f"notebooks/{nb.name}")
    return dict(out)


def _module_file(repo: Path, module: str) -> str | None:
    parts = module.split(".")
    for rel in (Path(*parts).with_suffix(".py"), Path(*parts) / "__init__.py"):
        if (repo / rel).is_file():
            return rel.as_posix()
    return None


def _own_name(node: ast.JoinedStr, own: str) -> str | None:
    """The module an f-string on `__name__` names: f"{__name__}.rules" -> own.rules; f"{__name__}.{m}" (a
    package importing its submodules by computed names, as a registry of rule modules does) -> own.* (all
    of them); None for any other f-string."""
    values = node.values
    if not own or not values or not (isinstance(values[0], ast.FormattedValue)
                                     and isinstance(values[0].value, ast.Name) and values[0].value.id == "__name__"):
        return None
    rest = values[1:]
    if all(isinstance(v, ast.Constant) for v in rest):
        suffix = "".join(str(v.value) for v in rest)
        return own + suffix if re.fullmatch(r"(\.\w+)*", suffix) else None
    return own + ".*"


@lru_cache(maxsize=4096)
def _imports(code: str, package: str, own: str = "") -> frozenset[str]:
    """Every rkstudy module `code` names: imports (relative ones resolved against `package`), string
    constants naming a module, as `python -m rkstudy.x` children and "module:function" jobs do, and
    f-strings on `__name__` (`own`, the code's module): a package that imports its own submodules by
    computed names names them all ("pkg.*"). Cached by the text: one check reads each module once for
    every study that imports it."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return frozenset()
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            m = re.fullmatch(r"(rkstudy(?:\.\w+)+)(?::\w+)?", node.value)
            if m:
                out.add(m.group(1))
        elif isinstance(node, ast.JoinedStr):
            named = _own_name(node, own)
            if named:
                out.add(named)
    return frozenset(m for m in out if m == "rkstudy" or m.startswith("rkstudy."))


# The command-line dispatcher: counted, not followed. Each handler imports its own command's code,
# so following them would make every study depend on every command; the notebooks call it only in
# board cells, whose rows go to results/board/.
DISPATCHERS = ("rkstudy.cli", "rkstudy.__main__")


def import_closure(repo: Path, sources: list[tuple[str, str]]) -> set[str]:
    """Repository-relative files of every rkstudy module reachable by import from `sources`
    ((code, package it lives in) pairs), parents' __init__.py included: importing a.b runs a."""
    repo = Path(repo)
    seen: set[str] = set()
    todo = [(code, package, "") for code, package in sources]
    while todo:
        code, package, own = todo.pop()
        found = set(_imports(code, package, own))
        for module in sorted(m for m in found if m.endswith(".*")):
            found.discard(module)
            folder = repo.joinpath(*module[:-2].split("."))
            found |= {f"{module[:-2]}.{f.stem}" for f in sorted(folder.glob("*.py")) if f.stem != "__init__"}
        for module in found:
            parts = module.split(".")
            for i in range(1, len(parts) + 1):
                name = ".".join(parts[:i])
                rel = _module_file(repo, name)
                if rel is None or rel in seen:
                    continue
                seen.add(rel)
                if name in DISPATCHERS:
                    continue
                is_package = rel.endswith("__init__.py")
                todo.append(((repo / rel).read_text(encoding="utf-8"), name if is_package else name.rpartition(".")[0],
                             name))
    return seen


def producing_code(repo: Path, study: str, table: str | None = None) -> list[str] | None:
    """Files whose change makes `study`'s tables stale: its family folder, the modules its family
    package and its notebooks import, the notebooks, and data/. None when nothing is known to write it."""
    repo = Path(repo)
    sources: list[tuple[str, str]] = []
    paths: set[str] = {"data"}
    if study == "benchmarks":
        module = BENCHMARKS.get(table or "")
        if module is None:
            return None
        paths.add(module)
        sources.append(((repo / module).read_text(encoding="utf-8") if (repo / module).is_file() else "",
                        "rkstudy"))
    else:
        family = repo / "rkstudy" / "families" / study
        notebooks = notebook_studies(repo).get(study, [])
        if not notebooks and not (study == BOARD or family.is_dir()):
            return None
        if study == BOARD:
            family = repo / "rkstudy" / "families" / (table or "")
            sources.append(("import rkstudy.board.run", "rkstudy"))
        if family.is_dir():
            paths.add(family.relative_to(repo).as_posix())
            sources += [(f"import rkstudy.families.{family.name}.{f.stem}", "rkstudy")
                        for f in sorted(family.glob("*.py")) if f.stem != "__init__"]
            sources.append((f"import rkstudy.families.{family.name}", "rkstudy"))
        for nb in notebooks:
            paths.add(nb)
            sources += [(cell, "rkstudy") for cell in code_cells(repo / nb)]
    paths |= import_closure(repo, sources)
    return sorted(paths)


# --- rows ---------------------------------------------------------------------------------------------
def _float(text: str) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _half_step(text: str) -> float:
    """Half the last written digit of `text` (its rounding error): "2.65" -> 0.005, "3e+06" -> 5e5."""
    mantissa, _, exponent = text.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 0.5 * 10.0 ** (-decimals + (int(exponent) if exponent else 0))


def _ranges(rows: list[int]) -> str:
    """[1, 2, 3, 7] -> "1-3, 7" (row numbers as in the CSV, the header being row 0)."""
    spans, start = [], None
    for i, r in enumerate(rows):
        if start is None:
            start = r
        if i + 1 == len(rows) or rows[i + 1] != r + 1:
            spans.append(f"{start}" if start == r else f"{start}-{r}")
            start = None
    return ", ".join(spans)


def where_problems(row: dict, under_board: bool) -> list[str]:
    """Why `row`'s where/target cannot be what made its numbers (empty when they can)."""
    where, target = row.get("where", ""), row.get("target", "")
    out = []
    if where not in WHERE:
        out.append(f"where={where!r} is none of {', '.join(WHERE)}")
    if target not in TARGETS:
        out.append(f"target={target!r} is none of {', '.join(TARGETS)}")
    sim = [c for c in row if SIMULATOR_COLUMN.match(c) and row[c] not in ("", None)]
    if sim and where != "simulator":
        out.append(f"where={where} beside simulator output in {', '.join(sim)}; stamp the row with the "
                   "simulator runner (or split the simulator score into its own row)")
    if where == "fp32" and target != "none":
        out.append(f"where=fp32 with target={target}: onnxruntime on the host runs for no SoC; use target none")
    if where in ("simulator", "board", "replay") and target == "none":
        out.append(f"where={where} with target=none: a {where} run is for one SoC; stamp it with its runner")
    if where in ("board", "replay") and not under_board:
        out.append(f"where={where} outside results/board/: board and replay rows are written by "
                   "`rkstudy board run` only")
    return out


def unit_problems(row: dict) -> list[str]:
    """Columns of one quantity in two units that do not convert into each other (engine_bytes and
    engine_mb; x_gb and x_gib; x_s and x_ms), and a `unit` cell naming another unit than the
    unit-suffixed column holding the same number as `measured`/`value`."""
    out = []
    by_stem: dict[str, list[tuple[str, str, float]]] = defaultdict(list)
    for col, text in row.items():
        stem, _, suffix = col.rpartition("_")
        value = _float(text)
        if stem and suffix in UNIT_SUFFIX and value is not None and col not in STAMP:
            by_stem[stem].append((col, text, value))
    for cols in by_stem.values():
        for i, (a, ta, va) in enumerate(cols):
            for b, tb, vb in cols[i + 1:]:
                (da, fa), (db, fb) = UNIT_SUFFIX[a.rpartition("_")[2]], UNIT_SUFFIX[b.rpartition("_")[2]]
                if da != db or fa == fb:
                    continue
                tolerance = _half_step(ta) * fa + _half_step(tb) * fb + 1e-9 * max(abs(va * fa), abs(vb * fb))
                if abs(va * fa - vb * fb) > tolerance:
                    out.append(f"{a}={ta} and {b}={tb} are one quantity and do not convert "
                               f"({ta} {a.rpartition('_')[2]} = {va * fa / fb:.6g} {b.rpartition('_')[2]})")
    unit = (row.get("unit") or "").strip()
    number = next((row[c] for c in ("measured", "value") if _float(row.get(c)) is not None), None)
    if unit and number is not None:
        spelled = unit.split("/")[0].strip()
        for col, text in row.items():
            suffix = col.rpartition("_")[2]
            if col in ("measured", "value") or suffix not in UNIT_NAME or _float(text) != _float(number):
                continue
            if spelled in UNIT_NAME.values() and spelled != UNIT_NAME[suffix]:
                out.append(f"unit={unit} for {number}, which is {col} ({UNIT_NAME[suffix]})")
    return out


# --- the check ------------------------------------------------------------------------------------------
def _commit_problems(git: Git, commit: str, path: str, rows: str) -> list[Problem]:
    where = f"rows {rows}" if rows else "headlines"
    if commit.endswith("-dirty"):
        return [Problem("dirty", path, f"{where} stamped {commit}: made from a tree with uncommitted code; "
                        "rerun them from a clean tree")]
    full = git.resolve(commit)
    if full is None:
        return [Problem("unknown-commit", path, f"{where} stamped {commit!r}, which this repository does not have; "
                        "rerun them (`make reproduce`)")]
    if not git.is_ancestor(full):
        return [Problem("not-ancestor", path, f"{where} stamped {commit}, which HEAD does not descend from; "
                        "rerun them at this branch's code")]
    return []


def check(repo: Path, root: Path | None = None) -> tuple[list[Problem], dict]:
    """The problems in the result tree `root` (default `<repo>/results`), and what was read."""
    repo = Path(repo)
    root = Path(root) if root is not None else repo / "results"
    git = Git(repo)
    problems: list[Problem] = []
    counts = {"tables": 0, "rows": 0, "figures": 0, "studies": 0}
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and p.name != "notebooks"):
        study = folder.name
        tables = sorted(folder.glob("*.csv"))
        if not tables:
            continue
        counts["studies"] += 1
        counts["figures"] += len(list((folder / FIGURES).glob("*.png")))
        no_machine: list[str] = []  # tables made before rows named their machine
        # study (or, for benchmarks and board tables, the table) -> {commit: [(table, rows)]}
        units: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
        for csv_path in tables:
            rel = csv_path.relative_to(repo).as_posix() if csv_path.is_relative_to(repo) else str(csv_path)
            counts["tables"] += 1
            with open(csv_path, newline="", encoding="utf-8") as fh:
                reader = csv.DictReader(fh)
                columns = reader.fieldnames or []
                rows = list(reader)
            counts["rows"] += len(rows)
            missing = [c for c in STAMP if c not in columns]
            if missing:
                problems.append(Problem("unstamped", rel, f"no {', '.join(missing)} column; write it with "
                                        "rkstudy.tables.results.write_table from stamped rows"))
                continue
            unit = study if study not in ("benchmarks", BOARD) else f"{study}/{csv_path.stem}"
            absent = [c for c in MACHINE if c not in columns]
            if absent:
                no_machine.append(csv_path.stem)
            by_commit: dict[tuple[str, bool], list[int]] = defaultdict(list)
            detail: dict[tuple[str, str], list[int]] = defaultdict(list)
            for n, row in enumerate(rows, start=1):
                empty = [c for c in STAMP if not row.get(c)]
                if empty:
                    fix = f"no {', '.join(empty)}; pass the row through rkstudy.tables.results.stamp()"
                    detail[("unstamped", fix)].append(n)
                    continue
                carried = bool(row.get(CARRIED))
                by_commit[(row["commit"], carried)].append(n)
                for message in where_problems(row, under_board=study == BOARD):
                    detail[("where", message)].append(n)
                for message in unit_problems(row):
                    detail[("unit", message)].append(n)
                if not absent and not all(row.get(c) for c in MACHINE):
                    detail[("no-machine", "no machine recorded (carried from a run that did not record it, or "
                            "written without rkstudy.tables.results.stamp()); rerun it")].append(n)
            for (kind, message), numbers in detail.items():
                problems.append(Problem(kind, rel, f"rows {_ranges(numbers)}: {message}"))
            for (commit, carried), numbers in sorted(by_commit.items()):
                problems += _commit_problems(git, commit, rel, _ranges(numbers))
                if not carried:
                    units[unit][commit].append(rel)
        if no_machine:
            label = _rel(repo, folder)
            shown = ", ".join(no_machine[:6]) + (f" and {len(no_machine) - 6} more" if len(no_machine) > 6 else "")
            problems.append(Problem("no-machine", label, f"{len(no_machine)} of {len(tables)} tables ({shown}) have no "
                                    f"{', '.join(MACHINE)} columns: made before rows named the machine that computed "
                                    "them, so a value that moves on a rerun elsewhere cannot be told a host change "
                                    "from a code change; rerun the study"))
        headlines = folder / "headlines.json"
        recorded = json.loads(headlines.read_text(encoding="utf-8")) if headlines.is_file() else None
        if recorded is not None:
            commit = recorded.get("commit", "")
            rel = headlines.relative_to(repo).as_posix() if headlines.is_relative_to(repo) else str(headlines)
            problems += _commit_problems(git, commit, rel, "")
            units[study][commit].append(rel)
        for figure_problem, commit, rel in figure_problems(repo, folder, recorded):
            if figure_problem is not None:
                problems.append(figure_problem)
            if commit:
                problems += _commit_problems(git, commit, rel, "")
                units[study][commit].append(rel)
        for unit, commits in sorted(units.items()):
            label = f"results/{unit}" if root == repo / "results" else str(root / unit)
            if len(commits) > 1 and study != BOARD:
                listing = "; ".join(f"{c} ({len(t)} table{'s' * (len(t) > 1)})" for c, t in sorted(commits.items()))
                problems.append(Problem("mixed-commits", label, f"stamped by {len(commits)} commits: {listing}; "
                                        "one run of its producer writes them all (`make reproduce STUDY=...`)"))
            paths = producing_code(repo, study, unit.partition("/")[2] or None)
            if paths is None:
                problems.append(Problem("no-producer", label, "no notebook makes this study and no benchmark "
                                        "writes it; make it a study step or remove it"))
                continue
            for commit in sorted(commits):
                full = git.resolve(commit) if not commit.endswith("-dirty") else None
                if full is None:
                    continue
                changed = git.changed(full, paths)
                if changed:
                    shown = ", ".join(changed[:8]) + (f" and {len(changed) - 8} more" if len(changed) > 8 else "")
                    problems.append(Problem("stale", label, f"stamped {commit}, and {len(changed)} producing file"
                                            f"{'s' * (len(changed) > 1)} changed since: {shown}; rerun it",
                                            tuple(changed)))
    return problems, counts


def _rel(repo: Path, path: Path) -> str:
    return path.relative_to(repo).as_posix() if path.is_relative_to(repo) else str(path)


def _named_in_notebooks(repo: Path, study: str) -> set[str]:
    """Every string constant in the code cells of the notebooks that make `study`: a figure name no
    notebook of the study names cannot be drawn by it."""
    names: set[str] = set()
    for nb in notebook_studies(repo).get(study, []):
        for cell in code_cells(Path(repo) / nb):
            try:
                tree = ast.parse(cell)
            except SyntaxError:
                continue
            names.update(n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str))
    return names


def drawn(recorded: dict | None) -> dict[str, str] | None:
    """{figure name: sha256} the run that wrote a study's headlines.json drew, or None when that run did
    not record its figures (made before figures were stamped)."""
    if recorded is None or not isinstance(recorded.get("figures"), dict):
        return None
    return recorded["figures"]


def orphan_figures(folder: Path) -> list[Path]:
    """The PNGs under `<folder>/figures/` that the study's last run did not draw (by the list it recorded in
    headlines.json); none when it recorded no list."""
    headlines = Path(folder) / "headlines.json"
    listed = drawn(json.loads(headlines.read_text(encoding="utf-8"))) if headlines.is_file() else None
    if listed is None:
        return []
    return [p for p in sorted((Path(folder) / FIGURES).glob("*.png")) if p.stem not in listed]


def figure_problems(repo: Path, folder: Path, recorded: dict | None) -> list[tuple[Problem | None, str, str]]:
    """(problem or None, the commit its stamp names, the figure's path) for every figure of the study in
    `folder`, and a problem for each figure its last run listed that is not there; `recorded` is the
    study's headlines.json (None when there is none)."""
    listed = drawn(recorded)
    run = (recorded or {}).get("commit", "")
    names = None
    out: list[tuple[Problem | None, str, str]] = []
    pngs = sorted((Path(folder) / FIGURES).glob("*.png"))
    for png in pngs:
        rel = _rel(repo, png)
        stamp = figure_stamp(png)
        commit = stamp.get("commit", "")
        if listed is not None and png.stem not in listed:
            out.append((Problem("figure-orphan", rel, f"the study's last run ({run}) drew no figure {png.stem!r}: no "
                                "current run draws it; `make reproduce` removes it"), "", rel))
            continue
        if listed is None:
            names = _named_in_notebooks(repo, folder.name) if names is None else names
            if png.stem not in names:
                out.append((Problem("figure-orphan", rel, f"no notebook of {folder.name} names a figure {png.stem!r}: "
                                    "no current run draws it; `make reproduce` removes it"), "", rel))
                continue
        if not commit:
            out.append((Problem("figure-unstamped", rel, "no stamp in the PNG (drawn before figures were stamped, or "
                                "not by rkstudy.tables.results.save_figure): which run drew it is unknown; rerun the "
                                "study"), "", rel))
            continue
        if listed is None:
            out.append((Problem("figure-stale", rel, f"drawn at {commit}, but the study's headlines list no figures: "
                                "the run that made them is not the one that drew it; rerun the study"), commit, rel))
        elif commit != run or listed[png.stem] != _digest(png):
            why = (f"drawn at {commit}, the study's last run was {run}" if commit != run else
                   "its bytes are not the ones the study's last run recorded (replaced since)")
            out.append((Problem("figure-stale", rel, f"{why}; rerun the study"), commit, rel))
        else:
            out.append((None, commit, rel))
    present = {p.stem for p in pngs}
    for name in sorted(set(listed or ()) - present):
        out.append((Problem("figure-missing", _rel(repo, Path(folder) / FIGURES / f"{name}.png"),
                            f"the study's last run ({run}) drew it, and it is not there; rerun the study"), "", ""))
    return out


def _digest(path: Path) -> str:
    from .results import file_digest

    return file_digest(path)


def summary(problems: list[Problem], counts: dict) -> str:
    figures = f", {counts['figures']} figures" if counts.get("figures") else ""
    read = f"{counts['tables']} tables, {counts['rows']} rows{figures} in {counts['studies']} studies"
    if not problems:
        return (f"results check: {read}: every row and figure is stamped by a clean ancestor commit whose code is "
                "HEAD's, on a named machine")
    kinds = defaultdict(int)
    for p in problems:
        kinds[p.kind] += 1
    by_kind = ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))
    return f"results check: {len(problems)} problems in {read} ({by_kind})"


def main(repo: Path, root: Path | None = None, as_json: bool = False) -> int:
    problems, counts = check(repo, root)
    if as_json:
        print(json.dumps({"problems": [p.to_json() for p in problems], **counts}, indent=1))
    else:
        for p in problems:
            print(p.line())
        print(summary(problems, counts))
    return 1 if problems else 0
