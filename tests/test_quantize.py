"""Quantization study pieces: which compiled layer computes which graph conv (and the table's extra MACs,
by cause, on real layer tables), the low-bit share of a hybrid engine, the calibration settings the
toolkit documents, the groups a search moves, the search itself, and the stages' calibration held apart
from their evaluation."""

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pytest
from board_cli import run_cli

from rkstudy import gates
from rkstudy.levers.quantization import equalized
from rkstudy.levers.quantization import search as qsearch
from rkstudy.levers.quantization.bench import Bench
from rkstudy.levers.quantization.curves import cheapest, goal_rows
from rkstudy.levers.quantization.probe import builds, probe_dtypes
from rkstudy.levers.quantization.run import keep_for
from rkstudy.levers.quantization.shares import engine_shares, float16_layers, weight_bits
from rkstudy.levers.quantization.stages import Stage, evenly, span_scores
from rkstudy.levers.quantization.tensors import IO_GROUP, config_groups, group_macs, quantized_tensors
from rkstudy.toolkit import macs
from rkstudy.toolkit import probes as toolchain
from rkstudy.toolkit.calibration import Calibration
from rkstudy.toolkit.log import Layer, layer_table

FIXTURES = Path(__file__).parent / "fixtures" / "layer_tables"
# the probe's convs: conv_pre 16x64 outputs x 16 x 7, up (ConvTranspose) 16x64 inputs x 16 x 8,
# conv_post 1x256 outputs x 16 x 7
PROBE_MACS = {"conv_pre": 114_688, "up": 131_072, "conv_post": 28_672}


SHAPES = {"conv_pre": ("Conv", "(1,16,1,64),(16,16,1,7),(16)", "(1,16,1,64)"),
          "up": ("ConvTranspose", "(1,16,1,64),(16,16,1,8),(16)", "(1,16,1,256)"),
          "conv_post": ("Conv", "(1,16,1,256),(1,16,1,7),(1)", "(1,1,1,256)")}


def _layers(**dtypes):
    return [Layer(0, "InputOperator", "CPU", "x", "INT8", "\\", "(1,16,1,64)")] + [
        Layer(i + 1, SHAPES[name][0], "NPU", name, dtype, *SHAPES[name][1:])
        for i, (name, dtype) in enumerate(dtypes.items())]


def _int8(layer):
    return layer.dtype == "INT8"


def test_the_low_bit_share_counts_the_macs_of_the_convs_compiled_int8():
    model = toolchain.vocoder_probe()
    found = macs.account(model, _layers(conv_pre="INT8", up="INT8", conv_post="INT8"))
    assert {c.node: c.macs for c in found.layers} == PROBE_MACS
    assert found.graph == {n: {"op": op, "macs": PROBE_MACS[n], "weight_params": w} for n, op, w in
                           (("conv_pre", "Conv", 16 * 16 * 7), ("up", "ConvTranspose", 16 * 16 * 8),
                            ("conv_post", "Conv", 16 * 7))}
    mixed = macs.account(model, _layers(conv_pre="INT8", up="FLOAT16", conv_post="INT8"))
    assert mixed.conv_macs == sum(PROBE_MACS.values()) == 274_432 and mixed.coverage == 1.0
    assert mixed.share(_int8) == pytest.approx(143_360 / 274_432)  # 0.5224
    assert mixed.share(_int8, weights=True) == pytest.approx((16 * 16 * 7 + 16 * 7) / (16 * 16 * 15 + 16 * 7))
    assert mixed.chosen_nodes(lambda layer: layer.dtype == "FLOAT16") == ["up"]
    # a conv the compiler tiles over halves of its input channels: each tile counts its own half
    tiles = _layers(conv_pre="INT8", conv_post="INT8") + [
        Layer(8, "ConvTranspose", "NPU", f"up_tile{k}", dtype, "(1,8,1,64),(8,16,1,8),(16)", "(1,16,1,256)")
        for k, dtype in enumerate(("INT8", "FLOAT16"))]
    tiled = macs.account(model, tiles)
    assert tiled.coverage == 1.0 and tiled.share(_int8) == pytest.approx((114_688 + 28_672 + 65_536) / 274_432)
    # a table that misses a conv says so in its coverage
    missing = macs.account(model, _layers(conv_pre="INT8", conv_post="INT8"))
    assert missing.coverage == pytest.approx(143_360 / 274_432)
    assert missing.reconciliation()["convs_without_a_layer_macs"] == 131_072


