"""The README's board section, walked: its fenced commands, parsed from README.md and run in order, the host
steps once (real stage 1, stage 2 for every SoC, latents), the board steps on every recorded board tree
through the replay double of RKNNLite, each step's exit code and the one line it prints checked against
what that tree must give; then the section's fix for an old librknnrt (a build with the board's toolkit
version) and the board steps again on the tree that needed it. A README edit that breaks a command, or a
command whose behaviour drifts from what the README promises, fails here (as onnx-graphsurgeon runs its
README's examples as tests).

What the walk cannot run it checks instead, and says so: `git clone` (the walk is in this checkout, with the
host's `engines/` and `latents.npz` in its working folder, as the README has them copied), `make board-env`
(it installs from PyPI: its recipe is checked with `make -n`; tests/test_board_install.py runs its venv
steps) and `make toolkit-venv` (the environment it makes must be here: `make test` makes it)."""

import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from rkstudy.paths import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")
SECTION = README[README.index("## On a board: from a clean board to a results row"):README.index("## What is here")]
BLOCKS = re.findall(r"```sh\n(.*?)```", SECTION, re.S)
BOARDS = REPO / "tests" / "fixtures" / "boards"
K = r"[0-9a-f]{12}"  # the graph digest in an engine's name
ENGINE = {soc: rf"piper_decoder-w93-{soc}-{K}\.rknn" for soc in ("rk3588", "rk3576", "rk3566", "rk3562")}


def commands(block: str) -> list[list[str]]:
    """The block's commands as argv lists (comments and comment-only lines dropped)."""
    return [argv for argv in (shlex.split(line, comments=True) for line in block.splitlines()) if argv]


def older(soc: str, runtime: str) -> str:
    return (rf"{ENGINE[soc]} is from rknn-toolkit2 2\.5\.0 and this board's librknnrt {re.escape(runtime)} is older: "
            r"Rockchip upgrades librknnrt with the toolkit, release for release \(older engines keep running\), and "
            rf"nothing recorded says what {re.escape(runtime)} does with a newer engine\.")


NO_RUNTIME = r"librknnrt\.so is not where RKNNLite loads it \(/usr/lib/librknnrt\.so\)"
# per tree, per board command: (exit code, a pattern the one line it prints must match)
EXPECT = {
    "rk3588": {"doctor": (1, r"\[FAIL\] " + older("rk3588", "2.3.2")),
               "check": (0, r"verdict: COMPARABLE with the reference documents' RK3588 figures"),
               "run": (2, r"rkstudy: error: " + older("rk3588", "2.3.2") + r" Fix: put librknnrt 2\.5\.0 in /usr/lib")},
    "rk3588-librknnrt-2.5.0": {
        "doctor": (0, r"\[ok\] librknnrt 2\.5\.0 \(5d2a7c5e3b@2025-10-20T10:00:00\) runs engines from rknn-toolkit2"),
        "check": (0, r"verdict: COMPARABLE"),
        "run": (0, r"piper_decoder on replay \(rk3588, cores 0_1_2\): RTF [\d.]+, 3\.19 s of audio, .*; gate "
                   r"board_vs_fp32_white_noise passed: worst window \d+ of \d+ of " + ENGINE["rk3588"]
                   + r" at inf dB")},
    "rk3588-npu-powersave": {
        "doctor": (1, r"\[FAIL\] " + older("rk3588", "2.3.2")),
        "check": (1, r"verdict: NOT COMPARABLE .* NPU at 300 MHz under governor powersave"),
        "run": (2, r"rkstudy: error: " + older("rk3588", "2.3.2"))},
    "rk3576": {"doctor": (0, r"\[ok\] librknnrt 2\.5\.0 .* runs engines from rknn-toolkit2 2\.5\.0"),
               "check": (0, r"verdict: NOT COMPARABLE .* this is an rk3576"),
               "run": (0, r"piper_decoder on replay \(rk3576, cores 0_1\): RTF .*; gate board_vs_fp32_white_noise "
                          r"passed")},
    "rk3566": {"doctor": (1, r"\[FAIL\] " + NO_RUNTIME),
               "check": (0, r"verdict: NOT COMPARABLE .* this is an rk3566"),
               "run": (2, r"rkstudy: error: " + NO_RUNTIME + r": install the RKNPU2 runtime")},
    "rk3566-orangepi-3b": {"doctor": (1, r"\[FAIL\] " + older("rk3566", "2.3.0")),
                           "check": (0, r"verdict: NOT COMPARABLE .* this is an rk3566"),
                           "run": (2, r"rkstudy: error: " + older("rk3566", "2.3.0") + r" .* or build with "
                                      r"rknn-toolkit2 2\.3\.0 or older")},
    "rk3562": {"doctor": (1, r"\[FAIL\] " + older("rk3562", "2.3.0")),
               "check": (0, r"verdict: NOT COMPARABLE .* this is an rk3562"),
               "run": (2, r"rkstudy: error: " + older("rk3562", "2.3.0"))},
}
# after the fix block (an rk3588 engine built by toolkit 2.3.2 joins the set), on the 2.3.2 tree
AFTER_FIX = {"doctor": (0, r"\[ok\] librknnrt 2\.3\.2 \(429f97ae6b@2025-04-09T09:09:27\) runs engines from "
                           r"rknn-toolkit2 2\.3\.2"),
             "check": (0, r"verdict: COMPARABLE"),
             "run": (0, r"piper_decoder on replay \(rk3588, cores 0_1_2\)")}


