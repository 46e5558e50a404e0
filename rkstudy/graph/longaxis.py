"""Make a fixed-shape 1-D audio graph compile cleanly when its time axis is longer than 8191.

rknn-toolkit2 2.5.0 encodes per-op extents in 13-bit register fields. Measured with one-op probes
on rk3588 (rkstudy.toolkit.probes builds the same kind of graph), over a [1, C, L] tensor with L past
8191:

* clean (0 REGTASK lines): elementwise ops, Concat, 1x1 Conv, undilated k=7 Conv (L = 122 880),
  ConvTranspose (stride 3, and k=1 with pads);
* a *dilated* Conv floods the build once kernel x output length passes the field (the compiler
  lays the taps out along the axis): one k=7, d=9 conv at L = 10 240 logs > 20 000 lines, and
  inside the step the two dilated convs of block 1 at 2 560 samples (7 x 2 560 = 17 920 =
  value 0x45ff + 1) log 35 840 each. The (k,1) Conv2d form with time on H logs none, but its
  engine grows with L (21.7 MB at 10 240, 85 MB at 40 960; 122 880 did not build in 40 min);
* a Slice along the long axis logs 48 lines per Slice at L = 122 934, values up to 0x1df10.

Both are exact to rewrite with ConvTranspose k=1, whose `pads` crop the output:

* Slice [start:end] of the last axis -> depthwise ConvTranspose (weight 1, group C) with pads
  [start, L - end];
* dilated causal Conv (weight W, K taps, dilation d, no pads) -> sum over j of the 1x1
  ConvTranspose of W[:, :, j]^T with pads [j*d, (K-1-j)*d] (the tap-j shifted crop), bias on
  the first term.

The pass is pure (returns a new model) and only touches nodes on axes longer than the field; each
rewrite is one function (`slice_to_crop`, `dilated_conv_to_taps`) that returns the nodes replacing
one node, or None when the node is not its case.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from . import REGISTER_FIELD_MAX as FIELD_MAX
from .index import Index, prune, splice

INT64_MAX = np.iinfo(np.int64).max


@dataclass(frozen=True)
class Rewrite:
    """What the pass changed."""

    slices: int
    dilated_convs: int
    added_nodes: int

    def row(self) -> dict:
        return {"slices_to_crops": self.slices, "dilated_convs_to_tap_sums": self.dilated_convs,
                "nodes_added": self.added_nodes}


def _attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _slice_bounds(node, consts, shape) -> tuple[int, int] | None:
    """(start, end) of a step-1 Slice on the last axis of a rank-3 tensor, else None."""
    ins = list(node.input) + [""] * (5 - len(node.input))
    if len(shape) != 3 or any(t and t not in consts for t in ins[1:]):
        return None
    starts, ends = consts[ins[1]].ravel(), consts[ins[2]].ravel()
    axes = consts[ins[3]].ravel() if ins[3] else np.arange(len(starts))
    steps = consts[ins[4]].ravel() if ins[4] else np.ones(len(starts), np.int64)
    if len(starts) != 1 or int(axes[0]) % 3 != 2 or int(steps[0]) != 1:
        return None
    n = shape[2]
    start, end = int(starts[0]), int(min(ends[0], INT64_MAX))
    start = start + n if start < 0 else start
    end = end + n if end < 0 else end
    return max(0, min(start, n)), max(0, min(end, n))


def _dilated_extent(node, shape) -> int:
    """Kernel taps x output length of an unpadded stride-1 Conv: what the compiler lays out."""
    k = int(_attr(node, "kernel_shape", [1])[0])
    d = int(_attr(node, "dilations", [1])[0])
    return k * (shape[2] - (k - 1) * d)


def slice_to_crop(node: onnx.NodeProto, shape: tuple[int, ...], consts: Mapping[str, np.ndarray],
                  ones: Callable[[int], str]) -> list[onnx.NodeProto] | None:
    """A step-1 Slice of the last axis of [1, C, L] as a depthwise ConvTranspose k=1 (weight
    `ones(C)`) whose pads crop [start, L - end], under the Slice's output name; None otherwise."""
    if node.op_type != "Slice":
        return None
    bounds = _slice_bounds(node, consts, shape)
    if bounds is None:
        return None
    start, end = bounds
    return [helper.make_node("ConvTranspose", [node.input[0], ones(shape[1])], list(node.output),
                             name=f"{node.name or 'Slice'}/crop", group=shape[1], kernel_shape=[1],
                             pads=[start, shape[2] - end])]


