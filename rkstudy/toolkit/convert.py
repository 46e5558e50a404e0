"""One engine path for every family (host): gate the simulator against fp32, and stage 2 (convert a
produced graph: compile, gate, write the compiled contract beside the engine).

Building is rkstudy.toolkit.build.build_engine (its BuildReport.row() is every family's build row); running
on a board is rkstudy.board.run. Families supply only their inputs and, where white noise is not a
valid input (token ids), a probe of their own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import gates, graph
from ..contract import Contract, from_metadata
from ..runtime import OrtRunner
from .build import BuildReport
from .engine_cache import name_key
from .log import parse_accuracy_analysis
from .simulator import SimulatorRunner

# Stage 2 of a decoder probed with white noise: the engine is alive (the fp16 noise floor sits at 22-36 dB on
# real decoders, a broken engine far below)
ALIVE_GATE = gates.ENGINE_FLOORS["white_noise"].gate()


@dataclass
class Comparison:
    """What simulator_vs_fp32 measured: one row per item scoring the simulator against fp32, the build,
    and both sides' outputs. (A bare simulator run, without the fp32 side, is rkstudy.toolkit.simulator.Simulated.)"""

    rows: list[dict]
    report: BuildReport
    fp32: list = field(default_factory=list)
    simulator: list = field(default_factory=list)
    seconds: list = field(default_factory=list)

    @property
    def worst_snr_db(self) -> float:
        return min((r["snr_db"] for r in self.rows), default=float("inf"))

    def score(self, row: dict, ref, test, target: str, keep: bool) -> None:
        """One item's row (stamped as the simulator's on `target`), and with `keep` both sides' outputs."""
        self.rows.append({**row, "where": SimulatorRunner.where, "target": target})
        if keep:
            self.fp32.append(ref)
            self.simulator.append(test)

    def check(self, gate: gates.Gate | None) -> Comparison:
        """Itself, once `gate` (if any) holds on the worst row's `snr_db` (GateFailed names both numbers)."""
        if gate is not None:
            target = self.report.target if self.report else "simulator"
            gate.check(self.worst_snr_db, context=f"{target} simulator vs fp32, worst of {len(self.rows)}")
        return self


def compare_outputs(ref: Sequence[np.ndarray], test: Sequence[np.ndarray], names: Sequence[str] | None = None) -> dict:
    """SNR, max |diff|, non-finite count and RMS ratio of each output pair, and the worst SNR."""
    row = {}
    names = names or [f"out{i}" for i in range(len(ref))]
    for name, a, b in zip(names, ref, test):
        row[f"{name}_snr_db"] = gates.snr_db(a, b)
        row[f"{name}_max_diff"] = float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
        row[f"{name}_nonfinite"] = gates.nonfinite_count(b)
    row["snr_db"] = min(row[f"{n}_snr_db"] for n in names)
    return row


def simulator_vs_fp32(onnx_path: Path | str, target: str, items: Iterable, *,
                      run: Callable | None = None, compare: Callable | None = None, out=None,
                      gate: gates.Gate | None = None, keep: bool = False, cache: bool = False,
                      **build_kwargs) -> Comparison:
    """Build `onnx_path` for `target` in a simulator child and run every item through the simulator
    and through onnxruntime fp32 on the same graph.

    `run(runner, item) -> list of outputs` says how an item runs (default: `runner.run(item)`; a
    family walks a latent through its sidecar here); `compare(ref, test, item) -> row` scores a
    pair (default: compare_outputs). Each row carries where/target from the simulator; with
    `gate`, the worst row's `snr_db` is checked (GateFailed names both numbers). `build_kwargs` go to
    the build (rkstudy.toolkit.build.EngineProcess: shapes, verbose for the layer table, regtask_limit, ...).

    With `cache` (plain items only, no `run`): the build is the engine cache's own (rkstudy.toolkit.
    engine_cache.engine_key; the engine, its log and its report land where build_engine reads them), and the
    simulator outputs are kept by the engine key and the items' bytes, so the same graph, target and
    inputs are built and simulated once, whoever asks (only the onnxruntime side runs again).
    """
    import time

    compare = compare or (lambda ref, test, item: compare_outputs(ref, test))
    if cache:
        if run is not None:
            raise ValueError("cache=True takes plain items (a walk through `run` is not cached)")
        return _simulated_once(Path(onnx_path), target, list(items), compare=compare, out=out, gate=gate,
                               keep=keep, **build_kwargs)
    run = run or (lambda runner, item: runner.run(item))
    ref_runner = OrtRunner(onnx_path)
    result = Comparison(rows=[], report=None)
    with SimulatorRunner(onnx_path, target, out=out, **build_kwargs) as sim:
        result.report = sim.report
        for item in items:
            ref = run(ref_runner, item)
            t0 = time.perf_counter()
            test = run(sim, item)
            result.seconds.append(time.perf_counter() - t0)
            result.score(compare(ref, test, item), ref, test, sim.target, keep)
    return result.check(gate)


