"""`rkstudy port`: a user's ONNX through the generic path with no family code. Each test architecture
(the real `vocos` backbone and head from its package, and rkstudy.families.port.architectures; seeded
random weights) becomes a window graph with its contract and a stateful step whose float64 walk equals
the full-length decode at both ends (fp32 within 90 dB, the padded tail window too); the window plan runs on
small settings (fp32); the CLI refuses bad flags and a graph that cannot stream in one line (exit 2);
one small architecture is built and gated in the simulator, then run through `rkstudy board run port`
on a recorded board tree with the replay double."""

import numpy as np
import onnx
import pytest
from board_cli import run_cli

from rkstudy import gates
from rkstudy.families.port import architectures, packages, producer
from rkstudy.families.port.sidecar import PortSidecar, input_names, load_inputs
from rkstudy.families.port.study import EXACT_GATE, FP32_GATE, plan_target, step_exactness, window_exactness
from rkstudy.graph.delays import NotStreamable
from rkstudy.runtime import OrtRunner
from rkstudy.tables import results
from rkstudy.walk import planner

FRAMES = 48   # the compiled window
EMIT = 16     # the step
LENGTH = 40   # frames of the test utterance: shorter than the window (its padded tail is walked)
OUTPUTS = {"vocos": ["real:1", "imag:1"]}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("port")
    paths = {}
    builders = {**architectures.BUILDERS, "instance_norm": architectures.instance_norm,
                "vocos": lambda: packages.vocos("legacy")}
    for name, build in builders.items():
        v = build()
        paths[name] = d / f"{name}.onnx"
        onnx.save(v.model, paths[name])
        paths[name + ":hop"] = v.hop
    return paths


def mel(frames: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, architectures.MELS, frames)).astype(np.float32)


def flags(name: str, hop: int) -> dict:
    return {"walk": ["mel:2:1"], "output": OUTPUTS.get(name, [f"audio:{hop}"])}


@pytest.mark.parametrize("name", sorted([*architectures.BUILDERS, "vocos"]))
def test_each_architecture_ports_to_a_window_and_a_step_exact_at_both_ends(models, name):
    port = producer.port_from_flags(models[name], **flags(name, models[name + ":hop"]))
    window = producer.produce_window(port, FRAMES, 8)
    c = window.contract
    assert (c.family, c.window.frames, c.window.emit, c.window.context) == ("port", FRAMES, FRAMES - 16, 8)
    assert [t.role for t in c.inputs] == ["walked", "mask"] and window.masked   # nothing in them masks itself
    assert producer.read_contract(window.model) == c
    step = producer.produce_step(port, EMIT, FRAMES)
    assert step.contract.state and step.contract.params["emit"] == EMIT
    x = {"mel": mel(LENGTH)}
    row = step_exactness(port, step, x)
    assert min(row["step_vs_full_f64_db"], row["first_frames_db"], row["last_frames_db"]) >= EXACT_GATE.threshold
    assert min(row["step_vs_full_fp32_db"], row["first_frames_fp32_db"], row["last_frames_fp32_db"]) >= 90.0
    # the fp32 window walk of the padded, masked window graph against the fp32 full decode
    tail = window_exactness(port, window, x)
    assert tail["padded"] and min(tail["tail_window_db"], tail["walk_vs_full_fp32_db"]) >= FP32_GATE.threshold
    full = OrtRunner(port.model).run(x)
    got = PortSidecar(OrtRunner(window.model), c).decode(x)
    for a, b in zip(full, got):
        assert gates.snr_db(a[0], b) > 100.0


def test_a_graph_that_cannot_stream_gets_a_window_and_the_node_that_stops_the_step(models):
    port = producer.port_from_flags(models["instance_norm"], ["mel:2:1"], output=["audio:1"])
    window = producer.produce_window(port, FRAMES, 8)
    assert [t.role for t in window.contract.inputs] == ["walked"]   # no frame mask: the delay map refuses it
    with pytest.raises(NotStreamable, match="/norm/InstanceNormalization"):
        producer.produce_step(port, EMIT, FRAMES)


