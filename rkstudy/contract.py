"""The versioned stage contract: what a produced graph and its compiled engine promise, for every family.

A stage is compiled for fixed shapes (RKNN has no dynamic shapes; a multi-shape engine, built with the
toolkit's dynamic_input, runs at each of a listed few and the contract's `shapes` lists them), so
whoever runs the engine has to know how to feed it: which inputs are walked over a latent (and at what
rate per latent frame), which are padded to a fixed width, which are masks the walker makes, which are
constants, and which feed back from an output (a stateful step's cache). The producer writes this
contract into the ONNX metadata at stage 1; the conversion stage completes it (target, toolkit, the ONNX
it compiled, the engine's digest) and writes it beside the `.rknn`, because a board cannot read ONNX
metadata.

Everything is validated at load and every refusal is an EngineMismatch whose one sentence names the
command that makes a matching engine: a missing or unknown field, another schema version, an engine
whose bytes changed after conversion, a target that is not the board's SoC, a source model that is
not the one passed in.

Board side: standard library only (numpy-free, onnx-free).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import atomic
from .cache import sha256_file
from .errors import EngineMismatch
from .targets import TARGETS, runs_engine_for

SCHEMA = 1
METADATA_KEY = "rkstudy.contract"
# walked: sliced per window along `axis` at `rate` elements per latent frame (+ `extra`);
# padded: right-padded to the compiled width; mask: 1 over real frames, 0 over padding, made by
# the walker at its rate; length: the real count of a padded input; constant: the same every step
# (a speaker or style vector); state: fed back from the output that `state` pairs it with.
ROLES = ("walked", "padded", "mask", "length", "constant", "state")
DTYPES = ("float32", "int64")
FIELDS = ("schema", "family", "stage", "target", "toolkit", "inputs", "outputs", "window", "state",
          "source", "onnx", "engine", "producer", "params", "shapes", "quantization", "build")
# written only by a multi-shape engine (shapes), a quantized one (quantization) or stage 2 (build), so every
# stage-1 contract (the ONNX carrying it) keeps its bytes, and a contract written before a field existed reads
OPTIONAL_FIELDS = ("shapes", "quantization", "build")
# What rknn.config(quantized_dtype=...) documents, by its weight and activation bits (which target takes
# which is not documented: notebook 08 measures it per target).
QUANTIZED_DTYPES = {"w8a8": (8, 8), "w8a16": (8, 16), "w16a16i_dfp": (16, 16), "w4a16": (4, 16)}
QUANTIZATION_FIELDS = ("dtype", "algorithm", "method", "label", "calibration_samples", "fp16_tensors")
# What stage 2's build logged and scored, for whoever runs the engine where the simulator cannot see (a board):
# the REGTASK lines and their largest field value, and the simulator-vs-fp32 gate it passed (its name, the floor
# in dB and the worst SNR measured on the probe; None for an exact match).
# npu_predicted (optional: contracts written before the cost model have none): the cost model's predicted ms
# per call under each core mask, with its terms ({mask: {"ms", "terms", "note"}}).
BUILD_FIELDS = ("regtask", "regtask_max_value", "gate", "threshold_db", "simulator_db", "npu_predicted")
TENSOR_FIELDS = ("name", "shape", "dtype", "role", "axis", "rate", "extra")
WINDOW_FIELDS = ("frames", "emit", "context", "hop")
DIGEST_FIELDS = ("file", "sha256")
DEFAULT_REMAKE = "the family's producer (rkstudy <family> <stage> --help)"


@dataclass(frozen=True)
class Tensor:
    """One graph input or output. For walked, padded and mask tensors `axis` is the frame axis and
    its length is `rate * frames + extra` (Kokoro's harmonic input: rate 60, extra 1; a decoder whose
    odd-stride upsampler has no output_padding: rate 320, extra -8)."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    role: str = "constant"
    axis: int | None = None
    rate: int = 1
    extra: int = 0

    @property
    def frames(self) -> int | None:
        """Latent frames this tensor spans (None for tensors without a frame axis)."""
        if self.axis is None:
            return None
        return (self.shape[self.axis] - self.extra) // self.rate


