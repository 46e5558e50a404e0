"""`rkstudy board check` against recorded board trees (tests/fixtures/boards, read through
RKSTUDY_SYSROOT): what the board is, and whether its figures compare with the reference documents'."""

import json
import shutil
from pathlib import Path

import pytest

from rkstudy.board import check
from rkstudy.cli import main

BOARDS = Path(__file__).parent / "fixtures" / "boards"


@pytest.fixture
def on(monkeypatch):
    def at(root):
        monkeypatch.setenv("RKSTUDY_SYSROOT", str(root))
        return check.board_check()
    return at


def test_rk3588_is_comparable(on):
    c = on(BOARDS / "rk3588")
    assert c.soc == "rk3588" and c.model == "Orange Pi 5 Plus"
    assert c.compatible == ["rockchip,rk3588-orangepi-5-plus", "rockchip,rk3588"]
    assert c.npu.node == "fdab0000.npu" and c.npu.governor == "rknpu_ondemand"
    assert c.npu.cur_hz == 1_000_000_000 and c.npu.top_hz == 1_000_000_000
    assert c.npu.available_hz[0] == 300_000_000
    assert (c.driver, c.driver_source) == ("0.9.8", "/sys/kernel/debug/rknpu/version")
    assert c.librknnrt == "2.3.2 (429f97ae6b@2025-04-09T09:09:27)"
    assert [(cl.cpus, cl.core, cl.max_khz, cl.capacity) for cl in c.clusters] == [
        ([0, 1, 2, 3], "Cortex-A55", 1800000, 414), ([4, 5, 6, 7], "Cortex-A76", 2256000, 1024)]
    assert c.npu_load_readable
    assert c.verdict.comparable is True and c.verdict.why == ("NPU at its top OPP, 1000 MHz, "
                                                              "governor rknpu_ondemand")


def test_rk3588_npu_not_at_top_opp(on):
    c = on(BOARDS / "rk3588-npu-powersave")
    assert c.verdict.comparable is False
    assert "NPU at 300 MHz under governor powersave, not at its top OPP 1000 MHz" in c.verdict.why
    assert c.verdict.fix == "echo performance | sudo tee /sys/class/devfreq/fdab0000.npu/governor"


def test_rk3588_ondemand_idle_asks_for_a_reading_under_load(on, tmp_path):
    root = tmp_path / "b"
    shutil.copytree(BOARDS / "rk3588", root)
    (root / "sys/class/devfreq/fdab0000.npu/cur_freq").write_text("300000000\n")
    v = on(root).verdict
    assert v.comparable is None and "ramps to 1000 MHz under load" in v.why
    assert v.fix.endswith("cur_freq during a run; it must show 1000000000")


def test_rk3566_is_another_soc(on):
    c = on(BOARDS / "rk3566-orangepi-3b")
    assert c.soc == "rk3566" and c.npu.node == "fde40000.npu"
    assert (c.driver, c.driver_source) == ("0.9.6", "/sys/module/rknpu/version")
    assert c.librknnrt.startswith("2.3.0 ")
    assert [(cl.cpus, cl.core, cl.capacity) for cl in c.clusters] == [([0, 1, 2, 3], "Cortex-A55", None)]
    assert not c.npu_load_readable
    assert c.verdict.comparable is False and "this is an rk3566" in c.verdict.why


def test_not_a_board(on, tmp_path):
    c = on(tmp_path)
    assert c.soc is None and c.npu is None and c.driver is None and c.librknnrt is None
    assert c.verdict.comparable is False and "not a Rockchip board" in c.verdict.why


@pytest.mark.parametrize("tree", ["rk3576", "rk3566-orangepi-3b", "rk3562"])
def test_another_soc_is_not_comparable_and_not_a_failure(monkeypatch, capsys, tree):
    monkeypatch.setenv("RKSTUDY_SYSROOT", str(BOARDS / tree))
    assert main(["board", "check"]) == 0
    soc = tree.split("-")[0]
    assert (f"verdict: NOT COMPARABLE with the reference documents' RK3588 figures: this is an {soc}; "
            "the reference documents' board figures are RK3588") in capsys.readouterr().out


def test_the_command_exits_1_when_an_rk3588_does_not_compare(monkeypatch, capsys):
    monkeypatch.setenv("RKSTUDY_SYSROOT", str(BOARDS / "rk3588"))
    assert main(["board", "check"]) == 0
    text = capsys.readouterr().out
    assert "verdict: COMPARABLE" in text and "cpu4-7: 4x Cortex-A76, max 2256.0 MHz" in text
    monkeypatch.setenv("RKSTUDY_SYSROOT", str(BOARDS / "rk3588-npu-powersave"))
    assert main(["board", "check", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["npu"]["governor"] == "powersave" and out["verdict"]["comparable"] is False


def test_rk3576_is_recognised_with_its_npu_devfreq(on, tmp_path):
    c = on(BOARDS / "rk3576")
    assert c.soc == "rk3576" and c.model == "ArmSoM Sige5" and c.npu.node == "27700000.npu"
    assert c.librknnrt.startswith("2.5.0 ") and c.driver == "0.9.8"
    assert [(cl.core, len(cl.cpus)) for cl in c.clusters] == [("Cortex-A53", 4), ("Cortex-A72", 4)]
    assert c.verdict.comparable is False and "this is an rk3576" in c.verdict.why
    root = tmp_path / "b"
    shutil.copytree(BOARDS / "rk3576", root)
    shutil.rmtree(root / "sys/class/devfreq/27700000.npu")
    assert "NPU clock      - (no /sys/class/devfreq/27700000.npu: the rknpu driver registers" in \
        check.render(on(root))


@pytest.mark.parametrize("soc,node", [("rk3588", "fdab0000.npu"), ("rk3566", "fde40000.npu"),
                                      ("rk3568", "fde40000.npu"), ("rk3576", "27700000.npu"),
                                      ("rk3562", "ff300000.npu")])
def test_each_soc_names_its_npu_devfreq_node(soc, node):
    from rkstudy.board import sysfs

    assert sysfs.expected_npu_devfreq(soc) == f"/sys/class/devfreq/{node}"
    assert check.missing_devfreq(soc).startswith(f"no /sys/class/devfreq/{node}: ")


def test_an_soc_with_no_recorded_node_says_so():
    assert check.missing_devfreq("rk3399") == ("no /sys/class/devfreq/*.npu, and rkstudy has no NPU devfreq node "
                                               "recorded for rk3399")
