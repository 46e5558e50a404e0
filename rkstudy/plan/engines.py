"""A plan's NPU artifacts as engines: each checked against its stage contract before anything runs,
and opened on the runtime the run asked for.

Three runtimes run an NPU component:
* rknnlite: RKNNLite on a board (the replay double of it in CI, whose rows say `replay`);
* simulator: the toolkit's PC simulator, built from the engine's own graph (host only);
* onnx: the engine's own graph in onnxruntime fp32, which says what the plan does before any fp16 (host only).
The engine's own graph is the stage-1 ONNX its contract was compiled from (the contract names it by
file and digest); the host runtimes find it beside the engine. On the host an artifact may also be that
graph itself (a produced .onnx, its contract in its metadata), so a plan runs before any engine is built;
the simulator then builds it for rk3588. A board takes engines only.

Before a run: the contract is present and valid, the engine's bytes are unchanged since conversion, it
is an engine of the component's family, compiled for this board's SoC (on a board) by a toolkit no newer
than this board's librknnrt, and carved from the model the run speaks with. A refusal is one line naming
the command that makes a matching engine (EngineMismatch, exit 2).

Board side: numpy; RKNNLite, onnxruntime or the toolkit (host) at call time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..board import sysfs
from ..board.runner import board_available
from ..cache import sha256_file
from ..contract import Contract, for_engine
from ..errors import BoardUnavailable, EngineMismatch, UsageError

BOARD, SIMULATOR, ONNX = "rknnlite", "simulator", "onnx"
RUNTIMES = (BOARD, SIMULATOR, ONNX)
HOST_RUNTIMES = (SIMULATOR, ONNX)


@dataclass(frozen=True)
class Engine:
    """One NPU artifact: the engine file, its checked contract, and (host runtimes) the graph it was
    compiled from."""

    path: Path
    contract: Contract
    graph: Path | None = None

    def to_json(self) -> dict:
        return {"path": str(self.path.resolve()), "graph": str(self.graph.resolve()) if self.graph else None}

    @property
    def label(self) -> str:
        digest = self.contract.engine.sha256 if self.contract.engine else sha256_file(self.path)
        return f"{self.path.name}:{digest[:12]}"


def on_board() -> bool:
    return board_available()[0]


def choose_runtime(runtime: str | None, npu_components: list[str], artifacts: Sequence[str] = ()) -> str:
    """The runtime of the plan's NPU components: RKNNLite on a board; on the host the one --runtime names,
    or, without it, the one the plan's `artifacts` allow: compiled engines run through the PC simulator (the
    only host runtime that runs what was compiled), produced graphs in onnxruntime (the graph itself, no
    compile). A plan on the CPU path alone needs none and takes any. RKNNLite asked for on a host is
    returned as asked: the caller checks the artifacts first, then refuses (refuse_off_board)."""
    board = on_board()
    if runtime in HOST_RUNTIMES and board:
        raise UsageError(f"--runtime {runtime} is a host runtime (the engine's own graph in "
                         f"{'the toolkit simulator' if runtime == SIMULATOR else 'onnxruntime'}); on a board the "
                         "plan's engines run on the NPU: omit --runtime")
    if runtime is None and npu_components and not board:
        runtime = ONNX if any(is_graph(a) for a in artifacts) else SIMULATOR
        print(f"no --runtime on this host: {', '.join(npu_components)} "
              + ("run through the PC simulator, the plan naming compiled engines (--runtime onnx runs their graphs "
                 "in onnxruntime)" if runtime == SIMULATOR else
                 "run in onnxruntime, the plan naming produced graphs (--runtime simulator compiles and simulates "
                 "them)"), flush=True)
    return runtime or BOARD


def refuse_off_board(runtime: str, npu_components: list[str]) -> None:
    """RKNNLite asked for where there is no board: refused once the plan's artifacts have been checked, naming
    the host runtimes."""
    if runtime == BOARD and npu_components and not on_board():
        why = board_available()[1]
        raise BoardUnavailable(f"--runtime {BOARD}: the plan puts {', '.join(npu_components)} on the NPU, and this "
                               f"machine has no board ({why[0].lower() + why[1:]}); on the host pass --runtime "
                               "simulator (the toolkit's simulator) or --runtime onnx (the engines' own graphs in "
                               "onnxruntime), or omit it")


def stage1_graph(path: Path, contract: Contract) -> Path:
    """The graph the engine was compiled from, beside it, with the digest the contract names."""
    named = contract.onnx.file if contract.onnx else "?"
    return contract.graph_beside(path, f"--runtime simulator and onnx run the graph {path.name} was compiled from, "
                                       f"{named}, and it is not beside the engine; put it there (stage 1 writes it: "
                                       f"`{contract.remake}`)")


def check_on_board(contract: Contract) -> None:
    """What only a board can answer, before any init: that its SoC runs the engine's target and its
    librknnrt the toolkit that compiled it (rkstudy.board.compat)."""
    from ..board.compat import check_engine

    check_engine(contract)


STAGE1_TARGET = "rk3588"  # what the simulator builds a stage-1 graph artifact for (the document's board)


def is_graph(path: Path | str) -> bool:
    return Path(path).suffix.lower() == ".onnx"


def contract_of(path: Path | str) -> Contract:
    """The contract of an artifact: beside an engine, or in a produced graph's metadata (read on the wire)."""
    if not is_graph(path):
        return for_engine(path)
    from ..contract import from_metadata
    from ..runtime import protowire

    return from_metadata(protowire.metadata(Path(path).read_bytes()), where=Path(path).name,
                         remake="the family's stage-1 command (rkstudy <model> <stage> --skip-rknn)")