@dataclass(frozen=True)
class WindowShape:
    """A fixed window walked over a latent: `frames = emit + 2 * context`, advancing `hop` frames a step."""

    frames: int
    emit: int
    context: int
    hop: int


@dataclass(frozen=True)
class Expect:
    """What a model needs of one contract param: its `value` (Ellipsis: any value, but present), the
    sentence that says a mismatch (formatted with `engine`, `model`, `key` and `what`), and what a
    contract without the param means (`absent`: a single-speaker engine has no speaker_dims, i.e. 0)."""

    value: Any
    says: str = "the engine's {key} is {engine!r}, the {what} has {model!r}"
    absent: Any = None


@dataclass(frozen=True)
class Digest:
    """A file by name and content (sha256 of its bytes)."""

    file: str
    sha256: str

    @classmethod
    def of(cls, path: Path | str) -> Digest:
        return cls(file=Path(path).name, sha256=sha256_file(path))


@dataclass(frozen=True)
class Contract:
    family: str                      # the registry name, e.g. piper_decoder
    stage: str                       # decoder, encoder, generator, vocoder, estimator
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    source: Digest                   # the model the stage was carved from
    producer: str                    # the stage-1 command that made the graph
    params: Mapping[str, Any] = field(default_factory=dict)  # family-specific (hop, dec_mask, ...)
    window: WindowShape | None = None
    state: tuple[tuple[str, str], ...] = ()  # (input, output) pairs carried from step to step
    target: str | None = None        # stage 2: the SoC the engine was compiled for
    toolkit: str | None = None       # stage 2: the toolkit that compiled it
    onnx: Digest | None = None       # stage 2: the graph the engine was compiled from
    engine: Digest | None = None     # stage 2: the engine's own bytes
    schema: int = SCHEMA
    # a multi-shape engine (config's dynamic_input): every input shape set it runs at, each the
    # inputs' shapes in input order, largest first (the inputs' own shapes); () for one shape
    shapes: tuple[tuple[tuple[int, ...], ...], ...] = ()
    # a quantized engine: what it computes in (QUANTIZATION_FIELDS: the toolkit's dtype, calibration algorithm
    # and method, the build's label, how many calibration samples, how many tensors a hybrid kept in
    # float16); None for an fp16 engine. The inputs and outputs stay float32 either way: the runtime casts.
    quantization: Mapping[str, Any] | None = None
    # stage 2: what the build logged and the simulator gate it passed (BUILD_FIELDS); None before stage 2 and in
    # a contract written before stage 2 recorded it
    build: Mapping[str, Any] | None = None

    # --- reading ------------------------------------------------------------------------
    def tensor(self, name: str) -> Tensor:
        for t in self.inputs + self.outputs:
            if t.name == name:
                return t
        raise KeyError(f"the {self.family} contract has no tensor {name!r}")

    def role(self, role: str, outputs: bool = False) -> list[Tensor]:
        return [t for t in (self.outputs if outputs else self.inputs) if t.role == role]

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    @property
    def shape_sets(self) -> list[tuple[tuple[int, ...], ...]]:
        """The input shapes the engine runs at: each set in input order (one set unless multi-shape)."""
        return list(self.shapes) or [tuple(t.shape for t in self.inputs)]

    def check_shapes(self, shapes: Sequence[Sequence[int]]) -> None:
        """Inputs of these shapes (in input order) are one of the sets the engine was compiled for."""
        refuse_unlisted(self.input_names, shapes, self.shape_sets)

    @property
    def remake(self) -> str:
        """The command that makes a matching graph (stage 1), then an engine (stage 2 with --onnx)."""
        return self.producer

    def engine_name(self, target: str, key: str) -> str:
        """The one naming scheme for engines: family, compiled frame width, target, and a key (the
        compiled graph's digest beside a stage-1 graph; the build's digest in the cache)."""
        width = self.window.frames if self.window else next(
            (t.frames for t in self.inputs if t.frames is not None), None)
        tag = f"w{width}" if width is not None else "fixed"
        return f"{self.family}-{tag}-{target}-{key}.rknn"

    # --- writing ------------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = asdict(self)
        d["inputs"] = [asdict(t) for t in self.inputs]
        d["outputs"] = [asdict(t) for t in self.outputs]
        d["state"] = [{"input": i, "output": o} for i, o in self.state]
        d["params"] = dict(self.params)
        d["shapes"] = [[list(x) for x in one] for one in self.shapes]
        d["quantization"] = dict(self.quantization) if self.quantization else None
        d["build"] = dict(self.build) if self.build else None
        return {k: d[k] for k in FIELDS if k not in OPTIONAL_FIELDS or d[k]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, indent=1)

    def compiled(self, *, target: str, toolkit: str, onnx_path: Path | str, engine_path: Path | str,
                 quantization: Mapping[str, Any] | None = None, build: Mapping[str, Any] | None = None) -> Contract:
        """The stage-2 contract: this one plus the target, toolkit, compiled graph and engine digests (and,
        for a quantized engine, what it computes in; `build`: what the build logged and the gate it passed)."""
        from dataclasses import replace

        if quantization is not None:
            quantization = _quantization(dict(quantization), self.remake)
        if build is not None:
            build = _build(dict(build), self.remake)
        return replace(self, target=target, toolkit=toolkit, onnx=Digest.of(onnx_path),
                       engine=Digest.of(engine_path), quantization=quantization, build=build)

    @property
    def dtype(self) -> str:
        """What the engine computes in: 'fp16', or a quantized build's label ('int8 w8a8 hybrid (12 layers
        fp16)')."""
        return self.quantization["label"] if self.quantization else "fp16"

    def with_shapes(self, shape_sets: Sequence[Sequence[Sequence[int]]]) -> Contract:
        """This contract for a multi-shape engine running at each of `shape_sets` (shapes in input
        order, the inputs' own shapes first: the largest, which the toolkit compiles as MaxShape)."""
        from dataclasses import replace

        sets = _shape_sets([[list(x) for x in one] for one in shape_sets], self.inputs, self.remake)
        return replace(self, shapes=sets)

    def write_beside(self, engine_path: Path | str) -> Path:
        """`<engine>.contract.json`, the file the board side reads."""
        return atomic.write_text(beside(engine_path), self.to_json() + "\n")

    # --- checks at load -----------------------------------------------------------------
    def check_engine(self, engine_path: Path | str) -> None:
        """The engine's bytes are the ones this contract was written for."""
        if self.engine is None or self.target is None:
            raise EngineMismatch(f"the contract beside {Path(engine_path).name} is a stage-1 contract "
                                 f"(no target, no engine digest); convert the graph with `{self.remake_engine()}`")
        actual = sha256_file(engine_path)
        if actual != self.engine.sha256:
            raise EngineMismatch(f"{Path(engine_path).name} has changed since it was converted (sha256 "
                                 f"{actual[:12]}, the contract says {self.engine.sha256[:12]}); "
                                 f"convert it again with `{self.remake_engine()}`")

    def graph_beside(self, engine_path: Path | str, missing: str) -> Path:
        """The graph the engine was compiled from, beside it, with the digest this contract records (stage 2 puts
        it there): EngineMismatch when no graph is named, another one is there, or none is (then `missing` is its
        line: what the caller needs it for and the fix)."""
        engine_path = Path(engine_path)
        if self.onnx is None:
            raise EngineMismatch(f"the contract beside {engine_path.name} names no compiled graph; convert it again "
                                 f"with `{self.remake_engine()}`")
        graph = engine_path.parent / self.onnx.file
        if not graph.is_file():
            raise EngineMismatch(missing)
        if sha256_file(graph) != self.onnx.sha256:
            raise EngineMismatch(f"{graph.name} beside {engine_path.name} is not the graph the engine was compiled "
                                 f"from (its contract says sha256 {self.onnx.sha256[:12]}); copy that graph beside it, "
                                 f"or convert this one with `{self.remake_engine()}`")
        return graph

    def check_target(self, soc: str | None) -> None:
        """The engine was compiled for this board's SoC (an .rknn is not portable between NPUs). `soc`
        None means the caller is not on a board and checks nothing."""
        if soc is None or self.target is None or runs_engine_for(soc, self.target):
            return
        if soc not in TARGETS:
            raise EngineMismatch(f"this engine was compiled for {self.target} and this board is {soc}, which "
                                 f"rknn-toolkit2 does not build for (its RKNPU2 targets: {', '.join(TARGETS)}); "
                                 "run it on a board with one of those SoCs")
        raise EngineMismatch(f"this engine was compiled for {self.target} and this board is {soc}; "
                             f"convert the graph for it with `{self.remake_engine(target=soc)}`")

    def check_source(self, model_path: Path | str) -> None:
        """The model passed in is the one the stage was carved from."""
        actual = sha256_file(model_path)
        if actual != self.source.sha256:
            raise EngineMismatch(f"{Path(model_path).name} (sha256 {actual[:12]}) is not the model this "
                                 f"engine was made from ({self.source.file}, sha256 {self.source.sha256[:12]}); "
                                 f"make one from it with `{self.remake}`")

    def check_runner(self, runner) -> None:
        """`runner` takes this contract's inputs, in its order, at its static shapes (a runner that
        says no input names or shapes, or a dynamic dimension, is taken at its word); a multi-shape
        runner or contract: every shape set the runner runs at is one the contract lists. Every walker
        checks this before its first step, so a wrong engine fails here, not inside a reshape."""
        fix = f"; make a matching one with `{self.remake}`"
        names = list(getattr(runner, "input_names", self.input_names))
        if names != self.input_names:
            raise EngineMismatch(f"the engine takes inputs {names} but its contract lists {self.input_names}" + fix)
        sets = getattr(runner, "shape_sets", None) or []
        if len(sets) > 1 or len(self.shape_sets) > 1:
            for one in sets or [getattr(runner, "shapes", None) or {}]:
                # {name: shape} (the simulator's) or shapes in input order (the board runner's)
                shapes = [one.get(n) for n in self.input_names] if isinstance(one, Mapping) else list(one)
                if all(s is not None and all(isinstance(d, int) for d in s) for s in shapes):
                    self.check_shapes(shapes)
            return
        shapes = getattr(runner, "shapes", None) or {}
        for t in self.inputs:
            got = shapes.get(t.name)
            if got is not None and all(isinstance(d, int) for d in got) and tuple(got) != t.shape:
                raise EngineMismatch(f"the engine's {t.name} is {tuple(got)} but its contract says {t.shape}" + fix)

    def check_params(self, expected: Mapping[str, Any], what: str) -> None:
        """The engine was made for this `what` (voice, model, vocoder step): every param in `expected`
        (a value, or an Expect that says its mismatch in the family's words) is the model's, and one
        EngineMismatch lists every one that is not, naming the command that makes a matching engine."""
        missing, problems = [], []
        for key, want in expected.items():
            want = want if isinstance(want, Expect) else Expect(want)
            if want.value is ...:
                if key not in self.params:
                    missing.append(key)
                continue
            engine = self.params.get(key, want.absent)
            if engine != want.value:
                problems.append(want.says.format(engine=engine, model=want.value, key=key, what=what))
        if missing:
            problems.insert(0, f"the {self.family} contract's params have no {', '.join(missing)}")
        if problems:
            raise EngineMismatch("; ".join(problems) + f". Produce an engine for this {what} with `{self.remake}`")

    def check_family(self, family: str, remake: str | None = None) -> None:
        if self.family != family:
            raise EngineMismatch(f"this is a {self.family} engine, not a {family} one; make a {family} "
                                 f"engine with `{remake or help_for(family, self.target)}`")

    def remake_engine(self, target: str | None = None) -> str:
        """The stage-2 command: the one the family registers (Family.stage2) where it has one, else the
        producer's own `rkstudy <group> <stage>` (a family whose stage 1 is a flag of another family's
        command converts there too) with --onnx; and --target."""
        from .registry import load_all

        graph = self.onnx.file if self.onnx else "slice.onnx"
        target = target or self.target or "rk3588"
        family = load_all().get(self.family)
        if family is not None and family.stage2:
            return f"{family.stage2.format(graph=graph)} --target {target}"
        words = self.producer.split()
        cmd = " ".join(words[1:3]) if words[:1] == ["rkstudy"] and len(words) >= 3 else \
            self.family.replace("_", " ", 1)
        return f"rkstudy {cmd} --onnx <{graph}> --target {target}"


