"""The flow estimator family (host): the DiT stand-in's contract and export, stage 1, the memory
model's tables on the reference documents' figures, the ladder walk, the growth fit and the compiler's plan."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from rkstudy.families.flow_estimator import study
from rkstudy.families.flow_estimator.reference_memory import reference_memory_model
from rkstudy.tables import results

torch = pytest.importorskip("torch")
FIXTURES = Path(__file__).parent / "fixtures"
REFERENCE_FIGURES = reference_memory_model()


def test_standin_contract_and_export(tmp_path):
    import onnxruntime as ort

    from rkstudy.families.flow_estimator import standin as D

    cfg = D.DiTConfig(dim=64, depth=2, heads=4, dim_head=16, ff_mult=2)
    model = D.build(cfg, seed=1)
    x = D.random_inputs(24, cfg, seed=2, valid=20)
    assert {k: list(v.shape) for k, v in x.items()} == D.input_shapes(24, cfg)
    ref = model(*[torch.from_numpy(x[k]) for k in D.INPUTS]).detach().numpy()
    assert ref.shape == (1, 80, 24) and np.isfinite(ref).all()
    path = D.export(model, 24, tmp_path / "dit.onnx")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == list(D.INPUTS)
    assert np.abs(sess.run(None, x)[0] - ref).max() < 1e-4
    # masked keys do not leak: changing x on masked frames leaves the valid frames' output alone
    y = dict(x)
    y["x"] = x["x"].copy()
    y["x"][..., 20:] += 5.0
    out2 = model(*[torch.from_numpy(y[k]) for k in D.INPUTS]).detach().numpy()
    np.testing.assert_allclose(out2[..., :20], ref[..., :20], atol=1e-5)


@pytest.mark.parametrize("field,value", [("attn_bias", "dense"), ("attn_form", "gated")])
def test_attention_variants_compute_the_same(field, value):
    """The variants differ in what the compiler can fuse, not in what they compute."""
    from rkstudy.families.flow_estimator import standin as D

    cfg = D.DiTConfig(dim=64, depth=1, heads=4, dim_head=16)
    ref = D.build(cfg, seed=3)
    other = D.build(dataclasses.replace(cfg, **{field: value}), seed=3)
    x = [torch.from_numpy(v) for v in D.random_inputs(16, cfg, seed=4, valid=12).values()]
    np.testing.assert_allclose(other(*x).detach().numpy(), ref(*x).detach().numpy(), atol=1e-5)
    with pytest.raises(ValueError, match=field):
        D.standin_config(2, **{field: "sparse"})


def test_full_size_parameter_count_sits_in_the_reference_image_range():
    """CosyVoice3's estimator shapes give 331 M parameters, 662 MB at fp16: inside the range the
    reference state for their engines' images."""
    from rkstudy.families.flow_estimator import standin as D

    n = D.parameter_count(D.COSYVOICE3)
    low, high = results.reference_numbers("flow_estimator", "estimator engine images (every S)")
    assert n == 331_142_224 and low * 1e6 <= 2 * n <= high * 1e6


@pytest.mark.slow
def test_stage_one_writes_the_contract(tmp_path):
    from rkstudy.contract import from_metadata
    from rkstudy.families.flow_estimator import producer, standin
    from rkstudy.graph import input_shapes, metadata

    product = producer.produce(12, depth=1, seed=0, output=tmp_path / "est.onnx")
    c = from_metadata(metadata(product.path), where="est.onnx", remake=producer.PRODUCER)
    assert c == product.contract and c.family == "flow_estimator" and c.stage == "estimator"
    assert [(t.name, t.shape, t.role) for t in c.inputs] == [
        ("x", (1, 80, 12), "padded"), ("mask", (1, 1, 12), "mask"), ("mu", (1, 80, 12), "padded"),
        ("t", (1,), "constant"), ("spks", (1, 80), "constant"), ("cond", (1, 80, 12), "padded")]
    assert c.outputs[0].name == "estimator_out" and c.outputs[0].frames == 12
    assert c.params["weights"].startswith("seeded random") and c.source.file.endswith("(random weights)")
    assert c.producer.startswith("rkstudy cosyvoice3 estimator --frames 12 --depth 1 --seed 0")
    assert c.remake_engine() == "rkstudy cosyvoice3 estimator --onnx <slice.onnx> --target rk3588"
    assert input_shapes(product.path)["x"] == (1, 80, 12)
    assert product.folded_nodes < product.raw_nodes  # the fold removed the shape plumbing
    feeds = producer.feeds(c)
    assert feeds["mask"].sum() == 10 and not feeds["cond"][..., 10:].any()
    # the source names the weights: the same seed builds the same ones, another seed others
    cfg = standin.standin_config(depth=1)
    assert producer.source_digest(standin.build(cfg, seed=0), cfg, 0) == c.source
    assert producer.source_digest(standin.build(cfg, seed=1), cfg, 1) != c.source


def test_the_model_agrees_with_every_row_of_the_reference_table():
    rows = study.admit_refuse_rows(REFERENCE_FIGURES)
    assert len(rows) == 8 + 3 * 3 and all(r["agrees"] for r in rows)
    by_set = {r["set"]: r for r in rows}
    assert by_set["S250+S400"]["model_total_mib"] == 4041 and by_set["S250+S400"]["model_verdict"] == "refuse"
    assert "its own mapping 4710000000 B" in by_set["S900+S110"]["reason"]


