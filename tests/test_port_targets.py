"""The per-target measurements of notebook 07 (rkstudy.families.port.targets): an RV110x part's row is the
toolkit's own refusal of an fp16 build; the register field per target is what the compiler prints
for the 64-channel k=7 probe (built in the simulator tier); the per-target summary keeps the
vendor's published figures beside ours, labelled as theirs, and takes the window plan's budget from
the window's own build on each target."""

import pytest

from rkstudy import targets as soc
from rkstudy.families.port import targets


@pytest.mark.parametrize("target", soc.QUANTIZED_ONLY)
def test_an_rv110x_part_gets_the_toolkits_refusal_as_its_row(target):
    (row,) = targets.field_probe_rows([target])
    assert row["status"] == "refused" and row["regtask"] == 0 and row["engine_bytes"] == 0
    assert f'"Current target_platform({target}) not support do_quantization = False"' in row["outcome"]
    assert target not in soc.FP16_TARGETS


@pytest.mark.simulator
def test_the_field_width_per_target_is_what_the_compiler_prints_for_the_probe():
    rows = {r["target"]: r for r in targets.field_probe_rows(["rk3576", "rk3588"], (16384,))}
    assert rows["rk3576"]["regtask"] == 14 and rows["rk3576"]["regtask_max_value"] == 16384
    assert rows["rk3576"]["limit"] == "0x3fff" and rows["rk3576"]["field_bits"] == "14"
    assert rows["rk3588"]["regtask"] == 0 and rows["rk3588"]["limit"] == "" and rows["rk3588"]["outcome"] == "built"
    summary = {r["target"]: r for r in targets.summary_rows(list(rows.values()), [], "window")}
    assert summary["rk3576"]["field_bits_measured"] == 14 == summary["rk3576"]["field_bits_recorded"]
    assert summary["rk3588"]["field_limit"] == "none printed" and summary["rk3588"]["longest_clean_probe"] == 16384


def test_the_summary_labels_their_figures_and_sets_the_window_build_beside_the_clean_budget():
    probes = [{"target": "rk3562", "frames": 16384, "status": "ok", "regtask": 0, "regtask_max_value": 0,
               "limit": "", "field_bits": "", "outcome": "built"},
              *targets.field_probe_rows(["rv1106"])]
    stages = [{"stage": "window", "target": "rk3562", "regtask": 355, "regtask_max_value": 23750},
              {"stage": "step", "target": "rk3562", "regtask": 60, "regtask_max_value": 19696}]
    rows = {r["target"]: r for r in targets.summary_rows(probes, stages, "window")}
    assert (rows["rk3562"]["window_lines"], rows["rk3562"]["window_value"], rows["rk3562"]["window_clean"]) == (
        355, 23750, False)
    assert rows["rk3562"]["plan_budget"] == "clean: no REGTASK line (no field value past rk3562's limit of 8,191)"
    assert rows["rk3562"]["their_value"] == 0.138 and rows["rk3562"]["comparable"] == targets.THEIRS
    assert rows["rv1106"]["fp16_build"].startswith("rknn-toolkit2 builds no fp16 engine for rv1106")
    assert rows["rv1106"]["their_value"] == "" and rows["rv1106"]["window_lines"] == ""


def test_the_field_limits_are_read_from_the_build_log():
    from rkstudy.toolkit.log import field_limits

    log = ("W RKNN: REGTASK: The bit width of field value exceeds the limit, target: v2, offset: 0x4038, "
           "shift = 0, limit: 0x3fff, value: 0x4000\n"
           "W RKNN: REGTASK: ... limit: 0x3fff, value: 0x4001\nI RKNN: done\n")
    assert field_limits(log) == [0x3FFF] and field_limits("I RKNN: done") == []
