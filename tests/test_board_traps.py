"""What a first `rkstudy board run` on a real board would fall into, each walked through the command line on
the recorded board trees (tests/fixtures/boards) with the replay double of RKNNLite (tests/doubles):

* a librknnrt older than the toolkit that compiled the engine is refused before any init, naming both
  versions and both fixes (the double fails such an init the way the real runtime does);
* an init that fails is one line: RKNNLite's traceback stays in its log (shown under --debug);
* Ctrl-C stops the measured child instead of leaving it on the NPU, and says so in one line (exit 130);
  what a run wrote under sudo goes back to the user even when a later write fails;
* under sudo, a runtime found only through LIBRKNNRT_PATH is gone, and the line says why;
* one engine per SoC (`--target all`): `board run` takes this board's from the set; a ladder's every rung
  is checked, not only its first.

The engines are a real `rkstudy port` window graph (a seeded HiFi-GAN V3) with placeholder engine files: the
double serves the graph named in each contract and never reads an engine's bytes, and a compiled contract
is what stage 2 writes (Contract.compiled). No toolkit child starts here."""

import json
import os
import shutil
import signal

import numpy as np
import psutil
import pytest
from board_cli import BOARDS, STAGE2_BUILD, place, port_engine_set, run_cli, signal_while_the_child_runs

from rkstudy.contract import Contract, Digest, Tensor
from rkstudy.tables import results
from rkstudy.targets import ALL_TARGETS

FRAMES = 48


def rkstudy(*argv, board, env=None, check=None, timeout=600):
    return run_cli(*argv, board=board, env=env, check=check, timeout=timeout)


@pytest.fixture(scope="module")
def port_set(tmp_path_factory):
    """engines/: the window graph and one engine per SoC (--target all); in.npz: a mel of 40 frames."""
    d = tmp_path_factory.mktemp("traps")
    contract, graph = port_engine_set(d, frames=FRAMES, context=8, mel_frames=40)
    return d, contract, graph


def one_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return lines[0]


# --- an old librknnrt ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tree,runtime", [("rk3588", "2.3.2"), ("rk3566-orangepi-3b", "2.3.0"), ("rk3562", "2.3.0")])
def test_an_engine_of_a_newer_toolkit_is_refused_before_init_naming_both_versions(port_set, tree, runtime, tmp_path):
    d, contract, _ = port_set
    soc = tree.split("-")[0]
    engine = next((d / "engines").glob(f"*-{soc}-*.rknn"))
    proc = rkstudy("board", "run", "port", "--engine", engine, "--inputs", d / "in.npz", "--results",
                   tmp_path / "results", board=tree, check=2)
    line = one_line(proc.stderr)
    assert line.startswith(f"rkstudy: error: {engine.name} is from rknn-toolkit2 2.5.0 and this board's librknnrt "
                           f"{runtime} is older: Rockchip upgrades librknnrt with the toolkit, release for release "
                           f"(older engines keep running), and nothing recorded says what {runtime} does with a newer "
                           "engine. Fix: put librknnrt 2.5.0 in /usr/lib (rknn-toolkit2's "
                           "rknpu2/runtime/Linux/librknn_api/aarch64/), or ")
    if runtime == "2.3.2":  # a converter environment for the board's own version is one make target away
        assert ("or build for 2.3.2: `make toolkit-venv TOOLKIT=2.3.2`, then `rkstudy port build --onnx "
                "<voc_w48.onnx> --inputs <inputs.npz> --target rk3588 --toolkit 2.3.2`") in line
    else:
        assert "or build with rknn-toolkit2 2.3.0 or older, a version no converter environment here makes" in line
    assert line.endswith("or try it anyway: `rkstudy board run ... --allow-older-runtime` (its row records it)")
    assert "init_runtime" not in line and not (tmp_path / "results").exists()  # no child, no init, no row


