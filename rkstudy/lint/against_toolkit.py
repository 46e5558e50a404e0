"""Lint against the real compiler (host): for every hazard, a small hand-built graph that has it and
one that does not, linted and then built (and, where it builds, simulated) with the installed
rknn-toolkit2, so that every rule's verdict is checked against what the toolkit does.

What the compiler can show on this machine, per graph: the build fails or aborts (`build`), a node's
layer lands on the CPU in the verbose build log (`cpu`), REGTASK lines (`regtask`), or the simulator
returns non-finite values where fp32 does not (`nonfinite`). Some hazards it cannot show here at all
(`none`): the board computes garbage while the simulator is fine (relative-shift chains, a Resize
mask upsampler), or the reference documents measured them on another toolkit version. Those rows disagree by
construction, and each such Case says why (`blind`). Numerics findings (the fp16 range, a Sin left
on the CPU) are also cross-checked against the toolkit's own per-layer accuracy_analysis
(rkstudy.toolkit.convert.accuracy_analysis), not a second per-layer comparer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .. import graph
from ..graph import decmask, relshift, sine
from ..process import shows_progress
from . import compiler
from . import lint as lint_graph

OPSET = 17
F = TensorProto.FLOAT
SIGNALS = ("build", "cpu", "regtask", "nonfinite", "none")
FLAGGING = ("error", "warning")  # a lint verdict that says "this graph has the hazard"
# Beside the case's own rule, the rules that predict the same compiler signal: a graph's CPU layers are
# checked against every rule that predicts one (a rewrite that moves CPU work elsewhere, Sin -> Floor, is
# caught by the rule that knows the new op), and a failed build against every rule's error-level findings.
RELATED = {"cpu": (("RK102", "RK202", "RK302", "RK303", "RK304"), ("error", "warning")),
           "build": (("RK102", "RK103", "RK304", "RK401"), ("error",))}


@dataclass(frozen=True)
class Case:
    """One graph of the matrix. `signal` is the compiler evidence read for it; `blind` says why the
    compiler cannot show this hazard here (then lint and compiler are expected to differ)."""

    hazard: str
    code: str
    graph: str
    has_hazard: bool
    make: Callable[[], onnx.ModelProto]
    signal: str
    blind: str = ""
    feeds: Callable[[], dict] | None = None
    shapes: Mapping | None = None       # shapes handed to the toolkit; {} hands it none (a dynamic graph)
    sample: bool = False                # lint with the feeds as --sample (the fp16-range rules)
    lint_inputs: Mapping | None = None

    def __post_init__(self):
        if self.signal not in SIGNALS:
            raise ValueError(f"case {self.graph}: signal {self.signal!r} is not one of {', '.join(SIGNALS)}")

    @property
    def codes(self) -> tuple[str, ...]:
        """The rules whose verdict is compared with the compiler's signal."""
        return tuple(dict.fromkeys((self.code,) + RELATED.get(self.signal, ((), ()))[0]))

    def counts(self, finding) -> bool:
        """A finding speaks to this case: it is the case's own rule's, or a related rule's at a severity
        that predicts the signal."""
        related, severities = RELATED.get(self.signal, ((), ()))
        return finding.code == self.code or (finding.code in related and finding.severity in severities)


# --- small hand-built graphs ----------------------------------------------------------------------
def _model(nodes, inputs, outputs, inits=(), opsets=(("", OPSET),)) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "honesty", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    m.ir_version = 8
    return m


def _vi(name, shape, dtype=F):
    return helper.make_tensor_value_info(name, dtype, shape)


def _w(shape, seed=0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)


def _i64(name, values):
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


def _f32(name, values):
    return numpy_helper.from_array(np.asarray(values, np.float32), name)


