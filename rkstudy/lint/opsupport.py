"""What rknn-toolkit2 does with one operator, measured (host).

Source. The installed rknn-toolkit2 2.5.0 wheel ships no operator support list: its package data is
compiled modules, and the operator names in librknnc.so are the whole ONNX operator enum, not a
support list. So the table is measured here: one small graph per operator (and per variant that
changes the answer: a ConvTranspose stride, a Slice with a negative step, a Clip with no min, a
Pad mode), built with the real compiler in verbose mode (rkstudy.lint.compiler.ask), its layer
table read for where the probe node landed, and the simulator compared with onnxruntime fp32 on
the probe's own input. `python -m rkstudy.lint.opsupport` (or notebook 05 in full mode) rewrites
rkstudy/lint/op_support.json; the lint rules read it.

support: `npu` (builds, on the NPU, simulator within INACCURATE_DB of fp32), `cpu` (builds, the
compiler left the node on the CPU), `fails` (the build fails or aborts), `inaccurate` (builds, but
the simulator is below INACCURATE_DB or non-finite where fp32 is not).
"""

from __future__ import annotations

import datetime as _dt
import json
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..process import shows_progress

TABLE = Path(__file__).with_name("op_support.json")
OPSET = 17
SHAPE = (1, 8, 32)  # [N, C, T]: how a TTS stage's tensors reach the compiler
INACCURATE_DB = 30.0
COMMAND = "python -m rkstudy.lint.opsupport"
F = TensorProto.FLOAT
CONST_OPERAND = ("Pow", "Max", "Min", "Equal", "Less", "Greater")  # probed with a tensor and a constant operand


@dataclass(frozen=True)
class Probe:
    """One operator (variant) to ask the compiler about: `make()` returns the graph, whose node
    under test is named `probe`; `feed(rng)` its input arrays."""

    key: str
    make: Callable[[], onnx.ModelProto]
    feed: Callable[[np.random.Generator], dict]


def _model(nodes, inputs, outputs, inits=(), opsets=(("", OPSET),)) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "op_probe", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m)


def _vi(name, shape, dtype=F):
    return helper.make_tensor_value_info(name, dtype, shape)


def _c(name, value, dtype=None):
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def _uniform(lo=0.1, hi=0.9, shape=SHAPE, names=("x",)):
    return lambda rng: {n: rng.uniform(lo, hi, shape).astype(np.float32) for n in names}


def _one(op: str, extra_inputs=(), inits=(), out_shape=None, out_dtype=F, domain="", n_out=1, opsets=None,
         shape=SHAPE, prelude=(), data="x", key=None, feed=None, **attrs) -> Probe:
    """x [1, 8, 32] -> op(x, *extra_inputs) -> y (shape left to inference unless given)."""
    def make():
        outs = ["y"] + [f"y{i}" for i in range(1, n_out)]
        node = helper.make_node(op, [data, *extra_inputs], outs, name="probe", domain=domain, **attrs)
        return _model(list(prelude) + [node], [_vi("x", list(shape))],
                      [_vi(o, out_shape, out_dtype) if i == 0 else _vi(o, None, TensorProto.UNDEFINED)
                       for i, o in enumerate(outs)],
                      inits, opsets or (("", OPSET),) + ((domain, 1),) * bool(domain))
    return Probe(key or (f"{domain}.{op}" if domain else op), make, feed or _uniform(shape=shape))


def _binary(op: str, out_dtype=F) -> Probe:
    def make():
        node = helper.make_node(op, ["x", "x2"], ["y"], name="probe")
        return _model([node], [_vi("x", list(SHAPE)), _vi("x2", list(SHAPE))], [_vi("y", None, out_dtype)])
    return Probe(op, make, _uniform(names=("x", "x2")))


def _convtranspose(stride: int, kernel_form: str = "2s") -> Probe:
    """VITS upsample form (kernel 2s, pads s/2) or the mask-upsampler form (kernel s, no pad)."""
    k = 2 * stride if kernel_form == "2s" else stride
    pad = stride // 2 if kernel_form == "2s" else 0
    w = (np.random.default_rng(stride).standard_normal((8, 8, k)) / np.sqrt(8 * k)).astype(np.float32)
    key = f"ConvTranspose/stride={stride}" + ("" if kernel_form == "2s" else "/kernel=stride")
    return _one("ConvTranspose", ["w"], [_c("w", w)], kernel_shape=[k], strides=[stride], pads=[pad, pad], key=key)


