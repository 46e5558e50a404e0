"""The board side imports and runs with no converter: onnx, onnxslim, the toolkit and torch refused."""

import ast
import importlib.util
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import rkstudy
import rkstudy.board
from rkstudy import families
from rkstudy.paths import REPO

REFUSED = ("onnx", "onnxslim", "rknn", "torch")
# How a module says it is board side: a docstring line such as "Board side: numpy only." or a first line
# such as "The Piper decoder sidecar (board side): ...".
DECLARED = re.compile(r"\bboard side\b", re.IGNORECASE)
# The modules of a family folder that a board runs (the family registry's section order).
FAMILY_BOARD_PARTS = ("sidecar", "cli", "board", "speak")


def declared_board_side() -> set[str]:
    """Every rkstudy module whose docstring says it runs on a board (read with ast, imported by no one)."""
    root = Path(rkstudy.__file__).parent
    found = set()
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if DECLARED.search(ast.get_docstring(ast.parse(path.read_text())) or ""):
            found.add(name)
    return found


def board_entry_points() -> set[str]:
    """What a board runs: the command line, every module of rkstudy.board, and for every registered family
    its package and whichever of its sidecar, command (cli) and `board run` job modules it has."""
    found = {"rkstudy", "rkstudy.cli", "rkstudy.board",
             *(m.name for m in pkgutil.walk_packages(rkstudy.board.__path__, "rkstudy.board."))}
    for family in families.load_all().values():
        package = f"rkstudy.families.{family.name}"
        found.add(package)
        found.update(name for name in (f"{package}.{part}" for part in FAMILY_BOARD_PARTS)
                     if importlib.util.find_spec(name))
        found.update(getattr(family, which).partition(":")[0] for which in ("cli", "board") if getattr(family, which))
    return found


BOARD_MODULES = sorted(declared_board_side() | board_entry_points())


def test_the_board_side_is_derived_from_the_registry_and_the_docstrings():
    """The derivation finds what a board certainly runs, so an empty or broken one cannot pass."""
    jobs = {f.board.partition(":")[0] for f in families.load_all().values() if f.board}
    assert len(jobs) >= 6 and jobs <= set(BOARD_MODULES)
    assert {"rkstudy.board", "rkstudy.board.run", "rkstudy.walk.window", "rkstudy.contract", "rkstudy.board.runner",
            "rkstudy.families.port.sidecar", "rkstudy.plan.speak", "rkstudy.plan.engines",
            "rkstudy.families.piper_decoder.speak", "rkstudy.families.piper.cuts"} <= set(BOARD_MODULES)
    assert not {"rkstudy.toolkit.build", "rkstudy.graph.index", "rkstudy.toolkit.simulator"} & set(BOARD_MODULES)

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


BOARD_JOBS = [["board", "run", name, "--help"] for name, family in families.load_all().items() if family.board]


@pytest.mark.parametrize("argv", [["doctor", "--board"], ["board", "--help"], ["--help"], ["board", "check"],
                                  ["board", "memory", "--help"], ["board", "dram", "--help"],
                                  ["cosyvoice3", "estimator", "--help"], ["qwen3", "vocoder", "--help"],
                                  ["piper", "decoder", "--help"], ["speak", "--help"], ["speak", "piper", "--help"],
                                  ["speak", "kokoro", "--help"], ["speak", "qwen3", "--help"], *BOARD_JOBS])
def test_board_commands_run_without_the_converter(argv):
    proc = run_guarded(f"from rkstudy.cli import main\nimport sys\nsys.exit(main({argv!r}))")
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    # --help exits 0; doctor --board and board check exit 1 where there is no board
    assert proc.returncode == 0 if "--help" in argv else proc.returncode in (0, 1)
    assert proc.stdout.strip()


def test_a_host_command_on_the_board_says_so_in_one_line(tmp_path):
    model = str(tmp_path / "x.onnx")
    proc = run_guarded(f"from rkstudy.cli import main\nimport sys\nsys.exit(main(['census', {model!r}]))")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "needs onnx, which is not installed here" in proc.stderr


def test_the_piper_cpu_plan_speaks_without_the_converter():
    """The whole CPU path of `rkstudy speak piper` (the voice cut on the wire, onnxruntime, piper-tts) in a
    process that refuses onnx, onnxslim, the toolkit and torch: prepared and run as the child runs it."""
    code = """
from rkstudy.cli import parser
from rkstudy.plan import speak
from rkstudy.families.piper_decoder.speak import job
args = parser().parse_args(["speak", "piper", "--plan", "{}", "--text", "Hello there."])
prepared, runtime = speak.prepare("piper", args.plan, args, args.runtime)
out = job(speak.payload_of(prepared, runtime, "0_1_2"))
print("AUDIO", out["audio"].size, out["where"], out["row"]["chunks"])
import sys
""" + f"print('LEAKED', sorted(m for m in sys.modules if m.split('.')[0] in {REFUSED!r}))\n"
    proc = run_guarded(code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "LEAKED []" in proc.stdout
    size = int(proc.stdout.split("AUDIO ")[1].split()[0])
    assert size > 0 and size % 256 == 0 and " fp32 1" in proc.stdout
