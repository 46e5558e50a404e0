"""Quantization as a lever (host): every quantized dtype the toolkit offers, on every target that builds
it, calibrated on a stage's own real data and scored in the simulator against fp32 on data the
calibration never saw, by SNR and by what a listener would judge (PESQ-WB, STOI, DNSMOS), beside the
share of the stage's conv MACs that run on weights of 8 bits or fewer.

Why: the NPU is rated for int8, fp16 runs at a fraction of it, and a plain int8 build of a decoder can
lose it whole (the Piper decoder window at 6 dB against fp32). Which tensors cost it is measured, not
assumed: one calibration pass per setting (rkstudy.toolkit.simulator.QuantizationSession) serves any
number of hybrid variants, each with some of the toolkit's quantization-config tensors in float16, so
a search can re-measure fidelity after every choice instead of trusting a per-layer report.

A family supplies a Stage: its engine graph, calibration feeds from its own real data, and evaluation
items held apart from them (a few of which, `search`, steer the search; every chosen point is then
scored on them all).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import atomic, cache, gates, graph
from ..graph.index import Index
from ..runtime import OrtRunner, Recording
from ..targets import ALL_TARGETS
from ..toolkit import macs
from ..toolkit.build import QUANTIZED_DTYPES, BuildReport, Calibration, engine_key
from ..toolkit.log import IO_OPS, WEIGHT_BITS, Layer, layer_table, weight_dtypes

CONVERT_OPS = ("exDataConvert",)  # the dtype casts a hybrid engine inserts between int8 and fp16 layers
# what accuracy_analysis reports beside the layers: the graph's inputs and the casts at its inputs and
# outputs (an output's cast carries the output's name)
ANALYSIS_IO_OPS = ("Input",) + CONVERT_OPS
IO_GROUP = "graph inputs and outputs"  # the casts and reshapes of the graph's own inputs and outputs
SCORES = 4  # bumped when what a recorded measurement holds changes, so older records are not read back


# --- stages ------------------------------------------------------------------------------------------
@dataclass
class Stage:
    """One stage to quantize: its engine graph, the calibration feeds ({input: array} per sample, what
    the engine really sees), the evaluation items (never among the calibration's sources), `walk(runner,
    item) -> 1-D output` that runs an item through any runner, and `score(items, refs, tests) -> {column:
    value}` over those items' outputs (per window and per utterance SNR for a decoder).

    `search` are the items that steer a search (a few windows held apart from the calibration like the
    evaluation; default: the first evaluation item); `rate` and `audio`
    (a walk output -> its audio at `rate`; None when the stage's output is not audio, e.g. an encoder's
    statistics) let a listener's scores be computed; `speech` says the audio is speech (DNSMOS, which
    needs no reference, means something only then). `groups` maps a node's module path
    ('/dec/resblocks.3/convs1.0') to the group a search moves as one (default: its first two levels).
    `outputs` holds the last measurements' outputs per setting ("fp32" the reference), one 1-D array per
    evaluation item, for a notebook to listen to."""

    name: str
    onnx: Path
    calibration: list[Mapping[str, np.ndarray]]
    evaluation: list
    walk: Callable
    score: Callable[[list, list, list], dict]
    texts: dict = field(default_factory=dict)
    outputs: dict[str, list[np.ndarray]] = field(default_factory=dict)
    search: list | None = None
    rate: int | None = None
    audio: Callable[[np.ndarray], np.ndarray] | None = None
    speech: bool = True
    groups: Callable[[str], str] | None = None

    def items(self, which: str) -> list:
        """The items of a measurement: 'full' (every evaluation item) or 'search' (the search items)."""
        if which == "full":
            return list(self.evaluation)
        return list(self.search) if self.search is not None else list(self.evaluation[:1])

    @property
    def listens(self) -> bool:
        return self.audio is not None and self.rate is not None


def held_apart(calibration: Sequence[str], evaluation: Sequence[str]) -> None:
    """Refuse a quantization set-up whose calibration and evaluation share a source (a text, an
    utterance): a score on data the ranges were fitted to flatters the quantizer."""
    shared = sorted(set(calibration) & set(evaluation))
    if shared:
        raise ValueError(f"{', '.join(shared)} would both calibrate and score; hold the evaluation texts apart")


def recorded_feeds(onnx: Path, walk: Callable, items: Sequence) -> list[dict[str, np.ndarray]]:
    """Every feed `walk` hands an onnxruntime fp32 run of `onnx` over `items`, in order: a stage's
    calibration set is what its engine sees in a real walk (its windows with their padding, or its
    steps with the state the fp32 walk carried into them), not a tensor made up to fit its shapes."""
    recorder = Recording(OrtRunner(onnx))
    for item in items:
        walk(recorder, item)
    return recorder.feeds


def evenly(items: Sequence, k: int | None) -> list:
    """`k` of `items` evenly spread from first to last (all of them when k is None or covers them):
    a calibration set cut to what a build can afford still spans every sentence it was drawn from."""
    if k is None or len(items) <= k:
        return list(items)
    return [items[int(i)] for i in np.linspace(0, len(items) - 1, k).round()]


def span_scores(refs: Sequence[np.ndarray], tests: Sequence[np.ndarray],
                spans: Sequence[Sequence[tuple[int, int]]]) -> dict:
    """The score columns every stage reports: the SNR against fp32 of each window (`spans`: each
    evaluation item's [start, stop) sample ranges, one per window or step), its worst and median,
    and the SNR of all items' outputs back to back (`utterance_snr_db`)."""
    windows = [gates.snr_db(a[lo:hi], b[lo:hi]) for a, b, item in zip(refs, tests, spans) for lo, hi in item]
    return {"windows": len(windows), "window_snr_db_min": float(np.min(windows)),
            "window_snr_db_median": float(np.median(windows)),
            "utterance_snr_db": gates.snr_db(np.concatenate(refs), np.concatenate(tests))}


def listening(stage: Stage, refs: Sequence[np.ndarray], tests: Sequence[np.ndarray], absolute: bool = True) -> dict:
    """What a listener would judge of the test render against fp32 (rkstudy.gates.perceptual: PESQ-WB,
    STOI, log-mel distance, and with `absolute` and speech, DNSMOS of both), on every item's audio back
    to back, as `utterance_snr_db` is; empty for a stage whose output is not audio."""
    if not stage.listens:
        return {}
    ref = np.concatenate([np.asarray(stage.audio(r), np.float32).ravel() for r in refs])
    test = np.concatenate([np.asarray(stage.audio(t), np.float32).ravel() for t in tests])
    return gates.perceptual(ref, test, stage.rate, absolute=absolute and stage.speech)


# --- which tensors a hybrid can keep in float16, by where they sit in the graph -------------------------
def module_of(node: str) -> str:
    """The exporter's module path of a node name: '/dec/resblocks.3/convs1.0/Conv' -> '/dec/resblocks.3/
    convs1.0' (every component but the op's own); '' for a name without one ('Tanh_5597')."""
    parts = node.strip("/").split("/")
    return "/" + "/".join(parts[:-1]) if node.startswith("/") and len(parts) > 1 else ""


def first_levels(module: str, depth: int = 2) -> str:
    """A module path cut to its first `depth` levels ('/dec/resblocks.3/convs1.0' -> '/dec/resblocks.3');
    '/' for the graph's top level."""
    parts = [p for p in module.split("/") if p]
    return "/" + "/".join(parts[:depth])


def tensor_modules(onnx, names: Iterable[str]) -> dict[str, str]:
    """{config tensor: the module path of the graph node it belongs to}, or IO_GROUP for the casts and
    reshapes of the graph's own inputs and outputs. A tensor is named after a node or a node's output
    (rkstudy.toolkit.macs.locate: a compiler-made tile or split after the tensor it splits); a node
    without a module path (an exporter's anonymous 'Tanh_5597') takes its nearest named producer's."""
    index = Index(graph.load(onnx, load_external_data=False))
    g = index.model.graph
    io = {v.name for v in list(g.input) + list(g.output)}
    nodes = {n.name: n for n in index.nodes}

    def named(node) -> str:
        seen = set()
        queue = [node]
        while queue:
            n = queue.pop(0)
            if n is None or n.name in seen:
                continue
            seen.add(n.name)
            if module_of(n.name):
                return module_of(n.name)
            queue += [index.producer.get(t) for t in n.input if t in index.producer]
        return "/"

    out = {}
    for name in names:
        kind, found = macs.locate(name, index)
        if kind == "tensor" and found in io:
            out[name] = IO_GROUP
        elif kind == "tensor" and found in index.producer:
            out[name] = named(index.producer[found])
        elif kind == "node":
            out[name] = named(nodes[found])
        else:
            out[name] = "/"
    return out


# Constants the toolkit lists in the config beside the layers, which step 2 refuses by name ('Invalid operands
# name ... in custom_quantize_layers'): an operand it stores for an op it rewrote (a Div by a constant turned
# into a Mul by its reciprocal, '/dec/Div_2mul_i1'; an einsum's '..._2einsum_i1'), an exporter's Constant
# output (kept under its name after folding, '/enc_p/Constant_output_0', '..._dup1').
STORED_OPERAND = re.compile(r"_i\d+$")
EXPORTED_CONSTANT = re.compile(r"(^|/)Constant(_\d+)?_output_\d+(_dup\d+)?$")
REFUSED_NAME = re.compile(r"Invalid operands name '([^']+)' in custom_quantize_layers")


def quantized_tensors(tensors: Sequence[Mapping], onnx=None) -> list[str]:
    """The config tensors a hybrid can keep in float16: every one the build quantizes (int8 under w8a8,
    int16 under w16a16i_dfp; under w4a16 the activations are float16 already and 'float16' there keeps
    the layer's weights in float16 too), less the constants the config lists beside the layers (stored
    operands and exporters' Constant outputs; with `onnx`, the graph's initializers and any tensor a
    Constant node makes): step 2 refuses those by name. The graph's float inputs and outputs are float32
    in the config and stay so."""
    names = [t["name"] for t in tensors if t["dtype"] != "float32" and not STORED_OPERAND.search(t["name"])
             and not EXPORTED_CONSTANT.search(t["name"])]
    if onnx is None:
        return names
    index = Index(graph.load(onnx, load_external_data=False))

    def constant(name: str) -> bool:
        if name in index.initializers:
            return True
        kind, found = macs.locate(name, index)
        producer = index.producer.get(found) if kind == "tensor" else None
        return producer is not None and producer.op_type == "Constant"
    return [n for n in names if not constant(n)]


def group_macs(stage: Stage, groups: Mapping[str, Sequence[str]]) -> dict[str, int]:
    """{group: the graph conv MACs it holds}: what returning it to low bits can move (0 for blocks of
    activations only). A conv belongs to the group holding a tensor named after it or its output
    (rkstudy.toolkit.macs.resolve); else, since the compiler names a fused conv's tensors after the op it
    feeds (so a conv's own output may not be in the config at all), to the group whose tensors' modules
    match its own most closely (the same module, or one inside the other: tensor_modules); a conv that
    writes a graph output, to the graph's inputs and outputs when that is a group, since its output cast
    decides its dtype. Each conv counts once."""
    model = graph.load(stage.onnx, load_external_data=False)
    convs = macs.graph_convs(model)
    index = Index(model)
    names = [t for members in groups.values() for t in members]
    modules = tensor_modules(stage.onnx, names)
    outputs = {o.name for o in model.graph.output}
    writes_output = {n.name for n in model.graph.node if n.name in convs and set(n.output) & outputs}
    module_groups = {g: {modules[t] for t in members} for g, members in groups.items()}
    named: dict[str, str] = {}  # conv -> the first group holding a tensor named after it or its output
    for g, members in groups.items():
        for t in members:
            node, origin = macs.resolve(t, index, convs)
            if node is not None and origin in ("node", "output"):
                named.setdefault(node, g)

    def related(where: str, module: str) -> int:
        """How closely a tensor's module matches a conv's: the length of the shared path when one contains
        the other (or they are equal), else -1."""
        if module == IO_GROUP:
            return -1
        if where == module or where.startswith(module.rstrip("/") + "/") or module.startswith(where.rstrip("/") + "/"):
            return min(len(where), len(module))
        return -1

    out = dict.fromkeys(groups, 0)
    for conv, info in convs.items():
        where = module_of(conv) or "/"
        if conv in writes_output and IO_GROUP in groups:
            home = IO_GROUP
        elif conv in named:
            home = named[conv]
        else:
            closeness = {g: max((related(where, m) for m in mods), default=-1) for g, mods in module_groups.items()}
            home = max(closeness, key=closeness.get) if closeness and max(closeness.values()) >= 0 else None
        if home is not None:
            out[home] += info["macs"]
    return out


def config_groups(stage: Stage, names: Sequence[str], depth: int | None = None) -> dict[str, list[str]]:
    """{group: config tensors}, in graph order: the stage's `groups` of each tensor's module (or its first
    `depth` levels when given), the graph's inputs and outputs one group of their own."""
    modules = tensor_modules(stage.onnx, names)
    out: dict[str, list[str]] = {}
    for name in names:
        module = modules[name]
        if module == IO_GROUP:
            label = IO_GROUP
        elif depth is not None:
            label = first_levels(module, depth)
        else:
            label = stage.groups(module) if stage.groups else first_levels(module)
        out.setdefault(label, []).append(name)
    return out


# --- what a compiled engine runs on low-bit weights --------------------------------------------------
def weight_bits(layer: Layer, quantize: Calibration | None, stored: Mapping[int, str] | None = None) -> int:
    """The bits of the weights a compiled layer computes with: what the build log's constant table says
    its weight is stored in (`stored`: rkstudy.toolkit.log.weight_dtypes; under w4a16 a layer computes in
    float16 on 4-bit weights, so its own dtype does not say), else 16 for a float16 layer (and every layer
    of an fp16 build) and the build's quantized dtype's weight bits for the rest."""
    if stored and layer.id in stored and stored[layer.id] in WEIGHT_BITS:
        return WEIGHT_BITS[stored[layer.id]]
    if quantize is None or layer.dtype.upper().startswith("FLOAT"):
        return 16
    return quantize.weight_bits


def engine_shares(onnx, log_text: str, quantize: Calibration | None) -> dict:
    """From a verbose build's layer table and constant table: the share of the graph's conv MACs (and of
    its conv weights) computed on weights of 8 bits or fewer, how much of the graph's conv MACs the table
    accounts for (rkstudy.toolkit.macs: 1.0 when every conv has a compiled layer), and the convs left
    in float16 (a layer on float16 weights)."""
    layers = layer_table(log_text)
    stored = weight_dtypes(log_text)
    accounting = macs.account(onnx, layers)
    low = lambda layer: weight_bits(layer, quantize, stored) <= 8  # noqa: E731
    return {"low_bit_mac_share": round(accounting.share(low), 4),
            "low_bit_weight_share": round(accounting.share(low, weights=True), 4),
            "conv_macs": accounting.conv_macs, "mac_coverage": round(accounting.coverage, 6),
            "fp16_layers": len(float16_layers(layers)),
            "fp16_convs": accounting.chosen_nodes(lambda layer: weight_bits(layer, quantize, stored) == 16
                                                  and layer.dtype.upper().startswith("FLOAT"))}


def float16_layers(layers: Sequence[Layer]) -> list[str]:
    """The compute layers a compiled engine runs in FLOAT16 (its I/O rows and dtype casts left out)."""
    return [layer.name for layer in layers if layer.dtype == "FLOAT16" and layer.op not in IO_OPS + CONVERT_OPS]


def mac_accounting(stage: Stage, report: BuildReport) -> dict:
    """One row for the MAC-accounting table: the stage's graph conv MACs against its layer table's
    printed conv MACs, every difference by cause (rkstudy.toolkit.macs.Accounting.reconciliation)."""
    accounting = macs.account(stage.onnx, layer_table(Path(report.log).read_text(encoding="utf-8", errors="replace")))
    return {"stage": stage.name, **accounting.reconciliation(), "where": "host", "target": report.target}


# --- measuring: a build or a session variant, scored against fp32 and recorded by content -------------
def _digest_arrays(arrays: Sequence[np.ndarray]) -> str:
    return cache.digest(*[(str(a.dtype), list(a.shape)) for a in arrays], *[np.ascontiguousarray(a).tobytes()
                                                                            for a in arrays])


def _settings(quantize: Calibration | None) -> str:
    return quantize.settings if quantize else "fp16"


class Bench:
    """A stage measured on one target: the fp32 walk of every evaluation item once (the reference of
    every row, keyed by its bytes), then any fp16, quantized or hybrid engine of the stage walked through
    the simulator and scored against it. Every measurement is recorded in the cache under its engine's
    content key and the reference's, so a rerun, or a chosen point asked for again, builds nothing.

    `listen` adds the listener's scores (rkstudy.gates.perceptual) to each row; `progress` gets one line
    per measurement."""

    def __init__(self, stage: Stage, target: str, *, listen: bool = True,
                 progress: Callable[[str], None] | None = None):
        self.stage, self.target, self.listen = stage, target, listen
        self.say = progress or (lambda _: None)
        self._fp32 = OrtRunner(stage.onnx)
        self._refs: dict[str, list[np.ndarray]] = {}
        self.refs = self.refs_for("full")
        stage.outputs["fp32"] = self.refs
        self.names = list(graph.input_shapes(stage.onnx))
        self.built = 0  # measurements this bench made (not read back)

    def refs_for(self, which: str) -> list[np.ndarray]:
        """The fp32 walk of the `which` items (computed once)."""
        if which not in self._refs:
            self._refs[which] = self._walk(self._fp32, which)
        return self._refs[which]

    def _key(self, quantize: Calibration | None, which: str) -> str:
        build, _ = engine_key(self.stage.onnx, self.target, quantize=quantize)
        return cache.digest(SCORES, build, which, _digest_arrays(self.refs_for(which)), self.listen)

    def _recall(self, key: str) -> tuple[dict, list[np.ndarray]] | None:
        path = cache.entry("quantized", self.stage.onnx.stem, key, ".npz")
        if not path.exists():
            return None
        with np.load(path) as saved:
            row = json.loads(str(saved["row"]))
            return row, [saved[f"out_{i}"] for i in range(int(saved["n"]))]

    def _record(self, key: str, row: dict, tests: Sequence[np.ndarray]) -> None:
        path = cache.entry("quantized", self.stage.onnx.stem, key, ".npz")
        with atomic.replacing(path) as tmp, open(tmp, "wb") as fh:
            np.savez(fh, row=np.array(json.dumps(row, default=float)), n=np.array(len(tests)),
                     **{f"out_{i}": t for i, t in enumerate(tests)})

    def _row(self, setting: str, quantize: Calibration | None, report: BuildReport, tests: list | None,
             which: str, groups: str) -> dict:
        stage, refs = self.stage, self.refs_for(which)
        row = {"stage": stage.name, "setting": setting, "dtype": report.dtype, "quantization": _settings(quantize),
               "calibration_samples": len(quantize.feeds) if quantize else 0,
               "fp16_groups": groups, "kept_fp16": len(quantize.keep_fp16) if quantize else 0,
               "scored_on": which, "status": report.status if tests is not None else "simulator refused",
               "error": (report.error or "")[:300]}
        if tests is not None:
            items = stage.items(which)
            row.update(stage.score(items, refs, tests))
            if self.listen:  # DNSMOS (no reference) on the full evaluation only: a search needs the pair scores
                row.update(listening(stage, refs, tests, absolute=which == "full"))
            shares = engine_shares(stage.onnx, Path(report.log).read_text(encoding="utf-8", errors="replace"),
                                   quantize)
            row.update({k: v for k, v in shares.items() if k != "fp16_convs"})
            row["fp16_convs"] = len(shares["fp16_convs"])  # graph convs with a float16 layer
        row.update({"engine_bytes": report.engine_bytes, **stage.texts, "regtask": report.regtask,
                    "build_s": round(report.seconds, 1), "where": "simulator", "target": self.target})
        return row

    def _walk(self, runner, which: str) -> list[np.ndarray]:
        return [np.asarray(self.stage.walk(runner, item), np.float32).reshape(-1) for item in self.stage.items(which)]

    def build(self, setting: str, quantize: Calibration | None = None, which: str = "full") -> dict:
        """One engine built on its own (fp16 when `quantize` is None; auto-hybrid and the int16 overflow
        mode need their own build) and walked over the `which` items; a build the toolkit refuses or dies
        in is a row with its status and error, never an exception."""
        from ..toolkit.build import BuildFailed, default_engine_path, record_report
        from ..toolkit.simulator import SimulatorRunner

        key = self._key(quantize, which)
        if (hit := self._recall(key)) is not None:
            self.stage.outputs[setting] = hit[1]
            return {**hit[0], "setting": setting}
        self.say(f"{self.stage.name}, {self.target}: {setting}")
        build, _ = engine_key(self.stage.onnx, self.target, quantize=quantize)
        out = default_engine_path(self.stage.onnx, self.target, build)
        runner = SimulatorRunner(self.stage.onnx, self.target, out=out, quantize=quantize, verbose=True,
                                 keep_failed=True)
        tests = None
        try:
            if runner.report.ok:
                tests = self._walk(runner, which)
        except (RuntimeError, BuildFailed) as exc:  # built, but the simulator would not run it
            runner.report.error = str(exc)
        finally:
            runner.close()
        self.built += 1
        row = self._row(setting, quantize, runner.report, tests, which, "all" if quantize is None else "")
        if not runner.report.ok:
            row["status"] = _outcome(runner.report)
        else:  # so `report` finds this build's log (its layer table) on a rerun too
            record_report(out, build, runner.report, verbose=True)
        if tests is not None:
            self.stage.outputs[setting] = tests
        if runner.report.status != "timeout":
            self._record(key, row, tests or [])
        return row

    def report(self, quantize: Calibration | None = None) -> BuildReport | None:
        """The recorded report of a build this bench (or an earlier run) made on its own, log included."""
        from ..toolkit.build import cached_report, default_engine_path

        build, _ = engine_key(self.stage.onnx, self.target, quantize=quantize)
        return cached_report(default_engine_path(self.stage.onnx, self.target, build), build, verbose=True)

    def session(self, calibration: Calibration) -> Session:
        """A quantization session of `calibration` on this bench (its child starts only when a variant
        that is not recorded yet is asked for)."""
        return Session(self, calibration)


class Session:
    """One calibration of a stage (dtype, algorithm, method, feeds) and its hybrid variants, measured
    on a Bench: `measure(keep, setting)` scores the build with the config tensors `keep` in float16 (none:
    the plain quantized build). The toolkit child (rkstudy.toolkit.simulator.QuantizationSession) starts
    at the first variant the cache does not hold, and the config's tensor list is recorded so the
    groups of a later run need no child either."""

    def __init__(self, bench: Bench, calibration: Calibration):
        self.bench, self.calibration = bench, calibration
        self._child = None
        self._tensors: list[dict] | None = None
        self.failed: dict | None = None  # the calibration's own failure (a refusal or a crash), as a row
        self.refused: set[str] = set()  # config tensors step 2 refused by name: never asked for again
        if self._refused_path().exists():
            self.refused = set(json.loads(self._refused_path().read_text()))

    def _tensors_path(self) -> Path:
        stage = self.bench.stage
        key = cache.digest(stage.onnx, self.bench.target, self.calibration.data_key(self.bench.names))
        return cache.entry("quantized", stage.onnx.stem + "-tensors", key, ".json")

    def _start(self) -> bool:
        from ..toolkit.simulator import QuantizationSession

        if self._child is not None:
            return self._child.alive
        if self.failed is not None:
            return False
        b = self.bench
        b.say(f"{b.stage.name}, {b.target}: calibrating {self.calibration.settings} on "
              f"{len(self.calibration.feeds)} samples")
        self._child = QuantizationSession(b.stage.onnx, b.target, self.calibration)
        if not self._child.report.ok:
            self.failed = b._row(self.calibration.label, self.calibration, self._child.report, None, "full", "")
            self.failed["status"] = _outcome(self._child.report)
            return False
        self._tensors = self._child.tensors
        atomic.write_text(self._tensors_path(), json.dumps(self._tensors))
        return True

    def _refused_path(self) -> Path:
        return self._tensors_path().with_suffix(".refused.json")

    @property
    def tensors(self) -> list[dict]:
        """The toolkit's quantization config: each tensor's name and dtype."""
        if self._tensors is None:
            path = self._tensors_path()
            if path.exists():
                self._tensors = json.loads(path.read_text())
            elif not self._start():
                return []
        return self._tensors or []

    def quantized(self) -> list[str]:
        """The config tensors a variant can keep in float16 (quantized_tensors), less any step 2 refused."""
        return [n for n in quantized_tensors(self.tensors, self.bench.stage.onnx) if n not in self.refused]

    def measure(self, keep: Sequence[str], setting: str, which: str = "full", groups: str = "") -> dict:
        """The variant with `keep` in float16 walked over the `which` items and scored (recorded by content)."""
        from ..toolkit.build import BuildFailed

        b = self.bench
        quantize = self.calibration.with_fp16(sorted(keep)) if keep else self.calibration
        key = b._key(quantize, which)
        if (hit := b._recall(key)) is not None:
            b.stage.outputs[setting] = hit[1]
            return {**hit[0], "setting": setting, "fp16_groups": groups}
        if not self._start():
            return {**self.failed, "setting": setting, "fp16_groups": groups, "scored_on": which}
        b.say(f"{b.stage.name}, {b.target}: {setting} ({which} evaluation)")
        build, _ = engine_key(b.stage.onnx, b.target, quantize=quantize)
        from ..toolkit.build import default_engine_path

        variant = self._child.variant(sorted(keep), default_engine_path(b.stage.onnx, b.target, build))
        tests = None
        try:
            if variant.report.ok:
                tests = b._walk(variant, which)
        except (RuntimeError, BuildFailed) as exc:
            variant.report.error = str(exc)
        b.built += 1
        refused = REFUSED_NAME.search(variant.report.error or "")
        if refused and refused.group(1) in keep:  # a constant the config lists: drop it, for good, and build again
            self.refused.add(refused.group(1))
            atomic.write_text(self._refused_path(), json.dumps(sorted(self.refused)))
            return self.measure([k for k in keep if k != refused.group(1)], setting, which, groups)
        row = b._row(setting, quantize, variant.report, tests, which, groups)
        row["calibration_s"] = round(self._child.report.seconds, 1)  # the session's one pass, for the cost
        if not variant.report.ok:
            row["status"] = _outcome(variant.report)
        if not self._child.alive:  # the toolkit died under this variant: the session's later asks say so
            self.failed = {**row, "error": f"the session ended at an earlier variant: {row['error']}"[:300]}
        if tests is not None:
            b.stage.outputs[setting] = tests
        if variant.report.status != "timeout":
            b._record(key, row, tests or [])
        return row

    def close(self) -> None:
        if self._child is not None:
            self._child.close()
            self._child = None

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _outcome(report: BuildReport) -> str:
    """A failed build's status as a row says it: refused at a step (the toolkit raised), crashed (a signal
    ended the toolkit: 'crashed (SIGSEGV, exit 139)' as a shell reports it), or its plain status."""
    if report.ok:
        return "ok"
    error = report.error or ""
    if report.status == "aborted":
        import re
        import signal

        m = re.search(r"died on (SIG\w+)", error)
        if m:
            return f"crashed ({m.group(1)}, exit {128 + signal.Signals[m.group(1)].value}) at {report.failed_step}"
        return f"crashed at {report.failed_step}"
    if report.status == "failed":
        return f"refused at {report.failed_step or 'build'}"
    return report.status


# --- which dtype each target builds ---------------------------------------------------------------------
def probe_dtypes(targets: Sequence[str] = ALL_TARGETS, dtypes: Sequence[str] = tuple(QUANTIZED_DTYPES),
                 progress: Callable[[str], None] | None = None) -> list[dict]:
    """Which quantized dtype each target builds and simulates, on the dtype probe (rkstudy.toolkit.probes:
    16 -> 32 -> 1 channels, k7), calibrated on 4 seeded noise inputs and scored against fp32 on a fifth:
    one row per (target, dtype), the toolkit's refusal or crash quoted (each build runs in its own child,
    so a toolkit that dies is a row, not the end of the study)."""
    from ..toolkit import probes
    from ..toolkit.simulator import simulate

    path = cache.cached_bytes("toolchain", "dtype_probe", probes.dtype_probe().SerializeToString(), ".onnx")
    shape = tuple(graph.input_shapes(path)["x"])
    noise = [np.random.default_rng(s).standard_normal(shape).astype(np.float32) for s in range(5)]
    ref = OrtRunner(path).run({"x": noise[4]})[0]
    rows = []
    for target in targets:
        for dtype in dtypes:
            (progress or (lambda _: None))(f"dtype probe: {target} {dtype}")
            quantize = Calibration([{"x": x} for x in noise[:4]], dtype=dtype)
            sim = simulate(path, target, [{"x": noise[4]}], quantize=quantize, verbose=True)
            got = sim.outputs[0][0] if sim.outputs else None
            status = _outcome(sim.report) if not sim.report.ok else ("simulator refused" if got is None else "ok")
            rows.append({"target_soc": target, "dtype": dtype, "weight_bits": QUANTIZED_DTYPES[dtype][0],
                         "activation_bits": QUANTIZED_DTYPES[dtype][1], "status": status,
                         "builds": sim.report.ok, "simulates": got is not None,
                         "snr_vs_fp32_db": gates.snr_db(ref, got) if got is not None else None,
                         "engine_bytes": sim.report.engine_bytes, "failed_step": sim.report.failed_step or "",
                         "error": (sim.inference_error or sim.report.error or "")[:240],
                         "where": "simulator" if got is not None else "host", "target": target})
    return rows


def builds(probe_rows: Sequence[Mapping], target: str) -> list[str]:
    """The dtypes the probe says `target` builds and simulates, in QUANTIZED_DTYPES order."""
    ok = {r["dtype"] for r in probe_rows if r["target_soc"] == target and r["simulates"]}
    return [d for d in QUANTIZED_DTYPES if d in ok]


# --- the toolkit's per-layer report, on more than one sample ---------------------------------------------
def rank_layers(stage: Stage, target: str, calibration: Calibration, samples: int = 3) -> list[dict]:
    """The toolkit's per-layer report of the quantized build (rknn.accuracy_analysis on the simulator) on
    `samples` calibration samples evenly spread (the evaluation data stay unseen), averaged per layer,
    worst first: a layer whose range overflowed on any sample, then by the mean cosine of its output
    computed alone from fp32 inputs (`single_cos`, the error that layer adds by itself; its worst sample
    beside it). The inputs and the casts the report lists beside the layers are left out."""
    from ..toolkit.convert import accuracy_analysis_many

    feeds = evenly(range(len(stage.calibration)), samples)
    names = list(graph.input_shapes(stage.onnx))
    picked = "-".join(map(str, feeds))
    out = cache.cache_dir("analysis") / f"{stage.onnx.stem}-{target}-{calibration.key(names)}-{picked}"
    analyses = accuracy_analysis_many(stage.onnx, target, [dict(stage.calibration[i]) for i in feeds], out_dir=out,
                                      quantize=calibration)
    per: dict[str, list[dict]] = {}
    for analysis in analyses:
        for r in analysis:
            if r["op"] not in ANALYSIS_IO_OPS:
                per.setdefault(r["layer"], []).append(r)
    rows = [{"layer": layer, "op": rs[0]["op"], "samples": len(rs),
             "single_cos": float(np.mean([r["single_cos"] for r in rs])),
             "single_cos_worst": float(np.min([r["single_cos"] for r in rs])),
             "entire_cos": float(np.mean([r["entire_cos"] for r in rs])),
             "overflow": any(r["overflow"] for r in rs)} for layer, rs in per.items()]
    rows.sort(key=lambda r: (not r["overflow"], r["single_cos"]))
    return [{"stage": stage.name, "rank": i + 1, **r, "where": "simulator", "target": target}
            for i, r in enumerate(rows)]


# --- the search: fidelity measured after every choice ---------------------------------------------------
FIDELITY = "pesq_wb"  # what the search steers by (a listener's score), and the goal is stated in
FIDELITY_CAP = 1000.0  # a fidelity past this (an identical render's infinite SNR) counts as this
SNR_FIDELITY = "utterance_snr_db"  # for a stage whose output is not audio


def fidelity_of(stage: Stage) -> str:
    return FIDELITY if stage.listens else SNR_FIDELITY


@dataclass
class Step:
    """One point of a search: the groups in float16 and the row measured for them."""

    fp16: tuple[str, ...]
    row: dict


def search(session: Session, groups: Mapping[str, Sequence[str]], *, direction: str = "backward",
           refine: Callable[[str], Mapping[str, Sequence[str]]] | None = None, floors: Sequence[float] = (),
           budget: int = 60, label: str = "search") -> list[dict]:
    """Greedy hybrid selection by measured fidelity on the stage's search items, one group at a time,
    re-measured after every choice. Groups without conv MACs (the graph's inputs and outputs, activation-
    only blocks: no graph conv writes any of their tensors) stay in float16 throughout.

    `direction` "backward" starts from every group in float16 (fp16's fidelity, up to the casts) and
    returns to low bits, each step, the group that costs the least fidelity per share of MACs it moves;
    "forward" starts from the plain quantized build (the MAC-free groups in float16) and keeps in float16,
    each step, the group that buys the most fidelity per share of MACs it takes back. Either way it is lazy
    greedy: a candidate's last measured value stands until it is the best, then it is re-measured against
    the current set (exact greedy when gains only shrink as the set grows, with far fewer builds).

    `refine(group)` gives a group's finer groups (layers before single layers): where a backward step takes
    the fidelity below one of `floors`, the finer groups of the group it moved go to low bits one at a time
    from the set before that step, each kept there while the fidelity stays at or above that floor.
    `budget` caps the variants built. One row per measured point: `search_step`, `search_move`, the groups
    in float16, `on_path` (the greedy path), `refined_for` (the floor a refined point holds)."""
    bench = session.bench
    metric = fidelity_of(bench.stage)
    every = {g: list(names) for g, names in groups.items()}
    weight = group_macs(bench.stage, every)
    rows: list[dict] = []
    spent = [0]

    def measure(fp16: Sequence[str], move: str, step: int, **extra) -> dict:
        keep = [t for g in fp16 for t in every[g]]
        before = bench.built
        row = session.measure(keep, f"{label} {step}: {move}", which="search", groups=" + ".join(fp16))
        spent[0] += bench.built - before
        row = {**row, "search": label, "direction": direction, "search_step": step, "search_move": move,
               "on_path": False, "refined_for": "", **extra}
        rows.append(row)
        return row

    def value(row: Mapping) -> float:
        """The row's fidelity, finite (an identical render's SNR is infinite: capped, so gains compare)."""
        v = row.get(metric)
        return float(np.clip(v, -FIDELITY_CAP, FIDELITY_CAP)) if isinstance(v, (int, float)) and not np.isnan(v) \
            else -FIDELITY_CAP

    def share(row: Mapping) -> float:
        return float(row.get("low_bit_mac_share") or 0.0)

    def trial_of(pick: str) -> list[str]:
        return [g for g in state if g != pick] if direction == "backward" else state + [pick]

    def best(stale: Mapping[str, float]) -> str:
        return min(stale, key=stale.get) if direction == "backward" else max(stale, key=stale.get)

    top = measure(list(every), "every group in float16", 0)
    movable = [g for g in every if weight[g] > 0]
    fixed = [g for g in every if g not in movable]
    if direction == "backward":
        state, current = list(every), top
        alone = {g: measure(trial_of(g), f"{g} alone at low bits", 0) for g in movable}
        stale = {g: (value(top) - value(alone[g])) / max(share(alone[g]) - share(top), 1e-6) for g in movable}
    else:
        state = list(fixed)
        current = measure(state, "only the groups without conv MACs in float16", 0)
        stale = {g: np.inf for g in movable}  # every candidate is measured once before one is taken
    current["on_path"] = True
    step = 0
    while stale:
        step += 1
        fresh: dict[str, dict] = {}  # candidates measured against the current set in this step
        while True:
            pick = best(stale)
            if pick in fresh or spent[0] >= budget:
                break
            row = measure(trial_of(pick), f"{pick} {'to low bits' if direction == 'backward' else 'kept in float16'}",
                          step)
            moved = abs(share(row) - share(current)) or 1e-6
            gain = value(current) - value(row) if direction == "backward" else value(row) - value(current)
            stale[pick], fresh[pick] = gain / moved, row
        if pick not in fresh:  # out of budget before this step's choice was measured
            break
        trial, row = trial_of(pick), fresh[pick]
        for floor in floors:
            if direction == "backward" and refine is not None and value(current) >= floor > value(row):
                finer = {f"{pick} / {sub}": list(names) for sub, names in refine(pick).items()}
                every.update(finer)
                held = [g for g in state if g != pick] + list(finer)
                weight.update(group_macs(bench.stage, finer))
                for sub in [f for f in finer if weight[f] > 0]:  # a block without conv MACs stays in float16
                    if spent[0] >= budget:
                        break
                    trial_row = measure([g for g in held if g != sub], f"{sub} to low bits", step,
                                        refined_for=floor)
                    if value(trial_row) >= floor:
                        held = [g for g in held if g != sub]
        state, current = trial, row
        current["on_path"] = True
        del stale[pick]
    return rows


def path(rows: Sequence[Mapping]) -> list[dict]:
    """The greedy path of a search's rows, by step."""
    return sorted([r for r in rows if r.get("on_path")], key=lambda r: r["search_step"])


def refiner(stage: Stage, groups: Mapping[str, Sequence[str]]) -> Callable[[str], dict[str, list[str]]]:
    """refine(group) for search: one of `groups`' tensors split by their module path at the first depth at
    which they fall into more than one module; a group that does not split has no finer groups."""
    modules = tensor_modules(stage.onnx, [t for names in groups.values() for t in names])

    def refine(group: str) -> dict[str, list[str]]:
        members = groups.get(group, [])
        for depth in range(1, 8):
            split: dict[str, list[str]] = {}
            for name in members:
                split.setdefault(first_levels(modules[name], depth), []).append(name)
            if len(split) > 1:
                return split
        return {}
    return refine


# --- what the curves say ---------------------------------------------------------------------------------
FP16_LIKE_PESQ = 0.1  # within this of fp16's PESQ-WB: perceived as fp16 (the goal's bar)
GOOD_PESQ = 3.5       # the second bar: good speech, if not fp16's
GOAL_LOW_BIT_SHARE = 0.8  # the goal: most of the conv MACs on weights of 8 bits or fewer
FP16_LIKE = "fp16-like (PESQ-WB within 0.1 of fp16)"
GOOD = f"PESQ-WB >= {GOOD_PESQ:g}"
GOAL = (f"at least {GOAL_LOW_BIT_SHARE:.0%} of its conv MACs on weights of 8 bits or fewer, "
        f"PESQ-WB within {FP16_LIKE_PESQ:g} of fp16")


def cheapest(rows: Sequence[Mapping], fp16: Mapping) -> list[dict]:
    """For one stage and target: the measured setting with the largest share of conv MACs on weights of
    8 bits or fewer (then the smallest engine) at fp16-like perception (PESQ-WB within FP16_LIKE_PESQ of
    the fp16 row's) and at PESQ-WB >= GOOD_PESQ, from rows scored on the full evaluation; where no row
    reaches a bar, the row says so and names the best PESQ-WB measured. Speed is the board's to settle."""
    out = []
    fp16_pesq = fp16.get("pesq_wb")
    scored = [r for r in rows if r.get("scored_on") == "full" and r.get("dtype") != "fp16"
              and isinstance(r.get("pesq_wb"), (int, float))]
    for criterion, bar in ((FP16_LIKE, fp16_pesq - FP16_LIKE_PESQ if isinstance(fp16_pesq, (int, float)) else None),
                           (GOOD, GOOD_PESQ)):
        base = {"stage": fp16["stage"], "soc": fp16["target"], "criterion": criterion,
                "pesq_wb_bar": round(bar, 3) if bar is not None else "", "fp16_pesq_wb": fp16_pesq,
                "fp16_engine_bytes": fp16.get("engine_bytes")}
        reach = [r for r in scored if bar is not None and r["pesq_wb"] >= bar]
        best = max(reach, key=lambda r: (r.get("low_bit_mac_share") or 0.0, -(r.get("engine_bytes") or 0)),
                   default=None)
        if best is None:
            top = max(scored, key=lambda r: r["pesq_wb"], default=None)
            why = (f"no measured setting reaches it: the best quantized PESQ-WB is {top['pesq_wb']:.2f} "
                   f"({top['setting']})" if top else "no setting was scored")
            out.append({**base, "found": False, "setting": "", "why_none": why, "summary": f"none ({why})",
                        "where": "simulator", "target": fp16["target"]})
            continue
        out.append({**base, "found": True, "setting": best["setting"], "dtype": best["dtype"],
                    "pesq_wb": best["pesq_wb"], "stoi": best.get("stoi"), "dnsmos_ovrl": best.get("dnsmos_ovrl"),
                    "utterance_snr_db": best.get("utterance_snr_db"),
                    "window_snr_db_min": best.get("window_snr_db_min"),
                    "low_bit_mac_share": best.get("low_bit_mac_share"),
                    "low_bit_weight_share": best.get("low_bit_weight_share"), "engine_bytes": best.get("engine_bytes"),
                    "goal_share_met": (best.get("low_bit_mac_share") or 0.0) >= GOAL_LOW_BIT_SHARE,
                    "speed": "board-only", "why_none": "",
                    "summary": f"{best['setting']} ({best['dtype']}: PESQ-WB {best['pesq_wb']:.2f}, "
                               f"{best.get('low_bit_mac_share') or 0.0:.0%} of the conv MACs on weights of 8 bits or "
                               f"fewer, {best.get('engine_bytes')} bytes)",
                    "where": "simulator", "target": fp16["target"]})
    return out


def uniform(rows: Iterable[Mapping]) -> list[dict]:
    """Rows with one set of columns (every column any row has, in first-seen order; '' where a row has
    none): a table mixes plain settings, search points and ranked hybrids, each with columns of its own."""
    rows = list(rows)
    columns = list(dict.fromkeys(k for r in rows for k in r))
    return [{k: r.get(k, "") for k in columns} for r in rows]


def goal_rows(cheapest_rows: Sequence[Mapping], stage: str) -> list[dict]:
    """The goal's verdict for `stage`, from its cheapest rows at fp16-like perception on every SoC: met when
    one of them has at least GOAL_LOW_BIT_SHARE of its conv MACs on weights of 8 bits or fewer; the largest
    share found, with its SoC and setting, either way (0 and 'none' when no SoC has a setting at the bar)."""
    mine = [r for r in cheapest_rows if r["stage"] == stage and r["criterion"] == FP16_LIKE]
    best = max((r for r in mine if r.get("found")), key=lambda r: r.get("low_bit_mac_share") or 0.0, default=None)
    share = (best or {}).get("low_bit_mac_share") or 0.0
    return [{"stage": stage, "socs": " ".join(r["soc"] for r in mine), "goal": GOAL,
             "verdict": "met" if share >= GOAL_LOW_BIT_SHARE else "not met",
             "best_low_bit_mac_share": share, "best_soc": best["soc"] if best else "none",
             "best_setting": best["setting"] if best else "none", "where": "simulator",
             "target": best["soc"] if best else "none"}]


def dtype_summary(probe_rows: Sequence[Mapping]) -> list[dict]:
    """Per SoC of the probe: the dtypes it builds and simulates, refuses, and crashes on, in one phrase."""
    out = []
    for soc in dict.fromkeys(r["target_soc"] for r in probe_rows):
        mine = [r for r in probe_rows if r["target_soc"] == soc]
        built = [r["dtype"] for r in mine if r["simulates"]]
        refused = [r["dtype"] for r in mine if r["status"].startswith("refused")]
        crashed = [r["dtype"] for r in mine if r["status"].startswith("crashed")]
        parts = [f"builds {', '.join(built)}" if built else "builds none"]
        parts += [f"refuses {', '.join(refused)}"] if refused else []
        parts += [f"crashes on {', '.join(crashed)}"] if crashed else []
        out.append({"target_soc": soc, "builds": " ".join(built), "refuses": " ".join(refused),
                    "crashes": " ".join(crashed), "summary": "; ".join(parts), "where": "host", "target": soc})
    return out


# --- where "every ranked layer in float16" loses: one change at a time -----------------------------------
def isolation(session: Session, ranked: Sequence[str]) -> list[dict]:
    """Where the loss of a hybrid that keeps every layer accuracy_analysis names in float16 comes from, one
    change at a time, scored on the full evaluation (per window and per utterance): the plain quantized
    build; the layers that report names in float16 (`ranked`: what such a hybrid keeps, the casts it names
    included); then each kind of config tensor it does not name added in turn (the compiler-made tiles,
    splits and pads, the graph's input casts and reshapes, its output cast), which ends at every quantized
    tensor in float16; and from there each kind alone returned to low bits (the input casts, the output
    cast, the last conv, the flow's Exp where the graph has one). A kind the graph does not have, or the
    report already names, adds no row. Each row names how many tensors its change moved and the first few."""
    stage = session.bench.stage
    names = session.quantized()
    model = graph.load(stage.onnx, load_external_data=False)
    index = Index(model)
    inputs = {i.name for i in model.graph.input}
    outputs = {o.name for o in model.graph.output}
    located = {name: macs.locate(name, index) for name in names}
    ranked_set = set(ranked)

    def kind(name: str) -> str:
        k, found = located[name]
        if k == "tensor" and found in inputs:
            return "input casts"
        if k == "tensor" and found in outputs:
            return "output cast"
        return "ranked" if name in ranked_set else "compiler-made"

    by = {k: [n for n in names if kind(n) == k] for k in ("ranked", "compiler-made", "input casts", "output cast")}

    def node_of(name: str) -> str:
        k, found = located[name]
        node = index.producer.get(found) if k == "tensor" else next((n for n in index.nodes if n.name == found), None)
        return node.name if node is not None else ""

    convs = [n.name for n in model.graph.node if n.op_type in macs.CONV_OPS]
    exps = {n.name for n in model.graph.node if n.op_type == "Exp"}
    rows = []

    def one(keep: Sequence[str], setting: str, change: str, changed: Sequence[str]) -> None:
        rows.append({**session.measure(keep, setting, which="full"), "change": change,
                     "tensors_changed": len(changed), "changed": " ".join(changed[:4]) + (" ..." if len(changed) > 4
                                                                                            else ""),
                     "exp_nodes": len(exps)})

    one([], f"{session.calibration.label}: plain", "nothing in float16", [])
    # what a hybrid of every ranked layer keeps: every name the report gives, the casts it names included
    kept = [n for n in names if n in ranked_set]
    one(kept, "the layers accuracy_analysis names in float16", "the ranked layers", kept)
    for k in ("compiler-made", "input casts", "output cast"):
        added = [n for n in by[k] if n not in kept]
        if added:
            kept = kept + added
            one(kept, f"... + {k} in float16", f"+ {k}", added)
    for k in ("input casts", "output cast"):
        if by[k]:
            one([n for n in names if n not in by[k]], f"every tensor in float16 but the {k}", f"- {k}", by[k])
    if convs:
        last = [n for n in names if node_of(n) == convs[-1]]
        if last:
            one([n for n in names if n not in last], f"every tensor in float16 but the last conv ({convs[-1]})",
                "- last conv", last)
    exp = [n for n in names if node_of(n) in exps]
    if exp:
        one([n for n in names if n not in exp], "every tensor in float16 but the Exp", "- Exp", exp)
    return rows


# --- the accuracy_analysis ranking as a hybrid, on the search's footing ----------------------------------
def ranked_keep(stage: Stage, ranking: Sequence[Mapping], names: Sequence[str], n: int,
                fixed: Sequence[str]) -> list[str]:
    """The config tensors a hybrid of the `n` worst layers of `ranking` keeps in float16, on the search's
    footing: those layers, every config tensor of the same graph nodes (the compiler-made tiles and
    splits the report does not name), and `fixed` (the groups without conv MACs, which the search keeps
    in float16 too)."""
    index = Index(graph.load(stage.onnx, load_external_data=False))

    def node(name: str) -> str:
        kind, found = macs.locate(name, index)
        producer = index.producer.get(found) if kind == "tensor" else None
        return producer.name if producer is not None else found

    worst = {node(r["layer"]) for r in ranking[:n]} | {r["layer"] for r in ranking[:n]}
    return [t for t in names if t in worst or node(t) in worst or t in set(fixed)]


# --- one stage through the whole lever: what notebook 08 runs per plan -----------------------------------
DEFAULT_SAMPLES = 16  # calibration samples of the default setting (evenly spread over the stage's set)


@dataclass
class StageRun:
    """What one stage's measurements produced: every full-evaluation row (`rows`: fp16, each dtype and
    calibration, auto-hybrid, the search's points re-scored on the full evaluation, their transfer to the
    other targets), the search rows (on the search items), the ranking and its curve, the isolation, the
    MAC accounting of its fp16 build, the cheapest settings per target, and the minutes it took."""

    stage: Stage
    rows: list[dict] = field(default_factory=list)
    search: list[dict] = field(default_factory=list)
    ranking: list[dict] = field(default_factory=list)
    isolation: list[dict] = field(default_factory=list)
    accounting: list[dict] = field(default_factory=list)
    cheapest: list[dict] = field(default_factory=list)
    minutes: float = 0.0


def _calibration(stage: Stage, dtype: str = "w8a8", algorithm: str = "normal", method: str = "channel",
                 samples: int | None = DEFAULT_SAMPLES) -> Calibration:
    return Calibration(evenly(stage.calibration, samples), dtype=dtype, algorithm=algorithm, method=method)


def _chosen(search_rows: Sequence[Mapping], floors: Sequence[float], metric: str, spread: int = 6) -> list[Mapping]:
    """The search points worth scoring on the full evaluation: the greedy path from the top down to the
    first point under the lowest floor, and the cheapest point at or above each floor (refined included);
    with no floors (a stage scored by SNR), `spread` points of the path evenly spread."""
    if not floors:
        return evenly(path(search_rows), spread)
    picked = []
    for r in path(search_rows):
        picked.append(r)
        if floors and isinstance(r.get(metric), (int, float)) and r[metric] < min(floors):
            break
    picked += _at_floors(search_rows, floors, metric)
    out, seen = [], set()
    for r in picked:
        if r["fp16_groups"] not in seen:
            seen.add(r["fp16_groups"])
            out.append(r)
    return out


def _at_floors(search_rows: Sequence[Mapping], floors: Sequence[float], metric: str) -> list[Mapping]:
    """The search's cheapest point (most MACs on low bits) at or above each floor, once each."""
    out = []
    for floor in floors:
        above = [r for r in search_rows if isinstance(r.get(metric), (int, float)) and r[metric] >= floor]
        best = max(above, key=lambda r: r.get("low_bit_mac_share") or 0.0, default=None)
        if best is not None and all(best["fp16_groups"] != r["fp16_groups"] for r in out):
            out.append(best)
    return out


def _keep_for(groups: Mapping[str, Sequence[str]], refine: Callable, labels: str) -> list[str] | None:
    """The config tensors of a row's `fp16_groups` (' + '-joined labels, a refined one 'group / module'),
    in another session's groups; None when a label has no counterpart there."""
    keep = []
    for label in filter(None, labels.split(" + ")):
        if label in groups:
            keep += groups[label]
            continue
        parent, _, sub = label.partition(" / ")
        finer = refine(parent) if parent in groups else {}
        if sub not in finer:
            return None
        keep += finer[sub]
    return keep


def run_stage(make: Callable[[], Stage], settings: Mapping, probe_rows: Sequence[Mapping],
              progress: Callable[[str], None] | None = None) -> StageRun:
    """One stage through the lever, as its family's plan says (`settings`):

    * `targets` (first: the primary) and, per target, every dtype the probe says it builds (of `dtypes`,
      when given): fp16 and each dtype's default calibration (DEFAULT_SAMPLES samples, normal, per channel);
    * on the primary, `grid`: the default w8a8 calibration varied one setting at a time (algorithm,
      method, samples), and `auto_hybrid` thresholds;
    * on the primary, `isolation` and `ranking` ({"samples", "counts"}: accuracy_analysis on that many
      calibration samples, its N worst layers kept in float16 on the search's footing), and `search`
      ({"budget", "depth", "forward"}: rkstudy.levers.quantization.search, backward, refined at the two PESQ
      bars; `depth` moves blocks of that many module levels instead of the stage's groups; `forward` also runs
      the forward greedy with that budget, from the plain build up), its chosen
      points re-scored on the full evaluation, the cheapest at each bar carried to every other target's
      w8a8 session;
    * the cheapest settings per target (`cheapest`) and the MAC accounting of the primary's fp16 build."""
    import time

    say = progress or (lambda _: None)
    started = time.monotonic()
    stage = make()
    run = StageRun(stage)
    targets = list(settings.get("targets", ("rk3588",)))
    primary = targets[0]
    metric = fidelity_of(stage)
    chosen: list[Mapping] = []
    carried: list[Mapping] = []
    for target in targets:
        bench = Bench(stage, target, progress=say)
        fp16 = bench.build("fp16")
        rows = [fp16]
        if target == primary and fp16.get("status") == "ok" and (report := bench.report()) is not None:
            run.accounting.append(mac_accounting(stage, report))
        floors = ([fp16[metric] - FP16_LIKE_PESQ, GOOD_PESQ] if metric == FIDELITY and
                  isinstance(fp16.get(metric), (int, float)) else [])
        for dtype in [d for d in builds(probe_rows, target) if d in settings.get("dtypes", QUANTIZED_DTYPES)]:
            calibration = _calibration(stage, dtype)
            with bench.session(calibration) as session:
                rows.append(session.measure([], calibration.label))
                if dtype != "w8a8" or session.failed is not None:
                    continue
                names = session.quantized()
                depth = (settings.get("search") or {}).get("depth")  # coarser blocks than the stage's own
                groups = config_groups(stage, names, depth=depth)
                refine = refiner(stage, groups)
                if target == primary:
                    fixed = [t for g, w in group_macs(stage, groups).items() if not w for t in groups[g]]
                    if settings.get("ranking"):
                        spec = settings["ranking"]
                        run.ranking = rank_layers(stage, target, calibration, samples=spec.get("samples", 2))
                        for n in spec.get("counts", ()):
                            n = min(n, len(run.ranking))
                            keep = ranked_keep(stage, run.ranking, names, n, fixed)
                            rows.append({**session.measure(keep, f"accuracy_analysis ranking: {n} worst in float16"),
                                         "ranked_layers": n})
                    if settings.get("isolation") and run.ranking:
                        run.isolation = isolation(session, [r["layer"] for r in run.ranking])
                    if settings.get("search"):
                        run.search = search(session, groups, refine=refine, floors=floors,
                                            budget=settings["search"].get("budget", 40))
                        if settings["search"].get("forward"):  # the same greedy from the plain build up
                            run.search += search(session, groups, direction="forward", label="forward search",
                                                 budget=settings["search"]["forward"])
                        backward = [r for r in run.search if r["search"] == "search"]
                        chosen = _chosen(backward, floors, metric)
                        carried = _at_floors(backward, floors, metric)
                # the primary scores every chosen point; another target, the cheapest at each bar
                for r in chosen if target == primary else carried:
                    keep = _keep_for(groups, refine, r["fp16_groups"])
                    if keep is not None:
                        rows.append({**session.measure(keep, f"search: {r['search_move']}", groups=r["fp16_groups"]),
                                     "search_step": r["search_step"], "from_search_on": primary})
        if target == primary:
            for change in settings.get("grid", ()):
                calibration = _calibration(stage, **change)
                with bench.session(calibration) as session:
                    rows.append({**session.measure([], f"{calibration.label}, {len(calibration.feeds)} samples"),
                                 "grid": ", ".join(f"{k}={v}" for k, v in change.items())})
            for threshold in settings.get("auto_hybrid", ()):
                quantize = _calibration(stage)
                quantize = Calibration(quantize.feeds, auto_hybrid_cos=threshold)
                rows.append(bench.build(f"auto-hybrid cos {threshold:g}", quantize))
        run.rows += rows
        if fp16.get("status") == "ok" and stage.listens:
            run.cheapest += cheapest(rows, fp16)
        elif fp16.get("status") == "ok":  # an encoder's statistics: no listener's bar to hold
            best = max((r for r in rows if r.get("dtype") != "fp16" and isinstance(r.get(metric), (int, float))),
                       key=lambda r: r[metric], default=None)
            run.cheapest.append({"stage": stage.name, "soc": target, "criterion": "PESQ-WB", "found": False,
                                 "why_none": "its outputs are no audio, so no listener's score applies; the best "
                                 f"quantized {metric} is {best[metric]:.1f} dB ({best['setting']})" if best else
                                 "its outputs are no audio, and no quantized setting was scored",
                                 "where": "simulator", "target": target})
    run.minutes = round((time.monotonic() - started) / 60, 1)
    return run
