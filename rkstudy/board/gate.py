"""The board gate: a run on a board scores each engine against the fp32 graph it was compiled from, and fails in
one line below the floor stage 2 held the simulator to.

Why a board needs one: the simulator cannot see what only a board shows. The Piper duration-encoder pull
request's first ladder scored 55.5-61.4 dB against fp32 in the simulator and 9.9-16 dB on the board (a
register-field overflow), NaN and ±65504 tails came from uninitialised pad memory, and the rel-logit chain
segfaulted the runtime. A board run that only times would write a results row from such an engine.

How: the measured run opens every engine through `open_engine`. While a gate is on, each call's outputs go to
a spool on disk in the child's temporary folder, so the row's peak RSS and times stay the run's own. After the
measurement the same job runs again with every engine replaced by the fp32 graph it was compiled from, in
onnxruntime on this board (the graph stage 2 ships beside the engine, checked against the digest its
contract records), or, where that pass is too slow for a board, against outputs carried from the host in a
reference file (`--reference`, written on the host by `rkstudy board run ... --write-reference`, checked by the
graphs' and the inputs' digests). Every call is scored against its counterpart:

* per window or step: the SNR of each output against fp32 (the worst output's, as stage 2 scores its probe),
  its non-finite values (NaN, inf) and its fp16-saturated ones (±65504);
* the run's audio: SNR, and PESQ-WB and STOI (rkstudy.gates) where pesq, pystoi and scipy are installed;
  recorded beside the verdict, not gated (stage 2 sets no perceptual floor).

The floor is the one stage 2 gated the simulator at (rkstudy.gates.ENGINE_FLOORS, named by the build record in
the engine's contract). A window or step fails below it or with any non-finite value; one whose fp32 output
sits QUIET_DB below the loudest of that engine's calls carries no signal to score (its SNR would measure the
fp16 floor of silence) and is recorded, not gated. Below the gate the run ends with exit 1 and one line naming
the worst window, the engine's REGTASK lines and largest field value (from its contract) and the fixes; nothing
is written.

Board side: numpy; onnxruntime (the board extra) for the fp32 pass; pesq, pystoi and scipy where installed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import gates
from ..cache import sha256_file
from ..contract import Contract, beside, for_engine, from_json
from ..errors import EngineMismatch, InputError
from ..runtime.base import Runner
from . import sysfs
from .runner import BoardRunner

QUIET_DB = 50.0  # a window this far below the loudest of its engine's windows has no signal to score
# The row's gate columns, in order, on every board row (an ungated run leaves them empty but for `gate`)
COLUMNS = ("gate", "gate_threshold_db", "gate_worst_snr_db", "gate_worst", "gate_windows", "gate_nonfinite",
           "gate_saturated", "gate_audio_snr_db", "pesq_wb", "stoi", "gate_reference", "gate_s", "gate_not_scored")
UNGATED = "ungated (--no-gate: timing only)"
PERCEPTUAL_INSTALL = ("pip install pystoi==0.4.1 scipy (the board extra has them); PESQ-WB: pip install pesq==0.0.4, "
                      "an sdist that compiles C: sudo apt install build-essential python3-dev first")
BOARD, CARRIED, WRITE, OFF = "board", "carried", "write", "off"


# --- where the fp32 graph is --------------------------------------------------------------------------------
def fp32_graph(engine: Path | str, contract: Contract) -> Path:
    """The graph `engine` was compiled from, beside it, with the digest its contract records (stage 2 writes it
    there). InputError naming the fixes when it is missing or another graph."""
    engine = Path(engine)
    named = contract.onnx.file if contract.onnx else "?"
    return contract.graph_beside(engine, f"the gate scores {engine.name} against {named}, the fp32 graph it was "
                                 "compiled from, and it is not beside the engine: copy it from the host (stage 2 "
                                 "writes it beside the engine), pass --reference FILE made on the host with "
                                 "--write-reference, or --no-gate for timing only")


def floor_gate(contract: Contract, where: str = "board") -> gates.Gate:
    """The floor `contract`'s engine is held to on a board: the engine floor its stage-2 gate stands for
    (rkstudy.gates.ENGINE_FLOORS), or the threshold stage 2 recorded where the gate is no engine floor.
    EngineMismatch when stage 2 recorded no build (a contract from before it did)."""
    build = contract.build
    if not build:
        engine = contract.engine.file if contract.engine else "this engine"
        raise EngineMismatch(f"the contract beside {engine} records no stage-2 build (its REGTASK count and the gate "
                             f"it passed), which the board gate needs: convert it again with "
                             f"`{contract.remake_engine()}`, or pass --no-gate for timing only")
    floor = gates.engine_floor(build["gate"])
    return floor.gate(where) if floor else gates.Gate(f"{where}_vs_fp32", float(build["threshold_db"]))


# --- the runners of the two passes ---------------------------------------------------------------------------
class ReferenceRunner(Runner):
    """The fp32 graph an engine was compiled from, in onnxruntime, where the engine ran: the gate's reference
    pass, and the host's reference file (`--write-reference`)."""

    where = "fp32"

    def __init__(self, engine: Path | str, input_names: list[str], *, cores: str = "cpu", shape_sets=None):
        from ..runtime import OrtRunner

        contract = _contract(engine)
        self._ort = OrtRunner(fp32_graph(engine, contract))
        self.input_names = list(input_names)
        self.shape_sets = [tuple(tuple(x) for x in one) for one in shape_sets or ()]
        self.shapes = self._ort.shapes
        self.target = sysfs.soc() or "none"
        self.cores = "cpu"
        self.engine = Path(engine)

    def run(self, inputs) -> list[np.ndarray]:
        if isinstance(inputs, Mapping):
            inputs = [inputs[n] for n in self.input_names]
        return self._ort.run(list(inputs))