def test_allow_older_runtime_runs_the_engine_and_the_row_records_the_warning(port_set, tmp_path):
    d, _, _ = port_set
    engine = next((d / "engines").glob("*-rk3588-*.rknn"))
    proc = rkstudy("board", "run", "port", "--engine", engine, "--inputs", d / "in.npz", "--results",
                   tmp_path / "results", "--allow-older-runtime", board="rk3588", check=0)
    assert "port on replay (rk3588, cores 0_1_2)" in proc.stdout and proc.stderr == ""
    (row,) = results.read_table(tmp_path / "results" / "board" / "port.csv")
    assert row["runtime_warning"] == (f"{engine.name} is from rknn-toolkit2 2.5.0 and this board's librknnrt 2.3.2 is "
                                      "older: Rockchip upgrades librknnrt with the toolkit, release for release (older "
                                      "engines keep running), and nothing recorded says what 2.3.2 does with a newer "
                                      "engine; run with --allow-older-runtime")
    fresh = rkstudy("board", "run", "port", "--engine", engine, "--inputs", d / "in.npz", "--results",
                    tmp_path / "r2", board="rk3588-librknnrt-2.5.0", check=0)  # a runtime as new: no warning
    (row,) = results.read_table(tmp_path / "r2" / "board" / "port.csv")
    assert row["runtime_warning"] == "" and "port on replay" in fresh.stdout


def test_a_runtime_older_than_the_engine_format_is_refused_even_when_allowed(port_set, tmp_path, monkeypatch):
    """librknnrt 1.4.0 (airockchip/rknn-toolkit2#281's) refuses every engine of rknn-toolkit2 1.5.2 or later at
    init: the flag cannot help, and the line says so before any init."""
    d, _, _ = port_set
    tree = tmp_path / "rk3588-1.4.0"
    shutil.copytree(BOARDS / "rk3588", tree)
    monkeypatch.syspath_prepend(str(BOARDS))
    from make_trees import fake_library

    (tree / "usr" / "lib" / "librknnrt.so").write_bytes(fake_library("1.4.0 (a10f100eb@2022-09-09T09:07:14)"))
    engine = next((d / "engines").glob("*-rk3588-*.rknn"))
    proc = rkstudy("board", "run", "port", "--engine", engine, "--inputs", d / "in.npz", "--results",
                   tmp_path / "results", "--allow-older-runtime", board=tree, check=2)
    line = one_line(proc.stderr)
    assert line.startswith(f"rkstudy: error: {engine.name} is from rknn-toolkit2 2.5.0 and this board's librknnrt "
                           "1.4.0 refuses it at init: runtimes before 1.5.2 do not read the engine format "
                           "rknn-toolkit2 1.5.2 introduced (\"Invalid RKNN model version 6\"). Fix: put librknnrt "
                           "2.5.0 in /usr/lib")
    assert line.endswith("(--allow-older-runtime cannot help: this runtime refuses the engine format)")
    assert not (tmp_path / "results").exists()


def test_the_same_engine_runs_once_the_runtime_the_refusal_names_is_installed(port_set, tmp_path):
    d, _, _ = port_set
    engine = next((d / "engines").glob("*-rk3588-*.rknn"))
    proc = rkstudy("board", "run", "port", "--engine", engine, "--inputs", d / "in.npz", "--results",
                   tmp_path / "results", board="rk3588-librknnrt-2.5.0", check=0)
    assert "port on replay (rk3588, cores 0_1_2)" in proc.stdout
    (row,) = results.read_table(tmp_path / "results" / "board" / "port.csv")
    assert row["where"] == "replay" and row["engine"] == engine.name


def test_minus_6_with_one_context_is_said_to_be_the_engine_file_not_an_aperture_overrun(port_set, tmp_path):
    d, _, _ = port_set
    proc = rkstudy("board", "run", "port", "--engine", d / "engines", "--inputs", d / "in.npz", "--results",
                   tmp_path / "results", board="rk3576", env={"RKNNLITE_REPLAY_INIT_CODE": "-6"}, check=1)
    line = one_line(proc.stderr)
    assert ("failed with code -6 (RKNN_ERR_MODEL_INVALID: the runtime refused the engine file itself (no other "
            "context resident: no aperture overrun)") in line and "too many contexts" not in line