def shape_chain(frames: int = 16) -> onnx.ModelProto:
    """x [1,4,T] -> Conv -> Mul by ConstantOfShape(Shape(h)): the dynamic-export plumbing."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["h"], kernel_shape=[3], pads=[1, 1], name="conv"),
             helper.make_node("Shape", ["h"], ["s"], name="shape"),
             helper.make_node("ConstantOfShape", ["s"], ["twos"], name="sized",
                              value=numpy_helper.from_array(np.array([2.0], np.float32))),
             helper.make_node("Mul", ["h", "twos"], ["y"], name="mul")]
    return _model(nodes, [_vi("x", [1, 4, frames])], [_vi("y", [1, 4, frames])],
                  [numpy_helper.from_array(_w((4, 4, 3)), "w")])


def fused_matmul(foreign: bool = True) -> onnx.ModelProto:
    """x @ W as com.microsoft FusedMatMul (what onnxruntime's optimizer writes) or as MatMul."""
    node = (helper.make_node("FusedMatMul", ["x", "w"], ["y"], name="matmul", domain="com.microsoft", alpha=1.0)
            if foreign else helper.make_node("MatMul", ["x", "w"], ["y"], name="matmul"))
    opsets = (("", OPSET), ("com.microsoft", 1)) if foreign else (("", OPSET),)
    return _model([node], [_vi("x", [1, 8, 32])], [_vi("y", [1, 8, 32])],
                  [numpy_helper.from_array(_w((32, 32)), "w")], opsets)


def empty_output() -> onnx.ModelProto:
    """x + Dropout(x), the Dropout's optional mask output named '' (as exporters leave it)."""
    nodes = [helper.make_node("Dropout", ["x"], ["d", ""], name="drop"),
             helper.make_node("Add", ["x", "d"], ["y"], name="add")]
    return _model(nodes, [_vi("x", [1, 8, 32])], [_vi("y", [1, 8, 32])])


def attention(length: int = 6, d: int = 4, heads: int = 2) -> onnx.ModelProto:
    """VITS relative-position attention at a fixed width: rel_to_abs and abs_to_rel shift chains."""
    L = length
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["q", "rel_k"], ["rl"], name="/attn/MatMul_1"),
             helper.make_node("Pad", ["rl", "p1"], ["a1"], name="/attn/Pad_1"),
             helper.make_node("Reshape", ["a1", "s1"], ["a2"], name="/attn/Reshape_1"),
             helper.make_node("Pad", ["a2", "p2"], ["a3"], name="/attn/Pad_2"),
             helper.make_node("Reshape", ["a3", "s2"], ["a4"], name="/attn/Reshape_2"),
             helper.make_node("Slice", ["a4", "st", "en", "ax"], ["bias"], name="/attn/Slice_1"),
             helper.make_node("Transpose", ["q"], ["qt"], perm=[0, 1, 3, 2], name="/attn/Transpose"),
             helper.make_node("MatMul", ["q", "qt"], ["scores0"], name="/attn/MatMul"),
             helper.make_node("Add", ["scores0", "bias"], ["scores"], name="/attn/Add"),
             helper.make_node("Softmax", ["scores"], ["probs"], axis=-1, name="/attn/Softmax"),
             helper.make_node("Pad", ["probs", "p3"], ["b1"], name="/attn/Pad_3"),
             helper.make_node("Reshape", ["b1", "s3"], ["b2"], name="/attn/Reshape_3"),
             helper.make_node("Pad", ["b2", "p4"], ["b3"], name="/attn/Pad_4"),
             helper.make_node("Reshape", ["b3", "s4"], ["b4"], name="/attn/Reshape_4"),
             helper.make_node("Slice", ["b4", "st2", "en2", "ax2"], ["shifted"], name="/attn/Slice_2"),
             helper.make_node("MatMul", ["shifted", "rel_v"], ["y"], name="/attn/MatMul_2")]
    inits = [_f32("rel_k", rng.standard_normal((1, 1, d, 2 * L - 1))),
             _f32("rel_v", rng.standard_normal((1, 1, 2 * L - 1, d))),
             _i64("p1", [0, 0, 0, 0, 0, 0, 0, 1]), _i64("s1", [1, heads, L * 2 * L]),
             _i64("p2", [0, 0, 0, 0, 0, L - 1]), _i64("s2", [1, heads, L + 1, 2 * L - 1]),
             _i64("st", [0, L - 1]), _i64("en", [L, 2 * L - 1]), _i64("ax", [2, 3]),
             _i64("p3", [0, 0, 0, 0, 0, 0, 0, L - 1]), _i64("s3", [1, heads, L * (2 * L - 1)]),
             _i64("p4", [0, 0, L, 0, 0, 0]), _i64("s4", [1, heads, L, 2 * L]),
             _i64("st2", [1]), _i64("en2", [2 * L]), _i64("ax2", [3])]
    return _model(nodes, [_vi("q", [1, heads, L, d])], [_vi("y", [1, heads, L, d])], inits)


