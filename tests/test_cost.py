"""rkstudy.toolkit.cost and rkstudy.levers.npu_cost on layer tables recorded from real verbose builds: the
Piper 93-frame window built with rknn-toolkit2 2.3.2 for rk3588 (the reference documents' toolkit and SoC;
piper_decoder_w93_rk3588_toolkit232.log.gz) and the Kokoro W = 64 window built with 2.5.0
(kokoro_generator_w64.log.gz). Host timings are passed in where a test needs exact numbers; where the host
times a layer itself, the test asserts what was timed and how, not how long it took."""

import gzip
import math
from pathlib import Path

import pytest

from rkstudy.errors import UsageError
from rkstudy.levers import npu_cost as cal
from rkstudy.toolkit import cost, log

TABLES = Path(__file__).parent / "fixtures" / "layer_tables"
NO_CPU = {"cpu_ms": lambda layer: 0.0, "io_ms": lambda layer: 0.0}
UNIT = cost.Constants(dram_share=0.1, dispatch_us=100.0, cpu_factor=2.0)   # the NPU's bytes at 2.79 GB/s


def table(name: str) -> list[log.Layer]:
    return log.layer_table(gzip.decompress((TABLES / name).read_bytes()).decode())


PIPER = "piper_decoder_w93_rk3588_toolkit232.log.gz"
KOKORO = "kokoro_generator_w64.log.gz"


def sin_layer(width: int, layer_id: int = 2, name: str = "/act/Sin") -> log.Layer:
    """A CPU Sin row of a layer table, as a verbose build prints it (no cycles, no bytes)."""
    shape = f"(1,8,1,{width})"
    return log.Layer(layer_id, "Sin", "CPU", name, "FLOAT16", shape, shape, 0, 0, 0, 0)


def test_the_layer_table_keeps_the_compilers_cycles_and_bytes():
    layers = table(PIPER)
    assert len(layers) == 236
    assert sum(x.cycles for x in layers) == 8_300_308 and sum(x.npu_cycles for x in layers) == 8_192_768
    assert sum(x.ddr_cycles for x in layers) == 3_069_305 and sum(x.rw_kb for x in layers) == 85_154
    conv = next(x for x in layers if x.name == "/dec/conv_post/Conv")
    assert (conv.op, conv.ddr_cycles, conv.npu_cycles, conv.cycles, conv.rw_bytes) == \
        ("ConvTanh", 128_853, 166_656, 166_656, 1488 * 1024)
    # elementwise layers print bytes and no cycles; CPU layers print no cycles
    assert all(x.cycles == 0 and x.rw_kb > 0 for x in layers if x.op in ("Add", "LeakyRelu"))
    assert {x.op for x in layers if x.target == "CPU" and x.op not in log.IO_OPS} == {"Slice"}
    # 2.5.0 prints the same columns
    kokoro = table(KOKORO)
    assert sum(x.cycles for x in kokoro) == 46_143_756 and sum(x.rw_kb for x in kokoro) == 1_050_383


def test_a_row_without_the_cost_columns_keeps_none():
    (layer,) = log.layer_table("D RKNN: [14:51:29.998] 12   exSDPAttention   FLOAT16  NPU (1,16,64,64) ... "
                               "exSDPAttention:/attn#2")
    assert (layer.cycles, layer.rw_kb, layer.rw_bytes) == (None, None, None)