@pytest.mark.parametrize("dtype, stored, low", [("w4a16", "INT4", 1.0), ("w16a16i_dfp", "INT16", 0.0)])
def test_the_low_bit_share_reads_what_the_weights_are_stored_in(dtype, stored, low):
    """Recorded from rknn-toolkit2 2.5.0 builds of the dtype probe for rk3576: under w4a16 every layer
    computes in FLOAT16 (the layer table's dtype) on 4-bit weights (the constant table's), so the share
    of conv MACs on weights of 8 bits or fewer is 1.0, not the 0.0 the layer dtypes would say; under
    w16a16i_dfp the weights are 16-bit and the share is 0."""
    from rkstudy.toolkit.log import weight_dtypes

    text = gzip.decompress((FIXTURES / f"dtype_probe_{dtype}_rk3576.log.gz").read_bytes()).decode()
    convs = [layer for layer in layer_table(text) if layer.op.startswith("Conv")]
    assert len(convs) == 2 and {weight_dtypes(text)[layer.id] for layer in convs} == {stored}
    if dtype == "w4a16":
        assert {layer.dtype for layer in convs} == {"FLOAT16"}
    shares = engine_shares(toolchain.dtype_probe(), text, Calibration([{"x": np.zeros(1)}], dtype=dtype))
    assert shares["low_bit_mac_share"] == low == shares["low_bit_weight_share"] and shares["mac_coverage"] == 1.0
    assert shares["fp16_convs"] == []


# Recorded verbatim from verbose rknn-toolkit2 2.5.0 fp16 builds (rk3588) of these exact graphs: the
# table's conv layers as printed, against the graph's convs, every difference by cause.
RECORDED = {
    "qwen3_step_tiny_b16": {"graph_conv_macs": 68_097_536, "table_printed_conv_macs": 84_325_568,
                            "not_graph_convs": "MatMul:1146880 tensor of Unsqueeze:1920",
                            "depthwise_layout_extra_macs": 666_624, "zero_stuffing_extra_macs": 14_412_608,
                            "sliced_output_macs_not_computed": 0},
    "piper_encoder_w64": {"graph_conv_macs": 412_987_392, "table_printed_conv_macs": 448_192_512,
                          "not_graph_convs": "MatMul:9363456 ReduceSum:4718592",
                          "depthwise_layout_extra_macs": 21_123_072, "zero_stuffing_extra_macs": 0,
                          "sliced_output_macs_not_computed": 0},
    "kokoro_generator_w64": {"graph_conv_macs": 19_740_383_232, "table_printed_conv_macs": 26_406_907_014,
                             "not_graph_convs": "GlobalAveragePool:5426910342",
                             "depthwise_layout_extra_macs": 0, "zero_stuffing_extra_macs": 1_258_291_200,
                             "sliced_output_macs_not_computed": 18_677_760},
}


def _recorded_graph(name, voice=None):
    if name == "qwen3_step_tiny_b16":
        from rkstudy.families.qwen3_vocoder import producer

        return producer.produce(16, widths="tiny").path
    if name == "piper_encoder_w64":
        from rkstudy.families.piper_encoder.producer import produce

        return produce(voice, 64).path
    from rkstudy.families.kokoro_generator.producer import produce

    return produce(64, 16).path


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RECORDED))
def test_the_layer_tables_extra_macs_are_explained_exactly(name, voice):
    """On real layer tables (tests/fixtures/layer_tables, recorded from builds of the graphs these producers
    make): every graph conv has a compiled layer (coverage 1.0), and the table's printed conv MACs are the
    graph's plus the ops compiled as convs that are no graph conv (MatMul, ReduceSum, GlobalAveragePool,
    a scalar Mul), plus a depthwise weight read as (C_out, C_in) and a lowered transposed conv's stuffed
    zeros, minus the outputs a sliced conv never computes; nothing is left unexplained."""
    text = gzip.decompress((FIXTURES / f"{name}.log.gz").read_bytes()).decode()
    found = macs.account(_recorded_graph(name, voice), layer_table(text))
    r = found.reconciliation()
    assert r["coverage"] == 1.0 and r["unexplained_macs"] == 0 and r["convs_without_a_layer_macs"] == 0
    assert {k: r[k] for k in RECORDED[name]} == RECORDED[name]
    assert r["table_printed_conv_macs"] == (r["graph_conv_macs"] + r["not_graph_convs_macs"]
                                           + r["depthwise_layout_extra_macs"] + r["zero_stuffing_extra_macs"]
                                           - r["sliced_output_macs_not_computed"])
    assert found.share(lambda layer: layer.dtype == "FLOAT16") == pytest.approx(1.0)


