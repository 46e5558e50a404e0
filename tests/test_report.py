"""The results index is generated from the tables, never typed: the committed one must be what the
generator writes from the committed results."""

import json

from rkstudy.paths import RESULTS
from rkstudy.tables import index as report
from rkstudy.tables import results
from rkstudy.tables.results import Origin


def test_the_committed_index_is_what_the_generator_writes():
    committed = (RESULTS / "README.md").read_text(encoding="utf-8")
    assert committed == report.generate(RESULTS), "run `rkstudy results index` and commit results/README.md"


def test_the_index_lists_tables_headlines_with_the_reference_figure_and_figures(tmp_path):
    rows = [results.stamp({"window": 93, "snr_db": 98.2}, Origin("fp32"))]
    results.write_table("piper_decoder", "window_sweep", rows, root=tmp_path, title="Window sweep")
    drawn = _figure(tmp_path, "piper_decoder", "sweep")
    results.record_headlines("piper_decoder", {"interior SNR": {
        "value": 73.25, "unit": "dB", "reference": "interior window SNR vs full-length decode at 93 (45+24+24)",
        "comparable": "same"}}, root=tmp_path, figures={"sweep": results.file_digest(drawn)})
    (tmp_path / "piper_decoder" / "figures" / "retracted.png").write_bytes(drawn.read_bytes())  # no run drew it
    text = report.generate(tmp_path)
    assert "| [`piper_decoder/window_sweep`](piper_decoder/window_sweep.md) | Window sweep | 1 |" in text
    assert "| interior SNR | 73.25 | dB |  | 98+ dB (fp32, none) | same |" in text
    assert "![piper_decoder: sweep](piper_decoder/figures/sweep.png)" in text
    assert "](piper_decoder/figures/retracted.png)" not in text
    assert "1 figure in `piper_decoder/figures/` not shown: not drawn by the run that made these tables" in text
    machine = results.machine("host")
    assert f"on {machine['machine_cpu']} ({machine['machine_isa']}, {machine['machine_threads']} threads" in text
    sections = text.split("# Results")[1].split("\n## ")[1:]
    assert [s.split(":")[0] for s in sections] == ["piper_decoder"]  # studies without tables are left out
    assert report.main(check=True, root=tmp_path) == 1  # no index written yet
    assert report.main(root=tmp_path) == 0 and report.main(check=True, root=tmp_path) == 0
    recorded = json.loads((tmp_path / "piper_decoder" / "headlines.json").read_text())["headlines"]
    assert recorded["interior SNR"]["value"] == 73.25


def _figure(root, study, name):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1])
    path = results.save_figure(fig, study, name, root=root)
    plt.close(fig)
    return path


def test_an_unstamped_or_redrawn_figure_is_not_shown(tmp_path):
    """Only the figures the run that made the study's headlines drew, as it drew them, are results."""
    results.write_table("toolchain", "simulator", [results.stamp({"graph": "probe"}, Origin("fp32"))], root=tmp_path)
    drawn = _figure(tmp_path, "toolchain", "probe")
    results.record_headlines("toolchain", {}, root=tmp_path, figures={"probe": results.file_digest(drawn)})
    assert "](toolchain/figures/probe.png)" in report.generate(tmp_path)
    drawn.write_bytes(drawn.read_bytes() + b"\0")  # redrawn or edited since the run
    assert "](toolchain/figures/probe.png)" not in report.generate(tmp_path)
    (tmp_path / "toolchain" / "headlines.json").write_text(json.dumps({"commit": "abc", "date": "2026-12-03",
                                                                       "headlines": {}}))
    text = report.generate(tmp_path)  # a run that listed no figures vouches for none
    assert "](toolchain/figures/probe.png)" not in text and "on a machine it did not record" in text


def test_a_goal_verdict_is_a_headline_of_the_index(tmp_path):
    """A goal table's verdict, with the figures its row gives, stands at the top of the study's section; the
    other tables are only linked."""
    goal = {"stage": "Piper decoder 93-frame window", "goal": "at least 80% of its conv MACs on weights of 8 bits "
            "or fewer, PESQ-WB within 0.1 of fp16", "verdict": "not met", "best_low_bit_mac_share": 0.1808,
            "best_soc": "rk3588"}
    results.write_table("toolkit_levers", "quantization_goal", [results.stamp(goal, Origin("simulator", "rk3588"))],
                        root=tmp_path)
    results.write_table("toolkit_levers", "quantization", [results.stamp({"setting": "fp16", "goal_share_met": False},
                                                                         Origin("simulator", "rk3588"))], root=tmp_path)
    text = report.generate(tmp_path)
    section = text.split("## toolkit_levers")[1]
    assert section.index("Goals ([`toolkit_levers/quantization_goal`]") < section.index("| table | what | rows |")
    assert ("| at least 80% of its conv MACs on weights of 8 bits or fewer, PESQ-WB within 0.1 of fp16 | not met | "
            "Piper decoder 93-frame window | 0.1808 | rk3588 |") in section
    assert "Goals ([`toolkit_levers/quantization`]" not in section  # a column named goal_* is no goal table


