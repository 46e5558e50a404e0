"""The benchmarks `make reproduce` and `make bench` run: the walker's row is measured and stamped; a make
target's wall time is judged against its budget only when the run passed."""

import csv
import os
import shutil

import pytest

from rkstudy.tables import bench, tier_bench
from rkstudy.walk.bench import walker_overhead


def test_walker_row_is_measured_and_stamped(tmp_path, monkeypatch):
    monkeypatch.setenv("RKSTUDY_RESULTS", str(tmp_path))
    row = walker_overhead()
    assert row["unit"] == "ms/window" and row["value"] > 0 and row["windows"] > 10
    path = bench.record(row, "walker")
    written = list(csv.DictReader(open(path)))
    assert len(written) == 1 and written[0]["where"] == "host" and written[0]["target"] == "none"
    assert written[0]["commit"] and float(written[0]["value"]) == row["value"]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize("status,cached", [(0, ()), (0, ("wheels",)), (0, ("wheels", "piper")), (2, ())])
def test_the_fast_tiers_wall_is_within_budget_only_when_it_passed(tmp_path, monkeypatch, status, cached):
    """`make test-fast` in a repository whose Makefile sleeps a moment and exits with `status`: the row holds
    its seconds, and says whether the build cache held derived files when it started (a downloaded wheel is
    none)."""
    (tmp_path / "Makefile").write_text(f"test-fast:\n\tsleep 0.3; exit {status}\n")
    for folder in cached:
        (tmp_path / "build" / "cache" / folder).mkdir(parents=True)
    for name in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL"):  # a make above this test is not this make's parent
        monkeypatch.delenv(name, raising=False)
    row = tier_bench.fast_tier_wall(repo=tmp_path)
    assert row["benchmark"] == "test_fast_wall" and row["budget"] == tier_bench.FAST_BUDGET_S == 180
    assert 0.3 <= row["value"] < 30 and row["unit"] == "s"
    assert row["within_budget"] is (status == 0) and row["first_run"] is ("piper" not in cached)
    assert row["machine"].endswith(f"{os.cpu_count()} cores")