def snake_sin(frames: int = 32) -> onnx.ModelProto:
    """x -> x + sin(x)²: Snake at alpha = 1."""
    nodes = [helper.make_node("Sin", ["x"], ["s"], name="sin"),
             helper.make_node("Mul", ["s", "s"], ["s2"], name="sq"),
             helper.make_node("Add", ["x", "s2"], ["y"], name="add")]
    return _model(nodes, [_vi("x", [1, 8, frames])], [_vi("y", [1, 8, frames])])


def mask_upsample(frames: int = 16, stride: int = 8) -> onnx.ModelProto:
    """h [1,4,sT] * Resize(y_mask [1,1,T], x stride): a decoder mask upsampled by Resize."""
    nodes = [helper.make_node("Resize", ["y_mask", "", "scales"], ["mask_up"], name="mask_up", mode="nearest",
                              nearest_mode="floor", coordinate_transformation_mode="asymmetric"),
             helper.make_node("Mul", ["h", "mask_up"], ["y"], name="masked")]
    return _model(nodes, [_vi("h", [1, 4, frames * stride]), _vi("y_mask", [1, 1, frames])],
                  [_vi("y", [1, 4, frames * stride])], [_f32("scales", [1, 1, stride])])


def weight_norm_conv() -> onnx.ModelProto:
    """Conv whose weight is g·v/‖v‖ computed in the graph (torch weight_norm traced)."""
    v, g = _w((4, 4, 3), 1) * 3, np.abs(_w((4, 1, 1), 2)) + 0.5
    nodes = [helper.make_node("ReduceL2", ["v"], ["norm"], axes=[1, 2], keepdims=1, name="wn_norm"),
             helper.make_node("Div", ["g", "norm"], ["scale"], name="wn_div"),
             helper.make_node("Mul", ["v", "scale"], ["w"], name="wn_mul"),
             helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3], pads=[1, 1], name="conv")]
    return _model(nodes, [_vi("x", [1, 4, 16])], [_vi("y", [1, 4, 16])], [_f32("v", v), _f32("g", g)])


def long_conv(length: int, channels: int = 256) -> onnx.ModelProto:
    """One Conv1d (k=7) over a time axis of `length` (the toolchain study's long-axis probe)."""
    from ..toolkit.probes import long_axis_probe

    return long_axis_probe(length, channels=channels)


