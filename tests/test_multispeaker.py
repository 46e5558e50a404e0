"""A multi-speaker voice: the speaker embedding g reaches the producer's contract, the sidecar, the
full-length reference and the conversion stage. On a small VITS-shaped graph with a g input (the
shipped voice has one speaker)."""

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkstudy import gates, graph
from rkstudy.families.piper.voice import DecoderModel
from rkstudy.families.piper_decoder import study
from rkstudy.families.piper_decoder.producer import produce_for_voice
from rkstudy.paths import REPO
from rkstudy.runtime import OrtRunner
from rkstudy.toolkit.convert import ALIVE_GATE, convert

C, GIN, HOP = 4, 8, 4


def vits_like_with_speaker() -> onnx.ModelProto:
    """z [1,C,T], y_mask [1,1,T], g [1,GIN,1] -> a masked, speaker-conditioned flow step -> conv_pre
    (+ speaker) -> ConvTranspose x4 -> conv_post -> tanh: the seam structure of a VITS decoder half."""
    rng = np.random.default_rng(0)
    w = lambda *s: numpy_helper.from_array((rng.standard_normal(s) / np.sqrt(np.prod(s[1:]))).astype(np.float32))  # noqa: E731
    inits = []
    for name, shape in (("flow.w", (C, C, 3)), ("flow.cond", (C, GIN, 1)), ("dec.pre", (C, C, 3)),
                        ("dec.cond", (C, GIN, 1)), ("dec.up", (C, C, 2 * HOP)), ("dec.post", (1, C, 7))):
        t = w(*shape)
        t.name = name
        inits.append(t)
    n = helper.make_node
    nodes = [n("Conv", ["z", "flow.w"], ["f0"], name="/flow/Conv", pads=[1, 1]),
             n("Conv", ["g", "flow.cond"], ["fc"], name="/flow/cond/Conv"),
             n("Add", ["f0", "fc"], ["f1"], name="/flow/Add"),
             n("Mul", ["f1", "y_mask"], ["f2"], name="/flow/Mul"),
             n("Tanh", ["f2"], ["f3"], name="/flow/Tanh"),
             n("Mul", ["f3", "y_mask"], ["f4"], name="/flow/Mul_1"),
             n("Conv", ["f4", "dec.pre"], ["d0"], name="/dec/Conv", pads=[1, 1]),
             n("Conv", ["g", "dec.cond"], ["dc"], name="/dec/cond/Conv"),
             n("Add", ["d0", "dc"], ["d1"], name="/dec/Add"),
             n("ConvTranspose", ["d1", "dec.up"], ["d2"], name="/dec/ConvTranspose", strides=[HOP],
               pads=[HOP // 2, HOP // 2]),
             n("Conv", ["d2", "dec.post"], ["d3"], name="/dec/Conv_1", pads=[3, 3]),
             n("Tanh", ["d3"], ["audio"], name="/dec/Tanh")]
    g = helper.make_graph(nodes, "vits_like", [
        helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, C, "T"]),
        helper.make_tensor_value_info("y_mask", TensorProto.FLOAT, [1, 1, "T"]),
        helper.make_tensor_value_info("g", TensorProto.FLOAT, [1, GIN, 1])],
        [helper.make_tensor_value_info("audio", TensorProto.FLOAT, [1, 1, "N"])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


class SpeakerVoice(DecoderModel):
    family = "piper_decoder"

    def __init__(self, path: Path):
        self.onnx_path, self.sample_rate = path, 22050


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("spk") / "speaker_voice.onnx"
    onnx.save(vits_like_with_speaker(), str(path))
    return SpeakerVoice(path)


def test_the_seam_finds_g(model):
    assert (model.seam.z, model.seam.y_mask, model.seam.g) == ("z", "y_mask", "g")
    assert (model.hop, model.channels) == (HOP, C)


def test_g_is_in_the_contract_and_reaches_the_walk_and_the_reference(model):
    produced = produce_for_voice(model, emit=16, context=8)
    c = produced.contract
    assert [(t.name, t.role, t.shape) for t in c.inputs] == [
        ("z", "walked", (1, C, 32)), ("y_mask", "mask", (1, 1, 32)), ("g", "constant", (1, GIN, 1))]
    assert c.params["speaker_dims"] == GIN and graph.input_shapes(produced.model)["g"] == (1, GIN, 1)
    rng = np.random.default_rng(1)
    z = rng.standard_normal((C, 100)).astype(np.float32)
    g1, g2 = rng.standard_normal((GIN, 1)).astype(np.float32), rng.standard_normal((GIN, 1)).astype(np.float32)
    full = study.FullDecoder(model.model, model.seam)
    side = study.sidecar(model, OrtRunner(produced.model), c)
    walked = side.decode(z, g1, progress=False)
    assert walked.shape == (100 * HOP,)
    assert gates.snr_db(full.decode(z, g1), walked) > 100  # the speaker reaches both sides, identically
    assert gates.snr_db(full.decode(z, g2), walked) < 40   # and it matters
    with pytest.raises(Exception, match="multi-speaker voice: pass the speaker embedding g"):
        side.decode(z, progress=False)


@pytest.mark.simulator
def test_the_conversion_stage_feeds_g(model, tmp_path):
    produced = produce_for_voice(model, emit=16, context=8)
    path = produced.save(tmp_path / "spk_decoder.onnx")
    done = convert(path, "rk3588", tmp_path / "spk.rknn", gate=ALIVE_GATE)
    assert done.simulated.worst_snr_db > 30 and done.contract.target == "rk3588"
    assert done.contract.tensor("g").role == "constant"


@pytest.mark.simulator
@pytest.mark.skipif(not (REPO / ".venv-rknn-2.3.2").is_dir(),
                    reason="no 2.3.2 environment: make toolkit-venv TOOLKIT=2.3.2 (make test makes it)")
def test_the_conversion_stage_records_the_toolkit_that_built_the_engine(model, tmp_path):
    path = produce_for_voice(model, emit=16, context=8).save(tmp_path / "spk_decoder.onnx")
    done = convert(path, "rk3588", tmp_path / "spk-2.3.2.rknn", gate=ALIVE_GATE, toolkit="2.3.2")
    assert done.contract.toolkit == done.simulated.report.toolkit_version == "rknn-toolkit2 2.3.2"
    assert '"toolkit": "rknn-toolkit2 2.3.2"' in (tmp_path / "spk-2.3.2.contract.json").read_text()
