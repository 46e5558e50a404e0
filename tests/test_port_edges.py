"""`rkstudy port` at the edges of what a codec decoder's export holds, on small graphs written here
with seeded weights (the real `dac` and `snac` decoders are in tests/test_port_packages.py, slow):

* an odd-stride ConvTranspose upsampler without output_padding (kernel 2s, stride s, padding ceil(s/2)):
  its audio ends a fixed 4 samples short of rate x frames; the step and the window carry that tail in
  their contracts and emit exactly the full decode, float64 exact at both ends, and as long as the
  module's own decode;
* a stride that does not divide the rate: the remainder changes with the length, refused;
* a noise block (randn_like every call) and a Dropout in training mode: refused by every command;
* windowed and global attention over time: the step names it, with its window;
* a legacy export that baked its traced length: told apart from an internal error, naming the exporter;
* a hop-512 decoder with 128 channels at 256 samples per frame: lint predicts the REGTASK flood of its
  dilated conv (RK305) exactly where the build has it (the builds: tests/test_lint_field.py).
"""

import math

import numpy as np
import onnx
import pytest
import torch
from board_cli import run_cli
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from rkstudy import gates
from rkstudy.errors import InputError, UsageError
from rkstudy.families.port import producer
from rkstudy.families.port.study import EXACT_GATE, FP32_GATE, step_exactness, window_exactness
from rkstudy.graph.delays import NotStreamable
from rkstudy.lint import lint
from rkstudy.walk.stateful import StatefulWalker

pytestmark = pytest.mark.usefixtures("one_torch_thread")
LATENT = 8


def export(module: nn.Module, path, frames: int = 16, seed: int = 0) -> onnx.ModelProto:
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape) * (0.5 / math.sqrt(max(p[0].numel(), 1)) if p.ndim > 1 else 0.1))
    module.eval()
    with torch.no_grad():
        torch.onnx.export(module, (torch.zeros(1, LATENT, frames),), str(path), dynamo=False, opset_version=17,
                          input_names=["z"], output_names=["audio"],
                          dynamic_axes={"z": {2: "frames"}, "audio": {2: "samples"}})
    return onnx.load(str(path))


def up(cin: int, cout: int, s: int, output_padding: bool) -> nn.ConvTranspose1d:
    """A codec decoder's upsampler: kernel 2s, stride s, padding ceil(s / 2)."""
    return nn.ConvTranspose1d(cin, cout, 2 * s, s, padding=math.ceil(s / 2), output_padding=s % 2 if output_padding
                              else 0)


class OddStride(nn.Module):
    """conv, x5 and x4 upsamplers without output_padding, a dilated residual conv, conv, tanh: hop 20,
    the x5 leaves its output 1 sample short at 5 per frame, so 4 short at 20."""

    def __init__(self, strides=(5, 4), first_stride: int = 1):
        super().__init__()
        self.pre = nn.Conv1d(LATENT, 16, 5, stride=first_stride, padding=2)
        self.ups = nn.ModuleList([up(16, 16, s, False) for s in strides])
        self.res = nn.Conv1d(16, 16, 7, dilation=3, padding=9)
        self.post = nn.Conv1d(16, 1, 7, padding=3)

    def forward(self, z):
        x = self.pre(z)
        for u in self.ups:
            x = u(torch.nn.functional.leaky_relu(x, 0.1))
        x = x + self.res(torch.sin(x))
        return torch.tanh(self.post(x))


class Noisy(nn.Module):
    """A noise block: the signal times fresh Gaussian noise, added back, on every call."""

    def __init__(self):
        super().__init__()
        self.pre = nn.Conv1d(LATENT, 8, 3, padding=1)
        self.post = nn.Conv1d(8, 1, 3, padding=1)

    def forward(self, z):
        x = self.pre(z)
        return self.post(x + torch.randn_like(x) * x)