def test_the_piper_window_on_rk3588_term_by_term():
    layers = [x for x in table(PIPER)]
    p = cost.predict(layers, "rk3588", "0", constants=UNIT, **NO_CPU)
    b = p.basis
    npu = [x for x in layers if x.target == "NPU"]
    conv = [x for x in npu if x.cycles]
    elementwise = [x for x in npu if not x.cycles and x.rw_kb]
    assert (b.conv_layers, b.elementwise_layers, b.cpu_layers, b.compute_layers) == (63, 165, 4, 233)
    assert b.uncosted == ("Reshape:1",)   # a Reshape of 34 B rounds to 0 KB: dispatch only
    # conv: NPU cycles at 1000 MHz, one core; dram: each such layer's bytes at 10 % of 27.9 GB/s past its compute
    assert p.terms["conv"] == pytest.approx(sum(x.npu_cycles for x in conv) / 1e6) == pytest.approx(8.192768)
    assert p.terms["dram"] == pytest.approx(sum(max(0, x.rw_bytes / 2.79e6 - x.npu_cycles / 1e6) for x in conv))
    assert p.terms["dram"] == pytest.approx(12.416, abs=1e-3)
    # elementwise: their bytes at the same rate; dispatch: 100 us per compute layer
    assert b.elementwise_bytes == sum(x.rw_bytes for x in elementwise) == 34_216_960   # 33,415 KiB
    assert p.terms["elementwise"] == pytest.approx(34_216_960 / 2.79e6)
    assert p.terms["dispatch"] == pytest.approx(23.3)
    assert p.ms == pytest.approx(sum(p.terms.values()))
    assert p.npu_ms == pytest.approx(p.ms)   # no CPU time given


def test_a_multi_core_mask_is_recorded_and_does_not_split_layers():
    layers = table(PIPER)
    one = cost.predict(layers, "rk3588", "0", constants=UNIT, **NO_CPU)
    three = cost.predict(layers, "rk3588", "0_1_2", constants=UNIT, **NO_CPU)
    assert (one.cores, three.cores) == (1, 3) and three.terms == one.terms
    assert three.row()["npu_mask"] == "0_1_2" and three.row()["npu_cores"] == 3
    # a multi-core mask on a single-core SoC runs on one core, as the runner falls back
    assert cost.effective_cores(cost.soc_record("rk3566"), "0_1_2") == 1
    with pytest.raises(UsageError, match="core mask '0_2'"):
        cost.effective_cores(cost.soc_record("rk3588"), "0_2")


def test_cpu_layers_and_io_take_their_host_times_times_the_cpu_factor():
    layers = table(PIPER)
    cpu = [x for x in layers if x.target == "CPU" and x.op not in log.IO_OPS]
    p = cost.predict(layers, "rk3588", "0", constants=UNIT, cpu_ms={x.id: 0.5 for x in cpu},
                     io_ms=lambda layer: 0.25)
    assert p.terms["cpu"] == pytest.approx(2.0 * 0.5 * 4) and p.basis.cpu_host_by_op == (("Slice", 2.0),)
    assert p.terms["io"] == pytest.approx(2.0 * 0.25 * 3)   # z, y_mask in; audio out
    assert p.npu_ms == pytest.approx(p.ms - p.terms["cpu"] - p.terms["io"])


def test_where_the_model_cannot_speak_it_says_so_and_gives_no_value():
    layers = table(PIPER)
    p = cost.predict(layers, "rk3566", "0", constants=UNIT, **NO_CPU)
    assert p.ms is None and p.cannot.startswith("cannot speak for rk3566: no DRAM bandwidth")
    assert "rkstudy board dram" in p.cannot
    row = p.row()
    assert row["npu_ms_predicted"] == "" and row["npu_cost_note"] == p.cannot
    bare = [log.Layer(1, "Conv", "NPU", "c"), log.Layer(2, "Add", "NPU", "a")]
    q = cost.predict(bare, "rk3588", "0", constants=UNIT, **NO_CPU)
    assert q.ms is None and "no Cycles and RW columns in the layer table" in q.cannot
    with pytest.raises(UsageError, match="no NPU cost figures for 'rk9999'"):
        cost.predict(layers, "rk9999")