def test_a_layer_name_resolves_to_the_conv_it_computes():
    """The compiler names a layer after its conv node, the node's output, or the tensor it reads; a layer
    named after anything else computes no graph conv."""
    from rkstudy.graph.index import Index

    index = Index(toolchain.vocoder_probe())
    convs = ["conv_pre", "up", "conv_post"]
    assert macs.resolve("conv_post", index, convs) == ("conv_post", "node")
    assert macs.resolve("up#1_tile0_ConvAdd", index, convs) == ("up", "node")
    assert macs.resolve("h1-rs_tile1", index, convs) == ("conv_pre", "output")
    assert macs.resolve("h3-rs_conv", index, convs) == ("conv_post", "input")
    assert macs.resolve("s2_output_conv", index, convs) == (None, "tensor of Mul")
    assert macs.resolve("snake_sin_2conv", index, convs) == (None, "Sin")
    assert macs.locate("x_int8", index) == ("tensor", "x")


def test_the_layer_table_keeps_each_layers_dtype():
    log = ("D RKNN: [20:38:00.517] 3    ConvTranspose      FLOAT16  NPU    (1,16,1,64),(16,16,1,8),(16)   "
           "(1,16,1,256)   609/2048/2048   6   ConvTranspose:up\n"
           "D RKNN: [20:38:00.517] 4    exDataConvert      FLOAT16  NPU    (1,16,1,256)   (1,16,1,256)   "
           "0/0/0   8   exDataConvert:h2__cvt_float16_int8\n"
           "D RKNN: [20:38:00.517] 8    Conv               INT8     NPU    (1,16,1,256),(1,16,1,7),(1)   "
           "(1,1,1,256)   535/1792/1792   4   Conv:conv_post\n")
    layers = layer_table(log)
    assert [(x.node, x.dtype) for x in layers] == [("up", "FLOAT16"), ("h2__cvt_float16_int8", "FLOAT16"),
                                                    ("conv_post", "INT8")]
    assert float16_layers(layers) == ["up"]  # the dtype cast is no layer's work
    w4 = Calibration([{"x": np.zeros(1)}], dtype="w4a16")
    assert [weight_bits(x, w4) for x in layers] == [16, 16, 4]
    assert [weight_bits(x, None) for x in layers] == [16, 16, 16]


def test_the_calibration_settings_are_the_ones_the_toolkit_documents():
    feeds = [{"x": np.zeros((1, 4), np.float32)}]
    assert Calibration(feeds, method="layer").label == "int8 w8a8 layer"
    assert Calibration(feeds, dtype="w16a16i_dfp", algorithm="kl_divergence").label == "int16 w16a16i_dfp kl_divergence"
    assert Calibration(feeds, dtype="w4a16").weight_bits == 4 and Calibration(feeds).settings == "w8a8 normal channel"
    hybrid = Calibration(feeds, algorithm="mmse").with_fp16(["a", "b"])
    assert hybrid.label == "int8 w8a8 mmse hybrid (2 layers fp16)" and hybrid.algorithm == "mmse"
    assert hybrid.record() == {"dtype": "w8a8", "algorithm": "mmse", "method": "channel", "label": hybrid.label,
                               "calibration_samples": 1, "fp16_tensors": 2}
    # one calibration pass serves every hybrid choice: the choice is outside the data key
    assert hybrid.data_key(["x"]) == Calibration(feeds, algorithm="mmse").data_key(["x"])
    assert hybrid.key(["x"]) != Calibration(feeds, algorithm="mmse").key(["x"])
    for bad, says in (({"dtype": "w8a4"}, "quantized dtype 'w8a4'"), ({"algorithm": "minmax"}, "algorithm"),
                      ({"method": "tensor"}, "method 'tensor'")):
        with pytest.raises(Exception, match=says):
            Calibration(feeds, **bad)


@pytest.mark.slow
def test_calibration_windows_are_what_the_walker_feeds_and_never_the_evaluation_texts(voice, slice_once):
    from rkstudy.families.piper.voice import read_text
    from rkstudy.families.piper_decoder.study import quantization_stage
    from rkstudy.walk.window import plan_windows

    stage = quantization_stage(voice, calibration_texts=("phone",), evaluation_texts=("short",))
    frames = [lat.frames for lat in voice.latents(read_text("phone"))]
    assert len(stage.calibration) == sum(len(plan_windows(n, 45, 24)) for n in frames)
    assert all(f["z"].shape == (1, voice.channels, 93) and f["y_mask"].shape == (1, 1, 93) for f in stage.calibration)
    assert stage.texts == {"calibration": "phone", "evaluation": "short"}
    cut = quantization_stage(voice, calibration_texts=("phone",), evaluation_texts=("short",), evaluation_frames=20)
    assert [lat.frames for lat in cut.evaluation] == [20]
    with pytest.raises(ValueError, match="short would both calibrate and score"):
        quantization_stage(voice, calibration_texts=("short",), evaluation_texts=("short", "phone"))
    assert np.isfinite(stage.calibration[0]["z"]).all()


