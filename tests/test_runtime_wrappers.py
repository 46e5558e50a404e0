"""The runner wrappers: the wrapped runner's surface passes through, Recording keeps copies of every
feed and output of a walk, ContractDtypes feeds each input in its contract dtype; carried_feeds, the
stateful probe built on both."""

from dataclasses import replace

import numpy as np

from rkstudy.contract import Contract, Digest, Tensor
from rkstudy.runtime import ContractDtypes, Recording
from rkstudy.walk.stateful import StatefulWalker, carried_feeds


class Doubler:
    """A runner that says where it ran, its names and shapes, and returns 2 x its first input."""

    where, target = "simulator", "rk3588"
    input_names = ["x", "codes"]
    shapes = {"x": (1, 2), "codes": (1, 2)}

    def __init__(self):
        self.dtypes = []

    def run(self, feed):
        self.dtypes.append({k: v.dtype for k, v in feed.items()})
        return [2 * np.asarray(feed["x"], np.float32)]


def step_contract() -> Contract:
    """A two-frame stateful step: audio out = the walked input's frames, the state = the running sum."""
    return Contract(family="toy", stage="step",
                    inputs=(Tensor("x", (1, 2), role="walked", axis=1), Tensor("s_in", (1, 1), role="state")),
                    outputs=(Tensor("y", (1, 2), role="walked", axis=1), Tensor("s_out", (1, 1), role="state")),
                    source=Digest("toy.onnx", "d" * 64), producer="the toy step",
                    params={"emit": 2, "lookahead_samples": 0}, state=(("s_in", "s_out"),))


class Accumulator:
    """y = x + s (each frame), s_out = s + sum(x): a step whose state matters."""

    input_names = ["x", "s_in"]
    shapes = {"x": (1, 2), "s_in": (1, 1)}

    def run(self, feed):
        x, s = feed["x"], feed["s_in"]
        return [x + s, s + x.sum(keepdims=True)]


def test_a_wrapper_passes_the_runners_surface_through():
    for wrapped in (Recording(Doubler()), ContractDtypes(Doubler(), step_contract())):
        assert (wrapped.where, wrapped.target) == ("simulator", "rk3588")
        assert wrapped.input_names == ["x", "codes"] and wrapped.shapes == {"x": (1, 2), "codes": (1, 2)}


def test_a_runner_that_says_nothing_is_fp32_with_the_contracts_names():
    class Bare:
        def run(self, feed):
            return []

    wrapped = ContractDtypes(Bare(), step_contract())
    assert (wrapped.where, wrapped.target, wrapped.input_names, wrapped.shapes) == ("fp32", "none", ["x", "s_in"],
                                                                                   None)


def test_recording_keeps_copies_of_every_feed_and_output_of_a_stateful_walk():
    rec = Recording(Accumulator())
    out = StatefulWalker(rec, step_contract()).decode({"x": np.array([1.0, 2.0, 3.0, 4.0, 5.0], np.float32)})
    # three steps (the last one zero-padded); the state is the running sum the walker carried
    assert [f["x"].tolist() for f in rec.feeds] == [[[1, 2]], [[3, 4]], [[5, 0]]]
    assert [f["s_in"].tolist() for f in rec.feeds] == [[[0]], [[3]], [[10]]]
    assert [o[0].tolist() for o in rec.outputs] == [[[1, 2]], [[6, 7]], [[15, 10]]]
    assert [o[1].tolist() for o in rec.outputs] == [[[3]], [[10]], [[15]]]
    assert np.concatenate([np.ravel(o) for o in out]).tolist() == [1, 2, 6, 7, 15]
    rec.feeds[0]["x"][0, 0] = 99.0  # a copy: the record is not the walker's buffer
    assert rec.outputs[0][0][0, 0] == 1.0


def test_contract_dtypes_feeds_int64_codes_and_float32_the_rest():
    c = Contract(family="toy", stage="step",
                 inputs=(Tensor("x", (1, 2)), Tensor("codes", (1, 2), dtype="int64")),
                 outputs=(Tensor("y", (1, 2)),), source=Digest("toy.onnx", "d" * 64), producer="the toy step")
    inner = Doubler()
    got = ContractDtypes(inner, c).run({"x": np.array([[1.5, 2.0]], np.float64),
                                        "codes": np.array([[2047.0, 3.0]], np.float32)})
    assert inner.dtypes == [{"x": np.float32, "codes": np.int64}]
    assert got[0].tolist() == [[3.0, 4.0]]


def test_carried_feeds_are_the_whole_steps_of_a_walk_with_the_state_the_runner_carried_in_contract_dtypes():
    c = step_contract()
    codes = replace(c, inputs=(Tensor("x", (1, 2), dtype="int64", role="walked", axis=1), c.inputs[1]))
    feeds = carried_feeds(Accumulator(), codes, {"x": np.array([1, 2, 3, 4, 5], np.int64)})
    # two whole steps of two frames (the fifth frame waits for a flush a probe never makes)
    assert [f["x"].tolist() for f in feeds] == [[[1, 2]], [[3, 4]]]
    assert [f["s_in"].tolist() for f in feeds] == [[[0]], [[3]]]
    assert [(f["x"].dtype, f["s_in"].dtype) for f in feeds] == [(np.int64, np.float32)] * 2