def test_family_order_does_not_depend_on_import_order(monkeypatch):
    from rkstudy import families

    registered = families.load_all()
    shuffled = dict(reversed(list(registered.items())))  # as if the last family had been imported first
    monkeypatch.setattr(families, "REGISTRY", shuffled)
    assert list(families.load_all()) == list(families.FAMILIES)


def test_the_index_states_the_board_risk_beside_every_engine_row(tmp_path):
    rows = [results.stamp({"window": w, "status": "ok", "regtask": n, "regtask_max_value": v, "snr_vs_fp32_db": snr},
                          Origin("simulator", "rk3588"))
            for w, n, v, snr in ((128, 0, 0, 63.5), (256, 31013, 15509, 65.6), (512, 62031, 30869, 65.7))]
    results.write_table("kokoro_generator", "builds", rows, root=tmp_path, title="Builds")
    text = report.generate(tmp_path)
    assert "Board risk of the 3 engine rows in these tables" in text
    assert "1 clean, 1 at risk, 1 known bad on a board" in text
    assert "| window=256 | rk3588 | 65.6 dB (snr_vs_fp32_db) | at risk: 31,013 REGTASK lines" in text
    assert "| window=512 | rk3588 | 65.7 dB (snr_vs_fp32_db) | known bad on a board: field value 30,869" in text
    assert "window=128 |" not in text  # clean rows are counted, not listed


def test_the_index_counts_each_studys_reference_claims_by_verdict(tmp_path):
    verdicts = ["reproduced", "differs: ours 73.2 dB, theirs 98+ dB: an open question", "board only",
                "not measured here: no table decodes it", "reproduced"]
    rows = [results.stamp({"claim": f"c{i}", "verdict": v}, results.HOST) for i, v in enumerate(verdicts)]
    results.write_table("piper_decoder", "reference_claims", rows, root=tmp_path, title="Claims")
    text = report.generate(tmp_path)
    assert ("The reference documents' measured claims about piper_decoder, ours beside each "
            "([`piper_decoder/reference_claims`](piper_decoder/reference_claims.md)): 5 claims, 2 reproduced, "
            "1 differ, 1 board only, 1 not measured here.") in text


def test_a_headline_pair_recorded_without_comparable_is_flagged_not_stated(tmp_path):
    folder = tmp_path / "piper_decoder"
    folder.mkdir()
    results.write_table("piper_decoder", "window_sweep", [results.stamp({"window": 93}, Origin("fp32"))],
                        root=tmp_path, title="Window sweep")
    (folder / "headlines.json").write_text(json.dumps({"commit": "abc", "date": "2026-11-30", "headlines": {
        "interior SNR": {"value": 73.25, "unit": "dB",
                         "reference": "interior window SNR vs full-length decode at 93 (45+24+24)"},
        "lag": {"value": 0, "unit": "samples", "reference": ""}}}))
    text = report.generate(tmp_path)
    assert "| interior SNR | 73.25 | dB |  | 98+ dB (fp32, none) | not stated |" in text
    assert "| lag | 0 | samples |  |  |" in text


def test_a_simulator_headline_shows_its_board_risk_in_its_row(tmp_path):
    folder = tmp_path / "toolchain"
    folder.mkdir()
    results.write_table("toolchain", "simulator", [results.stamp({"graph": "probe"}, Origin("fp32"))],
                        root=tmp_path, title="Simulator")
    (folder / "headlines.json").write_text(json.dumps({"commit": "abc", "date": "2026-12-03", "headlines": {
        "simulator vs fp32, worst": {"value": 61.32, "unit": "dB", "board_risk": "known bad on a board: field"},
        "simulator vs fp32, recorded before the column": {"value": 63.1, "unit": "dB"}}}))
    text = report.generate(tmp_path)
    assert "| simulator vs fp32, worst | 61.32 | dB | known bad on a board: field |  |  |" in text
    assert "| simulator vs fp32, recorded before the column | 63.1 | dB | not stated |  |  |" in text
