"""`rkstudy board run` end to end through BoardRunner, on a recorded board tree, with the replay double
of RKNNLite (tests/doubles): every board-only line executes, and the outputs equal the fp32 walk of the
same slice exactly. Rows say `replay`, never `board`."""

import numpy as np
import pytest
from board_cli import STAGE2_BUILD, run_cli

from rkstudy.cli import main
from rkstudy.families.piper import latents as latent_files
from rkstudy.families.piper_decoder.producer import read_contract
from rkstudy.families.piper_decoder.sidecar import DecoderSidecar
from rkstudy.families.piper_encoder.sidecar import Ladder, LadderEngine
from rkstudy.runtime import OrtRunner
from rkstudy.tables import results

TEXT = "Call me at 555 0142, extension 7. Thank you."


def rkstudy(*argv, board="rk3588-librknnrt-2.5.0", check=True):
    return run_cli(*argv, board=board, check=0 if check else None, timeout=900)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("replay")
    rkstudy("piper", "latents", "--text", TEXT, "-o", d / "latents.npz")
    rkstudy("piper", "decoder", "--skip-rknn", "--output", d / "decoder_z.onnx")
    rkstudy("piper", "decoder", "--onnx", d / "decoder_z.onnx", "--target", "rk3588", "--out", d / "decoder.rknn")
    return d


@pytest.mark.simulator
def test_board_run_piper_decoder_equals_the_fp32_walk(work):
    proc = rkstudy("board", "run", "piper_decoder", "--engine", work / "decoder.rknn", "--latents",
                   work / "latents.npz", "--outputs", work / "out.npz", "--audio", work / "out.wav",
                   "--results", work / "results")
    assert "piper_decoder on replay (rk3588, cores 0_1_2)" in proc.stdout
    with np.load(work / "out.npz") as data:
        audio = data["audio"]
    lat = latent_files.load(work / "latents.npz")
    c = read_contract(work / "decoder_z.onnx")
    side = DecoderSidecar(OrtRunner(work / "decoder_z.onnx"), c, channels=192, hop=256)
    ref = np.concatenate([side.decode(z, progress=False) for z in lat.z])
    np.testing.assert_array_equal(audio, ref)  # the same slice through the same walk: exact
    (row,) = results.read_table(work / "results" / "board" / "piper_decoder.csv")
    assert (row["where"], row["target"], row["cores"]) == ("replay", "rk3588", "0_1_2")
    assert row["npu_governor"] == "rknpu_ondemand" and row["driver"] == "RKNPU driver: v0.9.8"
    assert row["runtime"].startswith("driver none, api replay double") and float(row["peak_rss_mb"]) > 20
    # the recorded tree's load file (the reference documents' AUTO-mask reading), sampled while the job ran
    assert (row["npu_load_mean_pct"], row["npu_load_max_pct"]) == ("55/0/0", "55/0/0")
    assert int(row["npu_load_samples"]) >= 1 and "NPU load mean 55/0/0 %" in proc.stdout
    assert float(row["audio_s"]) == pytest.approx(ref.size / 22050, abs=1e-3) and float(row["rtf"]) > 0
    assert (work / "out.wav").stat().st_size == 44 + 2 * ref.size


@pytest.fixture(scope="module")
def step_engine(work):
    """The stateful step through both stages of the command line (stage 2 recognises the contract)."""
    rkstudy("piper", "decoder", "--stateful", "--emit", "45", "--skip-rknn", "--output", work / "decoder_step.onnx")
    proc = rkstudy("piper", "decoder", "--onnx", work / "decoder_step.onnx", "--target", "rk3588", "--out",
                   work / "decoder_step.rknn")
    assert "stateful step of 45 frames" in proc.stdout and "zero and carried state" in proc.stdout
    return work / "decoder_step.rknn"