def _contract(engine: Path | str) -> Contract:
    """The contract beside an engine, read without hashing the engine again (the parent checked it)."""
    path = beside(engine)
    return from_json(path.read_text(encoding="utf-8"), where=path.name)


class _Recorded(Runner):
    """A runner whose every call is handed to `on_call(record, inputs, outputs)` (the spool, or the scorer)."""

    def __init__(self, inner, engine: Path | str, on_call: Callable):
        self._inner = inner
        self.engine = Path(engine)
        self.contract = _contract(engine)
        self.input_names = list(inner.input_names)
        self.where, self.target = inner.where, inner.target
        self._on_call = on_call
        self.calls = 0

    def __getattr__(self, name):  # cores, shape_sets, shapes, ...: the runner's own
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._inner, name)

    def run(self, inputs) -> list[np.ndarray]:
        outputs = self._inner.run(inputs)
        self._on_call(self, inputs, outputs)
        self.calls += 1
        return outputs

    def close(self) -> None:
        self._inner.close()


_active: list[tuple[str, Callable]] = []  # (pass, on_call) while a gated pass runs in this process


def open_engine(path: Path | str, input_names: list[str], *, cores: str = "0_1_2", shape_sets=None) -> Runner:
    """The one way a board job opens an engine: RKNNLite (BoardRunner); inside a gated run its calls are
    recorded, and in the gate's reference pass the engine's fp32 graph stands in for it."""
    if not _active:
        return BoardRunner(path, input_names, cores=cores, shape_sets=shape_sets)
    which, on_call = _active[-1]
    inner = ReferenceRunner(path, input_names, shape_sets=shape_sets) if which == "fp32" else \
        BoardRunner(path, input_names, cores=cores, shape_sets=shape_sets)
    return _Recorded(inner, path, on_call)


@contextlib.contextmanager
def _pass(which: str, on_call: Callable):
    _active.append((which, on_call))
    try:
        yield
    finally:
        _active.pop()


# --- what one call produced --------------------------------------------------------------------------------
def call_kind(contract: Contract) -> str:
    """What one call of this engine is called in a message: a stateful step, a window, or a padded chunk."""
    if contract.state:
        return "step"
    if contract.window is not None or contract.role("walked"):
        return "window"
    return "chunk"


def scored_outputs(contract: Contract, names: list[str], inputs, outputs) -> list[np.ndarray]:
    """The parts of a call's outputs the gate scores: a padded output (the encoder's stats) up to the real length
    its `length` input gives, where the padding holds whatever the engine leaves there; every other output whole."""
    values = dict(inputs) if isinstance(inputs, Mapping) else dict(zip(names, inputs))
    length = next((t for t in contract.inputs if t.role == "length"), None)
    real = int(np.asarray(values[length.name]).ravel()[0]) if length is not None and length.name in values else None
    out = []
    for t, o in zip(contract.outputs, outputs):
        o = np.asarray(o, np.float32)
        if real is not None and t.role == "padded" and t.axis is not None:
            o = np.take(o, np.arange(min(o.shape[t.axis], real * t.rate + t.extra)), axis=t.axis)
        out.append(o)
    return out


