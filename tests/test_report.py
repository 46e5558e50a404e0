"""The results index is generated from the tables, never typed: the committed one must be what the
generator writes from the committed results."""

import json

from rkstudy import report, results
from rkstudy.paths import RESULTS
from rkstudy.results import Origin


def test_the_committed_index_is_what_the_generator_writes():
    committed = (RESULTS / "README.md").read_text(encoding="utf-8")
    assert committed == report.generate(RESULTS), "run `rkstudy results index` and commit results/README.md"


def test_the_index_lists_tables_headlines_with_the_seeds_figure_and_figures(tmp_path):
    rows = [results.stamp({"window": 93, "snr_db": 98.2}, Origin("fp32"))]
    results.write_table("piper_decoder", "window_sweep", rows, root=tmp_path, title="Window sweep")
    results.record_headlines("piper_decoder", {"interior SNR": {
        "value": 73.25, "unit": "dB", "seeds": "interior window SNR vs full-length decode at 93 (45+24+24)"}},
        root=tmp_path)
    (tmp_path / "piper_decoder" / "figures").mkdir()
    (tmp_path / "piper_decoder" / "figures" / "sweep.png").write_bytes(b"\x89PNG")
    text = report.generate(tmp_path)
    assert "| [`piper_decoder/window_sweep`](piper_decoder/window_sweep.md) | Window sweep | 1 |" in text
    assert "| interior SNR | 73.25 | dB | 98+ dB (fp32, none) |" in text
    assert "![piper_decoder: sweep](piper_decoder/figures/sweep.png)" in text
    sections = text.split("# Results")[1].split("\n## ")[1:]
    assert [s.split(":")[0] for s in sections] == ["piper_decoder"]  # studies without tables are left out
    assert report.main(check=True, root=tmp_path) == 1  # no index written yet
    assert report.main(root=tmp_path) == 0 and report.main(check=True, root=tmp_path) == 0
    recorded = json.loads((tmp_path / "piper_decoder" / "headlines.json").read_text())["headlines"]
    assert recorded["interior SNR"]["value"] == 73.25


def test_family_order_does_not_depend_on_import_order(monkeypatch):
    from rkstudy import families

    registered = families.load_all()
    shuffled = dict(reversed(list(registered.items())))  # as if the last family had been imported first
    monkeypatch.setattr(families, "REGISTRY", shuffled)
    assert list(families.load_all()) == list(families.FAMILIES)