def test_layers_with_neither_cycles_nor_bytes_are_named_in_the_row():
    p = cost.predict(table(KOKORO), "rk3588", "0", constants=UNIT, **NO_CPU)
    assert p.basis.uncosted == ("Add:44", "Expand:44", "Mul:88", "Reshape:1", "Sqrt:44")
    row = p.row()
    assert row["npu_layers_uncosted"] == "Add:44 Expand:44 Mul:88 Reshape:1 Sqrt:44"
    assert row["npu_cost_note"] == cost.PREDICTED_BY
    assert row["npu_ms_predicted"] == pytest.approx(sum(row[f"npu_ms_{k}"] for k in cost.TERMS), abs=0.1)


def test_a_cpu_layer_is_timed_here_by_its_op_or_as_a_copy_once_per_work(monkeypatch):
    monkeypatch.setattr(cost, "SPAN_S", 0.05)
    cost.forget_timings()
    sin, twin = sin_layer(30), sin_layer(30, 5, "/other/Sin")
    pad = log.Layer(3, "exConvTransposePad", "CPU", "/up/pad", "FLOAT16", "(1,16,1,64)", "(1,16,1,71)", 0, 0, 0, 0)
    out = log.Layer(4, "OutputOperator", "CPU", "out", "FLOAT16", "(1,16,64)", "\\", 0, 0, 0, 0)
    timed = cost.host_times([sin, twin, pad, out])
    assert timed[2][0] > 0 and timed[2][1] == "its op at the printed shapes"
    assert timed[5] == timed[2] and len(cost._timed) == 3   # the same work at the same shapes: timed once
    assert timed[3][1] == "a copy of its output" and timed[4][1] == "a cast and a transposing copy"
    assert cost.layer_timing(sin) == timed[2]   # cached for the process
    cost.forget_timings()
    assert not cost._timed
    assert cost.shapes("(1,16,1,64),(16,16,1,7),(16),...") == [(1, 16, 1, 64), (16, 16, 1, 7), (16,)]
    assert cost.shapes("\\") == []


def test_the_fit_recovers_the_constants_that_made_the_figures():
    layers = table(PIPER)
    p = cost.predict(layers, "rk3588", "0_1_2", constants=UNIT, cpu_ms=lambda x: 0.4, io_ms=lambda x: 0.1)
    q = cost.predict(table(KOKORO), "rk3588", "0_1_2", constants=UNIT, cpu_ms=lambda x: 0.02, io_ms=lambda x: 0.3)
    truth = cost.Constants(dram_share=0.15, dispatch_us=40.0, cpu_factor=1.7)
    readings = [lambda c: p.at(c).ms, lambda c: q.at(c).ms, lambda c: p.at(c).terms["cpu"]]
    theirs = [f(truth) for f in readings]
    got = cost.fit(lambda c: [math.log(f(c) / t) for f, t in zip(readings, theirs)], cal.START)
    assert (got.dram_share, got.dispatch_us, got.cpu_factor) == pytest.approx((0.15, 40.0, 1.7), rel=1e-4)


def test_a_range_counts_as_met_anywhere_inside_it():
    assert cost.relative_error(66.0, [71, 63, 65]) == 0.0
    assert cost.relative_error(78.1, [71, 63, 65]) == pytest.approx(0.1)
    assert cost.relative_error(50.4, [63, 71]) == pytest.approx(-0.2)


def test_an_extrapolated_width_follows_each_sum_as_a_power_law():
    points = {}
    for n in (128, 192, 256):
        s = (n / 128) ** 3
        points[n] = cost.Prediction("rk3588", "0", 1, cost.Basis(
            conv_ms=2.0 * s, dram_gbps=27.9, elementwise_bytes=int(1e6 * s), compute_layers=251, cpu_host_ms=0.0,
            io_host_ms=0.5 * n / 128, conv_costs=((1.0 * s, int(4e6 * s)), (1.0 * s, 0))), UNIT)
    wide = cal.extrapolated(points, 384)
    assert wide.basis.conv_ms == pytest.approx(54.0) and wide.basis.elementwise_bytes == pytest.approx(27e6, rel=1e-6)
    assert wide.basis.io_host_ms == pytest.approx(1.5) and wide.basis.compute_layers == 251
    assert wide.basis.cpu_host_ms == 0 and wide.basis.dram_gbps == 27.9
    (a, bytes_a), (b, bytes_b) = wide.basis.conv_costs
    assert (a, b, bytes_b) == (pytest.approx(27.0), pytest.approx(27.0), 0)
    assert bytes_a == pytest.approx(108e6, rel=1e-6)


