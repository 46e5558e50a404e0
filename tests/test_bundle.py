"""`rkstudy bundle`, walked as a user with only a board walks it: the archive made on the host (the Piper part:
real stage 1, stage 2 for every SoC), unpacked where nothing else is, and the fenced commands of its own README
run in order on every recorded board tree through the replay double of RKNNLite, with the bundle's own copy of
rkstudy (not this checkout's) on the path: doctor, check, and the gated board run. What the walk cannot run it
checks instead, as tests/test_readme_board.py does: `make board-env` installs from PyPI (its recipe is checked
with `make -n` in the unpacked folder, which must hold what it reads). Each plan the bundle carries is spoken on
the tree its SoC's engine runs on.

Every model's part is checked without building too: its host and board commands parse with the real command
line (a flag that does not exist fails here, not on a user's board)."""

import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile

import pytest

from rkstudy.paths import REPO

BOARDS = REPO / "tests" / "fixtures" / "boards"
RUN_PASSES = ("rk3588-librknnrt-2.5.0", "rk3576")  # librknnrt 2.5.0: the bundle's engines run and gate
NO_RUNTIME = ("rk3566",)


def test_every_models_part_parses_with_the_command_line():
    from rkstudy.bundle import parts
    from rkstudy.cli import parser

    found = parts()
    assert [p.model for p in found] == ["piper", "kokoro", "qwen3"]
    for part in found:
        for argv in part.host + part.board:
            args = parser().parse_args(list(argv))  # SystemExit (exit 2) on a flag or a value the CLI refuses
            assert callable(args.func), argv
        assert all(a[:2] == ("board", "run") for a in part.board)
        # whether a run's reference is carried from the host is measured when a bundle is made (rkstudy.bundle.carry),
        # never declared by the part
        assert not any("--reference" in a or "--write-reference" in a for a in part.host + part.board)
    assert [p.model for p in found if p.board_cpu is not None] == ["piper"]


def commands(readme: str) -> list[list[str]]:
    (block,) = re.findall(r"```sh\n(.*?)```", readme, re.S)
    return [shlex.split(line) for line in block.splitlines() if line.strip()]


def _board_env(root, tree):
    env = {**os.environ, "RKSTUDY_SYSROOT": str(BOARDS / tree),
           "PYTHONPATH": os.pathsep.join([str(REPO / "tests" / "doubles"), str(root)])}
    for key in ("LIBRKNNRT_PATH", "SUDO_UID", "RKSTUDY_DEBUG", "RKNNLITE_REPLAY_ONNX_DIR", "RKSTUDY_RESULTS"):
        env.pop(key, None)
    return env


@pytest.mark.simulator
def test_the_bundles_walk_through_runs_on_every_recorded_tree(tmp_path):
    from rkstudy.cli import main

    archive = tmp_path / "host" / "rkstudy-board.tar.gz"
    assert main(["bundle", "--model", "piper", "-o", str(archive)]) == 0
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert not any("__pycache__" in n for n in names) and "rkstudy-board/rkstudy/cli.py" in names
    problems, walk = [], []
    for tree in sorted(p.name for p in BOARDS.iterdir() if (p / "sys").is_dir()):
        home = tmp_path / "boards" / tree
        home.mkdir(parents=True)
        shutil.copy(archive, home)  # what the user copies to the board
        walk = commands((_unpacked(archive, tmp_path) / "README.md").read_text(encoding="utf-8"))
        assert walk[0] == ["tar", "xzf", "rkstudy-board.tar.gz", "&&", "cd", "rkstudy-board"], walk[0]
        subprocess.run(["tar", "xzf", "rkstudy-board.tar.gz"], cwd=home, check=True)
        (home / "rkstudy-board.tar.gz").unlink()
        root = home / "rkstudy-board"
        for argv in walk[1:]:
            if argv[0] == "make":  # installs from PyPI: its recipe, in the unpacked folder
                proc = subprocess.run(["make", "-n", "--no-print-directory", *argv[1:]], cwd=root, capture_output=True,
                                      text=True, timeout=120)
                assert proc.returncode == 0 and "pip install --quiet -e '.[board]'" in proc.stdout, proc.stderr
                continue
            assert argv[0] == ".venv-board/bin/rkstudy", argv
            proc = subprocess.run([sys.executable, "-m", "rkstudy", *argv[1:]], cwd=root, capture_output=True,
                                  text=True, env=_board_env(root, tree), timeout=900)
            problems += _judge(tree, argv, proc)
        if tree == "rk3576":  # the plan for this SoC speaks the whole text, its decoder on the (replayed) NPU
            proc = subprocess.run([sys.executable, "-m", "rkstudy", "speak", "piper", "--plan",
                                   "plans/piper.rk3576.json", "--voice-onnx", "voice/en_US-joe-medium.onnx", "--text",
                                   "Call me at 555 0142.", "--results", "spoken"], cwd=root, capture_output=True,
                                  text=True, env=_board_env(root, tree), timeout=900)
            if proc.returncode != 0 or "piper on replay (rk3576)" not in proc.stdout:
                problems.append(f"rk3576: speak with plans/piper.rk3576.json: {proc.stdout[-300:]}{proc.stderr[-600:]}")
        # one tree on disk at a time: each holds the bundle's engines and voice (about 0.3 GB), and a CI runner's
        # temporary space is shared by every worker of the run
        shutil.rmtree(home)
    assert [a[1:3] for a in walk if a[0].endswith("rkstudy")] == [["doctor", "--board"], ["board", "check"],
                                                                  ["board", "run"]]
    assert not problems, "\n".join(problems)


def _unpacked(archive, tmp_path):
    """The archive unpacked once beside this test's trees, to read its README."""
    where = tmp_path / "read"
    if not where.exists():
        where.mkdir()
        subprocess.run(["tar", "xzf", str(archive)], cwd=where, check=True)
    return where / "rkstudy-board"


def _judge(tree, argv, proc) -> list[str]:
    """What differs from what `tree` must give for this command, one line each."""
    which = argv[1] if argv[1] == "doctor" else argv[2]
    out = proc.stdout + proc.stderr
    if which == "doctor":
        want = 0 if tree in RUN_PASSES else 1
    elif which == "check":
        want = 1 if tree == "rk3588-npu-powersave" else 0
    else:
        want = 0 if tree in RUN_PASSES else 2
    problems = []
    if proc.returncode != want:
        problems.append(f"{tree}: `{shlex.join(argv)}` exit {proc.returncode} (want {want}): {out[-600:]}")
    if which == "run":
        if tree in RUN_PASSES and not re.search(r"piper_decoder on replay .*; gate board_vs_fp32_white_noise passed",
                                                proc.stdout):
            problems.append(f"{tree}: no gated run line: {proc.stdout[-400:]}")
        if tree not in RUN_PASSES and (len(proc.stderr.splitlines()) != 1 or "Traceback" in proc.stderr):
            problems.append(f"{tree}: not one line: {proc.stderr[-600:]}")
        if tree in NO_RUNTIME and "librknnrt.so is not where RKNNLite loads it" not in proc.stderr:
            problems.append(f"{tree}: {proc.stderr[-300:]}")
    return problems