class Attending(nn.Module):
    """conv, then self-attention over windows of `window` frames (the whole utterance when None), conv."""

    def __init__(self, window: int | None, baked: bool = False):
        super().__init__()
        self.window, self.baked = window, baked
        self.pre = nn.Conv1d(LATENT, 16, 3, padding=1)
        self.qkv = nn.Linear(16, 48, bias=False)
        self.post = nn.Conv1d(16, 1, 3, padding=1)

    def forward(self, z):
        x = self.pre(z).transpose(1, 2)                     # [1, T, C]
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        if self.window and self.baked:   # the count read as a Python int: the legacy exporter bakes it
            windows = int(x.shape[1]) // self.window
            q, k, v = (t.reshape(1, windows, -1, 16) for t in (q, k, v))
        elif self.window:
            q, k, v = (t.reshape(1, -1, self.window, 16) for t in (q, k, v))
        att = torch.softmax(q @ k.transpose(-1, -2) / 4.0, dim=-1) @ v
        return self.post(att.reshape(1, -1, 16).transpose(1, 2) + x.transpose(1, 2))


class LengthBaked(nn.Module):
    """A decoder that views its signal at the length it read as a Python int: the legacy exporter bakes
    the traced length into the Reshape."""

    def __init__(self):
        super().__init__()
        self.pre = nn.Conv1d(LATENT, 8, 3, padding=1)
        self.up = up(8, 4, 4, True)
        self.post = nn.Conv1d(4, 1, 3, padding=1)

    def forward(self, z):
        x = self.up(self.pre(z))
        x = x.reshape(1, 4, int(x.shape[-1]))
        return self.post(x)


class WideHop512(nn.Module):
    """A 44.1 kHz-style decoder: x8 x8 x4 upsamplers to 128 channels at 256 samples per frame, a residual
    unit with dilations 1 and 9 there, then x2 to 64 channels: hop 512."""

    def __init__(self):
        super().__init__()
        self.pre = nn.Conv1d(LATENT, 128, 7, padding=3)
        self.ups = nn.ModuleList([up(128, 128, 8, True), up(128, 128, 8, True), up(128, 128, 4, True)])
        self.res = nn.ModuleList([nn.Conv1d(128, 128, 7, dilation=d, padding=3 * d) for d in (1, 9)])
        self.last = up(128, 64, 2, True)
        self.post = nn.Conv1d(64, 1, 7, padding=3)

    def forward(self, z):
        x = self.pre(z)
        for u in self.ups:
            x = u(torch.sin(x) + x)
        for r in self.res:
            x = x + r(torch.sin(x))
        return torch.tanh(self.post(self.last(x)))


def z(frames: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, LATENT, frames)).astype(np.float32)


def cli(*argv):
    return run_cli(*argv, check=None, timeout=900)


# --- outputs off rate x frames by a fixed remainder -------------------------------------------------------

@pytest.fixture(scope="module")
def odd(tmp_path_factory):
    path = tmp_path_factory.mktemp("odd") / "odd.onnx"
    module = OddStride()
    export(module, path)
    return path, module


def test_an_odd_stride_decoder_streams_with_its_short_tail_exactly(odd):
    path, module = odd
    port = producer.port_from_flags(path, ["z:2:1"], [], ["audio:20"])
    step = producer.produce_step(port, 8, 32)
    assert step.contract.params["output_extra"] == {"audio": -4} and step.step.extents == {"audio": -4}
    u = {"z": z(37)}
    r = step_exactness(port, step, u)
    assert min(r["step_vs_full_f64_db"], r["first_frames_db"], r["last_frames_db"]) >= EXACT_GATE.threshold, r
    assert min(r["step_vs_full_fp32_db"], r["last_frames_fp32_db"]) >= FP32_GATE.threshold, r
    with torch.no_grad():
        own = module(torch.from_numpy(u["z"])).numpy()[0]
    (walked,) = StatefulWalker(_ort(step.model), step.contract).decode(u["z"][0])
    assert walked.shape == own.shape == (1, 20 * 37 - 4)
    assert gates.snr_db(own, walked) > 100.0


def _ort(model):
    from rkstudy.runtime import OrtRunner

    return OrtRunner(model)


def test_an_odd_stride_window_carries_the_tail_in_its_contract(odd, tmp_path):
    path, _ = odd
    port = producer.port_from_flags(path, ["z:2:1"], [], ["audio:20"])
    window = producer.produce_window(port, 24, 4)
    (out,) = window.contract.outputs
    assert (out.rate, out.extra, out.shape[-1], out.frames) == (20, -4, 20 * 24 - 4, 24)
    saved = window.save(tmp_path / "w.onnx")
    assert producer.read_contract(saved).outputs[0].extra == -4   # survives the metadata round trip
    r = window_exactness(port, window, {"z": z(37)})
    assert r["walk_vs_full_fp32_db"] > 40.0 and r["frames"] == 37