def test_at_most_a_third_of_the_figures_are_fitted():
    fitted = set(cal.FITTED) | set(cal.SAME_MEASUREMENT)
    assert len(fitted) == 4 and not fitted & set(cal.SHAPED_BY)
    assert cal.role("kokoro-sin-cpu-ms") == "fitted" and cal.role("qwen3-step-ms") == "held out"
    assert cal.role("piper-decoder-ms").startswith("seen: ")
    assert cal.role("kokoro-clipped-ms-per-frame").startswith("fitted (the same board measurement")


def test_a_verdict_is_computed_from_its_numbers():
    assert cal.verdict(0.1, "dispatch", 10.0, 11.0, [10.0]) == "within +-25 % (+10.0 %)"
    text = cal.verdict(1.5, "dispatch", 40.0, 50.0, [20.0])
    assert text.startswith("misses by +150.0 %: the dispatch term carries 40.0 of the 50.0") and text.endswith("x0.25")
    assert cal.verdict(-0.5, "conv", 5.0, 10.0, [20.0]).endswith("x3.00")


def test_every_soc_figure_names_its_source_in_the_soc_record():
    from rkstudy.targets import RECORDS

    rows = cost.soc_rows()
    assert [r["soc"] for r in rows] == [t.name for t in RECORDS]   # one place states each SoC fact
    for row in rows:
        for k in cost.COST_FIELDS:
            assert row[f"{k}_source"], (row["soc"], k)
    assert cost.soc_record("rk3588").dram_gbps == pytest.approx((26.4 + 29.4) / 2)
    # a SoC without a figure says how to get one, and its prediction says so
    assert "rkstudy board dram" in cost.soc_record("rk3576").source("dram_gbps")
    mcu = cost.predict(table(PIPER), "rv1106", "0_1_2", constants=UNIT, **NO_CPU)
    assert mcu.ms is None and mcu.cannot.startswith("cannot speak for rv1106: no NPU clock, no DRAM bandwidth, no "
                                                     "core count (no DRAM figure")


@pytest.mark.slow   # the fitted figures' families' cases: the encoder's CPU share of the stage on this host
def test_the_committed_constants_are_what_their_recorded_inputs_fit():
    """cost.CALIBRATED is what the fitted figures give from the record of the run that fitted it
    (data/npu_cost/fitted_inputs.json, calibration.record_fitted: the fitted engines' layer-table sums and
    that host's CPU timings): the fit runs again here, without a toolkit or a build, and notebook 09's constants
    table says the same."""
    got = cal.fit_recorded()
    c = cost.CALIBRATED
    assert (got.dram_share, got.dispatch_us, got.cpu_factor) == pytest.approx(
        (c.dram_share, c.dispatch_us, c.cpu_factor), rel=1e-3, abs=1e-6)
    assert got.fitted_on == c.fitted_on
    rows = cal.constant_rows(c, this_run=cost.Constants(c.dram_share, c.dispatch_us, 2 * c.cpu_factor))
    assert all(r["agrees"] for r in rows) and {r["timings"] for r in rows} == {5}   # the first and 4 reruns
    by = {r["constant"]: r for r in rows}
    assert by["cpu_factor"]["timings_low"] <= c.cpu_factor <= by["cpu_factor"]["timings_high"]
    assert by["cpu_factor"]["timings_high"] < 1.1 * by["cpu_factor"]["timings_low"]   # what the timing is for
    assert by["cpu_factor"]["drift_pct"] == 100.0 and by["cpu_factor"]["within_timings"] is False
    assert by["dram_share"]["within_timings"] is True
    assert cal.drift(rows).startswith("drift: cpu_factor ")