def upsampler(stride: int) -> onnx.ModelProto:
    """ConvTranspose1d in the VITS form: kernel 2s, stride s, pads s/2."""
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="up", kernel_shape=[2 * stride],
                            strides=[stride], pads=[stride // 2, stride // 2])
    return _model([node], [_vi("x", [1, 8, 16])], [_vi("y", None)],
                  [numpy_helper.from_array(_w((8, 8, 2 * stride), stride), "w")])


def clip(with_min: bool) -> onnx.ModelProto:
    node = helper.make_node("Clip", ["x", "lo" if with_min else "", "hi"], ["y"], name="clip")
    inits = [_f32("hi", 0.5)] + ([_f32("lo", -0.5)] if with_min else [])
    return _model([node], [_vi("x", [1, 8, 32])], [_vi("y", [1, 8, 32])], inits)


def one_op(op: str, **attrs) -> onnx.ModelProto:
    """x -> op -> + x (the op between two NPU-friendly ends)."""
    nodes = [helper.make_node(op, ["x"], ["u"], name=op.lower(), **attrs),
             helper.make_node("Add", ["x", "u"], ["y"], name="add")]
    return _model(nodes, [_vi("x", [1, 8, 32])], [_vi("y", [1, 8, 32])])


def expand(batch: bool) -> onnx.ModelProto:
    """Expand growing the batch axis (the form measured on the CPU) or a middle axis (on the NPU, as
    the DiT stand-in broadcasts its mask), then an Add."""
    src, dst = ([1, 8, 32], [2, 8, 32]) if batch else ([1, 1, 32], [1, 8, 32])
    nodes = [helper.make_node("Expand", ["x", "s"], ["u"], name="expand"),
             helper.make_node("Add", ["u", "u"], ["y"], name="add")]
    return _model(nodes, [_vi("x", src)], [_vi("y", dst)], [_i64("s", dst)])


def layer_norm(epsilon_written: bool) -> onnx.ModelProto:
    """LayerNormalization over the last axis, with its epsilon attribute written (as torch writes it)
    or left to the ONNX default."""
    node = helper.make_node("LayerNormalization", ["x", "g", "b"], ["u"], name="layernorm", axis=-1,
                            **({"epsilon": 1e-5} if epsilon_written else {}))
    add = helper.make_node("Add", ["x", "u"], ["y"], name="add")
    return _model([node, add], [_vi("x", [1, 8, 32])], [_vi("y", [1, 8, 32])],
                  [_f32("g", np.ones(32)), _f32("b", np.zeros(32))])


def flip(negative: bool) -> onnx.ModelProto:
    """Slice over the channel axis with step -1 (torch.flip, as VITS flows export it) or step 1."""
    start, end, step = ([7], [-(2 ** 31)], [-1]) if negative else ([0], [8], [1])
    node = helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["y"], name="flip")
    return _model([node], [_vi("x", [1, 8, 32])], [_vi("y", [1, 8, 32])],
                  [_i64("st", start), _i64("en", end), _i64("ax", [1]), _i64("sp", step)])


def dynamic_conv(pinned: bool) -> onnx.ModelProto:
    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3], pads=[1, 1], name="conv")
    t = 16 if pinned else "T"
    return _model([node], [_vi("x", [1, 4, t])], [_vi("y", [1, 4, t])], [numpy_helper.from_array(_w((4, 4, 3)), "w")])


def squared(gain: float) -> onnx.ModelProto:
    """(gain·x)² · 1e-5 + sin(x): an intermediate that leaves fp16 when gain·|x| > 255."""
    nodes = [helper.make_node("Mul", ["x", "k"], ["big"], name="scale_up"),
             helper.make_node("Mul", ["big", "big"], ["sq"], name="square"),
             helper.make_node("Mul", ["sq", "kinv"], ["small"], name="scale_down"),
             helper.make_node("Sin", ["x"], ["s"], name="sin"),
             helper.make_node("Add", ["small", "s"], ["y"], name="add")]
    return _model(nodes, [_vi("x", [1, 8, 64])], [_vi("y", [1, 8, 64])], [_f32("k", gain), _f32("kinv", 1e-5)])


def long_input(length: int, channels: int = 256):
    """The long-axis conv's input as the toolchain study feeds it (seed 0): the same graph, target and
    input hit the toolchain sweep's build and simulator run in the shared cache."""
    return _normal("x", (1, channels, length), seed=0)


def _normal(name: str, shape, seed: int = 1, scale: float = 1.0):
    return lambda: {name: (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)}


# --- the cases ---------------------------------------------------------------------------------------
TOOLKIT_FOLDS = ("rknn-toolkit2 2.5.0 builds it: the reference documents' abort was on 2.3.2, so lint keeps it a "
                 "warning that this compiler does not confirm")
