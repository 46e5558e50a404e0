import numpy as np
import onnx
import pytest

from rkstudy.errors import InputError
from rkstudy.runtime import OrtRunner, protowire
from rkstudy.toolkit.probes import vocoder_probe


def test_an_internal_tensor_becomes_an_output_onnxruntime_returns():
    model = vocoder_probe(frames=16)
    edited = protowire.add_graph_outputs(model.SerializeToString(), ["h2"])
    back = onnx.load_from_string(edited)
    assert [o.name for o in back.graph.output] == ["y", "h2"]
    assert [n.name for n in back.graph.node] == [n.name for n in model.graph.node]  # nothing else moved
    x = np.random.default_rng(0).standard_normal((1, 16, 1, 16)).astype(np.float32)
    y, h2 = OrtRunner(edited).run({"x": x})
    np.testing.assert_array_equal(y, OrtRunner(model).run({"x": x})[0])
    assert h2.shape == (1, 16, 1, 64)


def test_garbage_is_an_input_error():
    with pytest.raises(InputError, match="truncated or not an ONNX model"):
        protowire.add_graph_outputs(vocoder_probe().SerializeToString()[:-7], ["h2"])
    with pytest.raises(InputError, match="no graph"):
        protowire.add_graph_outputs(b"\x08\x07", ["h2"])


def test_the_wire_finds_the_voices_seams_where_onnx_finds_them(voice):
    from rkstudy.families.piper import cuts
    from rkstudy.families.piper_encoder.seam import find_encoder_seam

    s = cuts.seams(protowire.Graph(voice.onnx_path.read_bytes()))
    enc = find_encoder_seam(voice.model)
    assert (s.stats, s.cond) == (enc.stats, enc.cond)
    assert (s.z, s.y_mask, s.g, s.audio) == (voice.seam.z, voice.seam.y_mask, "", voice.seam.audio)


@pytest.mark.slow
def test_the_voices_cuts_seeded_are_the_voice_seeded(voice):
    """encoder -> middle (seeded) -> decoder equals the whole voice with the same seeds, bit for bit, and the
    middle's latent is the one `rkstudy piper latents` writes."""
    from rkstudy.families.piper import cuts
    from rkstudy.families.piper.voice import ids_feed, seed_random_nodes

    c = cuts.voice_cuts(voice.onnx_path)
    text = "Call me at 555 0142."
    ids = voice.sentences(text)[0]
    stats, cond = OrtRunner(c.encoder).run(ids_feed(ids))
    middle = OrtRunner(c.middle_seeded(1234))
    feed = {**ids_feed(ids), "scales": voice.scales, c.seams.stats: stats, c.seams.cond: cond}
    z, y_mask = middle.run({n: feed[n] for n in middle.input_names})
    np.testing.assert_array_equal(z[0], voice.latents(text, seed=1234)[0].z)
    (audio,) = OrtRunner(c.decoder).run({c.seams.z: z, c.seams.y_mask: y_mask})
    whole = OrtRunner(seed_random_nodes(voice.model, 1234)).run({**ids_feed(ids), "scales": voice.scales})[0]
    np.testing.assert_array_equal(audio, whole)


def test_a_cut_naming_no_tensor_is_refused_and_an_inner_tensor_becomes_its_input():
    model = vocoder_probe(frames=16).SerializeToString()
    g = protowire.Graph(model)
    with pytest.raises(InputError, match="no tensor 'nowhere' in this graph"):
        protowire.cut(g, {"nowhere": "float32"}, ["y"])
    inner = next(t for n in g.nodes for t in n.outputs if t not in ("y",) and g.producers()[t].op_type == "Conv")
    cut = protowire.cut(g, {inner: "float32"}, ["y"])
    assert OrtRunner(cut).input_names == [inner]


def test_metadata_is_read_without_onnx():
    model = vocoder_probe(frames=16)
    onnx.helper.set_model_props(model, {"rkstudy.contract": '{"a": 1}', "other": "x"})
    assert protowire.metadata(model.SerializeToString()) == {"rkstudy.contract": '{"a": 1}', "other": "x"}
