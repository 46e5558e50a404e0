"""Lint's RK305 prediction (rkstudy/lint/rules/dilated_field.py) against real rk3588 builds on both
sides of each boundary it states, and the reason the frame mask is repeated in steps
(rkstudy/graph/streaming/masks.py): each case is one graph built by rkstudy.toolkit.build.build_engine
(rknn-toolkit2 2.5.0, fp16) and the REGTASK lines it logged are compared with what lint says of the same
graph. Engines come from the build cache when their bytes were built before."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkstudy.lint import lint
from rkstudy.lint.rules.dilated_field import predicted_lines
from rkstudy.toolkit.build import build_engine

pytestmark = pytest.mark.simulator


def conv(channels: int, length: int, taps: int = 7, dilation: int = 9) -> onnx.ModelProto:
    """x [1, C, L] -> Conv1d(taps, dilation, same padding) -> y [1, C, L], seeded weights."""
    w = (np.random.default_rng(0).standard_normal((channels, channels, taps)) / np.sqrt(channels * taps))
    pad = (taps - 1) * dilation // 2
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="dilated", kernel_shape=[taps], dilations=[dilation],
                            pads=[pad, pad])
    shape = [1, channels, length]
    g = helper.make_graph([node], "dilated", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
                          [numpy_helper.from_array(w.astype(np.float32), "w")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def built_and_linted(model: onnx.ModelProto, path) -> tuple[int, int]:
    """(REGTASK lines the rk3588 build logged, REGTASK lines lint predicts) for one graph."""
    onnx.save(model, path)
    report = build_engine(path, "rk3588")
    assert report.ok, report.error
    predicted = sum(f.detail["predicted_lines"] for f in lint(path).findings if f.code == "RK305")
    return report.regtask, predicted


@pytest.mark.parametrize("channels, length, taps, dilation", [
    (128, 1170, 7, 9), (128, 1171, 7, 9),    # taps x length - 1 = 8189 | 8196 around the 13-bit field
    (64, 4096, 7, 9), (65, 4096, 7, 9),      # input channels at the 64 measured clean | one more
    (128, 4096, 7, 7), (128, 4096, 7, 8),    # reach 42 | 48
])
def test_lint_predicts_the_regtask_lines_of_a_dilated_conv_on_both_sides_of_each_boundary(tmp_path, channels, length,
                                                                                          taps, dilation):
    logged, predicted = built_and_linted(conv(channels, length, taps, dilation), tmp_path / "c.onnx")
    assert logged == predicted
    assert (logged > 0) == (channels > 64 and (taps - 1) * dilation >= 48 and taps * length - 1 > 0x1FFF)
    if logged:
        assert logged == predicted_lines(taps, length)


def test_a_wide_hop_512_decoder_window_builds_as_lint_predicts(tmp_path):
    """The decoder of tests/test_port_edges.py through `port fold` at 4 and 5 frames: the boundary pass's
    masks repeat to 512 per frame in steps (one ConvTranspose of kernel 512 would abort the build), and
    the dilated conv at 128 channels x 256 samples per frame logs nothing at 4 frames and the predicted
    2 x (7 x 1280 - 3) lines at 5."""
    from test_port_edges import WideHop512, export

    from rkstudy.families.port import producer

    export(WideHop512(), tmp_path / "wide.onnx", frames=8)
    port = producer.port_from_flags(tmp_path / "wide.onnx", ["z:2:1"], [], ["audio:512"])
    for frames, lines in ((4, 0), (5, 17914)):
        window = producer.produce_window(port, frames, 1).save(tmp_path / f"w{frames}.onnx")
        report = build_engine(window, "rk3588")
        predicted = sum(f.detail.get("predicted_lines", 0) for f in lint(tmp_path / "wide.onnx", {
            "z": [1, 8, frames]}, time_inputs=["z"]).findings if f.code == "RK305")
        assert report.ok and report.regtask == predicted == lines, (frames, report.status, report.regtask)


def test_a_one_channel_convtranspose_of_kernel_128_aborts_the_compiler(tmp_path):
    """Why the frame mask is repeated in steps of at most 16: kernel = stride 128 over 16 frames aborts
    ("buffer overflow!"), 16 builds clean."""
    for k, status in ((128, "aborted"), (16, "ok")):
        node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], kernel_shape=[k], strides=[k])
        g = helper.make_graph([node], "up", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 16 * k])],
                              [numpy_helper.from_array(np.ones((1, 1, k), np.float32), "w")])
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        onnx.save(model, tmp_path / f"up{k}.onnx")
        assert build_engine(tmp_path / f"up{k}.onnx", "rk3588").status == status
