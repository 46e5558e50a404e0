"""A model of the toolkit's quantizer in fp32 onnxruntime: what 8-bit (or 4-, 16-bit) weights and
activations do to a graph, layer by layer and as a whole, before any build (host).

What the toolkit does, as far as its documents and its own files say (rknn-toolkit2 2.5.0):
rknn.config documents quantized_dtype w8a8 (the default; also w8a16, w16a16i_dfp, w4a16),
quantized_method "channel" (the default: one weight scale per output channel; "layer" one per
tensor) and quantized_algorithm "normal" (the default: each range from the calibration data's
minimum and maximum). The quantization config hybrid_quantization_step1 writes lists every
activation tensor (each op's output, the graph's inputs and outputs) as `qtype: asym`,
`qmethod: layer`: one asymmetric 8-bit range per tensor, [min, max] over the calibration feeds,
zero point inside it. How the weights are stored is not written down; this model takes them
symmetric per output channel (scale = largest magnitude / 127), as int8 convolution weights
commonly are. Rounding is to nearest.

The model fake-quantizes in fp32: each weight is replaced by its value on the grid, each activation
tensor passes through clip(round(x / scale) + zero, qmin, qmax) - zero, times scale, so a graph
that onnxruntime runs shows the quantizer's error without the compiler's fusions (a conv fused
with its activation writes one tensor where this model quantizes two).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .equalize import CONVS, ChannelStats, channel_stats, quantize_weights, run_tensors, snr_db, weight_axis
from .index import Index


def activation_grid(lo, hi, bits: int = 8) -> tuple:
    """(scale, zero point, qmin, qmax) of an asymmetric `bits`-bit range over [lo, hi], widened to hold 0
    (the grid then represents zero exactly, as the toolkit's zero point does); arrays of ranges give
    arrays of scales and zero points."""
    lo, hi = np.minimum(np.asarray(lo, np.float64), 0.0), np.maximum(np.asarray(hi, np.float64), 0.0)
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    scale = np.where(hi > lo, (hi - lo) / (qmax - qmin), 1.0)
    zero = np.round(qmin - lo / scale).astype(np.int64)
    if scale.ndim == 0:
        return float(scale), int(zero), qmin, qmax
    return scale, zero, qmin, qmax


def fake_quantize(x: np.ndarray, lo: float, hi: float, bits: int = 8) -> np.ndarray:
    """`x` on the asymmetric `bits`-bit grid of [lo, hi] (activation_grid), as floats."""
    scale, zero, qmin, qmax = activation_grid(lo, hi, bits)
    return ((np.clip(np.round(x / scale) + zero, qmin, qmax) - zero) * scale).astype(x.dtype)


def _fake_quant_nodes(x: str, y: str, grid: tuple[float, float, int, int], prefix: str):
    """Nodes computing y = fake_quantize(x) in fp32 (Div, Round, Add, Clip, Sub, Mul) and their constants."""
    scale, zero, qmin, qmax = grid
    consts = {"scale": scale, "zero": np.asarray(zero, np.float64), "qmin": float(qmin), "qmax": float(qmax)}
    inits = [numpy_helper.from_array(np.array(v, np.float32), f"{prefix}.{k}") for k, v in consts.items()]
    t = lambda s: f"{prefix}.{s}"  # noqa: E731
    nodes = [helper.make_node("Div", [x, t("scale")], [t("steps")], name=t("steps")),
             helper.make_node("Round", [t("steps")], [t("rounded")], name=t("rounded")),
             helper.make_node("Add", [t("rounded"), t("zero")], [t("shifted")], name=t("shifted")),
             helper.make_node("Clip", [t("shifted"), t("qmin"), t("qmax")], [t("q")], name=t("q")),
             helper.make_node("Sub", [t("q"), t("zero")], [t("centred")], name=t("centred")),
             helper.make_node("Mul", [t("centred"), t("scale")], [y], name=t("dequantized"))]
    return nodes, inits


def activation_tensors(model: onnx.ModelProto) -> list[str]:
    """The tensors the toolkit gives a range of their own: the graph's float inputs and every float tensor a
    node computes from them (shape plumbing and constants excluded)."""
    idx = Index.inferred(model)
    inputs = [i.name for i in model.graph.input if i.name not in idx.initializers]
    out = [t for t in inputs if idx.elem_types.get(t) == TensorProto.FLOAT]
    for n in idx.nodes:
        if n.op_type == "Constant":
            continue
        out += [t for t in n.output if t and idx.elem_types.get(t) == TensorProto.FLOAT and not idx.from_constants(t)]
    return out


def quantized_model(model: onnx.ModelProto, stats: ChannelStats, weight_bits: int | None = 8,
                    activation_bits: int | None = 8, where: Callable[[str], bool] | None = None,
                    per_channel: bool = False) -> onnx.ModelProto:
    """A copy of `model` as the quantizer would compute it: every conv weight on its per-channel symmetric
    `weight_bits` grid, every activation tensor (activation_tensors) through its per-tensor asymmetric
    `activation_bits` grid, [min, max] from `stats` (None leaves weights or activations in fp32). With
    `where(name)`, only the convs and the tensors of the nodes it accepts (a graph input: by its own
    name) are quantized, the rest stays fp32: one block alone, as a hybrid that keeps the others in
    float16 would compute it. `per_channel` gives each channel of an activation its own grid: no toolkit
    option, but the bound of what any per-channel rescaling (equalization) can do for the activations."""
    model = copy.deepcopy(model)
    idx = Index.inferred(model)
    where = where or (lambda _: True)
    producers = {t: n.name for n in idx.nodes for t in n.output}
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    if weight_bits is not None:
        readers: dict[str, int] = {}
        for n in g.node:
            for t in n.input:
                readers[t] = readers.get(t, 0) + 1
        for n in g.node:
            if n.op_type not in CONVS or n.input[1] not in inits or not where(n.name):
                continue
            w = numpy_helper.to_array(inits[n.input[1]])
            q = quantize_weights(w, weight_bits, weight_axis(n.op_type)).astype(w.dtype)
            if readers[n.input[1]] == 1:
                inits[n.input[1]].CopyFrom(numpy_helper.from_array(q, n.input[1]))
            else:
                name = f"{n.name}/quantized.weight"
                g.initializer.append(numpy_helper.from_array(q, name))
                n.input[1] = name
    if activation_bits is None:
        return model
    chosen = [t for t in activation_tensors(model) if t in stats.lo and where(producers.get(t, t))]
    outputs = {o.name for o in g.output}
    # consumers read the quantized tensor: a new name after it, except a graph output, which keeps its name
    # (its producer writes `<name>/unquantized` instead)
    read_as = {t: t if t in outputs else f"{t}/fake_quantized" for t in chosen}

    def quantizer(t: str) -> list[onnx.NodeProto]:
        src = f"{t}/unquantized" if t in outputs else t
        rank = len(idx.shapes.get(t) or ())
        if per_channel and rank >= 2:
            scale, zero, qmin, qmax = activation_grid(stats.lo[t], stats.hi[t], activation_bits)
            shape = (1, -1) + (1,) * (rank - 2)
            grid = (scale.reshape(shape), zero.reshape(shape), qmin, qmax)
        else:
            grid = activation_grid(stats.lo[t].min(), stats.hi[t].max(), activation_bits)
        nodes, consts = _fake_quant_nodes(src, read_as[t], grid, f"{t}/fq")
        g.initializer.extend(consts)
        return nodes

    new_nodes = [q for i in g.input if i.name in read_as for q in quantizer(i.name)]
    for n in list(g.node):
        n.input[:] = [read_as.get(t, t) for t in n.input]
        n.output[:] = [f"{t}/unquantized" if t in outputs and t in read_as else t for t in n.output]
        new_nodes.append(n)
        new_nodes += [q for t in n.output if t.removesuffix("/unquantized") in read_as for q in
                      quantizer(t.removesuffix("/unquantized"))]
    del g.node[:]
    g.node.extend(new_nodes)
    del g.value_info[:]
    return model


def range_rows(stats: ChannelStats, tensors: Sequence[str], block: Callable[[str], str] | None = None,
               bits: int = 8) -> list[dict]:
    """Per tensor: its channels, its range and each channel's, and what a per-tensor asymmetric `bits`-bit
    grid leaves a channel: `bits_lost_mean`/`_max` = log2 of the tensor's range over the channel's (the
    grid steps a channel's own values never reach), averaged and worst over channels."""
    rows = []
    for t in tensors:
        lo, hi = stats.lo[t], stats.hi[t]
        span = max(hi.max(), 0) - min(lo.min(), 0)
        own = np.maximum(hi, 0) - np.minimum(lo, 0)
        lost = np.log2(span / np.maximum(own, span * 2.0 ** -bits)) if span > 0 else np.zeros_like(own)
        absmax = np.maximum(np.abs(lo), np.abs(hi))
        rows.append({"tensor": t, **({"block": block(t)} if block else {}), "channels": len(lo),
                     "min": float(lo.min()), "max": float(hi.max()),
                     "channel_absmax_min": float(absmax.min()), "channel_absmax_median": float(np.median(absmax)),
                     "channel_absmax_max": float(absmax.max()),
                     "spread": float(absmax.max() / max(np.median(absmax), 1e-30)),
                     "bits_lost_mean": float(lost.mean()), "bits_lost_max": float(lost.max())})
    return rows


def layer_errors(model: onnx.ModelProto, feeds: Sequence[Mapping[str, np.ndarray]], stats: ChannelStats | None = None,
                 weight_bits: int = 8, activation_bits: int = 8,
                 block: Callable[[str], str] | None = None) -> list[dict]:
    """Per conv, run alone on its fp32 input over `feeds`: the SNR against its fp32 output of the same conv
    with its weights quantized (`snr_weights_db`), its input quantized (`snr_input_db`), its output
    quantized (`snr_output_db`), and all three (`snr_db`), the grids as quantized_model's (ranges from
    `stats`, default: the feeds' own), beside its MACs per run."""
    idx = Index.inferred(model)
    convs = [n for n in idx.nodes if n.op_type in CONVS and n.input[1] in idx.constants]
    tensors = list(dict.fromkeys([t for n in convs for t in (n.input[0], n.output[0])]))
    stats = stats or channel_stats(model, feeds, tensors)
    probe, outs = _probe_model(model, idx, convs, stats, weight_bits, activation_bits)
    signal: dict[str, float] = {}
    noise: dict[str, dict[str, float]] = {}

    def each(_, arrays):
        for n in convs:
            ref = arrays[n.output[0]].astype(np.float64)
            signal[n.name] = signal.get(n.name, 0.0) + float(np.sum(ref ** 2))
            got = noise.setdefault(n.name, {})
            for key, t in outs[n.name].items():
                got[key] = got.get(key, 0.0) + float(np.sum((arrays[t] - ref) ** 2))

    run_tensors(probe, feeds, [n.output[0] for n in convs] + [t for o in outs.values() for t in o.values()], each)
    rows = []
    for n in convs:
        db = {k: (float("inf") if v == 0 else 10 * np.log10(signal[n.name] / v)) for k, v in noise[n.name].items()}
        rows.append({"conv": n.name, **({"block": block(n.name)} if block else {}), "op": n.op_type,
                     "macs": _macs(n, idx), "weight_bits": weight_bits, "activation_bits": activation_bits,
                     "snr_weights_db": db["weights"], "snr_input_db": db["input"], "snr_output_db": db["output"],
                     "snr_db": db["all"]})
    return rows


def _macs(node: onnx.NodeProto, idx: Index) -> int:
    """Multiply-accumulates of one run of a conv: weight elements times output positions (a ConvTranspose:
    input positions)."""
    w = idx.constants[node.input[1]]
    positions = idx.shapes[node.output[0] if node.op_type == "Conv" else node.input[0]][2:]
    return int(w.size * np.prod(positions))


def _variant(node: onnx.NodeProto, inputs: list[str], out: str) -> onnx.NodeProto:
    """A copy of conv `node` reading `inputs` (and its own bias) and writing `out`."""
    copy_ = helper.make_node(node.op_type, inputs + list(node.input[2:]), [out], name=out)
    copy_.attribute.extend(node.attribute)
    return copy_


def _probe_model(model, idx, convs, stats, weight_bits, activation_bits):
    """`model` plus, for each conv, its variants on quantized weights, on its quantized input, and on both
    (then its output quantized), as extra outputs; {conv: {variant: tensor}}."""
    m = copy.deepcopy(model)
    g = m.graph
    outs = {}
    for n in convs:
        w = np.asarray(idx.constants[n.input[1]])
        qw = f"{n.name}/probe.qweight"
        g.initializer.append(numpy_helper.from_array(
            quantize_weights(w, weight_bits, weight_axis(n.op_type)).astype(w.dtype), qw))
        x, y = n.input[0], n.output[0]
        qx = f"{n.name}/probe.qinput"
        nodes, consts = _fake_quant_nodes(x, qx, activation_grid(stats.lo[x].min(), stats.hi[x].max(), activation_bits),
                                          f"{n.name}/probe.fqx")
        made = {k: f"{n.name}/probe.{k}" for k in ("weights", "input", "both", "output", "all")}
        grid = activation_grid(stats.lo[y].min(), stats.hi[y].max(), activation_bits)
        out_nodes, out_consts = _fake_quant_nodes(y, made["output"], grid, f"{n.name}/probe.fqy")
        all_nodes, all_consts = _fake_quant_nodes(made["both"], made["all"], grid, f"{n.name}/probe.fqall")
        variants = [_variant(n, [x, qw], made["weights"]), _variant(n, [qx, n.input[1]], made["input"]),
                    _variant(n, [qx, qw], made["both"])]
        g.node.extend(nodes + variants + out_nodes + all_nodes)
        g.initializer.extend(consts + out_consts + all_consts)
        outs[n.name] = {k: made[k] for k in ("weights", "input", "output", "all")}
    return m, outs


def output_snr(model: onnx.ModelProto, test: onnx.ModelProto, feeds: Sequence[Mapping[str, np.ndarray]]) -> float:
    """The SNR of `test`'s first output against `model`'s over `feeds` back to back (fp32 onnxruntime)."""
    name = model.graph.output[0].name
    refs, tests = [], []
    run_tensors(model, feeds, [name], lambda _, a: refs.append(a[name]))
    run_tensors(test, feeds, [name], lambda _, a: tests.append(a[name]))
    return snr_db(np.concatenate([r.ravel() for r in refs]), np.concatenate([t.ravel() for t in tests]))