def _probe_stage(tmp_path):
    import onnx

    path = tmp_path / "probe.onnx"
    onnx.save(toolchain.vocoder_probe(), str(path))
    noise = [np.random.default_rng(s).standard_normal((1, 16, 1, 64)).astype(np.float32) for s in (0, 1, 2, 3, 100)]
    return Stage(name="probe", onnx=path, calibration=[{"x": x} for x in noise[:4]],
                          evaluation=[{"x": noise[4]}], walk=lambda runner, item: runner.run(item)[0],
                          score=lambda items, refs, tests: {"utterance_snr_db": gates.snr_db(refs[0], tests[0])})


@pytest.mark.simulator
def test_one_calibration_serves_every_hybrid_and_a_search_re_measures_each_choice(tmp_path, monkeypatch):
    """On the probe (rk3588): the session's plain variant is the plain quantized build bit for bit; a
    variant the toolkit refuses is a row, not an exception; every quantized tensor in float16 computes
    no conv on low bits and lands near fp16; the backward search walks from there to the plain build,
    re-measuring each choice, and its path only moves MACs to low bits; a second bench reads every
    measurement back without a toolkit child."""
    monkeypatch.setenv("RKSTUDY_CACHE", str(tmp_path / "cache"))
    stage = _probe_stage(tmp_path)
    bench = Bench(stage, "rk3588", listen=False)
    fp16 = bench.build("fp16")
    plain_build = bench.build("int8 w8a8, built alone", Calibration(stage.calibration))
    with bench.session(Calibration(stage.calibration)) as session:
        names = session.quantized()
        plain = session.measure([], "int8 w8a8")
        np.testing.assert_array_equal(stage.outputs["int8 w8a8"][0], stage.outputs["int8 w8a8, built alone"][0])
        refused = session.measure(["no such tensor"], "refused")
        assert refused["status"] == "refused at hybrid_quantization_step2" and "no quantized layer" in refused["error"]
        every = session.measure(names, "every tensor in float16")
        convs = {"conv_pre": [], "up": [], "conv_post": []}
        other = []
        from rkstudy.graph.index import Index

        index = Index(toolchain.vocoder_probe())
        for name in names:
            node, _ = macs.resolve(name, index, convs)
            (convs[node] if node else other).append(name)
        groups = {k: v for k, v in convs.items() if v} | ({"rest": other} if other else {})
        rows = qsearch.search(session, groups, budget=12)
    assert fp16["low_bit_mac_share"] == 0.0 and fp16["utterance_snr_db"] > 55 and fp16["mac_coverage"] == 1.0
    assert plain["low_bit_mac_share"] == 1.0 == plain_build["low_bit_mac_share"] and 25 < plain["utterance_snr_db"] < 40
    assert every["low_bit_mac_share"] == 0.0 and every["utterance_snr_db"] > plain["utterance_snr_db"] + 15
    on_path = qsearch.path(rows)
    shares = [r["low_bit_mac_share"] for r in on_path]
    assert shares == sorted(shares) and shares[0] == 0.0 and shares[-1] == 1.0
    assert all(r["scored_on"] == "search" and r["search"] == "search" for r in rows)
    again = Bench(stage, "rk3588", listen=False)
    with again.session(Calibration(stage.calibration)) as session:
        assert session.measure(names, "every tensor in float16")["utterance_snr_db"] == every["utterance_snr_db"]
        assert session._child is None  # read back: no toolkit child started
    assert again.built == 0


@pytest.mark.simulator
def test_the_dtype_probe_records_refusals_and_crashes_as_rows(tmp_path, monkeypatch):
    """rk3588 builds w8a8 and w16a16i_dfp and refuses w8a16 at config, quoted; on rk3562 the toolkit
    process dies on w8a16, a row like any other. A cold cache, so every build really runs in a child forked
    from the fork server and the crash is that child's exit status: a signal, SIGSEGV in most runs here and
    SIGABRT in some (the same build, where glibc catches the corrupted heap before the fault does)."""
    monkeypatch.setenv("RKSTUDY_CACHE", str(tmp_path / "cache"))
    rows = {(r["target_soc"], r["dtype"]): r for r in probe_dtypes(("rk3588", "rk3562"), ("w8a8", "w8a16",
                                                                                                     "w16a16i_dfp"))}
    assert rows["rk3588", "w8a8"]["status"] == "ok" and 25 < rows["rk3588", "w8a8"]["snr_vs_fp32_db"] < 45
    assert rows["rk3588", "w16a16i_dfp"]["snr_vs_fp32_db"] > 60
    assert rows["rk3588", "w8a16"]["status"] == "refused at config"
    assert "'w8a16' not support in 'rk3588'" in rows["rk3588", "w8a16"]["error"]
    assert re.match(r"crashed \((SIGSEGV, exit 139|SIGABRT, exit 134)\) at build", rows["rk3562", "w8a16"]["status"])
    assert builds(list(rows.values()), "rk3588") == ["w8a8", "w16a16i_dfp"]