def load(path: Path, *, family: str, runtime: str, source: Path | None = None, remake: str | None = None) -> Engine:
    """`path` checked as an engine of `family` for this run (see the module docstring)."""
    if is_graph(path):
        if not Path(path).is_file():
            raise EngineMismatch(f"no graph at {path}")
        contract = contract_of(path)
        if runtime == BOARD:
            from dataclasses import replace

            from ..contract import Digest

            named = replace(contract, onnx=Digest(Path(path).name, ""))
            raise EngineMismatch(f"{Path(path).name} is a produced graph, not an engine: the NPU runs engines; "
                                 f"convert it with `{named.remake_engine(target=sysfs.soc())}` on the host")
        contract.check_family(family, remake)
        if source is not None:
            contract.check_source(source)
        return Engine(Path(path), contract, Path(path))
    soc = sysfs.soc() if runtime == BOARD else None
    if runtime == BOARD and soc is None:
        raise BoardUnavailable(f"cannot tell this board's SoC: no rockchip,rkXXXX entry in {sysfs.COMPATIBLE}")
    contract = for_engine(path, family=family, soc=soc, source=source, remake=remake)
    if runtime == BOARD:
        check_on_board(contract)
        return Engine(Path(path), contract)
    return Engine(Path(path), contract, stage1_graph(Path(path), contract))


def open_runner(engine: dict, runtime: str, cores: str = "0_1_2"):
    """A runner for `engine` (Engine.to_json) on `runtime`, in the process that runs the synthesis."""
    contract = contract_of(engine["path"])
    if runtime == BOARD:  # through the board gate's opener: its calls are scored against fp32 after the run
        from ..board.gate import open_engine

        return open_engine(engine["path"], contract.input_names, cores=cores, shape_sets=contract.shape_sets)
    if runtime == SIMULATOR:
        from ..toolkit.simulator import SimulatorRunner

        sets = None
        if len(contract.shape_sets) > 1:
            sets = [{t.name: list(s) for t, s in zip(contract.inputs, one)} for one in contract.shape_sets]
        return SimulatorRunner(engine["graph"], contract.target or STAGE1_TARGET,
                               **({"shape_sets": sets} if sets else {}))
    from ..runtime import OrtRunner

    runner = OrtRunner(engine["graph"])
    # a compiled engine's graph runs here; its contract carries what stage 2 predicted for it on the NPU of
    # the SoC it was compiled for
    runner.recorded_prediction = ((contract.build or {}).get("npu_predicted") or {}).get(cores)
    runner.compiled_for = contract.target or ""  # its own `target` stays none: onnxruntime runs for no SoC
    return runner


def calls_now(runners: dict[str, list]) -> dict[int, int]:
    """Each open runner's calls so far, by runner: taken when the first sample leaves, it tells
    predicted_on_npu which calls stood between the text and the first audio."""
    return {id(r): r.calls for opened in runners.values() for r in opened}