def _simulated_once(onnx_path: Path, target: str, items: list, *, compare: Callable, out, gate, keep: bool,
                    **build_kwargs) -> Comparison:
    """simulator_vs_fp32 through the one simulator record (rkstudy.toolkit.simulator.simulate): the
    recorded outputs of the same engine key and input bytes when there are some, else one simulator
    child whose build is recorded as the engine's. Only the onnxruntime side runs again."""
    from .simulator import simulate

    if out is not None:
        raise ValueError("cache=True builds into the engine cache; drop `out` or build without the cache")
    sim = simulate(onnx_path, target, items, **build_kwargs)
    sim.report.raise_for_status()
    if sim.inference_error:
        raise RuntimeError(f"{target} simulator refused to run {onnx_path.name}: {sim.inference_error}")
    ref_runner = OrtRunner(onnx_path)
    result = Comparison(rows=[], report=sim.report, seconds=list(sim.run_s))
    for item, test in zip(items, sim.outputs):
        ref = ref_runner.run(item)  # the item as given: onnxruntime keeps integer inputs integer
        result.score(compare(ref, test, item), ref, test, target, keep)
    return result.check(gate)


@dataclass
class Analysis:
    """The toolkit's per-layer accuracy report (rknn.accuracy_analysis on the simulator): one row per
    layer (named by its output tensor), the build, and where the snapshot went."""

    rows: list[dict]
    report: BuildReport
    snapshot: Path

    @property
    def overflowed(self) -> list[str]:
        """Layers whose simulator output left the fp16 range ('q_inf' in the toolkit's report)."""
        return [r["layer"] for r in self.rows if r["overflow"]]


def accuracy_analysis(onnx_path: Path | str, target: str, feeds: dict, out_dir: Path | str | None = None,
                      **build_kwargs) -> Analysis:
    """Build `onnx_path` for `target` and run the toolkit's own per-layer report on the simulator
    (rknn.accuracy_analysis, target=None) for one input set: cosine and Euclidean error of every layer
    against the toolkit's fp32 golden run, accumulated ('entire') and alone ('single'), and 'q_inf'
    where a layer's range left fp16. This is the per-layer comparer; rkstudy does not write another."""
    from ..cache import cache_dir, digest
    from .build import EngineProcess

    onnx_path = Path(onnx_path)
    shapes = graph.input_shapes(onnx_path)
    missing = sorted(set(shapes) - set(feeds))
    if missing:
        raise ValueError(f"no input array for {', '.join(missing)}; accuracy_analysis needs one per graph input")
    key = digest(onnx_path, target, *[np.ascontiguousarray(feeds[n]).tobytes() for n in shapes])
    out = Path(out_dir) if out_dir else cache_dir("analysis") / f"{onnx_path.stem}-{target}-{key}"
    (out / "inputs").mkdir(parents=True, exist_ok=True)
    paths = []
    for i, name in enumerate(shapes):
        path = out / "inputs" / f"{i}.npy"
        np.save(path, np.asarray(feeds[name], np.float32))
        paths.append(str(path))
    snapshot = out / "snapshot"
    proc = EngineProcess(onnx_path, target, shapes, analysis={"inputs": paths, "output_dir": str(snapshot)},
                         log=out / "build.log", **build_kwargs)
    report = proc.wait_built().raise_for_status()
    return Analysis(rows=parse_accuracy_analysis(snapshot, Path(report.log).read_text(errors="replace")),
                    report=report, snapshot=snapshot)


