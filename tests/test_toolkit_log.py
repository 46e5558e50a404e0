"""rkstudy.toolkit.log on build logs recorded from rknn-toolkit2 2.5.0 (rk3588, verbose builds):
the one layer-table parser, REGTASK lines and their largest value, the memory plan, ANSI colour and
the accuracy-analysis report.

The logs: conv_sin_softmax_reshape.log (a whole log of a four-node graph: a Conv, a Sin and a 3-D
Reshape the compiler leaves on the CPU, a Softmax it runs as exSoftmax13); dit_d1_s64_layer_table.log
(the layer table of the flow-estimator stand-in, depth 1, 64 frames); dit_d1_s64_memory_tail.log (the
same build's memory plan); long_axis_32768_regtask.log (toolchain.long_axis_probe(32768), whose axis
overflows the 13-bit field).
"""

from collections import Counter
from pathlib import Path

import numpy as np

from rkstudy.toolkit import log

LOGS = Path(__file__).parent / "fixtures" / "buildlog"


def _read(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8")


def test_the_layer_table_of_a_whole_log():
    layers = log.layer_table(_read("conv_sin_softmax_reshape.log"))
    assert [(x.id, x.op, x.target, x.name) for x in layers] == [
        (0, "InputOperator", "CPU", "x"), (1, "Conv", "NPU", "/conv/Conv"), (2, "Sin", "CPU", "/act/Sin"),
        (3, "exSoftmax13", "NPU", "/attn/Softmax"), (4, "Reshape", "CPU", "/flat/Reshape"),
        (5, "OutputOperator", "CPU", "y")]
    assert log.op_targets(layers) == Counter({("Conv", "NPU"): 1, ("Sin", "CPU"): 1, ("exSoftmax13", "NPU"): 1,
                                              ("Reshape", "CPU"): 1})
    assert log.cpu_ops(layers) == "Reshape:1 Sin:1"


def test_the_layer_table_of_the_flow_stand_in():
    layers = log.layer_table(_read("dit_d1_s64_layer_table.log"))
    assert len(layers) == 153 and [x.id for x in layers] == list(range(153))
    assert sum(x.op in log.IO_OPS for x in layers) == 7
    assert log.op_targets(layers) == Counter({
        ("Conv", "NPU"): 79, ("Mul", "NPU"): 14, ("Reshape", "NPU"): 11, ("Add", "NPU"): 9, ("Concat", "NPU"): 6,
        ("Split", "NPU"): 5, ("Slice", "NPU"): 4, ("exNorm", "NPU"): 3, ("ConvAdd", "NPU"): 3, ("Pad", "NPU"): 2,
        ("ConvExSwish", "NPU"): 2, ("exMish", "NPU"): 2, ("Transpose", "NPU"): 1, ("Expand", "NPU"): 1,
        ("Sin", "CPU"): 1, ("Cos", "CPU"): 1, ("exSDPAttention", "NPU"): 1, ("ConvExGelu", "NPU"): 1})
    assert log.cpu_ops(layers) == "Cos:1 Sin:1"


def test_a_layer_row_on_its_own_and_a_split_layers_node():
    line = "D RKNN: [14:51:29.998] 12   exSDPAttention   FLOAT16  NPU (1,16,64,64) ... exSDPAttention:/attn#2"
    (layer,) = log.layer_table(line)
    assert log.op_targets([layer])[("exSDPAttention", "NPU")] == 1
    assert (layer.id, layer.name, layer.node) == (12, "/attn#2", "/attn")
    assert log.layer_table("I rknn building done.") == []


def test_regtask_lines_and_their_largest_value():
    lines = _read("long_axis_32768_regtask.log").splitlines()
    regtask = [line for line in lines if log.is_regtask(line)]
    assert len(regtask) == 30
    assert max(log.regtask_value(line) for line in regtask) == 0x7FC0
    assert log.regtask_value("E RKNN: [20:11:21.216] REGTASK: The bit width of field value exceeds the limit, "
                             "target: v2, offset: 0x4038, shift = 0, limit: 0x1fff, value: 0x6010") == 0x6010
    assert log.regtask_value("I rknn building done.") is None
    assert not any(log.is_regtask(line) for line in _read("conv_sin_softmax_reshape.log").splitlines())


def test_memory_plan_from_a_recorded_build_log():
    plan = log.memory_plan(_read("dit_d1_s64_memory_tail.log"))
    assert plan == log.MemoryPlan(internal_bytes=round(1626.38 * 1024), weight_bytes=round(44180.5 * 1024))
    assert log.memory_plan("I rknn building done.") is None
    assert log.memory_plan(_read("conv_sin_softmax_reshape.log")) == log.MemoryPlan(4096, 2496)


def test_ansi_colour_is_stripped():
    assert log.strip_ansi("\x1b[1;33mW RKNN: [1] REGTASK: value: 0x2000\x1b[0m") == "W RKNN: [1] REGTASK: value: 0x2000"


def test_accuracy_analysis_rows(tmp_path):
    """Two layers in the toolkit's error_analysis.txt format, one of them q_inf, with their npy dumps."""
    (tmp_path / "error_analysis.txt").write_text(
        "# simulator_error: calculate the output error of each layer of the simulator\n"
        "[Conv] c                        1.00000 | 0.0012    1.00000 | 0.0012\n"
        "[Exp] e                         q_inf | q_inf       0.99990 | 0.5\n")
    (tmp_path / "map_name_to_file.txt").write_text("name file\n----\nc c.npy\ne e_out.npy\n")
    for side, values in (("golden", {"c": [1.0, -3.0], "e_out": [7e4, 2.0]}),
                         ("simulator", {"c": [1.0, -2.5], "e_out": [np.inf, 2.0]})):
        (tmp_path / side / "npy").mkdir(parents=True)
        for name, v in values.items():
            np.save(tmp_path / side / "npy" / f"{name}.npy", np.array(v, np.float32))
    rows = log.parse_accuracy_analysis(tmp_path, "W build: The range [-70000.0, 70000.0] of 'e' is out of the float16")
    assert [(r["layer"], r["op"], r["overflow"], r["range_warned"]) for r in rows] == [
        ("c", "Conv", False, False), ("e", "Exp", True, True)]
    assert rows[0]["entire_cos"] == 1.0 and rows[0]["single_euc"] == 0.0012 and rows[1]["entire_cos"] == float("inf")
    assert (rows[0]["golden_max_abs"], rows[0]["simulator_max_abs"]) == (3.0, 2.5)
    e = rows[1]
    assert (e["golden_max_abs"], e["simulator_max_abs"], e["simulator_nonfinite"]) == (70000.0, 2.0, 1)
