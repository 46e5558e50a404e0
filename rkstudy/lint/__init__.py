"""`rkstudy lint`: a static checker of RKNN hazards in an ONNX graph (host).

No public RKNN tool says, before compiling, that a graph will abort the toolkit, fall back to the
CPU, overflow a register field or compute garbage on the board. Each hazard is one small rule in
rkstudy/lint/rules/ that registers itself here with a stable code (duplicates refused), the way
the families register themselves; `lint()` runs every rule over one view of the graph (pinned
shapes, producers, consumers, constants) and returns findings. Every finding names its nodes, the
measured consequence (a reference figure from data/reference/figures.csv, or this project's own probe
of the installed compiler) and the fix rkstudy offers.

Severity: `error` = the toolkit refuses the graph, or the engine computes garbage (measured);
`warning` = it builds and runs at a measured cost (a CPU fallback, REGTASK lines), or the hazard was
measured only on another toolkit version; `info` = worth knowing, nothing measured against it.
`rkstudy lint` exits 0 without error-level findings, 1 with any, 2 for unusable input.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnx
from onnx import shape_inference

from .. import graph
from ..errors import InputError, UsageError, one_line
from ..graph.index import Index
from ..tables.results import reference_figure
from ..targets import TARGETS

SEVERITIES = ("error", "warning", "info")
FP16_MAX = 65504.0  # the largest finite float16
RULE_PACKAGE = f"{__name__}.rules"


class Hit(NamedTuple):
    """What a rule yields: the registry adds the rule's code and name to make a Finding."""

    severity: str
    nodes: Sequence[str]
    message: str
    why: str
    fix: str
    detail: Mapping = {}


@dataclass(frozen=True)
class Finding:
    """One hazard in one graph: a stable code, severity, the nodes, why it matters (the measured
    consequence and where it was measured) and the fix rkstudy offers."""

    code: str
    rule: str
    severity: str
    nodes: tuple[str, ...]
    message: str
    why: str
    fix: str
    detail: Mapping = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"code": self.code, "rule": self.rule, "severity": self.severity, "nodes": list(self.nodes),
                "message": self.message, "why": self.why, "fix": self.fix, "detail": dict(self.detail)}

    def row(self) -> dict:
        """Results-row fragment (nodes counted, the first named; detail flattened to one text cell)."""
        return {"code": self.code, "rule": self.rule, "severity": self.severity, "nodes": len(self.nodes),
                "first_node": self.nodes[0] if self.nodes else "", "message": self.message,
                "detail": "; ".join(f"{k}={v}" for k, v in self.detail.items())}

    def text(self) -> str:
        shown = ", ".join(self.nodes[:6]) + (f", … ({len(self.nodes)} nodes)" if len(self.nodes) > 6 else "")
        return (f"{self.code} {self.severity} {self.rule}: {self.message}" + (f" [{shown}]" if shown else "")
                + f"\n    why: {self.why}\n    fix: {self.fix}")


@dataclass(frozen=True)
class Rule:
    """A registered rule: `check(graph_view)` yields Hits. `needs="sample"` rules run only with a sample."""

    code: str
    name: str
    check: Callable[[GraphView], Iterable[Hit]]
    needs: str = ""

    @property
    def summary(self) -> str:
        return (self.check.__doc__ or "").strip().splitlines()[0] if self.check.__doc__ else ""

    def ident(self) -> tuple:
        return self.code, self.name, self.check.__module__, self.check.__qualname__


RULES: dict[str, Rule] = {}


def rule(code: str, name: str, *, needs: str = "") -> Callable:
    """Register the decorated function as lint rule `code` (RKnnn) named `name`; a second rule
    under the same code or name is refused."""
    if not re.fullmatch(r"RK\d{3}", code):
        raise ValueError(f"lint rule code {code!r}: use RK followed by three digits")
    if needs not in ("", "sample"):
        raise ValueError(f"lint rule {code}: needs={needs!r}, expected '' or 'sample'")

    def register(check: Callable) -> Callable:
        new = Rule(code, name, check, needs)
        for other in RULES.values():
            if (other.code == code or other.name == name) and other.ident() != new.ident():
                raise ValueError(f"two lint rules claim {code} / {name}: {other.check.__module__}."
                                 f"{other.check.__qualname__} and {check.__module__}.{check.__qualname__}")
        RULES[code] = new
        return check
    return register


def load_rules() -> dict[str, Rule]:
    """Import every rule module (each registers itself) and return the registry, ordered by code."""
    importlib.import_module(RULE_PACKAGE)
    return dict(sorted(RULES.items()))


