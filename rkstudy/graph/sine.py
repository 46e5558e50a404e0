"""Sin and Cos as a range-reduced odd polynomial of NPU-native operators (host).

librknnrt has no NPU Sin: rknn-toolkit2 leaves every Sin node on the CPU (rkstudy/lint's op probe
measures it), and the reference documents measured the 48 Snake sines of one Kokoro window at 41% of its time.
This rewrite folds the argument into [-π, π] with k = Floor(x/(2π) + 0.5), r = x − 2πk, and
evaluates an odd polynomial in r by Horner in r² (Mul, Add, Floor, Sub only). Cos is sin(x + π/2).
The coefficients are a least-squares fit on [-π, π] computed here, not typed in.

The fold's Floor is itself a CPU operator for the toolkit (the op probe measures it), which is the
the reference documents' "the Floor chain does not stay on the NPU end to end". `fold=False` clips the argument at ±π
instead (the reference documents' pre-fold export): every node on the NPU, exact only where |x| <= π.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
from onnx import helper, numpy_helper

from . import load
from .index import splice

TWO_PI = 2.0 * np.pi


@functools.lru_cache(maxsize=8)
def coefficients(degree: int = 5, grid: int = 4001) -> tuple[float, ...]:
    """Odd-power coefficients (c1, c3, c5, ...) of the least-squares fit of sin on [-π, π]."""
    if degree < 1 or degree % 2 == 0:
        raise ValueError(f"degree {degree}: use an odd degree >= 1 (sin is odd)")
    r = np.linspace(-np.pi, np.pi, grid)
    powers = np.stack([r ** p for p in range(1, degree + 1, 2)], axis=1)
    c, *_ = np.linalg.lstsq(powers, np.sin(r), rcond=None)
    return tuple(float(x) for x in c)


def evaluate(x: np.ndarray, degree: int = 5, fold: bool = True) -> np.ndarray:
    """What the rewritten graph computes, in numpy (float64): the reference for its tests."""
    r = x - TWO_PI * np.floor(x / TWO_PI + 0.5) if fold else np.clip(x, -np.pi, np.pi)
    c = coefficients(degree)
    r2, acc = r * r, c[-1]
    for ck in reversed(c[:-1]):
        acc = acc * r2 + ck
    return acc * r


def _chain(x: str, y: str, prefix: str, degree: int, fold: bool) -> tuple[list[onnx.NodeProto], list]:
    """Nodes computing y = poly(reduce(x)) and their constants, all named under `prefix`."""
    c = coefficients(degree)
    consts = {**({"inv2pi": 1.0 / TWO_PI, "half": 0.5, "two_pi": TWO_PI} if fold else {"lo": -np.pi, "hi": np.pi}),
              **{f"c{2 * i + 1}": v for i, v in enumerate(c)}}
    inits = [numpy_helper.from_array(np.array(v, np.float32), f"{prefix}.{k}") for k, v in consts.items()]
    t = lambda name: f"{prefix}.{name}"  # noqa: E731
    if fold:
        nodes = [helper.make_node("Mul", [x, t("inv2pi")], [t("turns")], name=t("turns")),
                 helper.make_node("Add", [t("turns"), t("half")], [t("shifted")], name=t("shifted")),
                 helper.make_node("Floor", [t("shifted")], [t("k")], name=t("k")),
                 helper.make_node("Mul", [t("k"), t("two_pi")], [t("wraps")], name=t("wraps")),
                 helper.make_node("Sub", [x, t("wraps")], [t("r")], name=t("r"))]
    else:
        nodes = [helper.make_node("Clip", [x, t("lo"), t("hi")], [t("r")], name=t("r"))]
    nodes.append(helper.make_node("Mul", [t("r"), t("r")], [t("r2")], name=t("r2")))
    acc = f"c{degree}"
    acc_name = t(acc)
    for i in range(degree - 2, 0, -2):
        nodes += [helper.make_node("Mul", [acc_name, t("r2")], [t(f"h{i}m")], name=t(f"h{i}m")),
                  helper.make_node("Add", [t(f"h{i}m"), t(f"c{i}")], [t(f"h{i}")], name=t(f"h{i}"))]
        acc_name = t(f"h{i}")
    nodes.append(helper.make_node("Mul", [acc_name, t("r")], [y], name=t("poly")))
    return nodes, inits


def reduce_sin(model, degree: int = 5, ops: tuple[str, ...] = ("Sin", "Cos"), fold: bool = True) -> onnx.ModelProto:
    """A copy of `model` with every Sin (and Cos) node replaced by the range-reduced polynomial (or, with
    `fold=False`, the polynomial of the argument clipped at ±π), under the node's own output name, so
    its consumers are untouched."""
    unknown = set(ops) - {"Sin", "Cos"}
    if unknown:
        raise ValueError(f"reduce_sin rewrites Sin and Cos, not {', '.join(sorted(unknown))}")
    model = load(model)
    g = model.graph
    at, inits = {}, []
    for i, n in enumerate(g.node):
        if n.op_type not in ops or n.domain not in ("", "ai.onnx"):
            continue
        prefix = f"{n.name or n.output[0]}/sine{i}"
        x, new = n.input[0], []
        if n.op_type == "Cos":  # cos(x) = sin(x + π/2)
            inits.append(numpy_helper.from_array(np.array(np.pi / 2, np.float32), f"{prefix}.quarter"))
            new.append(helper.make_node("Add", [x, f"{prefix}.quarter"], [f"{prefix}.x"], name=f"{prefix}.x"))
            x = f"{prefix}.x"
        nodes, consts = _chain(x, n.output[0], prefix, degree, fold)
        at[i] = new + nodes
        inits.extend(consts)
    splice(model, at, drop=at.keys())
    g.initializer.extend(inits)
    return model