# --- one line on an init failure ---------------------------------------------------------------------------------
def test_an_init_failure_is_one_line_without_the_runtimes_traceback(port_set, tmp_path):
    d, _, _ = port_set
    env = {"RKNNLITE_REPLAY_INIT_CODE": "-4"}
    proc = rkstudy("board", "run", "port", "--engine", d / "engines", "--inputs", d / "in.npz", "--results",
                   tmp_path / "results", board="rk3576", env=env, check=1)
    line = one_line(proc.stderr)
    assert line.startswith("rkstudy: error: init_runtime(port-w48-rk3576-k.rknn) failed with code -4 "
                           "(RKNN_ERR_MALLOC_FAIL: the driver refused the init")
    debug = rkstudy("--debug", "board", "run", "port", "--engine", d / "engines", "--inputs", d / "in.npz",
                    "--results", tmp_path / "results", board="rk3576", env=env, check=1)
    assert "E Catch exception when init runtime!" in debug.stderr  # the runtime's log, under --debug


# --- Ctrl-C and sudo ---------------------------------------------------------------------------------------------
# Ctrl-C, a closed terminal (SIGHUP) and `kill`/`timeout`/a service stop (SIGTERM) to the parent: what a terminal's
# Ctrl-C sends the foreground group reaches the parent only, as the child runs in its own session
@pytest.mark.parametrize("signum,code,said", [(signal.SIGINT, 130, "interrupted"),
                                              (signal.SIGHUP, 129, "stopped by SIGHUP"),
                                              (signal.SIGTERM, 143, "stopped by SIGTERM")])
def test_a_stop_signal_stops_the_measured_child_and_says_so_in_one_line(port_set, tmp_path, signum, code, said):
    d, _, _ = port_set
    (tmp_path / "tmp").mkdir()
    parent, out, err, child = signal_while_the_child_runs(
        ["board", "run", "port", "--engine", d / "engines", "--inputs", d / "in.npz",
         "--results", tmp_path / "results"],
        board="rk3576", env={"RKNNLITE_REPLAY_INIT_SECONDS": "120"}, child_module="rkstudy.board.run",
        signum=signum, tmp=tmp_path / "tmp")
    assert parent.returncode == code
    assert one_line(err) == (f"rkstudy: error: {said}: the board run of port-w48-rk3576-k.rknn wrote nothing; its "
                             "child process stopped with it")
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    assert not (tmp_path / "results").exists()
    assert list((tmp_path / "tmp").iterdir()) == []  # the run's spec folder is gone with it


def test_a_run_under_nohup_outlives_a_hang_up(port_set, tmp_path):
    """A parent that ignores SIGHUP (`nohup rkstudy board run ...`) keeps ignoring it: the run ends as it would."""
    d, _, _ = port_set
    (tmp_path / "tmp").mkdir()
    parent, out, err, _ = signal_while_the_child_runs(
        ["board", "run", "port", "--engine", d / "engines", "--inputs", d / "in.npz",
         "--results", tmp_path / "results"],
        board="rk3576", env={"RKNNLITE_REPLAY_INIT_SECONDS": "3"},
        child_module="rkstudy.board.run", signum=signal.SIGHUP, tmp=tmp_path / "tmp", ignore=(signal.SIGHUP,))
    assert parent.returncode == 0, err[-3000:]
    assert (tmp_path / "results" / "board" / "port.csv").is_file()
    assert list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="a run under sudo is a run as root")
def test_under_sudo_what_was_written_is_handed_back_even_when_the_row_is_refused(port_set, tmp_path):
    d, _, _ = port_set
    table = tmp_path / "results" / "board" / "port.csv"
    table.parent.mkdir(parents=True)
    table.write_text("other,columns\n1,2\n")  # an earlier table of other columns: the row is refused
    proc = rkstudy("board", "run", "port", "--engine", d / "engines", "--inputs", d / "in.npz", "--audio",
                   tmp_path / "out.wav", "--results", tmp_path / "results", board="rk3576",
                   env={"SUDO_UID": "4321", "SUDO_GID": "4322"}, check=2)
    assert "has other columns than this run's row" in one_line(proc.stderr)
    assert (tmp_path / "out.wav").stat().st_size > 44
    assert ((tmp_path / "out.wav").stat().st_uid, (tmp_path / "out.wav").stat().st_gid) == (4321, 4322)


