"""Per-core NPU load (the driver's debugfs line, recorded in tests/fixtures/load and the board trees),
sampled in a background thread; and the DRAM read ceiling, which refuses a cache-sized working set."""

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from rkstudy.board import dram, load
from rkstudy.board.load import LoadSampler, parse_load
from rkstudy.errors import UsageError

FIXTURES = Path(__file__).parent / "fixtures"
BOARDS = FIXTURES / "boards"


def test_parse_the_reference_readings():
    assert parse_load((FIXTURES / "load" / "rk3588_reference_vocoder_auto.txt").read_text()) == {
        "Core0": 55, "Core1": 0, "Core2": 0}
    assert parse_load((FIXTURES / "load" / "rk3588_reference_kokoro_0_1_2.txt").read_text()) == {
        "Core0": 95, "Core1": 18, "Core2": 19}


def test_parse_single_core_and_blank_zero():
    assert parse_load((FIXTURES / "load" / "rk3566_single_core.txt").read_text()) == {"Core0": 23}
    assert parse_load("NPU load:  Core0:   %, Core1: 100%,") == {"Core0": 0, "Core1": 100}
    with pytest.raises(ValueError, match="not an rknpu load line"):
        parse_load("")


def _write(path, line):
    tmp = path.with_suffix(".tmp")
    tmp.write_text(line + "\n")
    os.replace(tmp, path)


PHASES = [(55, 0, 0), (95, 18, 19), (41, 15, 16), (100, 0, 0)]


def test_sampler_follows_a_file_a_thread_rewrites(tmp_path):
    path = tmp_path / "load"
    path.write_text((FIXTURES / "load" / "rk3588_reference_vocoder_auto.txt").read_text())
    with LoadSampler(path, interval=0.005) as sampler:
        def seen(phase):
            want = {f"Core{i}": v for i, v in enumerate(phase)}
            return sum(1 for _, s in sampler.samples if s == want)

        def writer():
            for phase in PHASES:
                _write(path, "NPU load: " + "".join(f" Core{i}: {v:2d}%," for i, v in enumerate(phase)))
                deadline = time.monotonic() + 10
                while seen(phase) < 3 and time.monotonic() < deadline:
                    time.sleep(0.005)

        t = threading.Thread(target=writer)
        t.start()
        t.join()
    summary = sampler.summary()
    assert all(seen(p) >= 3 for p in PHASES)
    assert [summary[c].max for c in ("Core0", "Core1", "Core2")] == [100, 18, 19]
    values = [s["Core0"] for _, s in sampler.samples]
    assert summary["Core0"].mean == pytest.approx(sum(values) / len(values))
    assert summary["Core0"].samples == len(sampler.samples)
    times = [t for t, _ in sampler.samples]
    assert times == sorted(times)
    fields = load.row_fields(summary)
    assert fields["npu_load_max_pct"] == "100/18/19" and fields["npu_load_samples"] == len(sampler.samples)
    assert load.format_summary(summary).startswith("Core0 mean ")


def test_sampler_names_the_fix_when_the_file_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="debugfs is not mounted"):
        with LoadSampler(tmp_path / "nope"):
            pass


def test_the_first_reading_is_a_sample_and_the_clock_is_sampled_beside_the_load(tmp_path):
    path, clock = tmp_path / "load", tmp_path / "cur_freq"
    path.write_text("NPU load:  Core0: 55%, Core1:  0%, Core2:  0%,\n")
    clock.write_text("1000000000\n")
    with LoadSampler(path, interval=60, clock=clock) as sampler:
        pass  # shorter than one interval: the reading taken at the start is the sample
    assert [s for _, s in sampler.samples] == [{"Core0": 55, "Core1": 0, "Core2": 0}]
    assert sampler.clocks_hz == [1_000_000_000] and sampler.clock_field() == "1000000000"
    sampler.clocks_hz += [300_000_000]
    assert sampler.clock_field() == "300000000-1000000000"  # the clock moved during the run


def test_board_sampler_reads_the_board_tree_and_says_why_not_elsewhere(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("RKSTUDY_SYSROOT", str(BOARDS / "rk3588"))
    with load.board_sampler(interval=60) as s:
        pass
    assert load.row_fields(s.summary())["npu_load_mean_pct"] == "55/0/0"
    assert s.clock_field() == "1000000000"
    monkeypatch.setenv("RKSTUDY_SYSROOT", str(BOARDS / "rk3566-orangepi-3b"))  # no debugfs: the clock only
    with load.board_sampler(interval=60) as clock_only:
        pass
    assert clock_only.samples == [] and clock_only.clock_field() == "900000000"
    assert "NPU load not sampled: no " in capsys.readouterr().err
    monkeypatch.setenv("RKSTUDY_SYSROOT", str(tmp_path))
    assert load.board_sampler() is None
    assert load.row_fields(None) == {"npu_load_mean_pct": "", "npu_load_max_pct": "", "npu_load_samples": 0}


# --- DRAM --------------------------------------------------------------------------------------
def test_parse_size():
    assert dram.parse_size("3072K") == 3 << 20
    assert dram.parse_size("266240K\n") == 266240 << 10
    assert dram.parse_size("2M") == 2 << 20
    with pytest.raises(ValueError):
        dram.parse_size("big")


def test_llc_from_recorded_trees(monkeypatch):
    for board, llc in (("rk3588", 3 << 20), ("rk3566-orangepi-3b", 512 << 10), ("rk3566", None)):
        monkeypatch.setenv("RKSTUDY_SYSROOT", str(BOARDS / board))
        assert dram.llc_bytes() == llc


def test_refuses_a_cache_sized_working_set(monkeypatch):
    monkeypatch.setenv("RKSTUDY_SYSROOT", str(BOARDS / "rk3588"))
    with pytest.raises(UsageError, match="served from cache"):
        dram.read_bandwidth(1 << 20)


def test_small_run_reports_sane_figures(monkeypatch):
    # 8 x the RK3588 tree's 3 MiB L3 = 24 MiB: quick, and exercises threads and pinning
    monkeypatch.setenv("RKSTUDY_SYSROOT", str(BOARDS / "rk3588"))
    r = dram.read_bandwidth(threads=2, repeats=2, cpus=[0], label="test")
    assert r.working_set_bytes == 24 << 20 and r.threads == 2 and r.cpus == [0]
    assert 0 < r.median_gb_per_s <= r.gb_per_s and r.cpu_gb_per_s > 0
    assert r.line().startswith("test: DRAM read ")
    assert r.row()["working_set_mib"] == 24 and r.row()["cpus"] == "0"


def test_stream_reads_every_slice():
    a = np.arange(10, dtype=np.float64)
    wall, cpu = dram._stream(np.array_split(a, 3))
    assert wall > 0 and len(cpu) == 3