def reference(figure: str, study: str = "lint") -> str:
    """A reference figure as finding text: the figure, its value, where it was measured and that it is
    the reference documents' (read from data/reference/figures.csv, so no rule types a reference number)."""
    r = reference_figure(study, figure)
    return f"{figure}: {r['value']} {r['unit']} (the reference documents, {r['where']}, {r['target']})"


def measured(key: str, target: str) -> tuple[str, str]:
    """(support, text) for operator (variant) `key` on `target` from the op-support table this
    project measured with the installed compiler (rkstudy.lint.opsupport); ("unprobed", ...) if absent."""
    from . import opsupport

    table = opsupport.load()
    row = opsupport.lookup(key, target, table)
    where = f"{table['toolkit']}, {target}, one-op probe"
    if row is None:
        return "unprobed", f"{key} is not in the op-support table ({where}s); probe it with {opsupport.COMMAND}"
    said = {"fails": f"the build fails at {row['failed_step']}: {row['error']}",
            "cpu": "the compiler leaves it on the CPU (CPU layers: "
                   f"{', '.join(x for x in row['layers'].split(',') if ':CPU' in x)})",
            "inaccurate": f"the simulator scores {row['simulator_snr_db']} dB against fp32 "
                          f"({row['simulator_nonfinite']} non-finite values)",
            "npu": f"the compiler places it for the NPU and the PC simulator scores {row['simulator_snr_db']} dB "
                   "against fp32"}
    return row["support"], f"measured ({where}): {said[row['support']]}"


# --- the graph view every rule reads ---------------------------------------------------------------
def node_name(node: onnx.NodeProto) -> str:
    """A node's name, or its first output where the exporter left it nameless (folds do)."""
    return node.name or (node.output[0] if node.output else node.op_type)


@dataclass
class GraphView:
    """One graph as the rules see it: pinned and shape-inferred, with its index (producers,
    consumers, shapes, constants: rkstudy.graph.index) and (with --sample) the sample inputs.

    `pinned` holds the shapes given by --input or taken from the sample; `dynamic` the inputs whose
    dims are still not concrete, with those dims (a symbol as text)."""

    model: onnx.ModelProto
    target: str
    declared: dict[str, tuple | None] = field(default_factory=dict)
    pinned: dict[str, tuple[int, ...]] = field(default_factory=dict)
    dynamic: dict[str, tuple] = field(default_factory=dict)
    sample: dict[str, np.ndarray] | None = None
    memo: dict = field(default_factory=dict)  # computations several rules share (the sample's node maxima)
    time_inputs: tuple[str, ...] | None = None   # the walked inputs (None: the float inputs, time last)
    index: Index = field(init=False)

    def __post_init__(self):
        self.index = Index(self.model)

    @property
    def nodes(self) -> list[onnx.NodeProto]:
        """Nodes in graph order (ONNX requires it to be topological)."""
        return self.index.nodes

    @property
    def inputs(self) -> list[str]:
        inits = self.index.initializers
        return [i.name for i in self.model.graph.input if i.name not in inits]

    @property
    def outputs(self) -> list[str]:
        return [o.name for o in self.model.graph.output]

    def time_axes(self) -> dict[str, int]:
        """Each tensor's time axis, tracked from the walked inputs by the streaming rules
        (rkstudy.graph.delays.time_axes: through Transposes, Reshapes, LayerNorms over channels ...; a node
        no rule streams ends the tracking there). Without named walked inputs, the float inputs whose last
        axis is as long as the first one's are taken as walked, time last (the walkers' convention). Empty
        when the graph is not pinned."""
        if "time_axes" not in self.memo:
            from ..graph.delays import time_axes

            names = self.time_inputs
            if names is None:
                floats = [i for i in self.inputs if self.elem_types.get(i) == onnx.TensorProto.FLOAT
                          and len(self.shapes.get(i) or ()) >= 2 and (self.shapes[i][-1] or 0) > 1]
                names = tuple(i for i in floats if self.shapes[i][-1] == self.shapes[floats[0]][-1]) if floats else ()
            try:
                dm = time_axes(self.model, list(names)) if names else None
                self.memo["time_axes"] = {t: dm.axis(t) for t in dm.timing if t in dm.shapes} if dm else {}
            except (InputError, KeyError, ValueError):   # not pinned, or a graph the walk cannot read
                self.memo["time_axes"] = {}
        return self.memo["time_axes"]

    @property
    def shapes(self) -> dict[str, tuple]:
        return self.index.shapes

    @property
    def elem_types(self) -> dict[str, int]:
        return self.index.elem_types

    @property
    def producer(self) -> dict[str, onnx.NodeProto]:
        return self.index.producer

    @property
    def consumers(self) -> dict[str, list[onnx.NodeProto]]:
        return self.index.consumers

    def shape(self, tensor: str) -> tuple | None:
        """Dims of `tensor` (ints; None where not concrete), or None when inference has no shape."""
        return self.index.shapes.get(tensor)

    def const(self, tensor: str) -> np.ndarray | None:
        """The value of an initializer or a Constant node's output, else None."""
        return self.index.constants.get(tensor)

    def is_const(self, tensor: str) -> bool:
        return self.index.is_const(tensor)

    def from_constants(self, tensor: str) -> bool:
        """`tensor` is computed from constants only (so a constant fold removes it)."""
        return self.index.from_constants(tensor)

    def attr(self, node: onnx.NodeProto, name: str, default=None):
        a = next((a for a in node.attribute if a.name == name), None)
        return default if a is None else onnx.helper.get_attribute_value(a)