def accuracy_analysis_many(onnx_path: Path | str, target: str, feeds: Sequence[dict], out_dir: Path | str,
                           **build_kwargs) -> list[list[dict]]:
    """accuracy_analysis on several input sets from one build (one child, the report run once per set):
    each set's rows, in order. A folder that already holds every set's report is read back, not rebuilt
    (the folder's name is the caller's content key)."""
    from .build import EngineProcess

    onnx_path, out = Path(onnx_path), Path(out_dir)
    shapes = graph.input_shapes(onnx_path)
    snapshots = [out / f"snapshot_{k}" for k in range(len(feeds))]
    log = out / "build.log"
    if not all((s / "error_analysis.txt").is_file() for s in snapshots) or not log.is_file():
        specs = []
        for k, feed in enumerate(feeds):
            missing = sorted(set(shapes) - set(feed))
            if missing:
                raise ValueError(f"no input array for {', '.join(missing)}; accuracy_analysis needs one per input")
            paths = []
            for i, name in enumerate(shapes):
                path = out / "inputs" / f"{k}_{i}.npy"
                path.parent.mkdir(parents=True, exist_ok=True)
                np.save(path, np.asarray(feed[name], np.float32))
                paths.append(str(path))
            specs.append({"inputs": paths, "output_dir": str(snapshots[k])})
        proc = EngineProcess(onnx_path, target, shapes, analysis=specs, log=log, **build_kwargs)
        proc.wait_built().raise_for_status()
    text = log.read_text(errors="replace")
    return [parse_accuracy_analysis(s, text) for s in snapshots]


def probe_feeds(contract: Contract, seed: int = 0) -> list[dict]:
    """One input set for a contract whose inputs are all floats: white noise on walked, padded and
    constant inputs, ones on masks, a zero cache on state inputs. Families with token inputs pass
    their own probe to convert()."""
    rng = np.random.default_rng(seed)
    feed = {}
    for t in contract.inputs:
        if t.dtype != "float32":
            raise ValueError(f"{t.name} is {t.dtype}: white noise is no valid input; pass a probe")
        if t.role == "mask":
            feed[t.name] = np.ones(t.shape, np.float32)
        elif t.role == "state":
            feed[t.name] = np.zeros(t.shape, np.float32)
        else:
            feed[t.name] = rng.standard_normal(t.shape).astype(np.float32)
    return [feed]


@dataclass
class Converted:
    engine: Path
    contract: Contract
    simulated: Comparison