BOARD_ONLY = ("the board computes garbage while the simulator matches fp32 (the reference documents' figures in the "
              "finding); no toolkit signal on the host shows it")
TILING = ("the compiler logs REGTASK lines only where the op's tiling overflows the field, which depends on the op, "
          "its channels and the target (results/toolchain/regtask.md: this conv logs none at some lengths past 8191, "
          "and none at all on rk3566); lint reports the axis it can see")


def cases() -> list[Case]:
    """Every hazard, a graph that has it and one that does not."""
    mask_feeds = lambda: {"h": np.random.default_rng(1).standard_normal((1, 4, 128)).astype(np.float32),  # noqa: E731
                          "y_mask": (np.arange(16) < 11).astype(np.float32).reshape(1, 1, 16)}
    x832 = _normal("x", (1, 8, 32))
    return [
        Case("shape chains (Shape -> ConstantOfShape)", "RK101", "shape_chain", True, shape_chain, "build",
             TOOLKIT_FOLDS, _normal("x", (1, 4, 16))),
        Case("shape chains (Shape -> ConstantOfShape)", "RK101", "shape_chain folded", False,
             lambda: graph.fold(shape_chain(), {"x": [1, 4, 16]}), "build", feeds=_normal("x", (1, 4, 16))),
        Case("com.microsoft fused op", "RK102", "FusedMatMul", True, fused_matmul, "cpu", feeds=x832),
        Case("com.microsoft fused op", "RK102", "MatMul", False, lambda: fused_matmul(False), "cpu", feeds=x832),
        Case("empty optional output name", "RK103", "Dropout ['d', '']", True, empty_output,
             "build", feeds=x832),
        Case("empty optional output name", "RK103", "same, graph.trim_outputs", False,
             lambda: graph.trim_outputs(empty_output()), "build", feeds=x832),
        Case("relative-shift chains", "RK201", "attention L=6, chains", True, attention, "none", BOARD_ONLY,
             _normal("q", (1, 2, 6, 4))),
        Case("relative-shift chains", "RK201", "attention L=6, relshift.rewrite_relshift", False,
             lambda: relshift.rewrite_relshift(attention()), "none", feeds=_normal("q", (1, 2, 6, 4))),
        Case("Sin on the CPU", "RK202", "Snake sin", True, snake_sin, "cpu", feeds=_normal("x", (1, 8, 32), scale=3)),
        Case("Sin on the CPU", "RK202", "Snake, sine.reduce_sin (fold: Floor)", True,
             lambda: sine.reduce_sin(snake_sin()), "cpu", feeds=_normal("x", (1, 8, 32), scale=3)),
        Case("Sin on the CPU", "RK202", "Snake, sine.reduce_sin(fold=False) (clip)", False,
             lambda: sine.reduce_sin(snake_sin(), fold=False), "cpu", feeds=_normal("x", (1, 8, 32), scale=3)),
        Case("Resize mask upsampler", "RK203", "Resize x8 mask", True, mask_upsample, "none", BOARD_ONLY, mask_feeds),
        Case("Resize mask upsampler", "RK203", "decmask.resize_to_convtranspose", False,
             lambda: decmask.resize_to_convtranspose(mask_upsample()), "none", feeds=mask_feeds),
        Case("weight norm (ReduceL2)", "RK204", "weight-normed conv", True, weight_norm_conv, "build", TOOLKIT_FOLDS,
             _normal("x", (1, 4, 16))),
        Case("weight norm (ReduceL2)", "RK204", "weight norm folded (graph.fold)", False,
             lambda: graph.fold(weight_norm_conv(), {"x": [1, 4, 16]}), "build", feeds=_normal("x", (1, 4, 16))),
        Case("axis past 8191 (13-bit field)", "RK301", "Conv1d 256 ch at 16384", True, lambda: long_conv(16384),
             "regtask", TILING, long_input(16384)),
        Case("axis past 8191 (13-bit field)", "RK301", "Conv1d 256 ch at 12288", True, lambda: long_conv(12288),
             "regtask", TILING, long_input(12288)),
        Case("axis past 8191 (13-bit field)", "RK301", "Conv1d 256 ch at 8191", False, lambda: long_conv(8191),
             "regtask", TILING, long_input(8191)),
        Case("ConvTranspose stride", "RK302", "ConvTranspose stride 3", True, lambda: upsampler(3), "cpu",
             feeds=_normal("x", (1, 8, 16))),
        Case("ConvTranspose stride", "RK302", "ConvTranspose stride 4", False, lambda: upsampler(4), "cpu",
             feeds=_normal("x", (1, 8, 16))),
        Case("Clip with an empty min", "RK303", "Clip(x, '', 0.5)", True, lambda: clip(False), "cpu", feeds=x832),
        Case("Clip with an empty min", "RK303", "Clip(x, -0.5, 0.5)", False, lambda: clip(True), "cpu", feeds=x832),
        Case("unsupported op", "RK304", "RandomNormalLike", True, lambda: one_op("RandomNormalLike"), "build",
             feeds=x832),
        Case("unsupported op", "RK304", "Atan", True, lambda: one_op("Atan"), "cpu", feeds=x832),
        Case("unsupported op", "RK304", "Slice step -1 (flip)", True, lambda: flip(True), "cpu", feeds=x832),
        Case("unsupported op", "RK304", "Slice step 1", False, lambda: flip(False), "cpu", feeds=x832),
        Case("unsupported op", "RK304", "Tanh", False, lambda: one_op("Tanh"), "cpu", feeds=x832),
        Case("unsupported op", "RK304", "Expand [1,8,32] -> [2,8,32] (batch)", True, lambda: expand(True), "cpu",
             feeds=x832),
        Case("unsupported op", "RK304", "Expand [1,1,32] -> [1,8,32]", False, lambda: expand(False), "cpu",
             feeds=_normal("x", (1, 1, 32))),
        Case("unsupported op", "RK304", "LayerNormalization, no epsilon attribute", True, lambda: layer_norm(False),
             "build", feeds=x832),
        Case("unsupported op", "RK304", "LayerNormalization, epsilon=1e-5 written", False, lambda: layer_norm(True),
             "build", feeds=x832),
        Case("dynamic input dims", "RK401", "Conv over [1,4,T], no shapes given", True, lambda: dynamic_conv(False),
             "build", shapes={}),
        Case("dynamic input dims", "RK401", "Conv over [1,4,16]", False, lambda: dynamic_conv(True), "build",
             feeds=_normal("x", (1, 4, 16))),
        Case("fp16 range (with --sample)", "RK501", "(300x)^2 intermediate", True, lambda: squared(300.0), "nonfinite",
             feeds=_normal("x", (1, 8, 64)), sample=True),
        Case("fp16 range (with --sample)", "RK501", "(3x)^2 intermediate", False, lambda: squared(3.0), "nonfinite",
             feeds=_normal("x", (1, 8, 64)), sample=True),
    ]