def test_evenly_spreads_a_cut_calibration_set_over_every_source():
    items = list(range(49))
    assert evenly(items, None) == items and evenly(items, 60) == items
    assert evenly(items, 5) == [0, 12, 24, 36, 48]


def test_the_calibration_set_is_written_and_read_back_in_input_order(tmp_path):
    """What the toolkit loads: one dataset line per feed, that feed's .npy paths in the graph's
    input order, each array as given (int64 ids stay int64)."""
    from rkstudy.toolkit.calibration import Calibration

    feeds = [{"input_lengths": np.array([k + 2], np.int64), "input": np.arange(k, k + 4, dtype=np.int64)[None]}
             for k in range(3)]
    dataset = Calibration(feeds).write(tmp_path / "cal", ["input", "input_lengths"])
    lines = dataset.read_text().splitlines()
    assert len(lines) == 3
    for feed, line in zip(feeds, lines):
        ids, lengths = (np.load(p) for p in line.split())
        assert ids.dtype == np.int64 and (ids == feed["input"]).all() and (lengths == feed["input_lengths"]).all()
    with pytest.raises(Exception, match="has no array for input_lengths"):
        Calibration([{"input": feeds[0]["input"]}]).write(tmp_path / "bad", ["input", "input_lengths"])


def test_the_hybrid_config_keeps_the_named_layers_in_float16_and_everything_else(tmp_path):
    """The step1 -> step2 hand-over: the named tensors go to custom_quantize_layers as float16, the
    toolkit's own entries and parameters survive the rewrite, and a name it does not quantize is
    refused with names it does (the toolkit would ignore it silently)."""
    import yaml

    from rkstudy.toolkit._child import keep_in_float16

    cfg = {"custom_quantize_layers": {"h0": "float16"},
           "quantize_parameters": {"h1": {"dtype": "asymmetric_quantized", "min": [-1.0]},
                                   "h2": {"dtype": "asymmetric_quantized", "min": [-2.0]},
                                   "x": {"dtype": "float32"}}}
    (tmp_path / "probe.quantization.cfg").write_text(yaml.safe_dump(cfg, sort_keys=False))
    path = keep_in_float16(tmp_path, ["h2"])
    back = yaml.safe_load(path.read_text())
    assert back["custom_quantize_layers"] == {"h0": "float16", "h2": "float16"}
    assert back["quantize_parameters"] == cfg["quantize_parameters"]
    with pytest.raises(ValueError, match="no quantized layer named 'x'.*'h1'"):
        keep_in_float16(tmp_path, ["x"])


def test_span_scores_take_every_window_and_the_whole_utterance():
    ref = np.sin(np.arange(400) / 5.0)
    test = ref.copy()
    test[300:] += 0.1  # the last window alone is off
    s = span_scores([ref], [test], [[(0, 100), (100, 200), (200, 300), (300, 400)]])
    assert s["windows"] == 4 and s["window_snr_db_median"] == np.inf
    assert s["window_snr_db_min"] == pytest.approx(gates.snr_db(ref[300:], test[300:]))
    assert s["window_snr_db_min"] < s["utterance_snr_db"] < np.inf