def test_the_cli_steps_an_odd_stride_decoder(odd, tmp_path):
    path, _ = odd
    proc = cli("port", "step", path, "--walk", "z:2:1", "--output", "audio:20", "--frames", "8",
               "--save", tmp_path / "s.onnx")
    assert proc.returncode == 0, proc.stderr
    assert producer.read_contract(tmp_path / "s.onnx").params["output_extra"] == {"audio": -4}


def test_the_window_plan_walks_an_odd_stride_decoder(odd, tmp_path):
    """`port plan` compares the window walk with the full decode frame by frame, the short tail included."""
    from rkstudy.families.port.study import plan_target
    from rkstudy.walk import planner

    path, _ = odd
    port = producer.port_from_flags(path, ["z:2:1"], [], ["audio:20"])
    pt = plan_target(port, [{"z": z(40)}], 24, 6)
    (rf,) = planner.receptive_field_rows(pt)
    assert 0 < rf["left_frames"] <= 6 and 0 < rf["right_frames"] <= 6   # a few frames each side, as its convs reach
    (row,) = planner.context_sweep(pt.decode, pt.latents, pt.hop, [8], pt.default_emit, "speech", walk=pt.walk,
                                   n_frames=pt.n_frames)
    assert row["worst_interior_snr_db"] > 100.0   # context past the receptive field: the walk is the decode


def test_a_remainder_that_changes_with_the_length_is_refused_naming_the_cause(tmp_path):
    export(OddStride(strides=(4, 5), first_stride=2), tmp_path / "half.onnx")
    port = producer.port_from_flags(tmp_path / "half.onnx", ["z:2:1"], [], ["audio:10"])
    with pytest.raises(UsageError) as exc:
        producer.produce_window(port, 16, 4)
    message = str(exc.value)
    assert "changes with the length" in message and "a stride that does not divide the rate" in message
    assert "\n" not in message


# --- random ops: every command refuses ---------------------------------------------------------------

@pytest.mark.parametrize("command", ["lint", "fold", "plan", "step", "all"])
def test_a_noise_block_is_refused_by_every_command_naming_the_op_and_the_fix(tmp_path, command):
    export(Noisy(), tmp_path / "noisy.onnx")
    np.savez(tmp_path / "in.npz", z=z(16))
    extra = {"plan": ["--inputs", tmp_path / "in.npz", "--skip-rknn"], "all": ["--inputs", tmp_path / "in.npz",
                                                                             "--skip-rknn", "--out-dir", tmp_path]}
    proc = cli("port", command, tmp_path / "noisy.onnx", "--walk", "z:2:1", "--output", "audio:1", "--frames", "16",
               *extra.get(command, []))
    (line,) = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert "RandomNormalLike" in line and "draws new random numbers on every run" in line
    assert "feed the noise as a graph input" in line
    assert not list(tmp_path.glob("noisy_*.onnx"))   # nothing written: no frozen noise


def test_a_dropout_in_training_mode_is_a_random_op(tmp_path):
    w = numpy_helper.from_array(np.ones((1, LATENT, 1), np.float32), "w")
    on = numpy_helper.from_array(np.array(True), "train")
    nodes = [helper.make_node("Mul", ["z", "w"], ["x"], name="scale"),
             helper.make_node("Dropout", ["x", "", "train"], ["audio"], name="drop")]
    g = helper.make_graph(nodes, "d", [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, LATENT, "T"])],
                          [helper.make_tensor_value_info("audio", TensorProto.FLOAT, [1, LATENT, "T"])], [w, on])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "d.onnx")
    with pytest.raises(InputError, match="Dropout 'drop' draws new random numbers"):
        producer.port_from_flags(tmp_path / "d.onnx", ["z:2:1"], [], ["audio:1"])


# --- attention over time ---------------------------------------------------------------------------------

@pytest.mark.parametrize("window, says", [(8, "attends over windows of 8 of its 32 frames (windowed local attention)"),
                                          (None, "attends over all 32 frames")])