@pytest.mark.skipif(os.geteuid() != 0, reason="a run under sudo is a run as root")
def test_under_sudo_a_runtime_found_only_through_librknnrt_path_is_named_with_the_fix(port_set, tmp_path):
    d, _, _ = port_set
    tree = tmp_path / "board"
    shutil.copytree(BOARDS / "rk3576", tree)
    (tree / "opt" / "rknpu2").mkdir(parents=True)
    (tree / "usr" / "lib" / "librknnrt.so").rename(tree / "opt" / "rknpu2" / "librknnrt.so")
    args = ("board", "run", "port", "--engine", d / "engines", "--inputs", d / "in.npz", "--results",
            tmp_path / "results")
    rkstudy(*args, board=tree, env={"LIBRKNNRT_PATH": "/opt/rknpu2/librknnrt.so"}, check=0)  # as the user
    proc = rkstudy(*args, board=tree, env={"SUDO_UID": "4321", "SUDO_GID": "4322"}, check=2)  # sudo dropped it
    assert one_line(proc.stderr) == (
        "rkstudy: error: librknnrt.so is not where RKNNLite loads it (/usr/lib/librknnrt.so), and sudo drops "
        "LIBRKNNRT_PATH from your environment: run `sudo env LIBRKNNRT_PATH=/path/to/librknnrt.so rkstudy ...`, or "
        "install it into /usr/lib (rkstudy doctor --board checks it)")


# --- one engine per SoC ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tree,soc,cores", [("rk3576", "rk3576", "0_1"), ("rk3588-librknnrt-2.5.0", "rk3588", "0_1_2")])
def test_board_run_takes_this_boards_engine_from_the_set(port_set, tmp_path, tree, soc, cores):
    d, _, _ = port_set
    proc = rkstudy("board", "run", "port", "--engine", d / "engines", "--inputs", d / "in.npz", "--results",
                   tmp_path / "results", board=tree, check=0)
    assert f"this {soc} board runs port-w48-{soc}-k.rknn (of 4 engines given)" in proc.stdout
    assert f"port on replay ({soc}, cores {cores})" in proc.stdout
    (row,) = results.read_table(tmp_path / "results" / "board" / "port.csv")
    assert (row["engine"], row["target"]) == (f"port-w48-{soc}-k.rknn", soc)


def test_a_single_core_rk3562_runs_on_auto_once_its_runtime_runs_the_engine(port_set, tmp_path, monkeypatch):
    """The rk3562 tree with the runtime its refusal names: the mask falls back to AUTO, and the single-core load
    file ("NPU load:  0%", no CoreN fields) is sampled."""
    d, _, _ = port_set
    tree = tmp_path / "rk3562"
    shutil.copytree(BOARDS / "rk3562", tree)
    monkeypatch.syspath_prepend(str(BOARDS))
    from make_trees import RUNTIME_2_5_0, fake_library

    (tree / "usr" / "lib" / "librknnrt.so").write_bytes(fake_library(RUNTIME_2_5_0))
    proc = rkstudy("board", "run", "port", "--engine", d / "engines", "--inputs", d / "in.npz", "--results",
                   tmp_path / "results", board=tree, check=0)
    assert "this rk3562 board runs port-w48-rk3562-k.rknn (of 4 engines given)" in proc.stdout
    (row,) = results.read_table(tmp_path / "results" / "board" / "port.csv")
    assert (row["target"], row["cores"], row["npu_load_mean_pct"]) == ("rk3562", "auto", "0")
    assert proc.stderr == ""  # the runtime's refusal of the mask stays in its log: the row says auto


def test_of_one_graph_built_by_two_toolkits_the_newest_this_runtime_runs_is_taken(port_set, tmp_path):
    d, contract, graph = port_set
    folder = tmp_path / "engines"
    shutil.copytree(d / "engines", folder)
    place(folder, contract, folder / graph.name, "rk3588", toolkit="rknn-toolkit2 2.3.2", key="k-tk2.3.2")
    old = rkstudy("board", "run", "port", "--engine", folder, "--inputs", d / "in.npz", "--results",
                  tmp_path / "r1", board="rk3588", check=0)
    assert "this rk3588 board runs port-w48-rk3588-k-tk2.3.2.rknn (of 5 engines given)" in old.stdout
    new = rkstudy("board", "run", "port", "--engine", folder, "--inputs", d / "in.npz", "--results",
                  tmp_path / "r2", board="rk3588-librknnrt-2.5.0", check=0)
    assert "this rk3588 board runs port-w48-rk3588-k.rknn (of 5 engines given)" in new.stdout