def _embedding() -> Probe:
    """Gather(table [16, 32], ids [1, 8] int64 input): an embedding lookup with run-time indices."""
    def make():
        node = helper.make_node("Gather", ["table", "x"], ["y"], name="probe", axis=0)
        return _model([node], [_vi("x", [1, 8], TensorProto.INT64)], [_vi("y", [1, 8, 32])],
                      [_c("table", _weights((16, 32)))])
    return Probe("Gather", make, lambda rng: {"x": rng.integers(0, 16, (1, 8)).astype(np.int64)})


def _gelu() -> Probe:
    """Erf inside the exact GELU, x * 0.5 * (1 + erf(x / sqrt 2)): the pattern the toolkit's fuse rules know."""
    def make():
        nodes = [helper.make_node("Div", ["x", "sqrt2"], ["u"], name="scale"),
                 helper.make_node("Erf", ["u"], ["e"], name="probe"),
                 helper.make_node("Add", ["e", "one"], ["a"], name="plus_one"),
                 helper.make_node("Mul", ["x", "a"], ["m"], name="times_x"),
                 helper.make_node("Mul", ["m", "half"], ["y"], name="half")]
        return _model(nodes, [_vi("x", list(SHAPE))], [_vi("y", list(SHAPE))],
                      [_c("sqrt2", np.float32(np.sqrt(2.0))), _c("one", np.float32(1.0)), _c("half", np.float32(0.5))])
    return Probe("Erf/gelu", make, _uniform(-3.0, 3.0))


def _weights(shape, seed=0):
    return (np.random.default_rng(seed).standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)


