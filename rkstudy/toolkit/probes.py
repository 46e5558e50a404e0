"""Compiler probe graphs (host): small, deterministic, built with onnx.helper; the toolchain study,
lint's compiler check, the per-target field probes and the toolkit-lever study all build them.

They exercise the operators every TTS decoder here leans on (Conv1d, ConvTranspose1d upsampling,
Sin for Snake) at a shape the compiler handles, and the 13-bit register-field limit with one
axis past 8191.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def _conv1d_as_2d(x: str, w: np.ndarray, b: np.ndarray, out: str, name: str, **attrs):
    """A Conv over [N, C, 1, T]: 4-D so the toolkit treats it as its native NCHW conv."""
    inits = [numpy_helper.from_array(w, f"{name}.w"), numpy_helper.from_array(b, f"{name}.b")]
    return helper.make_node("Conv", [x, f"{name}.w", f"{name}.b"], [out], name=name, **attrs), inits


def vocoder_probe(channels: int = 16, frames: int = 64, upsample: int = 4, seed: int = 0) -> onnx.ModelProto:
    """x [1, C, 1, T] -> Conv(k=7) -> ConvTranspose(stride=upsample) -> x + sin(x) (Snake, alpha=1)
    -> Conv(k=7) -> y [1, 1, 1, upsample*T].

    The shape of a vocoder stage in miniature. Kept 4-D (H=1): the simulator's 3-D conv path
    pads differently from onnxruntime on some versions; a [N,C,1,T] conv is the form the
    toolkit lowers natively.
    """
    rng = np.random.default_rng(seed)
    scale = lambda fan_in: 1.0 / np.sqrt(fan_in)  # noqa: E731  keeps activations O(1) for fp16
    w1 = (rng.standard_normal((channels, channels, 1, 7)) * scale(channels * 7)).astype(np.float32)
    b1 = (rng.standard_normal(channels) * 0.1).astype(np.float32)
    wt = (rng.standard_normal((channels, channels, 1, 2 * upsample)) * scale(channels * 2)).astype(np.float32)
    bt = (rng.standard_normal(channels) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((1, channels, 1, 7)) * scale(channels * 7)).astype(np.float32)
    b2 = np.zeros(1, dtype=np.float32)

    conv1, i1 = _conv1d_as_2d("x", w1, b1, "h1", "conv_pre", kernel_shape=[1, 7], pads=[0, 3, 0, 3])
    up = helper.make_node("ConvTranspose", ["h1", "up.w", "up.b"], ["h2"], name="up",
                          kernel_shape=[1, 2 * upsample], strides=[1, upsample],
                          pads=[0, upsample // 2, 0, upsample // 2])
    sin = helper.make_node("Sin", ["h2"], ["s"], name="snake_sin")
    sq = helper.make_node("Mul", ["s", "s"], ["s2"], name="snake_sq")
    add = helper.make_node("Add", ["h2", "s2"], ["h3"], name="snake_add")
    conv2, i2 = _conv1d_as_2d("h3", w2, b2, "y", "conv_post", kernel_shape=[1, 7], pads=[0, 3, 0, 3])
    inits = i1 + i2 + [numpy_helper.from_array(wt, "up.w"), numpy_helper.from_array(bt, "up.b")]
    g = helper.make_graph(
        [conv1, up, sin, sq, add, conv2], "vocoder_probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, 1, frames])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 1, upsample * frames])],
        inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def long_axis_probe(length: int, channels: int = 256, kernel: int = 7, seed: int = 0) -> onnx.ModelProto:
    """x [1, C, L] -> Conv1d(k=7) -> y [1, C, L]: one conv whose time axis is `length`.

    3-D on purpose: that is how a vocoder's time axis reaches the compiler, and it is the form
    whose tiling overflows the 13-bit field once the axis is long enough.
    """
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((channels, channels, kernel)) / np.sqrt(kernel * channels)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", kernel_shape=[kernel],
                            pads=[kernel // 2, kernel // 2])
    g = helper.make_graph(
        [node], "long_axis_probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, length])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, length])],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def save_probe(model: onnx.ModelProto, name: str) -> Path:
    """Write a probe graph into the cache (by content, so a rerun reuses its engines)."""
    from ..cache import cached_bytes

    return cached_bytes("toolchain", name, model.SerializeToString(), ".onnx")


def dtype_probe(channels: int = 16, hidden: int = 32, frames: int = 64, seed: int = 0) -> onnx.ModelProto:
    """x [1, C, 1, T] -> Conv(k=7, C -> 2C) -> Relu -> Conv(k=7, 2C -> 1) -> y [1, 1, 1, T]: the smallest
    graph that says whether a target builds and simulates a quantized dtype (two convs of 8-bit-friendly
    widths), and how far that dtype's rounding moves an output from fp32."""
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((hidden, channels, 1, 7)) / np.sqrt(channels * 7)).astype(np.float32)
    b1 = (rng.standard_normal(hidden) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((1, hidden, 1, 7)) / np.sqrt(hidden * 7)).astype(np.float32)
    b2 = np.zeros(1, dtype=np.float32)
    conv1, i1 = _conv1d_as_2d("x", w1, b1, "h", "conv1", kernel_shape=[1, 7], pads=[0, 3, 0, 3])
    relu = helper.make_node("Relu", ["h"], ["hr"], name="relu")
    conv2, i2 = _conv1d_as_2d("hr", w2, b2, "y", "conv2", kernel_shape=[1, 7], pads=[0, 3, 0, 3])
    g = helper.make_graph([conv1, relu, conv2], "dtype_probe",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, 1, frames])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 1, frames])], i1 + i2)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model