def dilated_conv_to_taps(node: onnx.NodeProto, shape: tuple[int, ...], consts: Mapping[str, np.ndarray],
                         inits: list[onnx.TensorProto]) -> list[onnx.NodeProto] | None:
    """An unpadded, ungrouped, stride-1 dilated Conv (weight W [O, C, K], dilation d) as the sum
    over taps j of the 1x1 ConvTranspose of W[:, :, j]^T with pads [j*d, (K-1-j)*d], the bias on
    the first term, under the Conv's output name (tap weights appended to `inits`); None when the
    node is not such a Conv."""
    if (node.op_type != "Conv" or max(_attr(node, "dilations", [1])) <= 1 or _attr(node, "group", 1) != 1
            or any(_attr(node, "pads", [0, 0])) or max(_attr(node, "strides", [1])) != 1
            or node.input[1] not in consts):
        return None
    w = consts[node.input[1]]  # [O, C, K]
    bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
    d, k = int(_attr(node, "dilations")[0]), w.shape[2]
    base = node.name or node.output[0]
    nodes, terms = [], []
    for j in range(k):
        wname = f"{base}/tap{j}.weight"
        inits.append(numpy_helper.from_array(np.ascontiguousarray(w[:, :, j].T[:, :, None]), wname))
        out = f"{base}/tap{j}"
        ins = [node.input[0], wname] + ([bias] if (bias and j == 0) else [])
        nodes.append(helper.make_node("ConvTranspose", ins, [out], name=out, kernel_shape=[1],
                                      pads=[j * d, (k - 1 - j) * d]))
        terms.append(out)
    acc = terms[0]
    for j in range(1, k):
        out = node.output[0] if j == k - 1 else f"{base}/sum{j}"
        nodes.append(helper.make_node("Add", [acc, terms[j]], [out], name=f"{base}/add{j}"))
        acc = out
    return nodes


def long_axis_safe(model: onnx.ModelProto, limit: int = FIELD_MAX) -> tuple[onnx.ModelProto, Rewrite]:
    """`model` with every long-axis Slice, and every dilated Conv whose taps x length passes the
    field, rewritten as cropping ConvTransposes; the constants only the replaced nodes read (Slice
    bounds, conv weights) are pruned."""
    model = copy.deepcopy(model)
    idx = Index.inferred(model, data_prop=True)
    inits: list[onnx.TensorProto] = []
    ones_of: dict[int, str] = {}

    def ones(c: int) -> str:
        if c not in ones_of:
            ones_of[c] = f"longaxis/ones_{c}"
            inits.append(numpy_helper.from_array(np.ones((c, 1, 1), np.float32), ones_of[c]))
        return ones_of[c]

    at: dict[int, list[onnx.NodeProto]] = {}
    n_slices = n_convs = added = 0
    for i, node in enumerate(model.graph.node):
        shape = idx.static_shape(node.input[0]) if node.input else None
        if not shape or len(shape) != 3:
            continue
        new = slice_to_crop(node, shape, idx.constants, ones) if shape[2] > limit else None
        n_slices += new is not None
        if new is None and _attr(node, "dilations") and _dilated_extent(node, shape) > limit:
            new = dilated_conv_to_taps(node, shape, idx.constants, inits)
            if new is not None:
                n_convs += 1
                added += len(new) - 1
        if new is not None:
            at[i] = new
    splice(model, at, drop=at.keys())
    model.graph.initializer.extend(inits)
    return prune(model), Rewrite(n_slices, n_convs, added)