def test_the_board_section_has_the_steps_the_walk_runs():
    """The section's three blocks, in the shape the walk below reads (fast: no command runs)."""
    host, board, fix = (commands(b) for b in BLOCKS)
    assert [argv[:3] for argv in host] == [["rkstudy", "piper", "decoder"], ["rkstudy", "piper", "decoder"],
                                           ["rkstudy", "piper", "latents"]]
    assert host[1][host[1].index("--target") + 1] == "all" and host[1][host[1].index("--out") + 1] == "engines/"
    # the stage-1 graph is written where stage 2 and the host runtimes look for it: beside the engines
    assert host[0][host[0].index("--output") + 1] == host[1][host[1].index("--onnx") + 1] == "engines/decoder_z.onnx"
    assert board[0][:2] == ["git", "clone"] and board[1] == ["make", "board-env"]
    assert [argv[:3] for argv in board[2:]] == [[".venv-board/bin/rkstudy", "doctor", "--board"],
                                                [".venv-board/bin/rkstudy", "board", "check"],
                                                [".venv-board/bin/rkstudy", "board", "run"]]
    assert all("engines/" in argv for argv in (board[2], board[4]))
    assert fix[0] == ["make", "toolkit-venv", "TOOLKIT=2.3.2"] and "--toolkit" in fix[1]
    # every recorded tree (a sysroot: it has sys/) is walked; the folder also holds make_trees.py, whose
    # __pycache__ appears once a test has imported it
    assert set(EXPECT) == {p.name for p in BOARDS.iterdir() if (p / "sys").is_dir()}


def _host(argv, work):
    """One host step: `rkstudy ...` in the converter environment here, `make ...` checked (see the docstring)."""
    if argv[0] == "make" and argv[1] == "toolkit-venv":
        from rkstudy.toolkit.envs import toolkit_env

        version = argv[2].split("=", 1)[1]
        assert toolkit_env(version).version == f"rknn-toolkit2 {version}"  # what the make target makes
        return
    assert argv[0] == "rkstudy", argv
    proc = subprocess.run([sys.executable, "-m", "rkstudy", *argv[1:]], cwd=work, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=3600)
    assert proc.returncode == 0, f"{shlex.join(argv)}\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}"


