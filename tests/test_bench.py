"""The benchmarks `make reproduce` and `make bench` run: the walker's row is measured and stamped."""

import csv

from rkstudy.tables import bench
from rkstudy.walk.bench import walker_overhead


def test_walker_row_is_measured_and_stamped(tmp_path, monkeypatch):
    monkeypatch.setenv("RKSTUDY_RESULTS", str(tmp_path))
    row = walker_overhead()
    assert row["unit"] == "ms/window" and row["value"] > 0 and row["windows"] > 10
    path = bench.record(row, "walker")
    written = list(csv.DictReader(open(path)))
    assert len(written) == 1 and written[0]["where"] == "host" and written[0]["target"] == "none"
    assert written[0]["commit"] and float(written[0]["value"]) == row["value"]
