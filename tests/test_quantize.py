"""Quantization study pieces: the int8 share of a graph's MACs from a compiled layer table, and the
Piper decoder's calibration windows held apart from its evaluation texts."""

import numpy as np
import pytest

from rkstudy import gates
from rkstudy.levers import quantization as quantize
from rkstudy.toolkit import probes as toolchain
from rkstudy.toolkit.log import Layer, layer_table

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


def test_the_int8_share_counts_the_macs_of_the_convs_compiled_int8():
    model = toolchain.vocoder_probe()
    assert {name: quantize.layer_macs(layer) for name, layer in
            zip(SHAPES, _layers(conv_pre="INT8", up="INT8", conv_post="INT8")[1:])} == PROBE_MACS
    share = quantize.int8_mac_share(model, _layers(conv_pre="INT8", up="FLOAT16", conv_post="INT8"))
    assert share["conv_macs"] == sum(PROBE_MACS.values()) == 274_432 and share["coverage"] == 1.0
    assert share["int8_macs"] == 114_688 + 28_672
    assert share["int8_mac_share"] == pytest.approx(143_360 / 274_432)  # 0.5224
    assert share["fp16_convs"] == ["up"]
    # a conv the compiler tiles over halves of its input channels: each tile counts its own half
    tiles = _layers(conv_pre="INT8", conv_post="INT8") + [
        Layer(8, "ConvTranspose", "NPU", f"up_tile{k}", dtype, "(1,8,1,64),(8,16,1,8),(16)", "(1,16,1,256)")
        for k, dtype in enumerate(("INT8", "FLOAT16"))]
    tiled = quantize.int8_mac_share(model, tiles)
    assert tiled["coverage"] == 1.0 and tiled["int8_macs"] == 114_688 + 28_672 + 65_536
    # a table that misses a conv says so in its coverage, not in its share
    missing = quantize.int8_mac_share(model, _layers(conv_pre="INT8", conv_post="INT8"))
    assert missing["coverage"] == pytest.approx(143_360 / 274_432) and missing["int8_mac_share"] == 1.0


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
    assert quantize.float16_layers(layers) == ["up"]  # the dtype cast is no layer's work


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


@pytest.mark.simulator
def test_the_sweep_on_a_small_graph(tmp_path):
    """fp16, int8, hybrid with the worst-ranked layer in fp16, the transposed conv kept in fp16 as a
    block, and auto-hybrid at cosine 0.9999 on the probe (calibration reference 0-3, scored on seed 100):
    int8 loses ~30 dB to fp16 (measured 63.2 and 32.8 dB, toolkit 2.5.0, rk3588), and each engine's
    int8 MAC share is what its layer table says."""
    import onnx

    path = tmp_path / "probe.onnx"
    onnx.save(toolchain.vocoder_probe(), str(path))
    noise = [np.random.default_rng(s).standard_normal((1, 16, 1, 64)).astype(np.float32) for s in (0, 1, 2, 3, 100)]
    stage = quantize.Stage(name="probe", onnx=path, calibration=[{"x": x} for x in noise[:4]],
                           evaluation=[{"x": noise[4]}], walk=lambda runner, item: runner.run(item)[0],
                           score=lambda refs, tests: {"snr_db": gates.snr_db(refs[0], tests[0])})
    rows, ranking = quantize.sweep(stage, "rk3588", hybrid_counts=(1,), auto_thresholds=(0.9999,),
                                   hybrid_groups={"upsampler": lambda layer: layer["op"] == "ConvTranspose"})
    by = {r["setting"]: r for r in rows}
    assert list(by) == ["fp16", "int8 w8a8", "hybrid 1", "hybrid upsampler", "auto-hybrid cos 0.9999"]
    assert all(r["mac_coverage"] == 1.0 and r["conv_macs"] == 274_432 and r["where"] == "simulator" for r in rows)
    assert by["fp16"]["int8_mac_share"] == 0.0 and by["fp16"]["snr_db"] > 55
    assert by["int8 w8a8"]["int8_mac_share"] == 1.0 and 25 < by["int8 w8a8"]["snr_db"] < 40
    assert by["int8 w8a8"]["engine_bytes"] < by["fp16"]["engine_bytes"]
    assert by["hybrid 1"]["kept_fp16"] == ranking[0]["layer"] and by["hybrid 1"]["dtype"].endswith("(1 layer fp16)")
    assert [r["rank"] for r in ranking] == list(range(1, len(ranking) + 1))
    # a block kept in fp16 by what it is: the transposed conv's 131,072 MACs leave int8
    assert by["hybrid upsampler"]["fp16_convs"] == "up"
    assert by["hybrid upsampler"]["int8_mac_share"] == pytest.approx(143_360 / 274_432, abs=1e-4)
    assert set(stage.outputs) == {"fp32", *by} and stage.outputs["fp32"][0].shape == (256,)
    # the toolkit keeps only conv_pre in int8 at this threshold: 114,688 of 274,432 MACs
    assert by["auto-hybrid cos 0.9999"]["int8_mac_share"] == pytest.approx(114_688 / 274_432, abs=1e-4)