@dataclass
class Spool:
    """Every call of the measured pass, its scored outputs in one file on disk (float32, in call order) and
    their place in it: the measured child's memory holds no copy."""

    path: Path
    calls: list[dict] = field(default_factory=list)

    def __post_init__(self):
        self.path = Path(self.path)
        self._fh = open(self.path, "wb")

    def add(self, record: _Recorded, inputs, outputs) -> None:
        entries = []
        for o in scored_outputs(record.contract, record.input_names, inputs, outputs):
            a = np.ascontiguousarray(o, np.float32)
            entries.append({"shape": list(a.shape), "offset": self._fh.tell()})
            self._fh.write(a.tobytes())
        self.calls.append({"engine": record.engine.name, "graph": record.contract.onnx.sha256,
                           "graph_file": record.contract.onnx.file, "kind": call_kind(record.contract),
                           "outputs": entries})

    def close(self) -> None:
        self._fh.close()

    def read(self, k: int) -> list[np.ndarray]:
        return [np.fromfile(self.path, np.float32, count=int(np.prod(e["shape"], dtype=np.int64)),
                            offset=e["offset"]).reshape(e["shape"]) for e in self.calls[k]["outputs"]]


# --- scoring -------------------------------------------------------------------------------------------------
@dataclass
class Scores:
    """Per call, per output: the reference's and the error's energy, sizes, non-finite and saturated counts."""

    calls: list[dict] = field(default_factory=list)

    def add(self, call: dict, ref: list[np.ndarray], test: list[np.ndarray]) -> None:
        outs = []
        for r, t in zip(ref, test):
            r64, t64 = np.asarray(r, np.float64), np.asarray(t, np.float64)
            if r64.shape != t64.shape:
                raise RuntimeError(f"{call['engine']}: the fp32 pass's output is {r64.shape} and the board's "
                                   f"{t64.shape}; the two passes did not run the same windows")
            with np.errstate(invalid="ignore", over="ignore"):
                outs.append({"sig": float(np.sum(r64 ** 2)), "err": float(np.sum((r64 - t64) ** 2)),
                             "size": int(r64.size), "nonfinite": gates.nonfinite_count(t64),
                             "saturated": int(np.count_nonzero(np.abs(t64[np.isfinite(t64)]) >= gates.FP16_MAX))})
        self.calls.append({"engine": call["engine"], "kind": call["kind"], "outputs": outs})

    def rows(self) -> list[dict]:
        """One row per call: engine, kind, its index of the engine's calls, SNR (the worst unquiet output's),
        non-finite and saturated counts, and whether it was too quiet to gate."""
        loudest: dict[tuple[str, int], float] = {}
        for c in self.calls:
            for i, o in enumerate(c["outputs"]):
                key = (c["engine"], i)
                loudest[key] = max(loudest.get(key, 0.0), o["sig"] / max(o["size"], 1))
        counts: dict[str, int] = {}
        for c in self.calls:
            counts[c["engine"]] = counts.get(c["engine"], 0) + 1
        seen: dict[str, int] = {}
        rows = []
        for c in self.calls:
            seen[c["engine"]] = seen.get(c["engine"], 0) + 1
            snrs = []
            for i, o in enumerate(c["outputs"]):
                top = loudest[(c["engine"], i)]
                if top > 0 and o["sig"] / max(o["size"], 1) < top * 10 ** (-QUIET_DB / 10):
                    continue
                snrs.append(_snr_db(o["sig"], o["err"]))
            rows.append({"engine": c["engine"], "kind": c["kind"], "index": seen[c["engine"]],
                         "of": counts[c["engine"]], "snr_db": min(snrs, key=_worst_key) if snrs else None,
                         "nonfinite": sum(o["nonfinite"] for o in c["outputs"]),
                         "saturated": sum(o["saturated"] for o in c["outputs"]), "quiet": not snrs})
        return rows