def probes() -> list[Probe]:
    """Every operator (variant) the table covers: what TTS exports carry, and the ops the rules RK302-RK304 name."""
    unary = ["Abs", "Acos", "Asin", "Asinh", "Atan", "Atanh", "Ceil", "Cos", "Cosh", "Elu", "Erf", "Exp",
             "Floor", "HardSigmoid", "HardSwish", "LeakyRelu", "Log", "Neg", "Reciprocal", "Relu",
             "Round", "Selu", "Sigmoid", "Sign", "Sin", "Sinh", "Softplus", "Softsign", "Sqrt", "Tan", "Tanh",
             "Celu", "ThresholdedRelu", "Shrink", "Identity", "Dropout"]
    out = [_one(op) for op in unary]
    out += [_one("Mish", opsets=(("", 18),)), _one("Acosh", feed=_uniform(1.1, 3.0)),
            _one("IsNaN", out_dtype=TensorProto.BOOL),
            _one("IsInf", out_dtype=TensorProto.BOOL)]
    out += [_binary(op) for op in ("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min")]
    out += [_binary(op, TensorProto.BOOL) for op in ("Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual")]
    # the same ops with a constant operand (x ** 2, a clamp, a threshold): lowered differently
    out += [_one(op, ["k"], [_c("k", np.float32(2.0 if op == "Pow" else 0.5))], key=f"{op}/const",
                 out_dtype=TensorProto.BOOL if op in ("Equal", "Greater", "Less") else F)
            for op in CONST_OPERAND]
    out += [_one("Mod", ["m"], [_c("m", np.float32(0.3))], fmod=1),
            _one("PRelu", ["s"], [_c("s", np.full((8, 1), 0.2, np.float32))]),
            _one("Where", ["x", "zero"], data="cond",
                 prelude=[helper.make_node("Greater", ["x", "half"], ["cond"], name="cond")],
                 inits=[_c("zero", np.zeros(SHAPE, np.float32)), _c("half", np.float32(0.5))])]
    axes = _c("axes", np.array([2], np.int64))
    out += [_one("ReduceSum", ["axes"], [axes], keepdims=1)]
    out += [_one(op, axes=[2], keepdims=1) for op in ("ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd",
                                                      "ReduceL1", "ReduceL2", "ReduceLogSumExp", "ReduceSumSquare")]
    out += [_one("ArgMax", axis=2, keepdims=1, out_dtype=TensorProto.INT64),
            _one("ArgMin", axis=2, keepdims=1, out_dtype=TensorProto.INT64),
            _one("CumSum", ["ax"], [_c("ax", np.array(2, np.int64))]),
            _one("TopK", ["k"], [_c("k", np.array([4], np.int64))], axis=-1, n_out=2),
            _one("Softmax", axis=-1), _one("LogSoftmax", axis=-1), _one("Hardmax", axis=-1)]
    i64 = lambda name, v: _c(name, np.array(v, np.int64))  # noqa: E731
    out += [_one("Transpose", perm=[0, 2, 1]), _one("Reshape", ["s"], [i64("s", [1, 16, 16])]),
            _one("Flatten", axis=1), _one("Unsqueeze", ["a"], [i64("a", [1])]),
            _one("Slice", ["st", "en", "ax", "sp"], [i64("st", [1]), i64("en", [31]), i64("ax", [2]), i64("sp", [1])]),
            _one("Slice", ["st", "en", "ax", "sp"], [i64("st", [-1]), i64("en", [-(2**31)]), i64("ax", [1]),
                                                     i64("sp", [-1])], key="Slice/negative-step"),
            _one("Concat", ["x"], axis=1), _one("Split", ["sp"], [i64("sp", [4, 4])], axis=1, n_out=2),
            _one("Pad", ["p"], [i64("p", [0, 0, 2, 0, 0, 2])], mode="constant"),
            _one("Pad", ["p"], [i64("p", [0, 0, 2, 0, 0, 2])], mode="reflect", key="Pad/reflect"),
            _one("Pad", ["p"], [i64("p", [0, 0, 2, 0, 0, 2])], mode="edge", key="Pad/edge"),
            _one("Div", ["x"], [_c("one", np.float32(1.0))], data="one", key="Div/const-numerator"),
            _one("Tile", ["r"], [i64("r", [1, 1, 2])]),
            _one("Expand", ["s"], [i64("s", [2, 8, 32])], key="Expand/batch"),
            _one("Expand", ["s"], [i64("s", [1, 8, 32])], shape=(1, 1, 32)),
            _one("Gather", ["i"], [i64("i", [7, 0, 3, 3])], axis=1, key="Gather/const-indices"),
            _embedding(), _gelu(),
            _one("GatherElements", ["i"], [i64("i", np.random.default_rng(0).integers(0, 32, SHAPE))], axis=2),
            _one("GatherND", ["i"], [i64("i", [[0, 1], [0, 5]])]),
            _one("ScatterND", ["i", "u"], [i64("i", [[0, 1], [0, 5]]), _c("u", np.ones((2, 32), np.float32))]),
            _one("ScatterElements", ["i", "u"], [i64("i", np.zeros((1, 8, 4), np.int64)),
                                                 _c("u", np.ones((1, 8, 4), np.float32))], axis=2),
            _one("Trilu", upper=1), _one("Einsum", ["e"], [_c("e", _weights((32, 16)))], equation="bct,td->bcd"),
            _one("MatMul", ["w"], [_c("w", _weights((32, 16)))]),
            _one("Gemm", ["w"], [_c("w", _weights((32, 16)))], shape=(8, 32)),
            _one("Conv", ["w"], [_c("w", _weights((8, 8, 3)))], kernel_shape=[3], pads=[1, 1]),
            _one("Resize", ["", "sc"], [_c("sc", np.array([1, 1, 2], np.float32))], mode="nearest",
                 key="Resize/nearest"),
            _one("Resize", ["", "sc"], [_c("sc", np.array([1, 1, 2], np.float32))], mode="linear",
                 key="Resize/linear"),
            _one("DepthToSpace", blocksize=2, shape=(1, 8, 4, 8)),
            _one("SpaceToDepth", blocksize=2, shape=(1, 8, 4, 8))]
    out += [_convtranspose(s) for s in (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16)]
    out += [_convtranspose(s, "s") for s in (2, 3, 4, 5, 8)]
    ones8, zeros8 = np.ones(8, np.float32), np.zeros(8, np.float32)
    ones32, zeros32 = np.ones(32, np.float32), np.zeros(32, np.float32)
    out += [_one("InstanceNormalization", ["g", "b"], [_c("g", ones8), _c("b", zeros8)]),
            # the epsilon attribute written, as every exporter writes it; and omitted (the ONNX default
            # 1e-5), which the toolkit's LayerNorm fuse rule cannot read (measured: the build fails)
            _one("LayerNormalization", ["g", "b"], [_c("g", ones32), _c("b", zeros32)], axis=-1, epsilon=1e-5),
            _one("LayerNormalization", ["g", "b"], [_c("g", ones32), _c("b", zeros32)], axis=-1,
                 key="LayerNormalization/no-epsilon"),
            _one("BatchNormalization", ["g", "b", "m", "v"], [_c("g", ones8), _c("b", zeros8), _c("m", zeros8),
                                                              _c("v", ones8)]),
            _one("LRN", size=3, shape=(1, 8, 4, 8)), _one("LpNormalization", axis=1),
            _one("MeanVarianceNormalization", axes=[0, 2]),
            _one("AveragePool", kernel_shape=[3], pads=[1, 1]), _one("MaxPool", kernel_shape=[3], pads=[1, 1]),
            _one("GlobalAveragePool"), _one("GlobalMaxPool"), _one("LpPool", kernel_shape=[3]),
            _one("Clip", ["lo", "hi"], [_c("lo", np.float32(0.2)), _c("hi", np.float32(0.7))]),
            _one("Clip", ["", "hi"], [_c("hi", np.float32(0.7))], key="Clip/empty-min"),
            _one("Cast", to=TensorProto.FLOAT16, out_dtype=TensorProto.FLOAT16),
            _one("RandomNormalLike"), _one("RandomUniformLike"),
            _one("NonZero", out_dtype=TensorProto.INT64),
            _one("LSTM", ["W", "R"], [_c("W", _weights((1, 64, 8))), _c("R", _weights((1, 64, 16)))], hidden_size=16,
                 shape=(32, 1, 8)),
            _one("GRU", ["W", "R"], [_c("W", _weights((1, 48, 8))), _c("R", _weights((1, 48, 16)))], hidden_size=16,
                 shape=(32, 1, 8)),
            _one("GridSample", ["grid"], [_c("grid", np.random.default_rng(0).uniform(-1, 1, (1, 4, 8, 2))
                                                 .astype(np.float32))], shape=(1, 8, 4, 8))]
    ms, same = "com.microsoft", list(SHAPE)  # onnx has no shape inference for these: the output is declared
    out += [_one("FusedMatMul", ["w"], [_c("w", _weights((32, 32)))], domain=ms, alpha=1.0, out_shape=same),
            _one("Gelu", domain=ms, out_shape=same), _one("FastGelu", domain=ms, out_shape=same),
            _one("QuickGelu", domain=ms, alpha=1.702, out_shape=same),
            _one("BiasGelu", ["b"], [_c("b", zeros32)], domain=ms, out_shape=same),
            _one("SkipLayerNormalization", ["x", "g"], [_c("g", ones32)], domain=ms, out_shape=same),
            _one("FusedConv", ["w"], [_c("w", _weights((8, 8, 3)))], domain=ms, kernel_shape=[3], pads=[1, 1],
                 activation="Relu", out_shape=same)]
    return out