# --- evaluation ----------------------------------------------------------------------------------------
@dataclass
class Outcome:
    """One row of the matrix: what lint said, what the compiler did, and whether they agree."""

    case: Case
    lint_said: str
    verdict: compiler.CompilerAnswer
    compiler_flags: bool
    compiler_did: str
    findings: list = field(default_factory=list)

    @property
    def lint_flags(self) -> bool:
        return self.lint_said in FLAGGING

    @property
    def agree(self) -> bool:
        return self.lint_flags == self.compiler_flags

    def row(self) -> dict:
        c = self.case
        fired = sorted({f"{f.code} {f.severity}" for f in self.findings})
        return {"hazard": c.hazard, "code": c.code, "graph": c.graph, "has_hazard": c.has_hazard,
                "lint_said": self.lint_said, "lint_findings": ", ".join(fired) or "-", "signal": c.signal,
                "compiler_did": self.compiler_did,
                "agree": self.agree, "why_not": "" if self.agree else (c.blind or "UNEXPLAINED"),
                "build_s": round(self.verdict.build_s, 1), "where": "simulator" if self.verdict.built else "host",
                "target": self.verdict.target}


def _compiler_side(case: Case, model: onnx.ModelProto, v: compiler.CompilerAnswer) -> tuple[bool, str]:
    """(flags, what it did) for the case's signal."""
    if not v.built:
        return case.signal == "build", f"{v.status} at {v.failed_step}: {v.error}"
    cpu = v.cpu_work([n.name or n.output[0] for n in model.graph.node])
    sim = ("" if v.snr_db is None else f"; simulator {v.snr_db:.1f} dB vs fp32"
           + (f", {v.nonfinite} non-finite" if v.nonfinite else ""))
    if case.signal == "cpu":
        return bool(cpu), ("on the CPU: " + ", ".join(f"{x.op}:{x.name}" for x in cpu) if cpu
                           else "builds, the compiler places every node for the NPU") + sim
    if case.signal == "regtask":
        return v.regtask > 0, f"builds, {v.regtask} REGTASK lines (max value {v.regtask_max:#x}){sim}"
    if case.signal == "nonfinite":
        return v.nonfinite > 0, f"builds{sim}"
    return False, f"builds{sim}"  # build (it built) or none


