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