def classify(verdict, model: onnx.ModelProto) -> str:
    """npu / cpu / fails / inaccurate, from a compiler.CompilerAnswer of a probe graph: `cpu` when any layer of
    the probe (the compiler's own helpers for it included, layout plumbing and prelude nodes not) runs
    on the CPU."""
    if not verdict.built:
        return "fails"
    from .compiler import LAYOUT_OPS

    names = [n.name for n in model.graph.node]
    prelude = set(names) - {"probe"}
    probed = next(n.op_type for n in model.graph.node if n.name == "probe")
    # A Reshape the compiler splits off the probed op (`probe#1_rs` after a ReduceMean lowered to a
    # Conv) is layout for a 3-D probe, not the op's own work: in a real graph the same op kept it on
    # the NPU (the encoder's 36 LayerNorm ReduceMeans), so it counts only when a layout op is probed.
    work = [x for x in verdict.cpu_work(names) if x.node not in prelude
            and (x.op not in LAYOUT_OPS or probed in LAYOUT_OPS)]
    if work:
        return "cpu"
    if verdict.nonfinite or (verdict.snr_db is not None and verdict.snr_db < INACCURATE_DB):
        return "inaccurate"
    return "npu"


def probe_row(p: Probe, target: str, seed: int = 0) -> dict:
    """Build one probe for `target`, run the simulator on its input, classify."""
    from . import compiler

    model = p.make()
    v = compiler.ask(model, target, p.feed(np.random.default_rng(seed)),
                     name=f"op_{p.key.replace('/', '_').replace('=', '').replace('.', '_')}")
    layers = ",".join(f"{x.op}:{x.target}:{x.name}" for x in v.layers if x.op not in compiler.IO_OPS)
    return {"key": p.key, "support": classify(v, model), "status": v.status, "failed_step": v.failed_step or "",
            "error": v.error, "layers": layers,
            "simulator_snr_db": None if v.snr_db is None else round(float(v.snr_db), 2),
            "simulator_nonfinite": None if v.snr_db is None else v.nonfinite}  # no simulator ran: no count


