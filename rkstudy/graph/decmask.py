"""The decoder mask: Mul by the frame mask after every decoder Conv/ConvTranspose.

Why: a VITS decoder (conv_pre, the resblocks, the upsamples, conv_post) is unmasked. In a window
that is zero-padded past the end of a short latent, a conv two levels deep reads the padding's
own conv output (its biases) where a full-length decode reads the implicit zeros past the end of
the tensor, so the last real frames come out 20-40 dB off. Masking after every conv makes the
padding zero again at every level.

The mask has to be upsampled with the audio: by an all-ones ConvTranspose1d at each upsample
stride (exact nearest-neighbour, and an operator the decoder already runs on the NPU). A Resize
node does the same in fp32 but, the reference documents measured, does not lower correctly on the board; it is
kept here only to measure that.

On a window whose mask is 1 everywhere every inserted Mul is an exact fp32 identity, so the
interior windows of a walk are unchanged.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from . import load
from .index import Index, splice

UPSAMPLERS = ("convtranspose", "resize")


def _strides(node: onnx.NodeProto) -> int:
    attr = next((a for a in node.attribute if a.name == "strides"), None)
    return int(np.prod(helper.get_attribute_value(attr))) if attr else 1


def mask_decoder(model, mask: str, prefix: str = "/dec/", upsampler: str = "convtranspose") -> onnx.ModelProto:
    """Return `model` with every Conv/ConvTranspose under `prefix` followed by Mul(mask at its rate).

    The rate of each conv is the number of decoder ConvTranspose nodes before it in the
    (topologically sorted) node list; when shapes are pinned, each masked tensor's length is
    checked against its mask's.
    """
    if upsampler not in UPSAMPLERS:
        raise ValueError(f"upsampler {upsampler!r}: choose one of {', '.join(UPSAMPLERS)}")
    model = load(model)
    g = model.graph
    targets = [n for n in g.node if n.name.startswith(prefix) and n.op_type in ("Conv", "ConvTranspose")]
    if not targets:
        raise ValueError(f"no Conv/ConvTranspose under {prefix!r}; is this a VITS decoder slice?")
    if mask not in {i.name for i in g.input} | {o for n in g.node for o in n.output}:
        raise ValueError(f"no tensor {mask!r} to mask with")

    # the mask at each rate, computed once at the top of the graph
    mask_nodes, inits, masks = [], [], [mask]
    for k, up in enumerate(n for n in targets if n.op_type == "ConvTranspose"):
        s = _strides(up)
        out = f"{prefix}mask_up{k}"
        if upsampler == "convtranspose":
            inits.append(numpy_helper.from_array(np.ones((1, 1, s), np.float32), f"{out}.ones"))
            mask_nodes.append(helper.make_node("ConvTranspose", [masks[-1], f"{out}.ones"], [out],
                                               name=out, kernel_shape=[s], strides=[s]))
        else:
            inits.append(numpy_helper.from_array(np.array([1.0, 1.0, float(s)], np.float32), f"{out}.scales"))
            mask_nodes.append(helper.make_node("Resize", [masks[-1], "", f"{out}.scales"], [out], name=out,
                                               mode="nearest", nearest_mode="floor",
                                               coordinate_transformation_mode="asymmetric"))
        masks.append(out)

    level, masked_of, new_nodes = 0, {}, []
    for n in g.node:
        new_nodes.append(n)
        if n in targets:
            if n.op_type == "ConvTranspose":
                level += 1
            t = n.output[0]
            masked_of[t] = (f"{t}_masked", masks[level])
            new_nodes.append(helper.make_node("Mul", [t, masks[level]], [f"{t}_masked"], name=f"{n.name}_mask"))
    for n in new_nodes:
        if n.op_type == "Mul" and n.name.endswith("_mask"):
            continue
        n.input[:] = [masked_of[t][0] if t in masked_of else t for t in n.input]
    exposed = [o.name for o in g.output if o.name in masked_of]
    if exposed:
        raise ValueError(f"{', '.join(exposed)} is a graph output; mask a graph whose output is "
                         "computed after the last conv (VITS: tanh after conv_post)")
    del g.node[:]
    g.node.extend(mask_nodes + new_nodes)
    g.initializer.extend(inits)
    _check_lengths(model, masked_of)
    return model


def _check_lengths(model: onnx.ModelProto, masked_of: dict) -> None:
    """With pinned shapes, every masked tensor must be as long as its mask."""
    try:
        inferred = shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # noqa: BLE001 - dynamic graphs simply skip the check
        return
    dims = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        d = vi.type.tensor_type.shape.dim
        if d and d[-1].HasField("dim_value"):
            dims[vi.name] = d[-1].dim_value
    for t, (_, m) in masked_of.items():
        if t in dims and m in dims and dims[t] != dims[m]:
            raise ValueError(f"decoder mask length {dims[m]} does not match {t} ({dims[t]}): the "
                             "conv order does not follow the upsample order this rewrite assumes")


def _resize_scale(node: onnx.NodeProto, idx: Index) -> int | None:
    """The integer upsampling factor of a Resize that scales only its last axis, else None."""
    consts, shape = idx.constants, idx.static_shape(node.input[0])
    scales = consts.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    if scales is None and len(node.input) > 3 and node.input[3] in consts and shape is not None:
        scales = np.asarray(consts[node.input[3]], np.float64) / np.asarray(shape, np.float64)
    if scales is None or len(scales) not in (3, 4) or np.any(np.asarray(scales[:-1]) != 1):
        return None
    s = float(scales[-1])
    return int(s) if s >= 2 and s == int(s) else None


def resize_to_convtranspose(model) -> onnx.ModelProto:
    """A copy of `model` whose nearest-mode Resize upsamplers (integer factor s on the last axis only)
    are all-ones depthwise ConvTranspose (kernel s, stride s) under the same output name.

    Why: the reference documents measured a Resize mask upsampler at 50-53 dB in the simulator and -7.9 dB on the
    board; the all-ones ConvTranspose is exact nearest and an operator the decoders already run on
    the NPU. Each replacement is checked against the Resize it replaces on an index probe in
    onnxruntime (any coordinate mode that does not repeat each frame s times is left alone).
    """
    model = load(model)
    g = model.graph
    idx = Index.inferred(model)
    at, inits = {}, []
    for i, n in enumerate(g.node):
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        s = _resize_scale(n, idx) if n.op_type == "Resize" else None
        shape = idx.static_shape(n.input[0]) if n.input else None
        if s is None or attrs.get("mode", b"nearest") != b"nearest" or shape is None:
            continue
        rank, channels = len(shape), shape[1]
        kernel = [s] if rank == 3 else [1, s]
        ones = np.ones((channels, 1, *kernel), np.float32)
        weight = f"{n.output[0]}.ones"
        up = helper.make_node("ConvTranspose", [n.input[0], weight], [n.output[0]], name=f"{n.name}_convtranspose",
                              kernel_shape=kernel, strides=kernel, group=channels)
        probe = {n.input[0]: np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)}
        runs = []
        for node in (n, up):
            try:
                runs.append(idx.probe([node], probe, [n.output[0]], extra={weight: ones})[0])
            except Exception:  # noqa: BLE001 - a Resize onnxruntime cannot run is left as it is
                runs.append(None)
        if all(r is not None for r in runs) and np.array_equal(*runs):  # same shape and values
            at[i] = [up]
            inits.append(numpy_helper.from_array(ones, weight))
    splice(model, at, drop=at.keys())
    g.initializer.extend(inits)
    return model
