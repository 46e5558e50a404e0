import numpy as np
import onnx
import pytest

from rkstudy import gates, graph
from rkstudy.board.runner import BoardRunner, board_available
from rkstudy.errors import BoardUnavailable
from rkstudy.runtime import OrtRunner
from rkstudy.toolkit import probes as toolchain
from rkstudy.toolkit.build import BuildFailed
from rkstudy.toolkit.simulator import SimulatorRunner
from rkstudy.walk.window import walk_windows


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    path = tmp_path_factory.mktemp("rt") / "vocoder_probe.onnx"
    onnx.save(toolchain.vocoder_probe(frames=32), str(path))
    return path


@pytest.fixture(scope="module")
def simulators(probe):
    """One simulator child per target for the module: a child serves any number of runs, so the tests
    that only run the probe share its build."""
    opened = {}

    def get(target):
        if target not in opened:
            opened[target] = SimulatorRunner(probe, target)
        return opened[target]

    yield get
    for sim in opened.values():
        sim.close()


@pytest.mark.simulator
@pytest.mark.parametrize("target", ["rk3588", "rk3566"])
def test_simulator_matches_fp32(probe, simulators, target):
    x = graph.random_inputs(probe, seed=3)
    ref = OrtRunner(probe).run(x)[0]
    sim = simulators(target)
    assert sim.report.ok and sim.where == "simulator" and sim.target == target
    out = sim.run(x)[0]
    again = sim.run([x["x"]])[0]  # the same child serves many runs
    assert out.shape == ref.shape == (1, 1, 1, 128)
    assert gates.snr_db(ref, out) > 50.0
    np.testing.assert_array_equal(out, again)


@pytest.mark.simulator
def test_simulator_refuses_a_wrong_shape_and_keeps_serving(simulators):
    sim = simulators("rk3588")
    with pytest.raises(ValueError, match=r"built for \(1, 16, 1, 32\)"):
        sim.run({"x": np.zeros((1, 16, 1, 33), np.float32)})
    with pytest.raises(KeyError, match="this engine takes x"):
        sim.run({"z": np.zeros((1, 16, 1, 32), np.float32)})
    assert sim.run({"x": np.zeros((1, 16, 1, 32), np.float32)})[0].shape == (1, 1, 1, 128)


@pytest.mark.simulator
def test_a_failed_build_raises_unless_its_report_is_kept(tmp_path):
    model = toolchain.vocoder_probe()
    model.opset_import[0].version = 20  # the toolkit refuses the opset at load_onnx
    path = tmp_path / "opset20.onnx"
    onnx.save(model, str(path))
    with pytest.raises(BuildFailed, match="failed at load_onnx"):
        SimulatorRunner(path, "rk3588")
    kept = SimulatorRunner(path, "rk3588", keep_failed=True, verbose=True)
    assert (kept.report.ok, kept.report.status, kept.report.failed_step) == (False, "failed", "load_onnx")
    assert kept.report.engine is None and kept.peak_rss_mb == kept.report.peak_rss_mb > 0
    kept.close()  # the child is already gone: closing again is harmless


@pytest.mark.simulator
def test_walk_the_simulator_over_a_long_latent(simulators):
    # The probe is a 32-frame "decoder" with hop 4; walk it with 16 emitted + 8 context each side.
    # Its receptive field exceeds 8 frames, so the walk is close to, not equal to, one long decode.
    rng = np.random.default_rng(5)
    latent = rng.standard_normal((16, 150)).astype(np.float32)
    long_model = graph.pin_shapes(toolchain.vocoder_probe(frames=32), {"x": (1, 16, 1, 150)})
    ref = OrtRunner(long_model).run([latent[None, :, None, :]])[0].ravel()
    sim = simulators("rk3588")
    out = walk_windows(latent, lambda x, m: sim.run([x[None, :, None, :]])[0][0, 0],
                       emit=16, context=8, samples_per_frame=4, progress=False)
    assert out.shape == (1, 600)
    assert gates.snr_db(ref, out[0]) > 40.0


@pytest.mark.skipif(board_available()[0], reason="a board is present; the real runner is exercised instead")
def test_board_runner_says_why_it_cannot_run(probe):
    with pytest.raises(BoardUnavailable, match="rknn-toolkit-lite2 is not installed|no RKNPU driver"):
        BoardRunner(probe.with_suffix(".rknn"), ["x"])