def test_a_set_with_no_engine_for_this_soc_says_which_targets_it_has(port_set, tmp_path):
    d, contract, graph = port_set
    folder = tmp_path / "engines"
    folder.mkdir()
    shutil.copy(graph, folder / graph.name)
    for target in ("rk3588", "rk3576"):
        place(folder, contract, folder / graph.name, target)
    proc = rkstudy("board", "run", "port", "--engine", folder, "--inputs", d / "in.npz", board="rk3562", check=2)
    assert one_line(proc.stderr) == (
        "rkstudy: error: none of the 2 port engines given runs on this rk3562 board (compiled for rk3576, rk3588); "
        "convert the graph for it with `rkstudy port build --onnx <voc_w48.onnx> --inputs <inputs.npz> --target "
        "rk3562` (or --target all)")


def test_a_board_with_no_librknnrt_says_so_before_the_child(port_set, tmp_path):
    d, _, _ = port_set
    proc = rkstudy("board", "run", "port", "--engine", d / "engines", "--inputs", d / "in.npz", "--results",
                   tmp_path / "results", board="rk3566", check=2)
    assert one_line(proc.stderr) == (
        "rkstudy: error: librknnrt.so is not where RKNNLite loads it (/usr/lib/librknnrt.so): install the RKNPU2 "
        "runtime (rknn-toolkit2's rknpu2/runtime/Linux/librknn_api/aarch64/librknnrt.so, the toolkit's release) "
        "into /usr/lib (rkstudy doctor --board checks it)")


def _rung(folder, width: int, target: str, source: str):
    """A placeholder encoder rung: its compiled contract names its width, SoC and source voice."""
    graph = folder / f"enc_n{width}.onnx"
    graph.write_bytes(f"graph {width}".encode())
    engine = folder / f"enc_n{width}-{target}.rknn"
    engine.write_bytes(b"rung")
    c = Contract(family="piper_encoder", stage="encoder", inputs=(Tensor("ids", (1, width), "int64", "padded", 1),),
                 outputs=(Tensor("stats", (1, 192, width), role="padded", axis=2),), source=Digest("v.onnx", source),
                 producer="rkstudy piper encoder --skip-rknn", params={"width": width})
    c.compiled(target=target, toolkit="rknn-toolkit2 2.5.0", onnx_path=graph, engine_path=engine,
               build=STAGE2_BUILD).write_beside(engine)
    return engine


@pytest.mark.parametrize("second,why", [
    (("rk3588", "a" * 64), "this engine was compiled for rk3588 and this board is rk3576"),
    (("rk3576", "b" * 64), "the inputs come from a model with sha256 aaaaaaaaaaaa and the engine was made from v.onnx "
                           "(bbbbbbbbbbbb)")])
def test_every_rung_of_the_encoder_ladder_is_checked_not_only_the_first(tmp_path, second, why):
    from rkstudy.families.piper import latents
    from rkstudy.families.piper.voice import Latent

    first = _rung(tmp_path, 32, "rk3576", "a" * 64)
    other = _rung(tmp_path, 64, *second)
    latents.save(tmp_path / "lat.npz", [Latent(text="x", ids=[1, 2, 3], z=np.zeros((192, 4), np.float32))],
                 source={"file": "v.onnx", "sha256": "a" * 64}, sample_rate=22050)
    proc = rkstudy("board", "run", "piper_encoder", "--engine", first, "--engine", other, "--latents",
                   tmp_path / "lat.npz", "--results", tmp_path / "results", board="rk3576", check=2)
    assert why in one_line(proc.stderr) and not (tmp_path / "results").exists()


def test_target_takes_one_soc_a_list_or_all():
    import argparse

    from rkstudy.cliutil import targets

    assert targets("rk3576") == ["rk3576"] and targets("rk3588, rk3576,rk3588") == ["rk3588", "rk3576"]
    assert targets("all") == list(ALL_TARGETS) == ["rk3588", "rk3576", "rk3566", "rk3562"]
    with pytest.raises(argparse.ArgumentTypeError, match="rk9999 is not a target; give one or more of rk3588"):
        targets("rk3588,rk9999")