def _board(argv, work, tree, results):
    """One board step on `tree`: (which, exit code, the lines it printed) or None for a step checked otherwise."""
    if argv[:2] == ["git", "clone"]:
        return None
    if argv[0] == "make":
        proc = subprocess.run(["make", "-n", "--no-print-directory", "-C", str(REPO), *argv[1:]], capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0 and "pip install --quiet -e '.[board]'" in proc.stdout, proc.stderr
        return None
    assert argv[0] == ".venv-board/bin/rkstudy", argv
    # the double finds each engine's graph beside it, as the gate does: no RKNNLITE_REPLAY_ONNX_DIR
    env = {**os.environ, "RKSTUDY_SYSROOT": str(BOARDS / tree), "RKSTUDY_RESULTS": str(results),
           "PYTHONPATH": os.pathsep.join([str(REPO / "tests" / "doubles"), str(REPO)])}
    for key in ("LIBRKNNRT_PATH", "SUDO_UID", "RKSTUDY_DEBUG", "RKNNLITE_REPLAY_ONNX_DIR"):
        env.pop(key, None)
    proc = subprocess.run([sys.executable, "-m", "rkstudy", *argv[1:]], cwd=work, capture_output=True, text=True,
                          env=env, timeout=900)
    which = {"doctor": "doctor", "board": argv[2]}[argv[1]]
    return which, proc.returncode, proc.stdout.splitlines() + proc.stderr.splitlines(), proc.stderr


def _walk(work, tree, results, expect) -> list[str]:
    """The board block on `tree`; what differs from `expect`, one line each."""
    problems = []
    for argv in commands(BLOCKS[1]):
        got = _board(argv, work, tree, results)
        if got is None:
            continue
        which, code, lines, stderr = got
        want_code, pattern = expect[which]
        matched = [line for line in lines if re.search(pattern, line)]
        if code != want_code or not matched:
            problems.append(f"{tree}: `{shlex.join(argv)}` exit {code} (want {want_code}), no line matches "
                            f"{pattern!r}: {lines[-4:]}")
        if code != 0 and which == "run" and (len(stderr.splitlines()) != 1 or "Traceback" in stderr):
            problems.append(f"{tree}: `{shlex.join(argv)}` printed more than one line on stderr: {stderr[-1500:]}")
    return problems


@pytest.mark.simulator
def test_the_readme_board_section_walks_on_every_recorded_tree(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    for argv in commands(BLOCKS[0]):  # the host steps: stage 1, stage 2 for every SoC, the latents
        _host(argv, work)
    built = sorted(p.name for p in (work / "engines").glob("*.rknn"))
    assert [re.sub(K, "K", n) for n in built] == [f"piper_decoder-w93-{soc}-K.rknn"
                                                  for soc in ("rk3562", "rk3566", "rk3576", "rk3588")]
    problems = []
    for tree, expect in EXPECT.items():
        problems += _walk(work, tree, tmp_path / "results" / tree, expect)
    for argv in commands(BLOCKS[2]):  # the fix for a board whose librknnrt is 2.3.2: its own toolkit's build
        _host(argv, work)
    assert len(list((work / "engines").glob("*-tk2.3.2.rknn"))) == 1
    problems += _walk(work, "rk3588", tmp_path / "results" / "rk3588-fixed", AFTER_FIX)
    assert not problems, "\n".join(problems)
    (row,) = [r for r in _rows(tmp_path / "results" / "rk3588-fixed")]
    assert re.fullmatch(rf"piper_decoder-w93-rk3588-{K}-tk2\.3\.2\.rknn", row["engine"]) and row["where"] == "replay"
    # gated against the graph stage 2 shipped beside it, at the floor the simulator gate used
    assert (row["gate"], row["gate_threshold_db"], row["gate_worst_snr_db"]) == ("board_vs_fp32_white_noise", "15",
                                                                                 "inf")
    assert row["gate_reference"].startswith("fp32 onnxruntime on this board: decoder_z.onnx ")
    shutil.rmtree(work / "engines")


def _rows(root):
    from rkstudy.tables import results

    return results.read_table(root / "board" / "piper_decoder.csv")