def test_the_plan_on_small_settings_fp32(models):
    port = producer.port_from_flags(models["hifigan_v3"], ["mel:2:1"], output=["audio:16"])
    pt = plan_target(port, [{"mel": mel(96, 1)}, {"mel": mel(70, 2)}], FRAMES, 8)
    (rf,) = planner.receptive_field_rows(pt)
    assert 2 <= rf["left_frames"] <= 20 and 2 <= rf["right_frames"] <= 20 and rf["latent_frames"] == 96
    reach = max(rf["left_frames"], rf["right_frames"])
    sweep = planner.context_sweep(pt.decode, pt.latents, pt.hop, [0, reach + 2], pt.default_emit, "speech",
                                  walk=pt.walk, n_frames=pt.n_frames)
    no_context, enough = (r["worst_interior_snr_db"] for r in sweep)
    assert no_context < 40.0 < 100.0 < enough   # a context past the reach is exact to fp32 rounding
    assert planner.min_context(sweep, 60.0) == reach + 2


def test_a_multi_channel_output_is_compared_frame_by_frame(models):
    port = producer.port_from_flags(models["vocos"], ["mel:2:1"], output=["real:1", "imag:1"])
    pt = plan_target(port, [{"mel": mel(64, 3)}], 32, 6)
    assert pt.hop == 33   # 33 bins x 1 frame
    (rf,) = planner.receptive_field_rows(pt)
    # four k7 convs (embed, three depthwise) reach 12 frames each side; what they move above -120 dB is less
    assert 3 <= rf["left_frames"] <= 12 and 3 <= rf["right_frames"] <= 12


def test_inputs_by_name_and_utterance(tmp_path):
    path = tmp_path / "in.npz"
    np.savez(path, **{"mel": mel(10), "mel.1": mel(7), "g": np.ones((1, 4, 1)), "g.1": np.zeros((1, 4, 1))})
    got = load_inputs(path, ["mel", "g"])
    assert [u["mel"].shape[-1] for u in got] == [10, 7] and float(got[1]["g"].sum()) == 0.0
    np.savez(path, mel=mel(10), spec=mel(3))
    with pytest.raises(Exception, match="'spec' names no input of the graph"):
        load_inputs(path, ["mel"])


def rkstudy(*argv, board=None, check=True):
    return run_cli(*argv, board=board, check=0 if check else None, timeout=1800)