def evaluate(case: Case, target: str = "rk3588") -> Outcome:
    """Lint the case's graph (only its rule), then ask the compiler."""
    model = case.make()
    feeds = case.feeds() if case.feeds else None
    report = lint_graph(model, case.lint_inputs, target=target, sample=feeds if case.sample else None,
                        select=list(case.codes))
    v = compiler.ask(model, target, feeds, shapes=case.shapes, name=f"honesty_{case.code}_{int(case.has_hazard)}")
    flags, did = _compiler_side(case, model, v)
    counted = [f for f in report.findings if case.counts(f)]
    said = [f.severity for f in counted]
    worst = next((s for s in ("error", "warning", "info") if s in said), "clean")
    return Outcome(case, worst, v, flags, did, counted)


def matrix(targets=("rk3588",), extra: list[Case] = (), progress: bool = True) -> list[Outcome]:
    """Every case (and `extra` ones, such as family_cases()) on every target."""
    from tqdm.auto import tqdm

    jobs = [(t, c) for t in targets for c in [*cases(), *extra]]
    return [evaluate(c, t) for t, c in tqdm(jobs, desc="lint vs compiler", disable=not shows_progress(progress))]


def _tensor(layer: str) -> str:
    """The ONNX tensor an accuracy_analysis layer is named after: the compiler adds `-rs` / `_rs` to the
    layout reshapes it inserts around 3-D tensors and `#k` to split layers."""
    base = layer.split("#", 1)[0]
    return base[:-3] if base.endswith(("-rs", "_rs")) else base


def numerics(case: Case, target: str = "rk3588") -> dict:
    """A numerics finding against the toolkit's own per-layer report: the nodes lint's fp16 rule puts past
    65504 on the sample against the layers accuracy_analysis marks q_inf, and the Sin layer's own error."""
    from ..toolkit.convert import accuracy_analysis
    from .rules.fp16_range import node_maxima

    model = case.make()
    feeds = case.feeds()
    path = compiler.save(model, f"numerics_{case.code}_{int(case.has_hazard)}")
    over = [r["node"] for r in node_maxima(graph.load(path), feeds) if r["max_abs"] > 65504.0]
    analysis = accuracy_analysis(path, target, feeds)
    producer = {o: (n.name or n.output[0]) for n in model.graph.node for o in n.output}
    q_inf = list(dict.fromkeys(producer.get(_tensor(layer), layer) for layer in analysis.overflowed))
    first_q_inf = next((r for r in analysis.rows if r["overflow"]), None)
    sin = next((r for r in analysis.rows if r["op"] == "Sin"), None)
    return {"graph": case.graph, "lint_over_fp16": ",".join(over) or "-",
            "accuracy_analysis_q_inf": ",".join(q_inf) or "-",
            "first_agrees": (over[:1] == q_inf[:1]),
            "first_q_inf_golden_max_abs": first_q_inf["golden_max_abs"] if first_q_inf else float("nan"),
            "sin_single_cos": sin["single_cos"] if sin else float("nan"),
            "sin_single_euc": sin["single_euc"] if sin else float("nan"),
            "where": "simulator", "target": target}