def predicted_on_npu(runners: dict[str, list], runtime: str, cores: str = "0_1_2",
                     first: dict[int, int] | None = None) -> dict[str, dict]:
    """What each NPU component's calls in this run would take on the NPU of its engines' SoC, by the NPU cost
    model (rkstudy.toolkit.cost): every engine's predicted ms per call times the calls it served, summed per
    component with its terms. `first` (calls_now at the first sample out) prices the calls made before the
    first audio the same way: "first_ms" and "first_calls" (a runner opened after that moment made none).
    `runners`: component -> the runners it opened (open_runner). The simulator
    builds the engine here and the model reads the compiler's layer table from that build; onnxruntime runs a
    compiled engine's graph and takes the prediction stage 2 recorded in the engine's contract; a produced
    graph in onnxruntime, or an engine from before the contract recorded one, gets no value and the reason. A
    multi-shape engine is priced at the shape set its build printed (its largest).

    Returns {component: {"ms": float | None, "terms": {term: ms}, "calls": int, "why": str,
    "first_ms": float | None, "first_calls": int | None, "soc": the SoCs its engines were built for}}: a run in
    onnxruntime is placed on no SoC, and its prediction is for the SoC each engine was compiled for."""
    out = {}
    for component, opened in runners.items():
        if not opened:
            continue
        if runtime == BOARD:
            out[component] = {"ms": None, "terms": {}, "calls": 0, "why": "a board run measures its NPU times",
                              "first_ms": None, "first_calls": None, "soc": ""}
            continue
        total, terms, calls, why, first_ms, first_calls = 0.0, {}, 0, "", 0.0, 0
        for runner in opened:
            ms, per_call, cannot = _per_call(runner, runtime, cores)
            calls += runner.calls
            before = (first or {}).get(id(runner), 0)
            first_calls += before
            if ms is None:
                why = why or cannot
                continue
            total += ms * runner.calls
            first_ms += ms * before
            for k, v in per_call.items():
                terms[k] = terms.get(k, 0.0) + v * runner.calls
        known = not why and first is not None
        # the SoC each engine was built for: the simulator's own target, or the one a compiled engine's
        # contract names when onnxruntime runs its graph
        socs = ",".join(dict.fromkeys(t for r in opened
                                      if (t := getattr(r, "compiled_for", "") or getattr(r, "target", "")) != "none"
                                      and t))
        out[component] = {"ms": None if why else total, "terms": {} if why else terms, "calls": calls, "why": why,
                          "first_ms": first_ms if known else None, "first_calls": first_calls if known else None,
                          "soc": socs}
    return out


def _per_call(runner, runtime: str, cores: str) -> tuple[float | None, dict, str]:
    """(ms per call, its terms, why not) of one runner's engine."""
    if runtime == SIMULATOR:
        p = runner.report.prediction(cores)
        return p.ms, p.terms, p.cannot
    recorded = getattr(runner, "recorded_prediction", None)
    if recorded is None:
        return None, {}, ("--runtime onnx ran a produced graph (or an engine whose contract records no prediction), "
                          "which has no layer table to price: a compiled engine's contract carries its stage-2 "
                          "prediction, and --runtime simulator builds and prices a graph")
    return recorded["ms"], recorded["terms"], recorded["note"]


def children_peak_rss_mb(runners: dict[str, list]) -> float | str:
    """The simulator children's peak RSS summed (each child's own peak, read once it is closed: they live
    through the whole synthesis, so the sum bounds what they held together); "" where no runner has a child."""
    peaks = [r.peak_rss_mb for opened in runners.values() for r in opened if hasattr(r, "peak_rss_mb")]
    return round(sum(peaks), 1) if peaks else ""


def place() -> tuple[str, str]:
    """(where, target) of a run whose components all ran on the CPU: the board's (`board`, or `replay`
    under the test double of RKNNLite, never a board number) and its SoC on a board, fp32 on the host."""
    if not on_board():
        return "fp32", "none"
    from rknnlite.api import RKNNLite

    return ("replay" if getattr(RKNNLite, "IS_TEST_DOUBLE", False) else "board"), sysfs.soc() or "none"