@pytest.mark.simulator
def test_board_run_piper_decoder_stateful_equals_the_fp32_step_walk(work, step_engine):
    from rkstudy.families.piper_decoder_stateful.sidecar import StatefulDecoderSidecar

    proc = rkstudy("board", "run", "piper_decoder_stateful", "--engine", step_engine, "--latents",
                   work / "latents.npz", "--outputs", work / "step.npz", "--results", work / "results_step")
    assert "piper_decoder_stateful on replay (rk3588, cores 0_1_2)" in proc.stdout
    with np.load(work / "step.npz") as data:
        audio = data["audio"]
    lat = latent_files.load(work / "latents.npz")
    c = read_contract(work / "decoder_step.onnx")
    side = StatefulDecoderSidecar(OrtRunner(work / "decoder_step.onnx"), c, channels=192, hop=256)
    ref = np.concatenate([side.decode(z) for z in lat.z])
    np.testing.assert_array_equal(audio, ref)  # the same step through the same walker: exact
    (row,) = results.read_table(work / "results_step" / "board" / "piper_decoder_stateful.csv")
    assert (row["where"], row["emit"]) == ("replay", "45")
    assert int(row["steps"]) == sum(-(-(z.shape[1] * 256 + 10774) // (45 * 256)) for z in lat.z)
    other = rkstudy("board", "run", "piper_decoder_stateful", "--engine", work / "decoder.rknn", "--latents",
                    work / "latents.npz", check=False)
    assert other.returncode == 2
    assert "this is a piper_decoder engine, not a piper_decoder_stateful one" in other.stderr
    assert "`rkstudy piper decoder --stateful --emit 45" in other.stderr


@pytest.mark.simulator
def test_board_run_from_text_synthesizes_the_latent_on_the_board(work):
    from rkstudy.families.piper.voice import default_voice_paths

    voice_onnx, _ = default_voice_paths()
    proc = rkstudy("board", "run", "piper_decoder", "--engine", work / "decoder.rknn", "--text", TEXT,
                   "--voice-onnx", voice_onnx, "--outputs", work / "text.npz", "--results", work / "results_text")
    assert "piper_decoder on replay" in proc.stdout
    (row,) = results.read_table(work / "results_text" / "board" / "piper_decoder.csv")
    assert row["sentences"] == "2" and float(row["audio_s"]) > 1.5  # the voice's own (unseeded) durations
    with np.load(work / "text.npz") as data:
        assert data["audio"].size == int(row["frames"]) * 256 and np.abs(data["audio"]).max() > 0.05
    other = rkstudy("board", "run", "piper_decoder", "--engine", work / "decoder.rknn", "--text", TEXT,
                    "--voice-onnx", work / "decoder_z.onnx", check=False)
    assert other.returncode == 2 and "is not the model this engine was made from" in other.stderr


@pytest.mark.simulator
@pytest.mark.parametrize("board", ["rk3566", "rk3576"])
def test_an_engine_for_another_soc_is_refused_before_a_child_starts(work, board):
    proc = rkstudy("board", "run", "piper_decoder", "--engine", work / "decoder.rknn", "--latents",
                   work / "latents.npz", "--results", work / f"results-{board}", board=board, check=False)
    assert proc.returncode == 2
    assert f"compiled for rk3588 and this board is {board}" in proc.stderr and proc.stderr.count("\n") == 1
    assert not (work / f"results-{board}").exists()


@pytest.mark.simulator
def test_board_run_refuses_latents_of_another_voice(work, tmp_path):
    lat = latent_files.load(work / "latents.npz")
    from rkstudy.families.piper.voice import Latent

    fake = [Latent(text="x", ids=i, z=z) for i, z in zip(lat.ids, lat.z)]
    latent_files.save(tmp_path / "other.npz", fake, source={"file": "other.onnx", "sha256": "f" * 64},
                      sample_rate=22050)
    proc = rkstudy("board", "run", "piper_decoder", "--engine", work / "decoder.rknn", "--latents",
                   tmp_path / "other.npz", check=False)
    assert proc.returncode == 2 and "make inputs from en_US-joe-medium.onnx" in proc.stderr


@pytest.mark.simulator
def test_board_run_piper_encoder_ladder_equals_fp32(work, voice):
    from rkstudy.families.piper_encoder.seam import encoder_slice

    rkstudy("piper", "encoder", "--frames", 32, "--skip-rknn", "--output", work / "enc_n32.onnx")
    rkstudy("piper", "encoder", "--onnx", work / "enc_n32.onnx", "--out", work / "enc_n32.rknn")
    (work / "enc_fp32.onnx").write_bytes(encoder_slice(voice.model).SerializeToString())
    proc = rkstudy("board", "run", "piper_encoder", "--engine", work / "enc_n32.rknn", "--latents",
                   work / "latents.npz", "--fallback", work / "enc_fp32.onnx", "--outputs", work / "enc.npz",
                   "--results", work / "results")
    assert "piper_encoder on replay" in proc.stdout
    lat = latent_files.load(work / "latents.npz")
    rung = LadderEngine(OrtRunner(work / "enc_n32.onnx"), read_contract(work / "enc_n32.onnx"))
    ladder = Ladder([rung], OrtRunner(work / "enc_fp32.onnx"))
    with np.load(work / "enc.npz") as data:
        for k, ids in enumerate(lat.ids):
            stats, cond, _ = ladder.run(ids)
            np.testing.assert_array_equal(data[f"stats_{k}"], stats)
            np.testing.assert_array_equal(data[f"cond_{k}"], cond)
    (row,) = results.read_table(work / "results" / "board" / "piper_encoder.csv")
    assert row["where"] == "replay" and row["ran_on"].split("/") == [
        "n32" if len(i) <= 32 else "fp32 fallback" for i in lat.ids]


# two short sentences (162 and 134 frames with their silences): each still several 24-frame windows
JA_TEXT = "良い天気ですね。行きましょう。"


@pytest.mark.slow
def test_board_run_kokoro_generator_equals_the_fp32_walk(tmp_path):
    """The Kokoro generator sidecar through BoardRunner and the replay double: two sentences, a 32-frame
    window (emit 24), with the gain correction on; the board's rows equal the same walk in fp32 exactly.
    Stage 2 of this graph is a 6-minute toolkit build at any window (the notebook's full mode makes the real
    engines), and the double never reads an engine's bytes, so the compiled contract here is written by the
    same Contract.compiled stage 2 uses, over a placeholder engine file."""
    from rkstudy.families.kokoro_generator import head, input_file
    from rkstudy.families.kokoro_generator.producer import read_contract as kokoro_contract
    from rkstudy.families.kokoro_generator.sidecar import GeneratorSidecar
    from rkstudy.tables.results import toolkit_version

    graph = tmp_path / "generator_w32.onnx"
    # the two host commands run in this process: they share one read of the model (load_model is cached per
    # process, so with tests/test_kokoro.py that one too), where a subprocess each imports torch and reads it
    # again; the board run is the command that must see a board, so it alone runs as a subprocess
    assert main(["kokoro", "generator", "--frames", "32", "--context", "4", "--skip-rknn", "--output", str(graph)]) == 0
    assert main(["kokoro", "inputs", "--text", JA_TEXT, "--gain", "-o", str(tmp_path / "inputs.npz")]) == 0
    engine = tmp_path / "generator_w32.rknn"
    engine.write_bytes(b"replay placeholder: the double serves the ONNX named in the contract")
    c = kokoro_contract(graph)
    from rkstudy.families.kokoro_generator.producer import SIM_GATE

    build = {**STAGE2_BUILD, "gate": SIM_GATE.name, "threshold_db": SIM_GATE.threshold}  # what stage 2 records
    c.compiled(target="rk3588", toolkit=toolkit_version(), onnx_path=graph, engine_path=engine,
               build=build).write_beside(engine)
    proc = rkstudy("board", "run", "kokoro_generator", "--engine", engine, "--inputs", tmp_path / "inputs.npz",
                   "--gain", "--overlap", 4, "--outputs", tmp_path / "out.npz", "--audio", tmp_path / "out.wav",
                   "--results", tmp_path / "results")
    assert "kokoro_generator on replay (rk3588, cores 0_1_2)" in proc.stdout
    data = input_file.load(tmp_path / "inputs.npz")
    assert len(data.sentences) == 2 and all(s.frames > 32 for s in data.sentences)  # several windows each
    side = GeneratorSidecar(OrtRunner(graph), c, channels=512, rows=22, samples_per_frame=300, overlap=4, gain=True)
    refs = [side.generate(s.x, s.har, s.style, reference=s.energy, progress=False) for s in data.sentences]
    with np.load(tmp_path / "out.npz") as out:
        for k, ref in enumerate(refs):
            np.testing.assert_array_equal(out[f"gen_{k}"], ref)  # the same graph through the same walk: exact
        audio = out["audio"]
    np.testing.assert_array_equal(audio, np.concatenate([head.istft(g, data.head) for g in refs]))
    assert audio.size == 300 * data.frames and np.abs(audio).max() > 0.05
    (row,) = results.read_table(tmp_path / "results" / "board" / "kokoro_generator.csv")
    assert (row["where"], row["target"], row["cores"]) == ("replay", "rk3588", "0_1_2")
    assert row["sentences"] == "2" and int(row["frames"]) == data.frames and float(row["generator_ms_per_frame"]) > 0
    assert float(row["audio_s"]) == pytest.approx(audio.size / 24000, abs=1e-3)