def refuse_unlisted(names, shapes, shape_sets) -> None:
    """One line when the inputs' `shapes` (in `names` order) are not one of a multi-shape engine's
    compiled `shape_sets` ({name: shape} each, or shapes in input order): the runtime would only say
    so inside a traceback (RKNNLite logs "Set input shape failed" and returns None)."""
    got = tuple(tuple(int(d) for d in s) for s in shapes)
    listed = [tuple(tuple(s[n]) for n in names) if isinstance(s, Mapping) else tuple(tuple(x) for x in s)
              for s in shape_sets]
    if got not in listed:
        said = " | ".join(", ".join(str(s) for s in one) for one in listed)
        raise EngineMismatch(f"inputs {', '.join(names)} of shapes {', '.join(map(str, got))} are not one of the "
                             f"shape sets this engine was compiled for ({said}); pad to one of them or build "
                             "the engine with this set too")


def help_for(family: str, target: str | None = None) -> str:
    """The command that makes a `family` engine for `target` when no contract is at hand to name its
    producer: the one the family registers (Family.makes; a family built from the user's own graph, its
    stage 2), found through the registry, since the contract layer imports no family."""
    from .registry import load_all

    record = load_all().get(family)
    target = target or "rk3588"
    if record is not None and record.makes:
        return record.makes.format(target=target)
    if record is not None and record.stage2:
        return f"{record.stage2.format(graph='graph.onnx')} --target {target}"
    return f"rkstudy --help (no family {family!r} is registered)"