def probe_all(targets: Iterable[str], keys: Iterable[str] | None = None, progress: bool = True) -> dict:
    """Probe every operator (or only `keys`) for every target: {target: {key: row}}."""
    from tqdm.auto import tqdm

    chosen = [p for p in probes() if keys is None or p.key in set(keys)]
    jobs = [(t, p) for t in targets for p in chosen]
    table: dict = {t: {} for t in targets}
    for t, p in tqdm(jobs, desc="op probes", disable=not shows_progress(progress)):
        table[t][p.key] = probe_row(p, t)
    return table


def table_rows(table: dict, targets: Iterable[str]) -> list[dict]:
    """The op_support results rows of a probed table: a row is the simulator's when the simulator ran on
    its probe, the host's (the build alone) when the build failed; a failed build has no simulator count."""
    rows = []
    for t in targets:
        for k, row in table[t].items():
            simulated = row["simulator_snr_db"] is not None
            rows.append({"key": k, **{c: row[c] for c in ("support", "status", "failed_step", "error", "layers")},
                         "simulator_snr_db": row["simulator_snr_db"] if simulated else None,
                         "simulator_nonfinite": row["simulator_nonfinite"] if simulated else None,
                         "where": "simulator" if simulated else "host", "target": t})
    return rows


def save(table: dict, path: Path = TABLE) -> Path:
    """Write the measured table with its provenance (toolkit version, date, the command)."""
    from .. import atomic
    from ..tables.results import toolkit_version

    payload = {"source": "measured: one-op graphs built with the installed compiler (verbose layer table) "
                         "and run in its simulator against onnxruntime fp32; the toolkit wheel ships no op list",
               "toolkit": toolkit_version(), "date": _dt.date.today().isoformat(), "command": COMMAND,
               "inaccurate_below_db": INACCURATE_DB, "targets": table}
    return atomic.write_text(path, json.dumps(payload, indent=1, sort_keys=False) + "\n")


def load(path: Path = TABLE) -> dict:
    """The committed table: {"toolkit", "date", "targets": {target: {key: row}}, ...}."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def lookup(key: str, target: str, table: dict | None = None) -> dict | None:
    """The measured row of `key` on `target`, or None when it was not probed."""
    table = table if table is not None else load()
    return table["targets"].get(target, {}).get(key)


def main(argv: list[str] | None = None) -> int:
    import argparse

    from ..targets import FP16_TARGETS  # the probes are fp16 builds, which RV110x refuses

    p = argparse.ArgumentParser(prog=COMMAND, description="Probe operator support with the installed compiler "
                                "and rewrite rkstudy/lint/op_support.json.")
    p.add_argument("--target", action="append", choices=FP16_TARGETS, help="repeat; default: every fp16 target")
    p.add_argument("--key", action="append", help="probe only these keys (the rest of the table is kept)")
    args = p.parse_args(argv)
    targets = args.target or list(FP16_TARGETS)
    fresh = probe_all(targets, args.key)
    old = load()["targets"] if TABLE.is_file() and args.key else {}
    merged = {t: {**old.get(t, {}), **fresh.get(t, {})} for t in sorted(set(old) | set(fresh))}
    print(save(merged))
    return 0


if __name__ == "__main__":
    sys.exit(main())
