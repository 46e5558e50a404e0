"""RK302 convtranspose-stride, RK303 clip-empty-min, RK304 op-support: operators the installed compiler
refuses, leaves on the CPU or computes wrongly, looked up in the table rkstudy measured for it
(rkstudy.lint.opsupport: one-op graphs built with the real compiler, the layer table read, the
simulator run). The hazards looked for are strides outside {1, 2, 4, 8}, Clip with an empty min, Atan,
RandomNormalLike and CumSum; the table says what rknn-toolkit2 actually does with each.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from .. import Hit, measured, node_name, rule
from ..opsupport import CONST_OPERAND

SEVERITY = {"fails": "error", "inaccurate": "error", "cpu": "warning", "unprobed": "info"}
# keys other rules own (their own fix text), and plumbing that folds or never reaches a kernel
OWNED = {"Sin", "Cos", "ReduceL2", "Clip/empty-min", "Resize/nearest", "Resize/linear", "Resize"}
PLUMBING = {"Constant", "Shape", "Size", "ConstantOfShape", "Range", "Squeeze", "Unsqueeze", "Identity"}
NEVER_FOLDED = ("RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli", "Multinomial")
FIXES = {
    "RandomNormalLike": "draw the noise outside the engine and feed it as an input (the Inflect v2 contract keeps its "
                        "noise head on the CPU)",
    "RandomUniformLike": "draw the noise outside the engine and feed it as an input",
    "Slice/negative-step": "flip with a constant-index Gather instead of a negative-step Slice",
    "Div/const-numerator": "no NPU form of 1/x was measured (Reciprocal and Pow(x, -1) land on the CPU too); on a "
                           "per-channel statistic ([1, C, 1], an AdaIN's 1/std) the CPU hop is small, on a full "
                           "tensor keep the division outside the engine",
    "LayerNormalization/no-epsilon": "write the epsilon attribute explicitly (1e-5, the ONNX default: the toolkit's "
                                     "convert_layernorm_to_exnorm reads the attribute, not the default; "
                                     "torch.onnx.export always writes it)",
}


def variant(g, n) -> str:
    """The op-support table key of node `n`: its op, qualified where the table measured that the
    answer changes (a ConvTranspose stride, a negative Slice step, a Clip with no min, a Pad or Resize
    mode, constant Gather indices, an Expand that grows the batch axis, a Div of a constant by a
    tensor, a LayerNormalization with no epsilon attribute, a constant operand of
    Pow/Max/Min/Equal/Less/Greater, an Erf inside GELU); `domain.op` outside the ONNX domain."""
    op = n.op_type
    if n.domain not in ("", "ai.onnx"):
        return f"{n.domain}.{op}"
    if op == "ConvTranspose":
        strides = g.attr(n, "strides") or [1]
        kernel = g.attr(n, "kernel_shape")
        s = max(strides)
        tail = "/kernel=stride" if kernel and max(kernel) == s and s > 1 and not any(g.attr(n, "pads") or []) else ""
        return f"ConvTranspose/stride={s}{tail}"
    if op == "Slice" and len(n.input) > 4 and n.input[4]:
        steps = g.const(n.input[4])
        return "Slice/negative-step" if steps is not None and np.any(steps < 0) else "Slice"
    if op == "Clip":
        has_min = len(n.input) > 1 and n.input[1] != ""
        has_max = len(n.input) > 2 and n.input[2] != ""
        return "Clip/empty-min" if has_max and not has_min else "Clip"
    if op == "Pad":
        mode = g.attr(n, "mode", b"constant")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        return "Pad" if mode == "constant" else f"Pad/{mode}"
    if op == "Resize":
        mode = g.attr(n, "mode", b"nearest")
        return f"Resize/{mode.decode() if isinstance(mode, bytes) else mode}"
    if op == "Gather":
        return "Gather/const-indices" if g.is_const(n.input[1]) else "Gather"
    if op in CONST_OPERAND and len(n.input) == 2 and any(g.is_const(t) for t in n.input):
        return f"{op}/const"
    if op == "Expand":
        return "Expand/batch" if _grows_batch(g, n) else "Expand"
    if op == "LayerNormalization" and g.attr(n, "epsilon") is None:
        return "LayerNormalization/no-epsilon"
    if op == "Div" and g.is_const(n.input[0]) and not g.is_const(n.input[1]) and not _in_rms_norm(g, n):
        return "Div/const-numerator"
    if op == "Erf" and _in_gelu(g, n):
        return "Erf/gelu"
    return op


def _grows_batch(g, n) -> bool:
    """An Expand whose output has a larger leading (batch) dim than its input (a missing leading dim
    counts as 1): the probe measured that form on the CPU and a broadcast along another axis on the NPU."""
    out, target = g.shape(n.output[0]), g.const(n.input[1])
    dims = list(out) if out else ([int(d) for d in target] if target is not None else [])
    src = g.shape(n.input[0]) or ()
    src_batch = src[0] if len(src) == len(dims) else 1
    return bool(dims) and dims[0] is not None and src_batch is not None and dims[0] > src_batch


def _in_rms_norm(g, n) -> bool:
    """1 / sqrt(ReduceMean(...) + eps), as an RMSNorm exports it: the compiler fuses the pattern into one
    norm layer on the NPU (measured: the Qwen3 step's 17 RMSNorm Divs), unlike the same reciprocal on a
    GlobalAveragePool statistic (the Kokoro AdaIN's 46 Divs, on the CPU)."""
    t = n.input[1]
    for _ in range(3):  # Sqrt <- Add(eps) <- ReduceMean
        p = g.producer.get(t)
        if p is None:
            return False
        if p.op_type == "ReduceMean":
            return True
        if p.op_type not in ("Sqrt", "Add"):
            return False
        t = next((i for i in p.input if not g.is_const(i)), "")
    return False


def _in_gelu(g, n) -> bool:
    """Erf as the exact GELU has it: erf(x / sqrt 2) + 1, times x (the toolkit fuses that pattern)."""
    adds = [u for u in g.consumers.get(n.output[0], []) if u.op_type == "Add" and any(g.is_const(t) for t in u.input)]
    return any(m.op_type == "Mul" for a in adds for m in g.consumers.get(a.output[0], []))


def _groups(g, keep):
    groups = defaultdict(list)
    for n in g.nodes:
        if n.domain not in ("", "ai.onnx") or n.op_type in PLUMBING:
            continue
        folds = n.output and g.from_constants(n.output[0]) and n.op_type not in NEVER_FOLDED
        key = variant(g, n)
        if not folds and keep(key):
            groups[key].append(node_name(n))
    return groups


@rule("RK302", "convtranspose-stride")
def convtranspose_stride(g):
    """ConvTranspose strides the compiler leaves on the CPU or refuses (measured per stride)."""
    for key, nodes in _groups(g, lambda k: k.startswith("ConvTranspose/")).items():
        support, said = measured(key, g.target)
        if support == "unprobed" and key.endswith("/kernel=stride"):
            support, said = measured(key.rsplit("/", 1)[0], g.target)
        if support == "npu":
            continue
        yield Hit(SEVERITY[support], nodes, f"{len(nodes)} ConvTranspose node(s) with {key.split('/', 1)[1]}",
                  why=said, fix="upsample by a stride the table measures on the NPU (a product of them: two "
                                "ConvTranspose steps), or keep this upsampler off the engine",
                  detail={"key": key, "support": support})


@rule("RK303", "clip-empty-min")
def clip_empty_min(g):
    """Clip with a max and an empty min."""
    for key, nodes in _groups(g, lambda k: k == "Clip/empty-min").items():
        support, said = measured(key, g.target)
        yield Hit("info" if support == "npu" else SEVERITY[support], nodes,
                  f"{len(nodes)} Clip node(s) with an empty min", why=said,
                  fix="give the Clip an explicit min (-65504, the fp16 floor) if a toolkit version mishandles it",
                  detail={"key": key, "support": support})


@rule("RK304", "op-support")
def op_support(g):
    """Operators the compiler refuses, leaves on the CPU or computes wrongly (measured per op)."""
    groups = _groups(g, lambda k: k not in OWNED and not k.startswith("ConvTranspose/"))
    unprobed = {}
    for key, nodes in groups.items():
        support, said = measured(key, g.target)
        if support == "npu":
            continue
        if support == "unprobed":
            unprobed[key] = nodes
            continue
        yield Hit(SEVERITY[support], nodes, f"{len(nodes)} {key} node(s)", why=said,
                  fix=FIXES.get(key, f"replace {key} before compiling (rkstudy has no rewrite for it), or keep it "
                                     "outside the engine"),
                  detail={"key": key, "support": support})
    if unprobed:
        yield Hit("info", [x for nodes in unprobed.values() for x in nodes],
                  f"operators not in the op-support table: {', '.join(sorted(unprobed))}",
                  why="nothing measured for them with the installed compiler",
                  fix="probe them: add them to rkstudy.lint.opsupport.probes() and run "
                      "`python -m rkstudy.lint.opsupport --key KEY`", detail={"keys": ",".join(sorted(unprobed))})