def beside(engine_path: Path | str) -> Path:
    return Path(engine_path).with_suffix(".contract.json")


# --- parsing and validation --------------------------------------------------------------------
def _refuse(what: str, remake: str) -> EngineMismatch:
    return EngineMismatch(f"{what}; make a matching one with `{remake}`")


def _keys(obj, expected: Sequence[str], where: str, remake: str, optional: Sequence[str] = ()) -> dict:
    if not isinstance(obj, dict):
        raise _refuse(f"{where} is {type(obj).__name__}, not an object", remake)
    missing = [k for k in expected if k not in obj and k not in optional]
    unknown = [k for k in obj if k not in expected]
    if missing:
        raise _refuse(f"{where} has no {', '.join(missing)}", remake)
    if unknown:
        raise _refuse(f"{where} has unknown field(s) {', '.join(unknown)} (written by another rkstudy?)", remake)
    return obj


def _int(value, what: str, remake: str, minimum: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise _refuse(f"{what} is {value!r}, not an integer >= {minimum}", remake)
    return value


def _signed(value, what: str, remake: str) -> int:
    """An integer of either sign: a walked output may end a fixed few samples short of rate x frames."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise _refuse(f"{what} is {value!r}, not an integer", remake)
    return value


def _tensor(d, where: str, remake: str) -> Tensor:
    d = _keys(d, TENSOR_FIELDS, where, remake)
    name = d["name"]
    if not isinstance(name, str) or not name:
        raise _refuse(f"{where} has no name", remake)
    if not isinstance(d["shape"], list) or not d["shape"]:
        raise _refuse(f"{where} ({name}) has no shape", remake)
    shape = tuple(_int(x, f"{where} ({name}) shape entry", remake, 1) for x in d["shape"])
    if d["dtype"] not in DTYPES:
        raise _refuse(f"{where} ({name}) has dtype {d['dtype']!r}; known: {', '.join(DTYPES)}", remake)
    if d["role"] not in ROLES:
        raise _refuse(f"{where} ({name}) has role {d['role']!r}; known: {', '.join(ROLES)}", remake)
    axis = d["axis"]
    if d["role"] in ("walked", "padded", "mask"):
        if not isinstance(axis, int) or not -len(shape) <= axis < len(shape):
            raise _refuse(f"{where} ({name}) is {d['role']} but has no valid frame axis ({axis!r})", remake)
        axis %= len(shape)
    elif axis is not None:
        raise _refuse(f"{where} ({name}) is {d['role']} and cannot have a frame axis", remake)
    t = Tensor(name=name, shape=shape, dtype=d["dtype"], role=d["role"], axis=axis,
               rate=_int(d["rate"], f"{where} ({name}) rate", remake, 1),
               extra=_signed(d["extra"], f"{where} ({name}) extra", remake))
    if t.axis is not None and (shape[t.axis] - t.extra) % t.rate:
        raise _refuse(f"{where} ({name}) length {shape[t.axis]} is not {t.rate} x frames + {t.extra}", remake)
    return t


def _shape_sets(d, inputs: tuple[Tensor, ...], remake: str) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """A multi-shape contract's sets: two or more, distinct, each a shape per input of that input's
    rank, the first the inputs' own shapes."""
    if not isinstance(d, list) or len(d) == 1:
        raise _refuse(f"the contract's shapes are {d!r}, not a list of two or more input shape sets", remake)
    sets = []
    for i, one in enumerate(d):
        if not isinstance(one, list) or len(one) != len(inputs):
            raise _refuse(f"shape set {i} is not one shape for each of the {len(inputs)} inputs", remake)
        shape_set = []
        for t, shape in zip(inputs, one):
            if not isinstance(shape, list) or len(shape) != len(t.shape):
                raise _refuse(f"shape set {i} gives {t.name} {shape!r}, not a shape of rank {len(t.shape)}", remake)
            shape_set.append(tuple(_int(x, f"shape set {i} ({t.name}) entry", remake, 1) for x in shape))
        sets.append(tuple(shape_set))
    if len(set(sets)) != len(sets):
        raise _refuse("the contract lists one input shape set twice", remake)
    if sets and sets[0] != tuple(t.shape for t in inputs):
        raise _refuse(f"the contract's first shape set {sets[0]} is not its inputs' shapes", remake)
    return tuple(sets)


def _quantization(d, remake: str) -> dict:
    """A quantized engine's record, checked: every QUANTIZATION_FIELDS entry, a documented dtype."""
    d = _keys(d, QUANTIZATION_FIELDS, "the contract's quantization", remake)
    if d["dtype"] not in QUANTIZED_DTYPES:
        raise _refuse(f"the contract's quantization dtype is {d['dtype']!r}; known: {', '.join(QUANTIZED_DTYPES)}",
                      remake)
    for key in ("calibration_samples", "fp16_tensors"):
        _int(d[key], f"the contract's quantization {key}", remake, 0)
    return dict(d)


def _build(d, remake: str) -> dict:
    """Stage 2's build record, checked: every BUILD_FIELDS entry, counts as integers, the floor and the
    measured SNR as numbers (the SNR None for an exact match)."""
    d = _keys(d, BUILD_FIELDS, "the contract's build", remake, optional=("npu_predicted",))
    predicted = d.get("npu_predicted", {})
    if not isinstance(predicted, dict) or any(
            not isinstance(p, dict) or set(p) != {"ms", "terms", "note"} for p in predicted.values()):
        raise _refuse("the contract's build npu_predicted is not {mask: {ms, terms, note}}", remake)
    for key in ("regtask", "regtask_max_value"):
        _int(d[key], f"the contract's build {key}", remake, 0)
    if not isinstance(d["gate"], str) or not d["gate"]:
        raise _refuse(f"the contract's build gate is {d['gate']!r}", remake)
    for key in ("threshold_db", "simulator_db"):
        value = d[key]
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if number or (value is None and key == "simulator_db"):
            continue
        raise _refuse(f"the contract's build {key} is {value!r}, not a number", remake)
    return dict(d)


def _digest(d, where: str, remake: str) -> Digest | None:
    if d is None:
        return None
    d = _keys(d, DIGEST_FIELDS, where, remake)
    if not (isinstance(d["sha256"], str) and len(d["sha256"]) == 64):
        raise _refuse(f"{where} has no sha256", remake)
    return Digest(file=str(d["file"]), sha256=d["sha256"])


def from_dict(d: Mapping, *, remake: str = DEFAULT_REMAKE) -> Contract:
    """A validated Contract from its JSON form; EngineMismatch naming `remake` when anything is off."""
    if not isinstance(d, dict):
        raise _refuse("the contract is not a JSON object", remake)
    remake = d.get("producer") if isinstance(d.get("producer"), str) and d.get("producer") else remake
    if d.get("schema") != SCHEMA:
        raise _refuse(f"the contract has schema version {d.get('schema')!r} and this rkstudy reads {SCHEMA}",
                      remake)
    _keys(d, FIELDS, "the contract", remake, optional=OPTIONAL_FIELDS)
    for key in ("family", "stage", "producer"):
        if not isinstance(d[key], str) or not d[key]:
            raise _refuse(f"the contract's {key} is {d[key]!r}", remake)
    for key in ("inputs", "outputs"):
        if not isinstance(d[key], list) or not d[key]:
            raise _refuse(f"the contract lists no {key}", remake)
    inputs = tuple(_tensor(t, f"input {i}", remake) for i, t in enumerate(d["inputs"]))
    outputs = tuple(_tensor(t, f"output {i}", remake) for i, t in enumerate(d["outputs"]))
    names = [t.name for t in inputs + outputs]
    if len(set(names)) != len(names):
        raise _refuse(f"the contract names a tensor twice ({', '.join(sorted(names))})", remake)
    window = None
    if d["window"] is not None:
        w = _keys(d["window"], WINDOW_FIELDS, "the window", remake)
        window = WindowShape(**{k: _int(w[k], f"window {k}", remake, 0) for k in WINDOW_FIELDS})
        if window.frames != window.emit + 2 * window.context or window.emit < 1 or not 1 <= window.hop <= window.emit:
            raise _refuse(f"the window {w} is not frames = emit + 2 x context with 1 <= hop <= emit", remake)
    if not isinstance(d["state"], list):
        raise _refuse("the contract's state is not a list", remake)
    state = []
    for i, s in enumerate(d["state"]):
        s = _keys(s, ("input", "output"), f"state {i}", remake)
        ins, outs = {t.name: t for t in inputs}, {t.name: t for t in outputs}
        if s["input"] not in ins or s["output"] not in outs:
            raise _refuse(f"state {i} pairs {s['input']!r} with {s['output']!r}, which are not an input and "
                          "an output of this contract", remake)
        if ins[s["input"]].shape != outs[s["output"]].shape or ins[s["input"]].role != "state":
            raise _refuse(f"state {i}: {s['input']} and {s['output']} must both be state tensors of one shape", remake)
        state.append((s["input"], s["output"]))
    paired = {name for pair in state for name in pair}
    unpaired = [t.name for t in inputs + outputs if t.role == "state" and t.name not in paired]
    if unpaired or len(paired) != 2 * len(state):
        raise _refuse(f"state tensor(s) {', '.join(unpaired) or 'named twice'} are not paired once input to "
                      "output: a walker could not carry them", remake)
    if not isinstance(d["params"], dict):
        raise _refuse("the contract's params is not an object", remake)
    for key in ("target", "toolkit"):
        if d[key] is not None and not isinstance(d[key], str):
            raise _refuse(f"the contract's {key} is {d[key]!r}", remake)
    shapes = _shape_sets(d.get("shapes", []), inputs, remake)
    quantization = _quantization(d["quantization"], remake) if d.get("quantization") else None
    build = _build(d["build"], remake) if d.get("build") else None
    return Contract(family=d["family"], stage=d["stage"], inputs=inputs, outputs=outputs,
                    source=_digest(d["source"], "the source", remake), producer=d["producer"],
                    params=dict(d["params"]), window=window, state=tuple(state), target=d["target"],
                    toolkit=d["toolkit"], onnx=_digest(d["onnx"], "the compiled graph", remake),
                    engine=_digest(d["engine"], "the engine", remake), schema=d["schema"], shapes=shapes,
                    quantization=quantization, build=build)


def from_json(text: str, *, where: str, remake: str = DEFAULT_REMAKE) -> Contract:
    try:
        d = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _refuse(f"{where} is not valid JSON ({exc.msg} at line {exc.lineno})", remake) from None
    return from_dict(d, remake=remake)


def from_metadata(props: Mapping[str, str], *, where: str, remake: str) -> Contract:
    """The contract stored in an ONNX graph's metadata_props (as a plain dict: no onnx import here)."""
    if METADATA_KEY not in props:
        raise EngineMismatch(f"{where} carries no stage contract; produce it with `{remake}`")
    return from_json(props[METADATA_KEY], where=f"the contract in {where}", remake=remake)


def for_engine(engine_path: Path | str, *, family: str | None = None, soc: str | None = None,
               source: Path | str | None = None, remake: str | None = None) -> Contract:
    """Load and check the contract beside an engine: present, valid, this family, the engine's bytes
    unchanged, compiled for `soc` (when given) and carved from `source` (when given)."""
    engine_path = Path(engine_path)
    given = remake
    remake = remake or (help_for(family, soc) if family else "rkstudy --help")
    if not engine_path.is_file():
        raise EngineMismatch(f"no engine at {engine_path}; make one with `{remake}`")
    if engine_path.stat().st_size == 0:
        raise EngineMismatch(f"{engine_path} is empty (0 bytes): a copy or a build that did not finish; make it "
                             f"again with `{remake}`")
    path = beside(engine_path)
    if not path.is_file():
        raise EngineMismatch(f"no contract beside {engine_path.name} ({path.name}); the conversion stage writes "
                             f"it: make the engine with `{remake}`")
    c = from_json(path.read_text(encoding="utf-8"), where=path.name, remake=remake)
    if family:
        c.check_family(family, given)
    c.check_engine(engine_path)
    c.check_target(soc)
    if source is not None:
        c.check_source(source)
    return c


STATE_TRANSPORT = ("grouped: one state tensor per channel count, buffers along time. The walker keeps one flat "
                   "fp32 vector (these tensors flattened, in this order); a flat [1, S] state input did not "
                   "compile with rknn-toolkit2 2.5.0 (killed after 30 min; cut by one Split: killed at 15 min), "
                   "the grouped form compiles in about a minute")


def _io_shape(model, name: str) -> tuple[int, ...]:
    for vi in list(model.graph.input) + list(model.graph.output):
        if vi.name == name:
            return tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
    raise KeyError(name)


def state_layout(step) -> list[dict]:
    """How the walker's flat state vector splits: each state tensor's names, shape, offset, floats (`step`
    is an rkstudy.graph.stateful.StepGraph)."""
    rows, offset = [], 0
    for g in step.groups:
        rows.append({"input": g.input, "output": g.output, "shape": list(g.shape), "offset": offset,
                     "floats": g.floats, "buffers": g.buffers})
        offset += g.floats
    return rows


STEP_METHOD = "graph surgery (rkstudy.graph.stateful.make_step) on the folded graph, its boundaries masked"


def step_contract(step, *, family: str, masks: Sequence[str], source: Digest, producer: str, params: Mapping,
                  stage: str = "decoder", method: str = STEP_METHOD) -> Contract:
    """The stage contract of a stateful step (an rkstudy.graph.stateful.StepGraph): time inputs walked (or
    masks, the surgery's own included), static inputs constant, state tensors paired input to output,
    outputs walked at the step's output rate on their own time axis, the step size, lookahead and state
    layout in `params`. Shared by every family that cuts a step (read attribute by attribute, so this
    layer imports nothing of the graph code)."""
    m, masks = step.model, tuple(masks) + tuple(step.masks)
    dm = step.delays
    inputs = [Tensor(t, _io_shape(m, t), role="mask" if t in masks else "walked", axis=dm.axis(t))
              for t in step.time_inputs]
    inputs += [Tensor(t, _io_shape(m, t), role="constant") for t in step.static_inputs]
    inputs += [Tensor(g.input, g.shape, role="state") for g in step.groups]
    outputs = [Tensor(o, _io_shape(m, o), role="walked", axis=dm.axis(o), rate=step.output_rate)
               for o in step.outputs]
    outputs += [Tensor(g.output, g.shape, role="state") for g in step.groups]
    hop = step.output_rate
    first = -(-(step.delay + 1) // (step.emit * hop)) * step.emit
    return Contract(family=family, stage=stage, inputs=tuple(inputs), outputs=tuple(outputs), source=source,
                    producer=producer, state=tuple((g.input, g.output) for g in step.groups),
                    params={**params, "emit": step.emit, "lookahead_samples": step.delay,
                            "lookahead_frames": step.lookahead_frames,
                            # frames the walker is given before it returns its first real sample
                            "first_audio_frames": first, "state_floats": step.state_floats,
                            "state_layout": state_layout(step), "state_transport": STATE_TRANSPORT,
                            "method": method})