def test_several_targets_and_one_engine_path_is_a_usage_error_before_any_build(port_set, tmp_path):
    d, _, graph = port_set
    proc = rkstudy("port", "build", "--onnx", graph, "--inputs", d / "in.npz", "--target", "all", "--out",
                   tmp_path / "e.rknn", board="rk3588", check=2)
    assert one_line(proc.stderr) == (
        f"rkstudy: error: --out {tmp_path / 'e.rknn'} names one engine and --target names 4 SoCs "
        "(rk3588,rk3576,rk3566,rk3562); give a folder for the set, such as --out engines/")
    bad = rkstudy("piper", "decoder", "--onnx", graph, "--target", "rk3588,rk9999", board="rk3588", check=2)
    assert "argument --target: rk9999 is not a target" in one_line(bad.stderr)


def test_a_target_that_fails_does_not_stop_the_others(port_set, tmp_path, monkeypatch, capsys):
    """stage 2 over a list builds every target, writes each one's engine and contract, and then fails (exit 1)
    naming the targets that did not build."""
    from types import SimpleNamespace

    from rkstudy import cliutil, gates
    from rkstudy.errors import Failed
    from rkstudy.toolkit import convert
    from rkstudy.toolkit.engine_cache import name_key

    _, _, graph = port_set
    built = []

    def fake_convert(onnx_path, target, out, **kw):
        if target == "rk3576":
            raise gates.GateFailed(f"{target} simulator vs fp32 on the probe: 3.0 dB < 15 dB")
        out.write_bytes(b"engine")
        built.append((target, out.name, kw["toolkit"]))
        report = SimpleNamespace(row=lambda: {"target": target}, engine_bytes=6, log="build.log")
        return SimpleNamespace(engine=out, simulated=SimpleNamespace(report=report, worst_snr_db=40.0))

    monkeypatch.setattr(convert, "convert", fake_convert)
    with pytest.raises(Failed, match=r"^1 of 3 targets failed \(rk3576; the others' engines are written\): rk3576 "
                                     r"simulator vs fp32 on the probe: 3.0 dB < 15 dB$"):
        cliutil.stage2(graph, ["rk3588", "rk3576", "rk3562"], tmp_path / "set", describe=str, remake="x",
                       as_json=True, toolkit="2.3.2")
    key = name_key(graph, "2.3.2")
    assert built == [("rk3588", f"port-w48-rk3588-{key}.rknn", "2.3.2"), ("rk3562", f"port-w48-rk3562-{key}.rknn",
                                                                            "2.3.2")]
    assert key.endswith("-tk2.3.2") and "rk3576: rk3576 simulator vs fp32" in capsys.readouterr().err


@pytest.mark.simulator
def test_port_all_builds_every_target_and_board_run_takes_this_boards(port_set, tmp_path):
    """`rkstudy port all --target rk3588,rk3576`: a window and a step engine per SoC, each with its contract; a
    folder of both kinds is ambiguous (two graphs) and says so, a window engine for the SoC runs."""
    d, contract, _ = port_set
    hop = contract.params["hop"]
    rkstudy("port", "all", d / "voc.onnx", "--walk", "mel:2:1", "--output", f"audio:{hop}", "--frames", FRAMES,
            "--inputs", d / "in.npz", "--target", "rk3588,rk3576", "--out-dir", tmp_path / "set", board="rk3576",
            check=0, timeout=3000)
    engines = sorted(p.name for p in (tmp_path / "set").glob("*.rknn"))
    assert len(engines) == 4 and all((tmp_path / "set" / n).with_suffix(".contract.json").is_file() for n in engines)
    assert sorted(n.split("-")[2] for n in engines) == ["rk3576", "rk3576", "rk3588", "rk3588"]
    both = rkstudy("board", "run", "port", "--engine", tmp_path / "set", "--inputs", d / "in.npz", board="rk3576",
                   check=2)
    assert "2 port engines given run on this rk3576 board, from different graphs" in one_line(both.stderr)
    window = [p for p in (tmp_path / "set" / n for n in engines)
              if not json.loads(p.with_suffix(".contract.json").read_text())["state"]]
    proc = rkstudy("board", "run", "port", *[a for p in window for a in ("--engine", p)], "--inputs", d / "in.npz",
                   "--results", tmp_path / "results", board="rk3576", check=0)
    assert f"this rk3576 board runs port-w{FRAMES}-rk3576-" in proc.stdout and "(of 2 engines given)" in proc.stdout