def test_the_cheapest_settings_are_read_from_full_evaluation_rows():
    fp16 = {"stage": "s", "setting": "fp16", "pesq_wb": 4.6, "engine_bytes": 20, "target": "rk3588",
            "scored_on": "full"}
    rows = [fp16,
            {"stage": "s", "setting": "a", "pesq_wb": 4.55, "low_bit_mac_share": 0.4, "engine_bytes": 15},
            {"stage": "s", "setting": "b", "pesq_wb": 4.52, "low_bit_mac_share": 0.7, "engine_bytes": 13},
            {"stage": "s", "setting": "c", "pesq_wb": 3.6, "low_bit_mac_share": 0.85, "engine_bytes": 12},
            {"stage": "s", "setting": "d", "pesq_wb": 4.6, "low_bit_mac_share": 0.99, "engine_bytes": 11,
             "scored_on": "search"}]  # a search-only score never concludes
    rows = [{"scored_on": "full", "dtype": "fp16" if r is fp16 else "int8 w8a8", **r} for r in rows]
    like, good = cheapest(rows, fp16)
    assert (like["setting"], like["pesq_wb_bar"], like["goal_share_met"]) == ("b", 4.5, False)
    assert (good["setting"], good["low_bit_mac_share"], good["goal_share_met"]) == ("c", 0.85, True)
    (none, _) = cheapest([r for r in rows if r["setting"] in ("fp16", "c")], {**fp16, "pesq_wb": 4.64})
    assert not none["found"] and "best quantized PESQ-WB is 3.60 (c)" in none["why_none"]



def _goal_rows(stage2_pesq: float, equalized_stage2_pesq: float, share: float) -> list[dict]:
    base = {"stage": "w", "target": "rk3588", "scored_on": "full", "engine_bytes": 10}
    fp16 = {**base, "setting": "fp16", "dtype": "fp16", "pesq_wb": 4.64, "graph": "original"}
    rows = [fp16]
    for graph, s2 in (("original", stage2_pesq), ("equalized", equalized_stage2_pesq)):
        tag = "" if graph == "original" else "equalized, "
        rows += [{**base, "graph": graph, "dtype": "int8 w8a8", "setting": f"{tag}{b} alone in int8", "alone": b,
                  "pesq_wb": p, "low_bit_mac_share": m}
                 for b, p, m in (("/dec stage 0", 4.6, 0.15), ("/dec stage 1", 4.52, 0.31),
                                 ("/dec stage 2", s2, 0.2995))]
        rows.append({**base, "graph": graph, "dtype": "int8 w8a8", "setting": f"{tag}search: x", "pesq_wb": 4.58,
                     "low_bit_mac_share": share})
    cheap = [{**r, "graph": g} for g in ("original", "equalized")
             for r in cheapest([r for r in rows if r["graph"] == g or r is fp16], fp16)]
    return goal_rows(cheap, "w", rows, "short, speak_443 (24.9 s)")


def test_the_goals_reason_names_each_block_that_breaks_the_bar_and_what_it_leaves():
    (g,) = _goal_rows(2.74, 3.9, 0.181)
    assert (g["verdict"], g["best_low_bit_mac_share"]) == ("not met", 0.181)
    assert g["evaluation"] == "short, speak_443 (24.9 s)"
    # stage 1 (4.52) and stage 2 are under 4.54; with both in float16, 1 - 0.31 - 0.2995 of the MACs remain
    assert "/dec stage 2 alone scores PESQ-WB 2.74 and holds 29.9% of the conv MACs" in g["reason"]
    assert "/dec stage 1 alone scores PESQ-WB 4.52" in g["reason"]
    assert "leaves at most 39.1% reachable" in g["reason"]
    assert "the equalized graph on rk3588: /dec stage 2 alone scores PESQ-WB 3.90" in g["reason"]
    assert "/dec stage 0 alone" not in g["reason"]
    (met,) = _goal_rows(2.74, 3.9, 0.85)
    assert met["verdict"] == "met" and met["reason"].startswith("met by search: x on rk3588: 85.0% of the conv MACs")


def test_the_equalized_curve_carries_the_levers_search_path_and_its_points_at_each_bar():
    lever = [{"target": "rk3588", "dtype": "fp16", "setting": "fp16", "pesq_wb": 4.64},
             {"target": "rk3588", "setting": "int8 w8a8", "dtype": "int8 w8a8", "pesq_wb": 1.9,
              "low_bit_mac_share": 1.0},  # a plain build: no search point
             *({"target": "rk3588", "setting": f"search: {m}", "fp16_groups": g, "pesq_wb": p,
                "low_bit_mac_share": m, "from_search_on": "rk3588", "search_step": k}
               for k, (g, p, m) in enumerate((("a + b + c", 4.64, 0.0), ("b + c", 4.55, 0.15), ("c", 3.8, 0.6),
                                               ("", 2.3, 1.0)))),
             {"target": "rk3576", "setting": "search: 0.15", "fp16_groups": "b + c", "pesq_wb": 4.5,
              "low_bit_mac_share": 0.15, "from_search_on": "rk3588", "search_step": 1}]
    assert [g for _, g in equalized._path_points(lever, "rk3588")] == ["a + b + c", "b + c", "c", ""]
    assert equalized._at_bars(lever, "rk3588") == [("search: 0.15", "b + c"), ("search: 0.6", "c")]
    groups = {"a": ["t1"], "b": ["t2", "t3"], "c": ["t4"]}
    assert keep_for(groups, lambda g: {}, "b + c") == ["t2", "t3", "t4"]
    assert keep_for(groups, lambda g: {"x": ["t2"]} if g == "b" else {}, "b / x") == ["t2"]
    assert keep_for(groups, lambda g: {}, "d") is None