def test_a_builds_prediction_reads_the_table_its_log_holds(tmp_path):
    from types import SimpleNamespace

    verbose = tmp_path / "verbose.log"
    verbose.write_bytes(gzip.decompress((TABLES / PIPER).read_bytes()))
    p = cost.for_build(SimpleNamespace(log=str(verbose), target="rk3588"), "0", constants=UNIT)
    assert p.basis.npu_cycles == 8_192_768 and p.ms > p.terms["conv"] > 0
    assert p.basis.cpu_layers == 4 and p.terms["cpu"] > 0   # its four CPU Slices, timed on this host
    quiet = tmp_path / "quiet.log"
    quiet.write_text("I rknn building done.\n")
    q = cost.for_build(SimpleNamespace(log=str(quiet), target="rk3588"), constants=UNIT)
    assert q.ms is None and "a verbose build prints them" in q.cannot


def test_a_build_record_another_version_wrote_is_read_and_predicted(tmp_path):
    """The build cache is shared by every checkout on a machine: a record with a field this BuildReport does not
    have (another version's) is the same engine, read with the fields this version knows, and its row predicts
    from the verbose log beside it."""
    import json

    from rkstudy.toolkit import build

    engine = tmp_path / "w93.rknn"
    engine.write_bytes(b"engine")
    log_path = tmp_path / "w93.log"
    log_path.write_bytes(gzip.decompress((TABLES / PIPER).read_bytes()))
    report = {"status": "ok", "target": "rk3588", "onnx": str(tmp_path / "gone.onnx"), "engine": str(engine),
              "engine_bytes": 6, "seconds": 12.5, "regtask": 0, "toolkit_version": "rknn-toolkit2 2.3.2",
              "log": str(log_path), "a_field_of_another_version": 1.5}
    engine.with_suffix(".json").write_text(json.dumps({"key": "k", "verbose": True, "report": report}))
    got = build.cached_report(engine, "k", verbose=True)
    assert got.ok and got.seconds == 12.5 and not hasattr(got, "a_field_of_another_version")
    row = got.row()
    assert row["npu_cycles"] == 8_192_768 and row["npu_ms_predicted"] > row["npu_ms_conv"] > 8.19
    assert build.cached_report(engine, "other key", verbose=True) is None


def test_a_verdict_this_hosts_timings_can_turn_is_undecided_and_not_counted():
    """Two runs of notebook 09 on one host timed the W = 136 and W = 128 windows' CPU layers apart and the
    saving's verdict flipped between 'misses' and 'within'. A figure is now scored with each engine at its
    fastest and its slowest host timings: where those disagree on the band, it is undecided."""
    from rkstudy.families.kokoro_generator import levers as kl

    layers = table(KOKORO)

    def at(io_ms):
        return cost.predict(layers, "rk3588", "0", constants=UNIT, cpu_ms=lambda x: 0.0, io_ms=lambda x: io_ms)

    probe = cal.Figure("ratio", "kokoro_generator", kl.WIDE_RTF, slice(0, 2), "q", "ms", ("a", "b"),
                       lambda p: cal.Outcome(0.0, {}))
    mid = sum(probe.theirs()) / len(probe.theirs())
    fig = cal.Figure("ratio", "kokoro_generator", kl.WIDE_RTF, slice(0, 2), "q", "ms", ("a", "b"),
                     lambda p: cal.Outcome(mid * p["a"].terms["io"] / p["b"].terms["io"],
                                           {"io": mid * p["a"].terms["io"] / p["b"].terms["io"]}))
    cases = cal.Cases(figures=[fig])
    fastest = {"a": at(1.0), "b": at(1.0)}
    steady = cal.rows(cases, fastest, {}, {"a": at(1.1), "b": at(1.1)})[0]
    assert steady["within_25_pct"] is True and steady["verdict"] == "within +-25 % (+0.0 %)"
    turned = cal.rows(cases, fastest, {}, {"a": at(2.0), "b": at(2.0)})[0]
    assert turned["within_25_pct"] == "" and turned["predicted"] == pytest.approx(mid, abs=1e-3)
    low = 100 * cost.relative_error(mid / 2, probe.theirs())
    high = 100 * cost.relative_error(mid * 2, probe.theirs())
    assert turned["verdict"] == (f"undecided: with each of its engines at the fastest or the slowest of this host's "
                                 f"timings of the CPU layers and I/O, the error runs {low:+.1f} % to {high:+.1f} %, "
                                 "across the +-25 % band; a board run decides it")
    tally = cal.summary([{**turned, "role": "held out"}, {**steady, "role": "held out"}])
    assert (tally["held_out"], tally["held_out_within_25_pct"], tally["held_out_undecided"]) == (1, 1, 1)