def _snr_db(signal_energy: float, noise_energy: float) -> float:
    """10·log10(signal / noise), +inf for no noise, NaN where the test held a NaN (rkstudy.gates.snr_db's rule)."""
    if noise_energy == 0:
        return float("inf")
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(10.0 * np.log10(np.float64(signal_energy) / np.float64(noise_energy)))


def _worst_key(snr: float) -> float:
    return -np.inf if np.isnan(snr) else snr


def _rank(row: dict) -> tuple:
    """Worst first: a call with non-finite values, then the lowest SNR (NaN lowest), a call without a score last."""
    snr = row["snr_db"]
    return (0 if row["nonfinite"] else 1, _worst_key(snr) if snr is not None else np.inf)


def describe_call(row: dict) -> str:
    return f"{row['kind']} {row['index']} of {row['of']} of {row['engine']}"


# --- one run's gate ------------------------------------------------------------------------------------------
@dataclass
class Check:
    """A gated run in the measured child: `mode` is BOARD (the fp32 pass here), CARRIED (a reference file from
    the host), WRITE (the host: the fp32 pass only, its outputs for a reference file) or OFF; `folder` the
    child's temporary folder (the spool)."""

    mode: str
    folder: Path
    reference: str | None = None
    spool: Spool | None = None

    @classmethod
    def from_spec(cls, spec: dict) -> Check:
        gate = spec.get("gate") or {"mode": OFF}
        return cls(gate["mode"], Path(spec["result"]).parent, gate.get("reference"))

    @property
    def on(self) -> bool:
        return self.mode in (BOARD, CARRIED)

    def measured_pass(self, run: Callable[[], dict]) -> dict:
        """`run()` (the job on the NPU), every call spooled when the gate is on."""
        if not self.on:
            return run()
        self.spool = Spool(self.folder / "npu.spool")
        try:
            with _pass("npu", self.spool.add):
                return run()
        finally:
            self.spool.close()

    def score(self, run: Callable[[], dict], audio, sample_rate: int) -> dict:
        """After the measured pass: the reference (the fp32 pass here, or the carried file) scored against every
        spooled call and the audio. A JSON-able result for the parent (Verdict.from_result reads it)."""
        t0 = time.perf_counter()
        scores, k = Scores(), [0]
        if self.mode == BOARD:
            def compare(record: _Recorded, inputs, outputs):
                if k[0] >= len(self.spool.calls):
                    raise RuntimeError(f"the fp32 pass made more engine calls than the board's {len(self.spool.calls)}")
                call = self.spool.calls[k[0]]
                if call["graph"] != record.contract.onnx.sha256:
                    raise RuntimeError(f"call {k[0] + 1} ran {call['engine']} on the board and {record.engine.name} in "
                                       "the fp32 pass: the two passes did not run the same engines")
                ref = scored_outputs(record.contract, record.input_names, inputs, outputs)
                scores.add(call, ref, self.spool.read(k[0]))
                k[0] += 1

            with _pass("fp32", compare):
                ref_audio = np.asarray(run()["audio"], np.float32)
            graphs = sorted({f"{c['graph_file']} {c['graph'][:12]}" for c in self.spool.calls})
            where = f"fp32 onnxruntime on this board: {', '.join(graphs)}"
        else:
            carried = Reference.load(self.reference)
            for j, call in enumerate(self.spool.calls):
                scores.add(call, carried.call(j, call), self.spool.read(j))
                k[0] += 1
            ref_audio = carried.audio()
            where = f"carried from the host: {Path(self.reference).name} {sha256_file(self.reference)[:12]}"
        if k[0] != len(self.spool.calls):
            raise RuntimeError(f"the reference has {k[0]} engine calls and the board's run {len(self.spool.calls)}: "
                               "the two passes did not run the same windows")
        result = {"mode": self.mode, "calls": scores.rows(), "reference": where}
        result.update(audio_scores(ref_audio, np.asarray(audio, np.float32), sample_rate))
        result["seconds"] = round(time.perf_counter() - t0, 3)
        return result

    def write_pass(self, run: Callable[[], dict]) -> tuple[dict, dict]:
        """The host: the job with every engine's fp32 graph, each call's scored outputs kept; (meta, arrays) of a
        reference file."""
        calls, arrays = [], {}

        def keep(record: _Recorded, inputs, outputs):
            outs = scored_outputs(record.contract, record.input_names, inputs, outputs)
            for i, o in enumerate(outs):
                arrays[f"call{len(calls)}_{i}"] = np.ascontiguousarray(o, np.float32)
            calls.append({"engine": record.engine.name, "graph": record.contract.onnx.sha256, "outputs": len(outs)})

        with _pass("fp32", keep):
            out = run()
        arrays["audio"] = np.asarray(out.get("audio", np.zeros(0)), np.float32)
        # the job's own time of the pass (its engines' work, without opening them) and the audio it made: what
        # deciding whether a board can afford the pass reads (rkstudy.bundle)
        return {"calls": calls, "sample_rate": out.get("sample_rate"), "fp32_s": out.get("seconds"),
                "audio_s": out.get("audio_s")}, arrays