@pytest.mark.slow
def test_the_stateful_steps_calibrate_on_the_state_an_fp32_walk_carries(voice):
    from rkstudy.families.piper_decoder_stateful.study import quantization_stage

    stage = quantization_stage(voice, calibration_texts=("short",), evaluation_texts=("phone",))
    assert stage.name == "Piper decoder stateful step E=45" and stage.texts == {"calibration": "short",
                                                                               "evaluation": "phone"}
    first, second = stage.calibration[:2]
    assert first["z"].shape == (1, voice.channels, 45)
    states = sorted(k for k in first if k.startswith("state_in"))
    assert states and all(not first[k].any() for k in states)  # the walk starts from a zeroed state
    assert any(second[k].any() for k in states)  # and the next step gets what the first one left
    assert len(evenly(stage.calibration, 2)) == 2
    with pytest.raises(ValueError, match="phone would both calibrate and score"):
        quantization_stage(voice, calibration_texts=("phone",), evaluation_texts=("phone",))


def test_the_encoder_calibrates_on_padded_ids_of_real_text_that_fit_its_width(voice):
    from rkstudy.families.piper_encoder.study import quantization_stage

    stage = quantization_stage(voice, width=64, calibration_chunks=6)
    assert len(stage.calibration) == 6 and stage.texts["calibration"] == "paragraph"
    for feed in stage.calibration:
        n = int(feed["input_lengths"][0])
        assert feed["input"].shape == (1, 64) and 2 <= n <= 64 and not feed["input"][0, n:].any()
    assert all(len(ids) <= 64 for ids in stage.evaluation) and len(stage.evaluation) >= 2


def test_the_qwen3_step_calibrates_and_scores_on_two_streams_of_random_codes():
    from rkstudy.families.qwen3_vocoder import producer
    from rkstudy.families.qwen3_vocoder.study import CALIBRATION_SEED, CODES_SEED, quantization_stage

    stage = quantization_stage(producer.produce(4, widths="tiny").path, calibration_steps=2, evaluation_steps=2)
    assert stage.texts == {"calibration": f"random codes, seed {CALIBRATION_SEED}",
                           "evaluation": f"random codes, seed {CODES_SEED + 1}"}
    assert [f["codes"].shape for f in stage.calibration] == [(1, 16, 4)] * 2
    assert not np.array_equal(stage.calibration[0]["codes"], stage.evaluation[0]["codes"])
    assert not stage.calibration[0]["cache_in"].any() and stage.calibration[1]["cache_in"].any()


def test_a_step_window_is_a_whole_step_never_the_tail_past_the_last_one():
    """The stateful step's quantization scores one step's output per window: the 49-frame short text
    (12,544 samples at E=45, hop 256: one step and 1,024 samples) is one window, not a step and a
    near-silent 1,024-sample tail that scores as the worst window of an engine that is as good there."""
    from rkstudy.families.piper_decoder_stateful.study import step_spans

    step = 45 * 256
    assert step_spans(49 * 256, step) == [(0, 12544)]
    spans = step_spans(380 * 256, step)
    assert len(spans) == 8 and spans[0] == (0, step) and spans[-1][1] == 380 * 256
    assert all(hi - lo >= step for lo, hi in spans) and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert step_spans(100, step) == [(0, 100)] and step_spans(2 * step, step) == [(0, step), (step, 2 * step)]
    # an utterance ending in near-silence: fixed spans make the tail the worst window, whole steps do not
    rng = np.random.default_rng(0)
    ref = np.concatenate([rng.standard_normal(step), 1e-4 * rng.standard_normal(1024)])
    test = ref + 1e-3 * rng.standard_normal(ref.size)
    fixed = span_scores([ref], [test], [[(0, step), (step, ref.size)]])
    whole = span_scores([ref], [test], [step_spans(ref.size, step)])
    assert fixed["window_snr_db_min"] < 0 < 50 < whole["window_snr_db_min"]
    assert whole["window_snr_db_min"] == pytest.approx(whole["utterance_snr_db"])
    with pytest.raises(ValueError, match="both must be positive"):
        step_spans(0, step)


