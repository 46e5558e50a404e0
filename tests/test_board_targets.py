"""Every RKNPU2 target rknn-toolkit2 2.5.0 builds for: an fp16 build for an RV110x part is refused before
a child starts (the toolkit does not build one), the lists of targets are the records' (rkstudy.targets),
and the register field recorded per target is what the compiler prints for the probe (a 64-channel k=7
Conv1d at 16384 frames)."""

import re

import numpy as np
import pytest

from rkstudy import targets
from rkstudy.errors import UsageError
from rkstudy.toolkit import build
from rkstudy.toolkit.calibration import Calibration


@pytest.mark.parametrize("target", targets.QUANTIZED_ONLY)
def test_an_fp16_build_for_an_rv110x_part_is_refused_with_the_fix(target):
    with pytest.raises(UsageError, match=rf"builds no fp16 engine for {target} \("
                                         rf"\"Current target_platform\({target}\) not support do_quantization = "
                                         r"False\"\): make a quantized build, quantize=Calibration"):
        build.check_target(target)
    build.check_target(target, Calibration([{"x": np.zeros((1, 4), np.float32)}]))


def test_a_target_the_toolkit_does_not_build_for_is_refused():
    with pytest.raises(UsageError, match="target 'rk3399' is not one this project builds for; use one of rk3588, "
                                         "rk3566, rk3568, rk3576, rk3562, rv1103, rv1106"):
        build.check_target("rk3399")


def test_every_list_of_targets_is_read_from_the_records():
    assert targets.QUANTIZED_ONLY == ("rv1103", "rv1106")
    assert set(targets.FP16_TARGETS) == set(targets.TARGETS) - set(targets.QUANTIZED_ONLY)
    assert targets.ALL_TARGETS == ("rk3588", "rk3576", "rk3566", "rk3562")  # one engine per NPU a board run serves
    assert targets.STUDIED_TARGETS == ("rk3588", "rk3566")
    assert targets.CHIP_TARGETS["rk3588s"] == "rk3588" and "rv1106" not in targets.CHIP_TARGETS
    assert targets.runs_engine_for("rk3568", "rk3566") and targets.runs_engine_for("rk3566", "rk3568")
    assert not targets.runs_engine_for("rk3562", "rk3566") and not targets.runs_engine_for("rk3399", "rk3588")
    assert targets.record("rk3568").npu_devfreq == targets.record("rk3566").npu_devfreq == "fde40000.npu"
    assert targets.record("rk3399") is None


@pytest.mark.simulator
@pytest.mark.parametrize("target", targets.TARGETS)
def test_the_recorded_register_field_is_what_the_compiler_prints(target, tmp_path):
    from rkstudy.toolkit.probes import long_axis_probe, save_probe

    record = targets.record(target)
    onnx_path = save_probe(long_axis_probe(16384, channels=64), "register_field_probe_64x16384")
    out = tmp_path / f"probe-{target}.rknn"
    # a part the toolkit builds no fp16 engine for is probed in int8 w8a8, as its record says
    quantize = None if record.fp16 else Calibration(
        [{"x": np.random.default_rng(0).standard_normal((1, 64, 16384)).astype(np.float32)}])
    report = build.build_engine(onnx_path, target, out=out, reuse=False, quantize=quantize).raise_for_status()
    limits = set(re.findall(r"limit: 0x([0-9a-f]+)", out.with_suffix(".log").read_text()))
    bits = record.register_field_bits
    if bits is None:
        assert report.regtask == 0 and limits == set()
    else:
        assert report.regtask == 14 and limits == {f"{(1 << bits) - 1:x}"}
        assert report.regtask_max == 1 << bits  # 16384 frames: one past the field