def audio_scores(ref, test, sample_rate: int | None) -> dict:
    """The whole run's audio against the reference's: SNR, non-finite count, PESQ-WB and STOI where their packages
    are installed (and the audio long enough); `not_scored` says what was left out and why."""
    out = {"audio_snr_db": None, "pesq_wb": None, "stoi": None, "not_scored": []}
    if not ref.size or ref.size != test.size or not sample_rate:
        return out
    with np.errstate(invalid="ignore", over="ignore"):
        out["audio_snr_db"] = gates.snr_db(ref, test)
    for name, score in (("pesq_wb", gates.pesq_wb), ("stoi", gates.stoi)):
        try:
            value = score(ref, test, int(sample_rate))
            out[name] = None if np.isnan(value) else float(value)
            if np.isnan(value):
                out["not_scored"].append(f"{name} (too little voiced audio to score)")
        except ModuleNotFoundError as missing:
            out["not_scored"].append(f"{name} ({missing.name} is not installed: {PERCEPTUAL_INSTALL})")
        except ValueError as why:
            out["not_scored"].append(f"{name} ({' '.join(str(why).split())})")
    return out


# --- a reference carried from the host -----------------------------------------------------------------------
def payload_digest(payload) -> str:
    """The inputs a job reads, by content: every file the payload names by its bytes' sha256, an engine by the
    digest of the graph it was compiled from (the reference does not depend on the SoC), the rest as given.
    A reference file made from other inputs, or for another graph, does not match."""
    def content(value):
        if isinstance(value, dict):
            return {k: content(v) for k, v in sorted(value.items())}
        if isinstance(value, (list, tuple)):
            return [content(v) for v in value]
        if isinstance(value, str) and len(value) < 4096 and Path(value).is_file():
            if value.endswith(".rknn") and beside(value).is_file():
                return {"graph": _contract(value).onnx.sha256}
            return {"file": sha256_file(value)}
        return value

    return hashlib.sha256(json.dumps(content(payload), sort_keys=True).encode()).hexdigest()


REFERENCE_FORMAT = 1


@dataclass
class Reference:
    """A reference file (`--write-reference` on the host, `--reference` on a board): every engine call's fp32
    outputs and the run's audio, for one family, one set of graphs and one input digest."""

    path: Path
    meta: dict

    @classmethod
    def load(cls, path: Path | str) -> Reference:
        path = Path(path)
        if not path.is_file():
            raise InputError(f"--reference {path}: no such file; write it on the host with `rkstudy board run ... "
                             "--write-reference FILE`")
        try:
            with np.load(path) as data:
                meta = json.loads(str(data["meta"]))
        except (OSError, ValueError, KeyError) as exc:
            raise InputError(f"--reference {path} is not a reference file ({type(exc).__name__}); write it on the "
                             "host with `rkstudy board run ... --write-reference FILE`") from None
        if meta.get("format") != REFERENCE_FORMAT:
            raise InputError(f"--reference {path} has format {meta.get('format')!r} and this rkstudy reads "
                             f"{REFERENCE_FORMAT}; write it again on the host")
        return cls(path, meta)

    def check(self, family: str, payload: dict) -> None:
        """The reference was made for this family and these inputs (by content), or one line saying it was not."""
        if self.meta["family"] != family:
            raise InputError(f"--reference {self.path.name} is a {self.meta['family']} reference, not {family}'s")
        if self.meta["payload_sha256"] != payload_digest(payload):
            raise InputError(f"--reference {self.path.name} was made from other inputs or another graph than this "
                             f"run's (inputs digest {self.meta['payload_sha256'][:12]}); write it again on the host "
                             f"from the same inputs and engines with `rkstudy board run {family} ... "
                             "--write-reference FILE`")

    def call(self, k: int, spooled: dict) -> list[np.ndarray]:
        calls = self.meta["calls"]
        if k >= len(calls) or calls[k]["graph"] != spooled["graph"]:
            raise InputError(f"--reference {self.path.name} does not hold call {k + 1} of {spooled['engine']}'s graph "
                             "(made for other engines); write it again on the host")
        with np.load(self.path) as data:
            return [data[f"call{k}_{i}"] for i in range(calls[k]["outputs"])]

    def audio(self) -> np.ndarray:
        with np.load(self.path) as data:
            return np.asarray(data["audio"], np.float32)

    @staticmethod
    def write(path: Path | str, *, family: str, payload: dict, meta: dict, arrays: dict) -> Path:
        import io

        from .. import atomic

        full = {"format": REFERENCE_FORMAT, "family": family, "payload_sha256": payload_digest(payload),
                "made": time.strftime("%Y-%m-%d %H:%M:%S"), **meta}
        buf = io.BytesIO()
        np.savez_compressed(buf, meta=np.array(json.dumps(full)), **arrays)
        return atomic.write_bytes(path, buf.getvalue())