def family_cases() -> list[Case]:
    """The same questions on real graphs: every registered family's `compiler_cases` hook (a real slice
    unfolded and folded, say), in registry order. Full mode only: each builds a real graph."""
    from ..registry import hooked

    return [case for _, make in hooked("compiler_cases") for case in make()]


def _attribute(layer: compiler.Layer, names: set[str], producer: Mapping[str, str],
               padded_by: Mapping[str, str]) -> str | None:
    """The ONNX node a compiler layer belongs to: its name is the node's, or a tensor's (the node that
    produces it), possibly with the compiler's suffixes (`#k`, `-rs`, `_rs`, `_pad`, `-rs_conv`). A
    ConvTranspose's input padding layer (`exConvTransposePad`, named after the input tensor) belongs
    to the ConvTranspose that reads the tensor (`padded_by`), not to the tensor's producer."""
    t = layer.node
    while t:
        if t in names:
            return t
        if layer.op.startswith("exConvTranspose") and t in padded_by:
            return padded_by[t]
        if t in producer:
            return producer[t]
        cut = max(t.rfind("_"), t.rfind("-"))
        if cut <= 0:
            return None
        t = t[:cut]
    return None


def placement(label: str, model: onnx.ModelProto, target: str = "rk3588", inputs: Mapping | None = None) -> dict:
    """lint's CPU predictions on a real graph against the compiler's layer table: the ONNX nodes a CPU
    rule names (error or warning), the nodes whose layers the compiler puts on the CPU, and both.

    Only the build is asked (no simulator run: where a layer lands is in the verbose build's layer table),
    so a verbose build another study recorded for the same graph bytes answers it from the engine cache."""
    cpu_rules = RELATED["cpu"][0]
    report = lint_graph(model, inputs, target=target, select=list(cpu_rules))
    predicted = {n for f in report.findings if f.severity in FLAGGING for n in f.nodes}
    v = compiler.ask(model, target, name=f"placement_{label.split()[0]}")
    names = {n.name or n.output[0] for n in model.graph.node}
    producer = {o: (n.name or n.output[0]) for n in model.graph.node for o in n.output}
    padded_by = {n.input[0]: (n.name or n.output[0]) for n in model.graph.node if n.op_type == "ConvTranspose"}
    found, unattributed = set(), []
    for layer in v.cpu_work(sorted(names)):
        node = _attribute(layer, names, producer, padded_by)
        (found.add(node) if node else unattributed.append(f"{layer.op}:{layer.name}"))
    both, lint_only, compiler_only = predicted & found, predicted - found, found - predicted
    show = lambda nodes: ", ".join(sorted(nodes)[:4]) + (f", … ({len(nodes)})" if len(nodes) > 4 else "")  # noqa: E731
    return {"graph": label, "status": v.status, "nodes": len(names), "lint_cpu_nodes": len(predicted),
            "compiler_cpu_nodes": len(found), "both": len(both), "lint_only": len(lint_only),
            "compiler_only": len(compiler_only), "unattributed_cpu_layers": len(unattributed),
            "lint_only_nodes": show(lint_only) or "-", "compiler_only_nodes": show(compiler_only) or "-",
            "unattributed": ", ".join(unattributed[:4]) or "-",
            "where": "host", "target": target}  # every number here is lint's or the build log's layer table
