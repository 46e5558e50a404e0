"""The lint study's measurements (host): what notebook 06 calls.

Every graph the family studies compile, linted before and after the family's rewrite (raw slice
against produced slice, folded against rewritten), each family's graphs built by its own
`lint_graphs` hook (rkstudy.families.Family), and `rkstudy lint` run as a command on those
graphs (which the tests never see) to record its exit codes.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from ..tables.results import HOST
from . import Report, lint


@dataclass
class FamilyGraph:
    """One graph a family study compiles: which family and stage (raw / rewritten), the graph, the
    input shapes lint pins, and a real input for the fp16-range rules.

    Once linted the graph is stored (`store`: written to the cache by its bytes, `model` dropped) and
    read back by `graph()` when a later step builds it: every family's graphs held at once (the Kokoro
    and Qwen3 ones carry their weights) took the lint study's kernel to 11 GB."""

    family: str
    stage: str
    label: str
    model: onnx.ModelProto | None
    inputs: Mapping[str, tuple] = field(default_factory=dict)
    sample: Mapping[str, np.ndarray] | None = None
    path: Path | None = None
    nodes: int = 0

    def graph(self) -> onnx.ModelProto:
        return self.model if self.model is not None else onnx.load(str(self.path))

    def store(self) -> FamilyGraph:
        """Write the graph to the cache (content-keyed) and let go of it in memory."""
        from ..cache import cached_bytes

        if self.model is not None:
            self.nodes = len(self.model.graph.node)
            name = re.sub(r"[^A-Za-z0-9]+", "_", f"{self.family}_{self.stage}")[:60]
            self.path = cached_bytes("lint_graphs", name, self.model.SerializeToString(), ".onnx")
            self.model = None
        return self


def family_graphs(quick: bool) -> Iterator[FamilyGraph]:
    """Every registered family's lint graphs, in registry order (each family's `lint_graphs` hook
    decides what a quick run leaves out), one family at a time."""
    from ..registry import load_all

    for family in load_all().values():
        if family.lint_graphs:
            yield from family.resolve("lint_graphs")(quick)


def lint_family(graphs: Iterable[FamilyGraph], target: str = "rk3588") -> list[tuple[FamilyGraph, Report]]:
    """Lint each graph as it comes, then store it (FamilyGraph.store), so only the family whose hook is
    producing its graphs is in memory."""
    out = []
    for fg in graphs:
        report = lint(fg.graph(), fg.inputs, target=target, sample=fg.sample)
        out.append((fg.store(), report))
    return out


def summary_rows(linted) -> list[dict]:
    """One row per graph: severities counted, the codes that fired, the exit code `rkstudy lint` gives."""
    rows = []
    for fg, report in linted:
        by = Counter(f"{f.code} {f.severity}" for f in report.findings)
        nodes = fg.nodes or len(fg.graph().graph.node)
        rows.append({"family": fg.family, "stage": fg.stage, "graph": fg.label, "nodes": nodes,
                     **report.counts, "exit_code": report.exit_code,
                     "codes": ", ".join(f"{k} x{v}" if v > 1 else k for k, v in sorted(by.items())) or "-",
                     "target": report.target, "where": HOST.where})
    return rows


def finding_rows(linted) -> list[dict]:
    """Every finding of every graph (nodes counted, the first named)."""
    return [{"family": fg.family, "stage": fg.stage, "graph": fg.label, **f.row(), "target": report.target,
             "where": HOST.where} for fg, report in linted for f in report.findings]


def side_by_side(rows: list[dict]) -> list[dict]:
    """Raw against rewritten per family: the codes each stage leaves."""
    out = []
    for family in dict.fromkeys(r["family"] for r in rows):
        mine = [r for r in rows if r["family"] == family]
        for stage in ("raw", "rewritten"):
            these = [r for r in mine if r["stage"] == stage]
            out.append({"family": family, "stage": stage, "graphs": len(these),
                        "errors": sum(r["error"] for r in these), "warnings": sum(r["warning"] for r in these),
                        "exit_1": sum(r["exit_code"] == 1 for r in these),
                        "codes": "; ".join(f"{r['graph']}: {r['codes']}" for r in these)})
    return out


