import numpy as np
import pytest

from rkstudy import graph
from rkstudy.errors import UsageError
from rkstudy.runtime import OrtRunner
from rkstudy.toolkit import probes as toolchain


def test_census_counts_ops_weights_hazards_and_axis():
    c = graph.census(toolchain.vocoder_probe(channels=16, frames=64, upsample=4))
    assert c.nodes == 6
    assert c.ops == {"Conv": 2, "ConvTranspose": 1, "Sin": 1, "Mul": 1, "Add": 1}
    # conv 16x16x1x7 + 16, transpose 16x16x1x8 + 16, post 1x16x1x7 + 1, all float32
    assert c.initializer_bytes == 4 * (16 * 16 * 7 + 16 + 16 * 16 * 8 + 16 + 16 * 7 + 1)
    assert c.hazards["Sin"] == 1 and c.hazards["Shape"] == 0
    assert c.longest_axis == 256
    row = c.row("before_")
    assert row["before_nodes"] == 6 and row["before_Sin"] == 1


def test_longest_axis_sees_past_the_13_bit_field():
    assert graph.longest_axis(toolchain.long_axis_probe(9000, channels=4)) == 9000 > graph.REGISTER_FIELD_MAX


def test_slice_at_extracts_and_pins(dynamic_model):
    sliced = graph.slice_at(dynamic_model, ["seam"], ["y"], {"seam": (1, 4, 93)})
    assert [n.op_type for n in sliced.graph.node] == ["Shape", "ConstantOfShape", "Mul"]
    assert graph.input_shapes(sliced) == {"seam": (1, 4, 93)}
    out = sliced.graph.output[0].type.tensor_type.shape
    assert [d.dim_value for d in out.dim] == [1, 4, 93]
    with pytest.raises(graph.SeamNotFound, match="/flow/missing"):
        graph.slice_at(dynamic_model, ["/flow/missing"], ["y"])


def test_fold_removes_shape_plumbing_and_keeps_the_numbers(dynamic_model):
    shapes = {"x": (1, 4, 93)}
    folded = graph.fold(dynamic_model, shapes)
    before, after = graph.census(dynamic_model, with_axis=False), graph.census(folded, with_axis=False)
    assert (before.hazards["Shape"], before.hazards["ConstantOfShape"]) == (1, 1)
    assert (after.hazards["Shape"], after.hazards["ConstantOfShape"]) == (0, 0)
    assert after.nodes < before.nodes
    x = graph.random_inputs(folded)
    ref = OrtRunner(graph.pin_shapes(dynamic_model, shapes)).run(x)[0]
    np.testing.assert_array_equal(OrtRunner(folded).run(x)[0], ref)


def test_pin_shapes_names_the_inputs_it_has(dynamic_model):
    with pytest.raises(UsageError, match="inputs are x"):
        graph.pin_shapes(dynamic_model, {"z": (1, 192, 93)})
    with pytest.raises(ValueError, match="dynamic shape"):
        graph.input_shapes(dynamic_model)