def _dims(vi: onnx.ValueInfoProto) -> tuple | None:
    t = vi.type.tensor_type
    if not t.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim)


def _infer(model: onnx.ModelProto) -> onnx.ModelProto:
    return shape_inference.infer_shapes(model, data_prop=True)


def parse_input(text: str) -> tuple[str, tuple[int, ...]]:
    """`z=1x192x93` -> ("z", (1, 192, 93)); UsageError naming the expected form otherwise."""
    name, sep, dims = text.rpartition("=")
    try:
        if not sep or not name:
            raise ValueError
        shape = tuple(int(d) for d in dims.lower().split("x"))
        if any(d < 1 for d in shape):
            raise ValueError
    except ValueError:
        raise UsageError(f"--input {text!r}: expected NAME=D0xD1x..., positive sizes, such as z=1x192x93") from None
    return name, shape


def load_sample(path) -> dict[str, np.ndarray]:
    """Arrays of an .npz keyed by input name (InputError when the file is not a readable .npz)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"no sample at {path}; write one with numpy.savez(path, **{{input_name: array}})")
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {k: np.asarray(npz[k]) for k in npz.files}
    except (ValueError, OSError, EOFError) as exc:
        raise InputError(f"{path} is not a readable .npz ({one_line(str(exc), 120)}); "
                         "write it with numpy.savez(path, **{input_name: array})") from None


def view(model, inputs: Mapping[str, Sequence[int]] | None = None, *, target: str = "rk3588",
         sample: Mapping[str, np.ndarray] | None = None, time_inputs: Sequence[str] | None = None) -> GraphView:
    """The GraphView of `model` with `inputs` (and, for inputs not given, the sample's shapes) pinned.

    Unknown input names, a rank that does not match the graph's, and a sample that disagrees with
    the pinned shapes are UsageErrors (exit 2)."""
    if target not in TARGETS:
        raise UsageError(f"--target {target!r}: use one of {', '.join(TARGETS)}")
    m = graph.load(model)
    inits = {i.name for i in m.graph.initializer}
    declared = {vi.name: _dims(vi) for vi in m.graph.input if vi.name not in inits}
    pins = {k: tuple(int(d) for d in v) for k, v in (inputs or {}).items()}
    sample = {k: np.asarray(v) for k, v in sample.items()} if sample is not None else None
    for source, names in (("--input", pins), ("--sample", sample or {})):
        unknown = sorted(set(names) - set(declared))
        if unknown:
            raise UsageError(f"{source}: no graph input named {', '.join(unknown)}; inputs are "
                             f"{', '.join(declared) or '(none)'}")
    if sample is not None:
        missing = sorted(set(declared) - set(sample))
        if missing:
            raise UsageError(f"--sample has no array for input(s) {', '.join(missing)}; the .npz needs one per input")
        for name, arr in sample.items():
            if name in pins and tuple(arr.shape) != pins[name]:
                raise UsageError(f"--sample {name} has shape {'x'.join(map(str, arr.shape))}, --input pins "
                                 f"{'x'.join(map(str, pins[name]))}; make them agree")
            pins.setdefault(name, tuple(arr.shape))
    for name, shape in pins.items():
        dims = declared[name]
        if dims is not None and len(dims) != len(shape):
            raise UsageError(f"--input {name}={'x'.join(map(str, shape))}: {name} has rank {len(dims)} "
                             f"({'x'.join(str(d or '?') for d in dims)})")
        if dims is not None and any(d and d != s for d, s in zip(dims, shape)):
            raise UsageError(f"--input {name}={'x'.join(map(str, shape))} contradicts the graph's fixed dims "
                             f"{'x'.join(str(d or '?') for d in dims)}")
    try:
        pinned = graph.pin_shapes(m, pins) if pins else _infer(m)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as exc:
        raise UsageError(f"the graph's shapes do not infer at --input {pins} ({one_line(str(exc), 200)}); "
                         "check the pinned shapes against the graph's inputs") from None
    v = GraphView(model=pinned, target=target, declared=declared, pinned=pins, sample=sample,
                  time_inputs=tuple(time_inputs) if time_inputs is not None else None)
    g = pinned.graph
    for vi in g.input:
        if vi.name in inits:
            continue
        dims = vi.type.tensor_type.shape.dim
        if not vi.type.tensor_type.HasField("shape") or not all(d.HasField("dim_value") for d in dims):
            v.dynamic[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                                       for d in dims) if vi.type.tensor_type.HasField("shape") else ("?",)
    return v


# --- running the rules -----------------------------------------------------------------------------
@dataclass
class Report:
    """Every finding of one lint run, with what was linted."""

    model: str
    target: str
    findings: list[Finding]
    pinned: dict
    sampled: bool = False

    @property
    def counts(self) -> dict[str, int]:
        return {s: sum(f.severity == s for f in self.findings) for s in SEVERITIES}

    @property
    def exit_code(self) -> int:
        """0 without error-level findings, 1 with any."""
        return 1 if self.counts["error"] else 0

    def codes(self, severity: str | None = None) -> list[str]:
        return sorted({f.code for f in self.findings if severity is None or f.severity == severity})

    def worst(self, code: str) -> str:
        """The most severe severity among `code`'s findings, or `clean`."""
        sev = [f.severity for f in self.findings if f.code == code]
        return next((s for s in SEVERITIES if s in sev), "clean")

    def to_json(self) -> dict:
        return {"model": self.model, "target": self.target, "pinned": {k: list(v) for k, v in self.pinned.items()},
                "sampled": self.sampled, "counts": self.counts, "exit_code": self.exit_code,
                "findings": [f.to_json() for f in self.findings]}

    @property
    def undecided(self) -> list[Finding]:
        """Findings whose outcome lint cannot predict (a rule marks them `decides`): only a build tells."""
        return [f for f in self.findings if f.detail.get("decides")]

    def text(self) -> str:
        c = self.counts
        head = (f"{self.model} ({self.target}): {c['error']} error(s), {c['warning']} warning(s), "
                f"{c['info']} info")
        if self.undecided:
            codes = ", ".join(sorted({f.code for f in self.undecided}))
            head += f"; the compiler decides {len(self.undecided)} finding(s) ({codes}): build it to know"
        return "\n".join([head] + [f.text() for f in self.findings])


def lint(model, inputs: Mapping[str, Sequence[int]] | None = None, *, target: str = "rk3588",
         sample: Mapping[str, np.ndarray] | str | Path | None = None,
         select: Iterable[str] | None = None, time_inputs: Sequence[str] | None = None) -> Report:
    """Lint `model` (a path or a ModelProto) for `target`.

    `inputs` pins input shapes ({name: dims}); `sample` (arrays by input name, or an .npz path) also
    pins the inputs it covers and enables the fp16-range rules (an onnxruntime fp32 run recording
    every node's max |x|); `select` limits the run to some rule codes; `time_inputs` names the walked
    inputs the time axis is tracked from (GraphView.time_axes). Findings come in rule-code order, each
    rule's in graph order."""
    if isinstance(sample, (str, Path)):
        sample = load_sample(sample)
    rules = load_rules()
    chosen = list(rules) if select is None else list(select)
    unknown = sorted(set(chosen) - set(rules))
    if unknown:
        raise UsageError(f"no lint rule {', '.join(unknown)}; rules are {', '.join(rules)}")
    v = view(model, inputs, target=target, sample=sample, time_inputs=time_inputs)
    findings = []
    for code in chosen:
        r = rules[code]
        if r.needs == "sample" and v.sample is None:
            continue
        for h in r.check(v):
            if h.severity not in SEVERITIES:
                raise ValueError(f"lint rule {code} yielded severity {h.severity!r}")
            findings.append(Finding(r.code, r.name, h.severity, tuple(h.nodes), h.message, h.why, h.fix,
                                    dict(h.detail)))
    name = Path(model).name if isinstance(model, (str, Path)) else (model.graph.name or "model")
    return Report(model=name, target=target, findings=findings, pinned=v.pinned, sampled=v.sample is not None)
