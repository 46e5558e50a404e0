"""Probe graphs for the toolchain study (notebook 00): small, deterministic, built with onnx.helper.

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


SNR_GATE_DB = 40.0  # fp16 engine vs fp32: the seeds' export gates sit at 40 dB and up


def save_probe(model: onnx.ModelProto, name: str) -> Path:
    """Write a probe graph into the cache (by content, so a rerun reuses its engines)."""
    from ..cache import cache_dir, digest

    path = cache_dir("toolchain") / f"{name}-{digest(model.SerializeToString())}.onnx"
    if not path.exists():
        onnx.save(model, str(path))
    return path


def simulate_probe(target: str, frames: int = 64, seed: int = 1) -> tuple[dict, np.ndarray, np.ndarray]:
    """Build the vocoder probe for `target`, run it in the simulator and in onnxruntime on the
    same input, gate the SNR. Returns (results row, fp32 output, simulator output)."""
    from .. import gates
    from ..runtime import OrtRunner, SimulatorRunner

    model = vocoder_probe(frames=frames)
    path = save_probe(model, f"vocoder_probe_t{frames}")
    x = np.random.default_rng(seed).standard_normal((1, 16, 1, frames)).astype(np.float32)
    ref = OrtRunner(path).run({"x": x})[0].ravel()
    with SimulatorRunner(path, target) as sim:
        test = sim.run({"x": x})[0].ravel()
        build = sim.report
    gate = gates.Gate(f"simulator_vs_fp32_{target}", SNR_GATE_DB)
    row = {"graph": "vocoder_probe", "frames": frames, "build_s": round(build.seconds, 1),
           "regtask": build.regtask, **{k: v for k, v in gates.compare(ref, test).items()
                                        if k in ("snr_db", "median_slice_snr_db", "best_lag",
                                                 "nonfinite", "rms_ratio")},
           **gate.check(gates.snr_db(ref, test), context=f"vocoder probe on {target}")}
    return row, ref, test


def build_probe(target: str) -> dict:
    """Compile the vocoder probe to an engine file and report it."""
    from ..build import build_engine

    path = save_probe(vocoder_probe(), "vocoder_probe_t64")
    report = build_engine(path, target).raise_for_status()
    return {"graph": "vocoder_probe", **report.row()}


def regtask_row(length: int, target: str, channels: int = 256, simulate: bool = True) -> dict:
    """Build the long-axis probe at `length`, count the compiler's REGTASK lines and, with
    `simulate`, score the simulator against onnxruntime on the same graph.

    256 channels, because the overflow depends on the conv's tiling and not on the axis alone:
    the same 30720-frame conv at 64 channels logs nothing.
    """
    from .. import gates
    from ..build import build_engine
    from ..graph import REGISTER_FIELD_MAX
    from ..runtime import OrtRunner, SimulatorRunner

    path = save_probe(long_axis_probe(length, channels=channels), f"long_axis_c{channels}_t{length}")
    report = build_engine(path, target)
    row = {"graph": "long_axis_probe", "channels": channels, "length": length,
           "past_13_bit_field": length > REGISTER_FIELD_MAX, **report.row()}
    if simulate:
        row["simulator_snr_db"] = float("nan")  # stays nan when the build did not produce an engine
    if simulate and report.ok:
        x = np.random.default_rng(0).standard_normal((1, channels, length)).astype(np.float32)
        ref = OrtRunner(path).run([x])[0]
        with SimulatorRunner(path, target) as sim:
            row["simulator_snr_db"] = gates.snr_db(ref, sim.run([x])[0])
    return row


def regtask_sweep(lengths, targets, channels: int = 256, progress: bool = True) -> list[dict]:
    """regtask_row for every target and length (one build and one simulator run each)."""
    from tqdm.auto import tqdm

    jobs = [(t, n) for t in targets for n in lengths]
    return [regtask_row(n, t, channels) for t, n in tqdm(jobs, desc="builds", disable=not progress)]