# --- the verdict, in the parent ------------------------------------------------------------------------------
@dataclass
class Verdict:
    """What the parent does with the child's gate result: the row's columns, and the one line of a failure."""

    row: dict
    failure: str | None = None

    @classmethod
    def ungated(cls) -> Verdict:
        return cls(dict.fromkeys(COLUMNS, "") | {"gate": UNGATED})

    @classmethod
    def from_result(cls, result: dict, contracts: Mapping[str, Contract]) -> Verdict:
        """`result` from Check.score; `contracts` by engine file name (every engine the job loaded)."""
        rows = result["calls"]
        floors = {name: floor_gate(c) for name, c in contracts.items()}
        failed = [r for r in rows if r["nonfinite"] or (not r["quiet"] and not floors[r["engine"]].passes(r["snr_db"]))]
        gated = [r for r in rows if not r["quiet"]]
        if not rows:  # the job never called an engine (a ladder whose every chunk took the fallback)
            first = next(iter(contracts))
            return cls(dict.fromkeys(COLUMNS, "") | {"gate": floors[first].name,
                                                    "gate_threshold_db": floors[first].threshold,
                                                    "gate_windows": "0 calls: no engine ran",
                                                    "gate_reference": result["reference"], "gate_s": result["seconds"]})
        worst = min(failed or gated or rows, key=_rank)
        gate = floors[worst["engine"]]
        quiet = len(rows) - len(gated)
        kinds = sorted({r["kind"] for r in rows})
        row = {"gate": gate.name, "gate_threshold_db": gate.threshold,
               "gate_worst_snr_db": _db(worst["snr_db"]), "gate_worst": describe_call(worst),
               "gate_windows": f"{len(rows)} {'/'.join(kinds)}{'s' * (len(rows) != 1)} ({quiet} too quiet to gate)",
               "gate_nonfinite": sum(r["nonfinite"] for r in rows), "gate_saturated": sum(r["saturated"] for r in rows),
               "gate_audio_snr_db": _db(result.get("audio_snr_db")),
               "pesq_wb": "" if result.get("pesq_wb") is None else round(result["pesq_wb"], 3),
               "stoi": "" if result.get("stoi") is None else round(result["stoi"], 4),
               "gate_reference": result["reference"], "gate_s": result["seconds"],
               "gate_not_scored": "; ".join(result.get("not_scored") or [])}
        if not failed:
            return cls(row)
        return cls(row, failure_line(worst, gate, contracts[worst["engine"]], len(failed)))


def _db(value) -> float | str:
    if value is None:
        return ""
    return round(float(value), 2) if np.isfinite(value) else float(value)