def test_reference_fit_and_the_wrap_reading():
    rows = {r["fit"]: r for r in study.reference_fit_rows(REFERENCE_FIGURES, dma_map_bytes=4710850560)}
    quad = rows["w + c*S^2"]
    assert quad["points_S"] == "110/200/250/400/500"
    assert quad["weights_mib_intercept"] == pytest.approx(636.23, abs=0.01)
    assert quad["internal_bytes_per_S2"] == pytest.approx(13045.9, abs=0.1)
    assert quad["max_abs_residual_mib"] == pytest.approx(12.2, abs=0.05)
    assert quad["S_at_budget"] == pytest.approx(512.18, abs=0.01)
    wrap = rows["uint32 wrap reading of S=900"]
    assert wrap["weights_mib_intercept"] == pytest.approx(1039 - 415883264 / 2**20)  # 642.4 MiB


def test_the_ladder_walk_loads_lazily_evicts_lru_and_refuses_the_long_rung():
    rungs = ["S110", "S200", "S250", "S400", "S500", "S900"]
    rows = study.walk_ladder(REFERENCE_FIGURES, rungs, [90, 180, 240, 100, 390, 105, 700, 480, 2100])
    ran = [r["ran"] for r in rows]
    assert ran == ["npu S110", "npu S200", "npu S250", "npu S110", "npu S400", "npu S110",
                   "cpu (refused alone)", "npu S500", "cpu (past the widest rung)"]
    assert rows[2]["resident"] == "S110+S200+S250" and rows[2]["resident_mib"] == 3341
    assert rows[3]["events"] == "hit" and rows[8]["events"] == "no rung holds it"
    assert rows[4]["events"] == "evict S200 (for S400); evict S250 (for S400); load S400"
    assert rows[6]["events"] == "cpu S900" and rows[6]["resident"] == "S400+S110"  # nothing evicted for it
    assert rows[7]["resident"] == "S500" and max(r["resident_mib"] for r in rows) <= REFERENCE_FIGURES.budget.mib


def test_growth_fit_recovers_a_known_curve_and_its_crossing():
    a, b, c = 500_000.0, 16_000.0, 10.0
    builds = [{"attn": "sdpa/key", "depth": 2, "status": "ok", "S": s, "engine_bytes": 7e7 + 2000 * s,
               "plan_internal_bytes": a + b * s + c * s * s, "plan_weight_bytes": 7.4e7 + 256 * s}
              for s in (64, 110, 250, 500, 900, 2000)]
    probe = {**builds[-1], "depth": 4, "plan_internal_bytes": 1.0}  # another depth: not mixed into the fit
    rows = study.growth_rows(builds + [probe])
    quad = study.ceiling_estimate(rows, "sdpa/key", 2)
    assert quad["c_bytes_per_S2"] == pytest.approx(c) and quad["b_bytes_per_S"] == pytest.approx(b)
    s = quad["S_at_2^32_bytes"]
    assert a + b * s + c * s * s == pytest.approx(2**32)
    assert quad["longest_S_built"] == 2000
    assert not study.growth_rows(builds[:2])  # two points fit no line honestly


def test_the_command_refuses_mixed_stages_and_a_missing_length(capsys):
    from rkstudy.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["cosyvoice3", "estimator", "--onnx", "est.onnx", "--frames", "250"])
    assert exit_.value.code == 2 and "--frames belong to stage 1" in capsys.readouterr().err
    assert main(["cosyvoice3", "estimator"]) == 2
    assert "give --frames S" in capsys.readouterr().err


@pytest.mark.slow
def test_a_graph_from_the_cache_reads_the_row_of_the_run_that_made_it(tmp_path, monkeypatch):
    """The builds row does not depend on which study put the graph in the shared cache first: the raw
    node count and the export seconds stay beside the entry, and an entry without them is made again."""
    from rkstudy import cache
    from rkstudy.families.flow_estimator import producer

    monkeypatch.setenv("RKSTUDY_CACHE", str(tmp_path))
    made = producer.produce(12, depth=1, seed=0)
    again = producer.produce(12, depth=1, seed=0)
    assert again.path == made.path and again.row() == made.row()
    assert again.raw_nodes > again.folded_nodes and again.row()["export_fold_s"] == round(made.seconds, 1)
    assert cache.made_note(made.path, "raw_nodes", "export_fold_s")["raw_nodes"] == made.raw_nodes


def test_a_cache_note_is_read_only_whole(tmp_path):
    """An entry without its note (made before the note existed, or its maker killed between the two
    writes) reads as not made, so its study makes it again instead of writing a row with holes."""
    from rkstudy import cache

    entry = tmp_path / "graph.onnx"
    entry.write_bytes(b"onnx")
    assert cache.made_note(entry, "raw_nodes") is None
    cache.note_made(entry, raw_nodes=490, export_fold_s=14.7)
    assert cache.made_note(entry, "raw_nodes", "export_fold_s") == {"export_fold_s": 14.7, "raw_nodes": 490}
    assert cache.made_note(entry, "raw_nodes", "export_s") is None
    (tmp_path / "graph.onnx.made.json").write_text("{truncated")
    assert cache.made_note(entry, "raw_nodes") is None