@pytest.mark.parametrize("args, says", [
    (["--walk", "mel:2", "--output", "audio:16"], "--walk 'mel:2': expected NAME:AXIS:RATE"),
    (["--walk", "mel:two:1", "--output", "audio:16"], "'two' is not an integer"),
    (["--walk", "mel:1:1", "--output", "audio:16"], "the frame axis must be the last one (2 for mel)"),
    (["--walk", "spec:2:1", "--output", "audio:16"], "the graph has no input 'spec'; its inputs: mel"),
    (["--walk", "mel:2:1", "--output", "wave:16"], "the graph has no output 'wave'; its outputs: audio"),
    (["--walk", "mel:2:1", "--output", "audio:16", "--static", "g"], "--static g: the graph has no input 'g'"),
    (["--walk", "mel:2:1", "--output", "audio:8"], "16 samples per frame, not 8; give --output audio:16"),
    (["--walk", "mel:2:1"], "name the walked output: --output NAME:RATE"),
])
def test_cli_refuses_bad_flags_in_one_line(models, args, says):
    proc = rkstudy("port", "step", models["hifigan_v3"], *args, "--frames", "16", check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and says in lines[0], proc.stderr


def test_cli_names_the_node_of_a_graph_that_cannot_stream(models, tmp_path):
    proc = rkstudy("port", "step", models["instance_norm"], "--walk", "mel:2:1", "--output", "audio:1",
                   "--frames", "16", "--save", tmp_path / "x.onnx", check=False)
    (line,) = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "InstanceNormalization '/norm/InstanceNormalization'" in line
    assert not (tmp_path / "x.onnx").exists()


@pytest.mark.simulator
def test_build_gate_and_board_run_of_a_step(models, tmp_path):
    """One small architecture: `port step`, `port build` (the simulator gated against fp32 over the
    full-length inputs), then `board run port` on a recorded RK3588 tree through the replay double,
    whose outputs equal the fp32 walk of the same step exactly."""
    small = architectures.hifigan(3, channels=32, frames=32)
    onnx.save(small.model, tmp_path / "small.onnx")
    np.savez(tmp_path / "in.npz", mel=mel(40, 4), **{"mel.1": mel(23, 5)})
    spec = ["--walk", "mel:2:1", "--output", "audio:16", "--frames", str(EMIT)]
    rkstudy("port", "step", tmp_path / "small.onnx", *spec, "--save", tmp_path / "step.onnx")
    proc = rkstudy("port", "build", "--onnx", tmp_path / "step.onnx", "--inputs", tmp_path / "in.npz",
                   "--target", "rk3588", "--out", tmp_path / "step.rknn")
    snr = float(proc.stdout.split("simulator vs fp32 on your inputs")[1].split(":")[1].split("dB")[0])
    assert snr > 30.0 and (tmp_path / "step.contract.json").is_file()
    proc = rkstudy("board", "run", "port", "--engine", tmp_path / "step.rknn", "--inputs", tmp_path / "in.npz",
                   "--outputs", tmp_path / "out.npz", "--results", tmp_path / "results",
                   board="rk3588-librknnrt-2.5.0")
    assert "port on replay (rk3588, cores 0_1_2)" in proc.stdout
    contract = producer.read_contract(tmp_path / "step.onnx")
    side = PortSidecar(OrtRunner(tmp_path / "step.onnx"), contract)
    ref = np.concatenate([side.decode(u)[0].reshape(-1)
                          for u in load_inputs(tmp_path / "in.npz", input_names(contract))])
    with np.load(tmp_path / "out.npz") as data:
        np.testing.assert_array_equal(data["audio"], ref)
    (row,) = results.read_table(tmp_path / "results" / "board" / "port.csv")
    assert (row["where"], row["walk"], int(row["utterances"])) == ("replay", "stateful step", 2)


def test_cli_plan_fp32_writes_the_plan_tables(models, tmp_path):
    np.savez(tmp_path / "in.npz", mel=mel(96, 6))
    proc = rkstudy("port", "plan", models["hifigan_v3"], "--walk", "mel:2:1", "--output", "audio:16", "--frames",
                   str(FRAMES), "--inputs", tmp_path / "in.npz", "--snr", "60", "--skip-rknn", "--results", tmp_path)
    rf = next(line for line in proc.stdout.splitlines() if "receptive field" in line)
    left = int(rf.split("receptive field ")[1].split(" frames")[0])
    assert 2 <= left <= 20 and "rk3588 at 60 dB: context" in proc.stdout
    rows = results.read_table(tmp_path / "port" / "window_plan_plan.csv")
    assert [(r["target"], float(r["snr_target_db"])) for r in rows] == [("rk3588", 60.0)]


def test_a_static_speaker_input_is_fed_unchanged_and_the_step_stays_exact(tmp_path):
    v = architectures.hifigan(3, channels=32, frames=32, speaker_dims=4)
    onnx.save(v.model, tmp_path / "spk.onnx")
    port = producer.port_from_flags(tmp_path / "spk.onnx", ["mel:2:1"], ["g"], ["audio:16"])
    step = producer.produce_step(port, EMIT, FRAMES)
    assert [t.role for t in step.contract.inputs][:3] == ["walked", "mask", "constant"]
    g = np.random.default_rng(7).standard_normal((1, 4, 1)).astype(np.float32)
    x = {"mel": mel(LENGTH), "g": g}
    row = step_exactness(port, step, x)
    assert min(row["step_vs_full_f64_db"], row["first_frames_db"], row["last_frames_db"]) >= EXACT_GATE.threshold
    moved = step_exactness(port, step, {"mel": x["mel"], "g": -g})   # another speaker decodes differently
    assert moved["step_vs_full_f64_db"] >= EXACT_GATE.threshold
    full, other = (OrtRunner(port.model).run({"mel": x["mel"], "g": s})[0] for s in (g, -g))
    assert gates.snr_db(full, other) < 20.0


def test_cli_all_writes_the_window_and_says_why_there_is_no_step(models, tmp_path):
    np.savez(tmp_path / "in.npz", mel=mel(30))
    proc = rkstudy("port", "all", models["instance_norm"], "--walk", "mel:2:1", "--output", "audio:1", "--frames",
                   "32", "--inputs", tmp_path / "in.npz", "--out-dir", tmp_path, "--skip-rknn")
    assert "no stateful step: InstanceNormalization '/norm/InstanceNormalization'" in proc.stdout
    window = producer.read_contract(tmp_path / "instance_norm_w32.onnx")
    assert (window.window.frames, window.window.emit) == (32, 16) and not window.state
    assert not list(tmp_path.glob("*step*"))
