"""The board side imports and runs with no converter: onnx, onnxslim, the toolkit and torch refused."""

import subprocess
import sys

import pytest

from rkstudy.paths import REPO

REFUSED = ("onnx", "onnxslim", "rknn", "torch")
BOARD_MODULES = [
    "rkstudy", "rkstudy.paths", "rkstudy.errors", "rkstudy.atomic", "rkstudy.cache", "rkstudy.contract",
    "rkstudy.window", "rkstudy.gates", "rkstudy.results", "rkstudy.sidecar", "rkstudy.report",
    "rkstudy.cliutil", "rkstudy.cli", "rkstudy.doctor", "rkstudy.runtime", "rkstudy.runtime.board",
    "rkstudy.runtime.ort", "rkstudy.runtime.wrappers", "rkstudy.board", "rkstudy.board.sysfs", "rkstudy.board.run",
    "rkstudy.board.memory",
    "rkstudy.board.dmesg", "rkstudy.board.rknnrt", "rkstudy.board.check", "rkstudy.board.load", "rkstudy.board.dram",
    "rkstudy.families",
    "rkstudy.families.piper.latents", "rkstudy.families.piper.frontend", "rkstudy.families.piper.boardfront",
    "rkstudy.protowire", "rkstudy.families.piper_decoder", "rkstudy.families.piper_decoder.sidecar",
    "rkstudy.families.piper_decoder.board", "rkstudy.families.piper_decoder.cli", "rkstudy.stream",
    "rkstudy.families.piper_decoder_stateful", "rkstudy.families.piper_decoder_stateful.sidecar",
    "rkstudy.families.piper_decoder_stateful.board", "rkstudy.families.piper_decoder_stateful.cli",
    "rkstudy.families.piper_encoder", "rkstudy.families.piper_encoder.sidecar",
    "rkstudy.families.piper_encoder.tokens", "rkstudy.families.piper_encoder.board",
    "rkstudy.families.piper_encoder.cli", "rkstudy.families.inflect_decoder", "rkstudy.families.inflect_decoder.cli",
    "rkstudy.families.toolchain", "rkstudy.families.flow_estimator", "rkstudy.families.flow_estimator.cli",
    "rkstudy.families.kokoro_generator", "rkstudy.families.kokoro_generator.sidecar",
    "rkstudy.families.kokoro_generator.head", "rkstudy.families.kokoro_generator.inputs",
    "rkstudy.families.kokoro_generator.board", "rkstudy.families.kokoro_generator.cli",
    "rkstudy.families.qwen3_vocoder", "rkstudy.families.qwen3_vocoder.sidecar", "rkstudy.families.qwen3_vocoder.board",
    "rkstudy.families.qwen3_vocoder.cli",
]

# A meta-path finder that refuses the converter's packages, as a board without them would.
GUARD = f"""
import sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {REFUSED!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (refused: the board has no converter)", name=name)
sys.meta_path.insert(0, Refuse())
"""


def run_guarded(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", GUARD + code], capture_output=True, text=True, cwd=REPO,
                          timeout=120)


def test_the_guard_refuses():
    proc = run_guarded("import onnx")
    assert proc.returncode != 0 and "refused: the board has no converter" in proc.stderr


def test_every_board_side_module_imports_without_the_converter():
    proc = run_guarded(f"import importlib, sys\nfor m in {BOARD_MODULES!r}: importlib.import_module(m)\n"
                       f"print('LEAKED', sorted(m for m in sys.modules if m.split('.')[0] in {REFUSED!r}))")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "LEAKED []" in proc.stdout


@pytest.mark.parametrize("argv", [["doctor", "--board"], ["board", "--help"],
                                  ["board", "run", "piper_decoder", "--help"],
                                  ["board", "run", "piper_encoder", "--help"], ["--help"], ["board", "check"],
                                  ["board", "memory", "--help"], ["board", "dram", "--help"],
                                  ["cosyvoice3", "estimator", "--help"],
                                  ["board", "run", "piper_decoder_stateful", "--help"],
                                  ["board", "run", "kokoro_generator", "--help"],
                                  ["board", "run", "qwen3_vocoder", "--help"], ["qwen3", "vocoder", "--help"],
                                  ["piper", "decoder", "--help"]])
def test_board_commands_run_without_the_converter(argv):
    proc = run_guarded(f"from rkstudy.cli import main\nimport sys\nsys.exit(main({argv!r}))")
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode in (0, 1)  # doctor --board exits 1 where there is no board
    assert proc.stdout.strip()


def test_a_host_command_on_the_board_says_so_in_one_line(tmp_path):
    model = str(tmp_path / "x.onnx")
    proc = run_guarded(f"from rkstudy.cli import main\nimport sys\nsys.exit(main(['census', {model!r}]))")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "needs onnx, which is not installed here" in proc.stderr