@pytest.mark.simulator
def test_a_quantized_engine_converts_with_its_contract_and_a_board_run_takes_it(voice, tmp_path):
    """Stage 2 with a Calibration: the engine's contract records what it computes in, and `rkstudy board
    run` (on a recorded RK3588 tree with librknnrt 2.5.0, through the replay double) takes it through that
    contract like any engine and stamps its row with the engine's dtype."""
    from rkstudy import contract as contracts
    from rkstudy.families.piper.voice import read_text
    from rkstudy.families.piper_decoder.producer import produce_for_voice
    from rkstudy.families.piper_decoder.study import walked_windows
    from rkstudy.tables import results
    from rkstudy.toolkit.convert import convert

    produced = produce_for_voice(voice, emit=16, context=8)
    path = produced.save(tmp_path / "decoder_z.onnx")
    feeds = walked_windows(voice, voice.latents(read_text("paragraph"))[:1], produced.contract)
    calibration = Calibration(evenly(feeds, 4), algorithm="kl_divergence")
    done = convert(path, "rk3588", tmp_path / "decoder_q.rknn", quantize=calibration,
                   gate=gates.Gate("alive", -100.0))  # the fidelity is notebook 08's to measure, not this test's
    assert done.contract.quantization == calibration.record() and done.contract.dtype == "int8 w8a8 kl_divergence"
    back = contracts.for_engine(tmp_path / "decoder_q.rknn", family="piper_decoder", soc="rk3588")
    assert back.quantization["calibration_samples"] == 4

    def rkstudy(*argv):  # on the recorded RK3588 whose librknnrt (2.5.0) runs the toolkit's engines
        return run_cli(*argv, board="rk3588-librknnrt-2.5.0")

    rkstudy("piper", "latents", "--text", "Call me at 555 0142.", "-o", tmp_path / "latents.npz")
    proc = rkstudy("board", "run", "piper_decoder", "--engine", tmp_path / "decoder_q.rknn", "--latents",
                   tmp_path / "latents.npz", "--results", tmp_path / "results")
    assert "piper_decoder on replay (rk3588" in proc.stdout
    (row,) = results.read_table(tmp_path / "results" / "board" / "piper_decoder.csv")
    assert (row["where"], row["dtype"]) == ("replay", "int8 w8a8 kl_divergence")


@pytest.mark.slow
def test_a_real_quantization_config_falls_into_the_decoders_blocks(voice, slice_once):
    """The Piper window's quantization config as rknn-toolkit2 2.5.0's step 1 wrote it for rk3588 w8a8
    (tests/fixtures/quantization): the casts and reshapes of the graph's inputs and output are one block
    that holds no conv MACs; a tiled conv's compiler-made tiles and the splits and pads feeding them fall
    into their conv's block (the tensors accuracy_analysis never names); the exporter's anonymous gated
    activations into their flow coupling; the stored reciprocals of the decoder's Divs are no layer."""
    from rkstudy.families.piper_decoder.study import quantization_stage

    tensors = json.loads((Path(__file__).parent / "fixtures" / "quantization" /
                          "piper_w93_w8a8_rk3588_tensors.json").read_text())
    stage = quantization_stage(voice, calibration_texts=("phone",), evaluation_texts=("short",))
    names = quantized_tensors(tensors, stage.onnx)
    assert len(names) == 276 and not any(n.endswith("mul_i1") for n in names)
    groups = config_groups(stage, names)
    assert sorted(groups[IO_GROUP]) == ["audio_int8", "y_mask_int8", "y_mask_rs", "z_int8", "z_rs"]
    assert "/dec/ups.0/ConvTranspose_output_0-rs_tile1_convtranspose" in groups["/dec stage 0"]
    assert "/dec/resblocks.5/convs.1/Conv_output_0-rs_tile0_conv" in groups["/dec stage 1"]
    assert "/dec/resblocks.8/LeakyRelu_output_0-rs_pad" in groups["/dec stage 2"]
    assert "onnx::Tanh_6911-rs" in groups["/flow/flows.6"]
    weight = group_macs(stage, groups)
    assert weight[IO_GROUP] == 0 and weight["/dec"] == 0  # activations only
    assert sum(weight.values()) == sum(macs.graph_convs(stage.onnx)[n]["macs"] for n in macs.graph_convs(stage.onnx))
    assert weight["/dec stage 1"] == weight["/dec stage 2"] == 2 * weight["/dec stage 0"]
    refine = qsearch.refiner(stage, groups)
    assert sorted(refine("/dec stage 1")) == ["/dec/resblocks.3", "/dec/resblocks.4", "/dec/resblocks.5", "/dec/ups.1"]