def one_per_verdict(linted) -> list[tuple[FamilyGraph, Report]]:
    """The first graph of each (family, stage, exit code): what the command is checked on in full mode.
    The command runs the API's own lint (tests/test_lint.py holds them equal on the rules' graphs), so a
    second graph with the same family, stage and verdict repeats a check already made (the long-axis
    lengths, the encoder widths); every family's raw and rewritten graphs, with their pins and samples,
    and every exit code each of them gives, are still run."""
    seen, out = set(), []
    for fg, report in linted:
        key = (fg.family, fg.stage, report.exit_code)
        if key not in seen:
            seen.add(key)
            out.append((fg, report))
    return out


def one_per_shape(linted) -> list[tuple[FamilyGraph, Report]]:
    """The first graph of each (family, stage, label with its numbers left out): what the compiler's
    placement is checked on in full mode. The same graph at another length or width (the long-axis
    probe at 4096 ... 65536, the encoder at widths 64 ... 192) lowers the same ops to the same places, and
    its build is the costly part (the 65536-frame probe floods REGTASK lines); every distinct graph of
    every family is still built once."""
    seen, out = set(), []
    for fg, report in linted:
        key = (fg.family, fg.stage, re.sub(r"\d+", "#", fg.label))
        if key not in seen:
            seen.add(key)
            out.append((fg, report))
    return out


def cli_exit_codes(linted, workdir) -> list[dict]:
    """`rkstudy lint` run as a command on each graph (saved under `workdir`), and on inputs it must refuse:
    a corrupt file, an unknown input name, a shape that does not parse. The exit code and the first line.

    The command runs in `workdir` on the files' own names, as a user runs it beside their model: the
    line it prints names the file, never this run's temporary folder (which differs every run)."""
    from ..atomic import save_onnx
    from ..paths import REPO

    rows = []
    workdir = Path(workdir)
    # the child imports this checkout's rkstudy whatever folder it runs in
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}

    def run(label: str, args: list[str], expected: int) -> None:
        args = [Path(a).name if Path(a).parent == workdir else a for a in args]
        proc = subprocess.run([sys.executable, "-m", "rkstudy", "lint", *args], capture_output=True, text=True,
                              timeout=1800, cwd=workdir, env=env)
        said = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        rows.append({"graph": label, "args": " ".join(a if not a.endswith((".onnx", ".npz")) else a.rsplit("/", 1)[-1]
                                                     for a in args[1:]),
                     "exit_code": proc.returncode, "expected": expected, "agrees": proc.returncode == expected,
                     "first_line": said[0] if said else "", "where": HOST.where, "target": "none"})

    first = None
    for k, (fg, report) in enumerate(linted):
        path = workdir / f"{fg.family}_{k}.onnx"
        save_onnx(fg.graph(), path)
        first = first or (path, fg)
        args = [str(path)] + [a for name, shape in fg.inputs.items()
                              for a in ("--input", f"{name}={'x'.join(map(str, shape))}")]
        if fg.sample is not None:  # the API's report ran the fp16 rules on it: so does the command
            np.savez(path.with_suffix(".npz"), **fg.sample)
            args += ["--sample", str(path.with_suffix(".npz"))]
        run(f"{fg.family}: {fg.label}", args, report.exit_code)
    path, fg = first
    corrupt = workdir / "corrupt.onnx"
    corrupt.write_bytes(path.read_bytes()[: path.stat().st_size // 3])
    run("corrupt copy of the first graph", [str(corrupt)], 2)
    run("unknown input name", [str(path), "--input", "no_such_input=1x2"], 2)
    run("a shape that does not parse", [str(path), "--input", f"{fg.graph().graph.input[0].name}=1xNx3"], 2)
    return rows