def test_evenly_spreads_a_cut_calibration_set_over_every_source():
    items = list(range(49))
    assert quantize.evenly(items, None) == items and quantize.evenly(items, 60) == items
    assert quantize.evenly(items, 5) == [0, 12, 24, 36, 48]


def test_the_calibration_set_is_written_and_read_back_in_input_order(tmp_path):
    """What the toolkit loads: one dataset line per feed, that feed's .npy paths in the graph's
    input order, each array as given (int64 ids stay int64)."""
    from rkstudy.toolkit.build import Calibration

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
    s = quantize.span_scores([ref], [test], [[(0, 100), (100, 200), (200, 300), (300, 400)]])
    assert s["windows"] == 4 and s["window_snr_db_median"] == np.inf
    assert s["window_snr_db_min"] == pytest.approx(gates.snr_db(ref[300:], test[300:]))
    assert s["window_snr_db_min"] < s["utterance_snr_db"] < np.inf


def test_the_goal_rows_read_both_sides_of_the_curve():
    rows = [{"stage": "s", "setting": "fp16", "window_snr_db_min": 45.0, "int8_mac_share": 0.0},
            {"stage": "s", "setting": "int8 w8a8", "window_snr_db_min": 3.0, "int8_mac_share": 1.0},
            {"stage": "s", "setting": "hybrid 8", "window_snr_db_min": 12.0, "int8_mac_share": 0.9},
            {"stage": "s", "setting": "hybrid 96", "window_snr_db_min": 36.0, "int8_mac_share": 0.4}]
    (goal,) = quantize.goal_rows([{**r, "where": "simulator", "target": "rk3588"} for r in rows])
    assert goal["best_snr_db_at_0.8_int8"] == 12.0 and goal["best_at_0.8_int8_setting"] == "hybrid 8"
    assert goal["best_int8_share_at_35_db"] == 0.4 and goal["best_at_35_db_setting"] == "hybrid 96"
    assert goal["fp16_window_snr_db_min"] == 45.0 and goal["int8_window_snr_db_min"] == 3.0
    assert goal["goal_met"] is False


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
    assert len(quantize.evenly(stage.calibration, 2)) == 2
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
    fixed = quantize.span_scores([ref], [test], [[(0, step), (step, ref.size)]])
    whole = quantize.span_scores([ref], [test], [step_spans(ref.size, step)])
    assert fixed["window_snr_db_min"] < 0 < 50 < whole["window_snr_db_min"]
    assert whole["window_snr_db_min"] == pytest.approx(whole["utterance_snr_db"])
    with pytest.raises(ValueError, match="both must be positive"):
        step_spans(0, step)