def failure_line(worst: dict, gate: gates.Gate, contract: Contract, failed: int) -> str:
    """One line: which window or step failed and by how much, what the simulator scored, what the build logged
    (REGTASK lines and their largest field value against the target's field) and the fixes."""
    snr = worst["snr_db"]
    measured = "nan" if snr is not None and np.isnan(snr) else f"{snr:.1f} dB" if snr is not None else "no signal"
    bad = []
    if worst["nonfinite"]:
        bad.append(f"{worst['nonfinite']:,} non-finite values")
    if worst["saturated"]:
        bad.append(f"{worst['saturated']:,} at ±{gates.FP16_MAX:g}")
    also = f" ({'; '.join(bad)})" if bad else ""
    others = f"; {failed - 1} more failed" if failed > 1 else ""
    build = contract.build or {}
    sim = build.get("simulator_db")
    simulator = (f"; the simulator scored {sim:.1f} dB on the probe" if isinstance(sim, (int, float))
                 else "; the simulator matched fp32 exactly on the probe" if build else "")
    if build:
        limit = gates.field_limit(contract.target)
        value = build["regtask_max_value"]
        logged = (f"its build logged {build['regtask']:,} REGTASK lines, largest field value {value:,} (field limit "
                  f"{limit:,})" + (": a register-field overflow, which only a board shows" if value > limit else ""))
    else:
        logged = "its contract records no build (REGTASK count unknown)"
    engine = contract.engine.file if contract.engine else describe_call(worst)
    graph = contract.onnx.file if contract.onnx else "<graph.onnx>"
    return (f"{engine} failed the board gate: {describe_call(worst)} scored {measured} against fp32{also} ({gate.name} "
            f"needs >= {gate.threshold:g} dB and no non-finite value{others}){simulator}; {logged}. Fix: a narrower "
            f"window (stage 1 again with a smaller width: `{contract.producer}`), another toolkit version (stage 2 "
            f"with --toolkit {_other_toolkit(contract)}), and `rkstudy lint {graph}` for the hazards it knows; "
            "nothing was written")


def _other_toolkit(contract: Contract) -> str:
    from .compat import release, toolkits

    built = release(contract.toolkit)
    others = [v for v in toolkits() if release(v) != built]
    return others[0] if others else "VERSION"


def request(options, family: str, payload: dict, contracts: Mapping[str, Contract]) -> dict:
    """The child's gate spec for a run with these board options (rkstudy.board.run.BoardOptions), checked in the
    parent before the child starts: the floors recorded, the fp32 graphs beside the engines (BOARD), or the
    reference file made for these inputs (CARRIED)."""
    if options.write_reference:
        return {"mode": WRITE}
    if options.no_gate:
        return {"mode": OFF}
    for c in contracts.values():
        floor_gate(c)
    if options.reference:
        Reference.load(options.reference).check(family, payload)
        return {"mode": CARRIED, "reference": str(Path(options.reference).resolve())}
    return {"mode": BOARD}


def for_engines(engines) -> dict:
    """The gate spec of a run whose NPU components are `engines` ((path, contract) pairs: `rkstudy speak`'s plan):
    each one's floor recorded and its fp32 graph beside it, checked before the child starts."""
    contracts = {Path(p).name: c for p, c in engines}
    for c in contracts.values():
        floor_gate(c)
    check_graphs([p for p, _ in engines], contracts)
    return {"mode": BOARD}


def verdict(result: dict, contracts: Mapping[str, Contract], ungated: str = UNGATED) -> Verdict:
    """The verdict of a child's result: its gate's (GateFailed, one line, when below the floor), or `ungated` for a
    run that was not gated."""
    if not result.get("gate"):
        return Verdict(dict.fromkeys(COLUMNS, "") | {"gate": ungated})
    found = Verdict.from_result(result["gate"], contracts)
    if found.failure:
        raise gates.GateFailed(found.failure)
    return found


def gated_child(spec: dict, run: Callable[[], dict], *, sample_npu: bool = True) -> dict:
    """What a measured child does, for a board run and a whole-text synthesis alike: `run()` measured (its engine
    calls spooled while the gate is on), then, the measurement done, the gate's reference pass and its scores in
    `["gate"]`."""
    from .child import measured

    check = Check.from_spec(spec)
    out = measured(lambda: check.measured_pass(run), sample_npu=sample_npu)
    if check.on:
        out["gate"] = check.score(run, out["audio"], out.get("sample_rate"))
    return out


def check_graphs(engines, contracts: Mapping[str, Contract]) -> None:
    """Every engine's fp32 graph is beside it with its digest (the BOARD pass opens them after the measurement:
    a missing one is said now, before the child starts)."""
    for path in engines:
        fp32_graph(path, contracts[Path(path).name])


def contracts_of(engines) -> dict[str, Contract]:
    return {Path(p).name: for_engine(p) for p in engines}