def convert(onnx_path: Path | str, target: str, out: Path | str | None = None, *,
            probe: Callable[[Contract], list] | None = None, run: Callable | None = None,
            gate: gates.Gate = ALIVE_GATE, remake: str = "the family's stage-1 command",
            toolkit: str | None = None, shape_sets: Sequence[Mapping[str, Sequence[int]]] | None = None,
            quantize=None) -> Converted:
    """Stage 2 for every family: read the contract back out of the graph (restating nothing), build
    the engine and, in the same child, gate the simulator against fp32 on the probe inputs, then
    write the compiled contract (target, toolkit, graph and engine digests) beside the engine.
    `toolkit` ('2.3.2', for a board whose runtime is that version) builds in that version's
    environment (rkstudy.toolkit.envs.toolkit_env); the contract names the toolkit the build child imported.
    `shape_sets` ({input: shape} each, the contract's own shapes among them) makes one multi-shape
    engine (rkstudy.toolkit.build.shape_sets_for), probed at the contract's shapes; its contract lists the sets.
    `quantize` (a rkstudy.toolkit.calibration.Calibration: any dtype, algorithm, method and float16 tensors notebook
    08 measures) makes a quantized engine; its contract records what it computes in (`quantization`), and
    every walker and board run takes it as it takes an fp16 one (float32 in and out: the runtime casts)."""
    from .build import shape_sets_for

    onnx_path = Path(onnx_path)
    contract = from_metadata(graph.metadata(onnx_path), where=onnx_path.name, remake=remake)
    sets = shape_sets_for(shape_sets, contract.input_names) if shape_sets else []
    if sets:
        contract = contract.with_shapes([[s[n] for n in contract.input_names] for s in sets])
    engine = Path(out) if out else onnx_path.parent / contract.engine_name(
        target, name_key(onnx_path, toolkit, quantize, contract.input_names))
    items = (probe or probe_feeds)(contract)
    extra = {**({"shape_sets": sets} if sets else {}), **({"quantize": quantize} if quantize else {})}
    simulated = simulator_vs_fp32(onnx_path, target, items, run=run, out=engine, toolkit=toolkit, **extra)
    try:
        gate.check(simulated.worst_snr_db, context=f"{target} simulator vs fp32 on the probe")
    except gates.GateFailed:
        engine.unlink(missing_ok=True)  # an engine that failed its gate gets no contract and is not kept
        raise
    ship_graph(onnx_path, engine.parent)
    compiled = contract.compiled(target=target, toolkit=simulated.report.toolkit_version,  # the build's own
                                 onnx_path=onnx_path, engine_path=engine,
                                 quantization=quantize.record() if quantize else None,
                                 build=build_record(simulated.report, gate, simulated.worst_snr_db))
    compiled.write_beside(engine)
    return Converted(engine=engine, contract=compiled, simulated=simulated)


def build_record(report: BuildReport, gate: gates.Gate, simulator_db: float) -> dict:
    """What a board needs of the build (Contract.build): the REGTASK lines and their largest field value (the
    overflow the simulator cannot see), and the gate the simulator passed, with its floor and the worst SNR on
    the probe (None for an exact match)."""
    return {"regtask": int(report.regtask), "regtask_max_value": int(report.regtask_max), "gate": gate.name,
            "threshold_db": float(gate.threshold),
            "simulator_db": round(float(simulator_db), 2) if np.isfinite(simulator_db) else None,
            "npu_predicted": predicted_per_mask(report)}


def predicted_per_mask(report: BuildReport) -> dict:
    """The cost model's prediction per call under each core mask the runner takes, from this build's layer
    table: kept in the contract, so whoever runs the engine without its build log (onnxruntime on its graph,
    a board) can put the prediction beside what it measured. {mask: {"ms", "terms", "note"}}; ms None and
    the reason in note where the model cannot speak."""
    from .cost import MASK_CORES

    out = {}
    for mask in MASK_CORES:
        p = report.prediction(mask)
        ms = p.ms
        out[mask] = {"ms": None if ms is None else round(ms, 3),
                     "terms": {} if ms is None else {k: round(v, 3) for k, v in p.terms.items()},
                     "note": p.cannot}
    return out


def ship_graph(onnx_path: Path, folder: Path) -> Path:
    """The compiled graph beside the engine: a board gates the engine against it (onnxruntime fp32 on the same
    inputs) and the host runtimes run it, both finding it by the name and digest the contract records. A copy
    already there with the same bytes is kept; otherwise a hard link, or a copy where the folder is on another
    file system."""
    import os

    from .. import atomic
    from ..cache import sha256_file

    onnx_path, there = Path(onnx_path), Path(folder) / Path(onnx_path).name
    if there.exists() and (there.resolve() == onnx_path.resolve() or sha256_file(there) == sha256_file(onnx_path)):
        return there
    there.unlink(missing_ok=True)
    try:
        os.link(onnx_path, there)
    except OSError:
        atomic.write_bytes(there, onnx_path.read_bytes())
    return there