def test_engines_timed_together_share_one_timing_per_work_and_keep_the_fastest(monkeypatch):
    monkeypatch.setattr(cost, "SPAN_S", 0.02)
    cost.forget_timings()
    sin, wide = sin_layer(30), sin_layer(34)
    conv = log.Layer(3, "Conv", "NPU", "/c", "FLOAT16", "(1,8,1,30)", "(1,8,1,30)", 10, 10, 10, 1.0)
    fastest, slowest = cost.time_together([([sin, conv], None), ([wide, conv], None)], timings=3)
    assert set(fastest) == set(slowest) == {("op", "Sin", ((1, 8, 1, 30),)), ("op", "Sin", ((1, 8, 1, 34),))}
    assert all(0 < fastest[k][0] <= slowest[k] for k in fastest)
    assert cost.timings() == fastest   # the predictions that follow use the fastest
    cost.forget_timings()


def test_a_calibration_run_times_every_engine_together_and_predicts_at_both_ends(tmp_path, monkeypatch):
    """npu_cost.build on two recorded verbose builds (the toolkit replaced by their logs): both engines'
    predictions come from one shared timing, at each op's fastest, and `slowest` holds the same engines at the
    slowest of the TIMINGS timings."""
    import types

    import rkstudy.graph
    import rkstudy.toolkit.build
    from rkstudy.graph.index import Index

    logs = {}
    for name in (PIPER, KOKORO):
        logs[name] = tmp_path / name.removesuffix(".gz")
        logs[name].write_bytes(gzip.decompress((TABLES / name).read_bytes()))
    engines = [cal.Engine(n, lambda n=n: tmp_path / f"{n}.onnx") for n in logs]
    monkeypatch.setattr(cal, "collect", lambda quick: cal.Cases(engines=engines))
    monkeypatch.setattr(cal, "TIMINGS", 2)
    monkeypatch.setattr(cost, "SPAN_S", 0.02)
    monkeypatch.setattr(rkstudy.graph, "load", lambda path: None)
    monkeypatch.setattr(Index, "inferred", staticmethod(lambda model: None))   # each CPU layer timed by its op

    def built(onnx_path, target, verbose, toolkit):
        assert verbose
        return types.SimpleNamespace(ok=True, status="ok", toolkit_version="2.3.2", regtask=0, engine_bytes=1,
                                     seconds=1.0, log=str(logs[Path(onnx_path).stem]))
    monkeypatch.setattr(rkstudy.toolkit.build, "build_engine", built)
    run = cal.build(False, progress=False)
    assert set(run.predictions) == set(run.slowest) == set(logs)
    for name in logs:
        fast, slow = run.predictions[name], run.slowest[name]
        assert fast.basis.io_host_ms > 0 and fast.basis.io_host_ms <= slow.basis.io_host_ms
        assert fast.basis.cpu_host_ms <= slow.basis.cpu_host_ms and fast.basis.cycles == slow.basis.cycles
    assert run.predictions[PIPER].basis.cpu_layers == 4 and run.predictions[PIPER].basis.cpu_host_ms > 0
    cost.forget_timings()
