"""The decoder mask: Mul by the frame mask after every decoder Conv/ConvTranspose.

Why: a VITS decoder (conv_pre, the resblocks, the upsamples, conv_post) is unmasked. In a window
that is zero-padded past the end of a short latent, a conv two levels deep reads the padding's
own conv output (its biases) where a full-length decode reads the implicit zeros past the end of
the tensor, so the last real frames come out 20-40 dB off. Masking after every conv makes the
padding zero again at every level.

The mask has to be upsampled with the audio: by an all-ones ConvTranspose1d at each upsample
stride (exact nearest-neighbour, and an operator the decoder already runs on the NPU). A Resize
node does the same in fp32 but, the seeds measured, does not lower correctly on the board; it is
kept here only to measure that.

On a window whose mask is 1 everywhere every inserted Mul is an exact fp32 identity, so the
interior windows of a walk are unchanged.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from . import load

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