def test_attention_over_time_is_named_with_its_window(tmp_path, window, says):
    export(Attending(window), tmp_path / "att.onnx", frames=32)
    port = producer.port_from_flags(tmp_path / "att.onnx", ["z:2:1"], [], ["audio:1"])
    with pytest.raises(NotStreamable) as exc:
        producer.produce_step(port, 8, 32)
    message = str(exc.value)
    assert says in message and "MatMul" in message and "Softmax" in message and "\n" not in message


def test_a_windowed_attention_needs_a_multiple_of_its_window(tmp_path):
    export(Attending(8), tmp_path / "att.onnx", frames=32)
    port = producer.port_from_flags(tmp_path / "att.onnx", ["z:2:1"], [], ["audio:1"])
    assert producer.produce_window(port, 32, 8).contract.outputs[0].extra == 0   # the window walk takes it
    with pytest.raises(InputError, match="runs at 40: its attention cuts time into windows; compile a multiple"):
        producer.produce_window(port, 20, 4)


def test_an_attention_whose_window_count_was_baked_is_refused_by_fold(tmp_path):
    """A legacy export of windows = int(T) // 8 keeps 4 windows at any length: right at 32 frames only."""
    export(Attending(8, baked=True), tmp_path / "baked_att.onnx", frames=32)
    port = producer.port_from_flags(tmp_path / "baked_att.onnx", ["z:2:1"], [], ["audio:1"])
    with pytest.raises(InputError) as exc:
        producer.produce_window(port, 32, 8)
    assert "attends over windows of 8 frames at 32 frames but of 16 at 64" in str(exc.value)
    assert "export it at the 32 frames you compile" in str(exc.value)


# --- a length-baked legacy export ---------------------------------------------------------------------

@pytest.mark.parametrize("command, fix", [
    ("step", "Re-export it with the dynamo exporter (torch.onnx.export(..., dynamo=True))"),
    ("fold", "or export it at the 16 frames you compile")])
def test_a_length_baked_export_is_told_apart_from_an_internal_error(tmp_path, command, fix):
    export(LengthBaked(), tmp_path / "baked.onnx", frames=16)
    proc = cli("port", command, tmp_path / "baked.onnx", "--walk", "z:2:1", "--output", "audio:4", "--frames", "16",
               "--save", tmp_path / "x.onnx")
    (line,) = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert "dynamic in name only" in line and "runs at 16 frames but not at 32" in line and fix in line
    assert "valid" not in line.split("(onnxruntime")[0]   # the cause, not a tensor the boundary pass made


# --- lint predicts the register-field flood --------------------------------------------------------------

def test_lint_predicts_the_dilated_conv_flood_of_a_wide_hop_512_decoder(tmp_path):
    export(WideHop512(), tmp_path / "wide.onnx", frames=8)
    clean = lint(tmp_path / "wide.onnx", {"z": [1, LATENT, 4]}, time_inputs=["z"])
    flood = lint(tmp_path / "wide.onnx", {"z": [1, LATENT, 5]}, time_inputs=["z"])
    killed = lint(tmp_path / "wide.onnx", {"z": [1, LATENT, 32]}, time_inputs=["z"])
    assert "RK305" not in clean.codes()   # 7 taps x 1024 samples - 1 = 7167 fits the field
    (f,) = [f for f in flood.findings if f.code == "RK305"]
    assert (f.severity, f.detail["length"], f.detail["field_value"], f.detail["predicted_lines"]) == \
        ("warning", 1280, 8959, 17914)
    (k,) = [f for f in killed.findings if f.code == "RK305"]
    assert k.severity == "error" and "the build is killed" in k.message and killed.exit_code == 1


def test_lint_says_the_compiler_decides_where_it_was_not_measured(tmp_path):
    export(WideHop512(), tmp_path / "wide.onnx", frames=8)
    report = lint(tmp_path / "wide.onnx", {"z": [1, LATENT, 5]}, time_inputs=["z"], target="rk3576")
    (f,) = [f for f in report.findings if f.code == "RK305"]
    assert f.severity == "warning" and f.detail["decides"] and "measured on rk3588 only" in f.message
    assert "the compiler decides 1 finding(s) (RK305)" in report.text().splitlines()[0]


