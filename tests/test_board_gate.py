"""The board gate, proved on the faults boards show: each fault mode of the replay double of RKNNLite
(tests/doubles/rknnlite) reproduces one, a real `rkstudy board run` meets it on a recorded board tree, and the
gate (or the child's supervision) fails it with exit 1 and one line, writing nothing: no row, no audio file,
no temporary folder.

The engine is a real `rkstudy port` window graph (a seeded HiFi-GAN V3) over a mel of several windows, with
placeholder engine files whose compiled contracts record what stage 2 would (the build record of an engine
whose compiler logged REGTASK lines past the field, like the README's rk3588 Piper engine): the double serves
the graph each contract names, and the gate runs that same graph in onnxruntime as the fp32 reference, so a
clean run scores +inf dB and every fault below is the double's alone."""

import json
import re
import shutil

import numpy as np
import pytest
from board_cli import STAGE2_BUILD, port_engine_set, run_cli

from rkstudy import gates
from rkstudy.contract import beside
from rkstudy.families.port import architectures
from rkstudy.tables import results
from rkstudy.toolkit import convert

FRAMES, CONTEXT, MEL_FRAMES = 48, 8, 200
TREE = "rk3576"  # librknnrt 2.5.0: engines of toolkit 2.5.0 run
AT_RISK = {**STAGE2_BUILD, "regtask": 18, "regtask_max_value": 16352}


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """engines/: the window graph beside one placeholder engine per SoC; in.npz: a mel of several windows."""
    d = tmp_path_factory.mktemp("gate")
    port_engine_set(d, frames=FRAMES, context=CONTEXT, mel_frames=MEL_FRAMES, build=AT_RISK)
    return d


def board_run(d, tmp_path, *extra, env=None, check=None, engines_dir=None):
    return run_cli("board", "run", "port", "--engine", engines_dir or d / "engines", "--inputs", d / "in.npz",
                   "--results", tmp_path / "results", "--audio", tmp_path / "out.wav", *extra, board=TREE,
                   env={"TMPDIR": str(_tmp(tmp_path)), **(env or {})}, check=check)


def _tmp(tmp_path):
    (tmp_path / "tmp").mkdir(parents=True, exist_ok=True)
    return tmp_path / "tmp"


def one_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return lines[0]


def nothing_written(tmp_path):
    assert not (tmp_path / "results").exists() and not (tmp_path / "out.wav").exists()
    assert list((tmp_path / "tmp").iterdir()) == []  # the child's folder, its spool included, is gone


def windows(d) -> int:
    """How many windows the walk over the input takes (emit = frames - 2 x context)."""
    emit = FRAMES - 2 * CONTEXT
    return -(-MEL_FRAMES // emit)


# --- a clean engine passes, and says how ---------------------------------------------------------------------
def test_a_clean_run_is_gated_at_the_stage2_floor_and_the_row_records_the_verdict(engines, tmp_path):
    proc = board_run(engines, tmp_path, check=0)
    (row,) = results.read_table(tmp_path / "results" / "board" / "port.csv")
    floor = gates.ENGINE_FLOORS["white_noise"]
    assert row["gate"] == "board_vs_fp32_white_noise" and float(row["gate_threshold_db"]) == floor.db
    assert convert.ALIVE_GATE.threshold == floor.db  # stage 2 gates the simulator at the same floor
    n = windows(engines)
    assert row["gate_windows"] == f"{n} windows (0 too quiet to gate)"
    assert row["gate_worst_snr_db"] == "inf" and row["gate_nonfinite"] == "0" and row["gate_audio_snr_db"] == "inf"
    assert row["gate_reference"].startswith(f"fp32 onnxruntime on this board: voc_w{FRAMES}.onnx ")
    assert row["runtime_warning"] == ""
    assert "gate board_vs_fp32_white_noise passed" in proc.stdout
    assert (tmp_path / "out.wav").stat().st_size > 44


# --- the faults boards show ----------------------------------------------------------------------------------
@pytest.mark.parametrize("fault,at,said", [
    ("overflow", None, r"window \d+ of 7 of \S+ scored (-?\d+\.\d) dB against fp32 \(board_vs"),  # every window
    ("nan-tail", 3, r"window 3 of 7 of \S+ scored nan against fp32 \("),
    ("zeros", 2, r"window 2 of 7 of \S+ scored (0\.0) dB against fp32 \(board_vs"),
])
def test_a_fault_below_the_gate_fails_in_one_line_naming_the_build_and_writes_nothing(engines, tmp_path, fault, at,
                                                                                     said):
    env = {"RKNNLITE_REPLAY_FAULT": fault, **({"RKNNLITE_REPLAY_FAULT_AT": str(at)} if at else {})}
    proc = board_run(engines, tmp_path, env=env, check=1)
    line = one_line(proc.stderr)
    engine = f"port-w{FRAMES}-{TREE}-k.rknn"
    assert windows(engines) == 7
    assert line.startswith(f"rkstudy: error: {engine} failed the board gate: window ")
    m = re.search(said, line)
    assert m, line
    if m.groups():
        assert float(m.group(1)) < gates.ENGINE_FLOORS["white_noise"].db
    assert ("(board_vs_fp32_white_noise needs >= 15 dB and no non-finite value" in line
            and "the simulator scored 42.0 dB on the probe; its build logged 18 REGTASK lines, largest field value "
                "16,352 (field limit 16,383)" in line)  # rk3576's field is 14 bits wide (rkstudy.targets)
    assert "Fix: a narrower window" in line and "--toolkit 2.3.2" in line
    assert f"`rkstudy lint voc_w{FRAMES}.onnx`" in line
    if fault == "nan-tail":
        assert "non-finite values" in line and f"at ±{gates.FP16_MAX:g}" in line
    nothing_written(tmp_path)


def test_the_overflow_of_an_engine_past_its_field_is_named_as_one(engines, tmp_path):
    """An rk3588 engine whose largest field value is past rk3588's 13-bit field: the line says what it is."""
    proc = run_cli("board", "run", "port", "--engine", engines / "engines", "--inputs", engines / "in.npz",
                   "--results", tmp_path / "results", board="rk3588-librknnrt-2.5.0",
                   env={"RKNNLITE_REPLAY_FAULT": "overflow"}, check=1)
    assert ("largest field value 16,352 (field limit 8,191): a register-field overflow, which only a board shows"
            in one_line(proc.stderr))
    assert not (tmp_path / "results").exists()


def test_an_init_that_fails_with_the_runtimes_code_is_one_line_and_writes_nothing(engines, tmp_path):
    proc = board_run(engines, tmp_path, env={"RKNNLITE_REPLAY_INIT_CODE": "-3"}, check=1)
    line = one_line(proc.stderr)
    assert line.startswith(f"rkstudy: error: init_runtime(port-w{FRAMES}-{TREE}-k.rknn) failed with code -3 "
                           "(RKNN_ERR_DEVICE_UNAVAILABLE: device is unavailable; the NPU device is unavailable: the "
                           "rknpu driver is not loaded, or a killed run still holds it")
    nothing_written(tmp_path)


SEGFAULT = ("crashed inside the runtime (SIGSEGV): a graph librknnrt cannot run, as the rel-logit chain crashed it on "
            "the Piper duration-encoder pull request's board (rc=139); `rkstudy lint` on the engine's graph names the "
            "patterns known to do this, and `dmesg | tail` what the kernel saw; nothing was written")
SUBMIT = ("failed with code -1 (RKNN_ERR_FAIL: execute failed; the runtime could not run the engine: `dmesg | tail` "
          "names what the driver refused")


@pytest.mark.parametrize("fault,starts", [("segfault", f"the board run of port-w{FRAMES}-{TREE}-k.rknn {SEGFAULT}"),
                                          ("submit-fails", f"inference(port-w{FRAMES}-{TREE}-k.rknn) {SUBMIT}")])
def test_a_run_the_runtime_crashes_or_refuses_midway_is_one_line_and_writes_nothing(engines, tmp_path, fault, starts):
    """The child's supervision (a crash: the child dies on SIGSEGV in its second window) and the runner's (the
    driver refuses the second window's job): one line each, exit 1, nothing written."""
    proc = board_run(engines, tmp_path, env={"RKNNLITE_REPLAY_FAULT": fault, "RKNNLITE_REPLAY_FAULT_AT": "2"},
                     check=1)
    line = one_line(proc.stderr)
    assert line.startswith(f"rkstudy: error: {starts}"), line
    if fault == "submit-fails":
        assert 'RKNNLite caught "rknn_run failed. error code: RKNN_ERR_FAIL"' in line
        assert 'librknnrt said "failed to submit!"' in line
    nothing_written(tmp_path)


def test_the_runtimes_log_of_a_refused_inference_is_shown_under_debug(engines, tmp_path):
    debug = run_cli("--debug", "board", "run", "port", "--engine", engines / "engines", "--inputs",
                    engines / "in.npz", "--results", tmp_path / "results", board=TREE,
                    env={"RKNNLITE_REPLAY_FAULT": "submit-fails"}, check=1)
    assert "E Catch exception when running RKNN model." in debug.stderr


# --- timing only, and what the gate needs before the child starts --------------------------------------------
def test_no_gate_times_a_faulty_engine_and_records_the_row_as_ungated(engines, tmp_path):
    board_run(engines, tmp_path, "--no-gate", env={"RKNNLITE_REPLAY_FAULT": "zeros"}, check=0)
    (row,) = results.read_table(tmp_path / "results" / "board" / "port.csv")
    assert row["gate"] == "ungated (--no-gate: timing only)" and row["gate_worst_snr_db"] == ""


def test_an_engine_without_its_fp32_graph_is_refused_before_the_child(engines, tmp_path):
    folder = tmp_path / "engines"
    folder.mkdir()
    for p in (engines / "engines").glob(f"*-{TREE}-*"):
        shutil.copy(p, folder / p.name)
    proc = board_run(engines, tmp_path, engines_dir=folder, check=2)
    assert one_line(proc.stderr).startswith(
        f"rkstudy: error: the gate scores port-w{FRAMES}-{TREE}-k.rknn against voc_w{FRAMES}.onnx, the fp32 graph it "
        "was compiled from, and it is not beside the engine: copy it from the host (stage 2 writes it beside the "
        "engine)")
    nothing_written(tmp_path)


def test_a_contract_without_stage2s_build_record_is_refused_unless_ungated(engines, tmp_path):
    folder = tmp_path / "engines"
    shutil.copytree(engines / "engines", folder)
    engine = next(folder.glob(f"*-{TREE}-*.rknn"))
    d = json.loads(beside(engine).read_text())
    del d["build"]
    beside(engine).write_text(json.dumps(d))
    proc = board_run(engines, tmp_path, engines_dir=folder, check=2)
    assert "records no stage-2 build (its REGTASK count and the gate it passed)" in one_line(proc.stderr)
    nothing_written(tmp_path)
    board_run(engines, tmp_path, "--no-gate", engines_dir=folder, check=0)


# --- a reference carried from the host ----------------------------------------------------------------------
def test_a_reference_written_on_the_host_gates_the_board_run(engines, tmp_path):
    ref = tmp_path / "ref.npz"
    host = run_cli("board", "run", "port", "--engine", engines / "engines", "--inputs", engines / "in.npz",
                   "--write-reference", ref, check=0)  # no board: this host
    assert f"wrote {ref} (the fp32 reference of {windows(engines)} engine calls" in host.stdout
    board_run(engines, tmp_path, "--reference", ref, check=0)
    (row,) = results.read_table(tmp_path / "results" / "board" / "port.csv")
    assert row["gate_reference"].startswith("carried from the host: ref.npz ") and row["gate_worst_snr_db"] == "inf"
    faulty = board_run(engines, tmp_path / "f", "--reference", ref, env={"RKNNLITE_REPLAY_FAULT": "zeros"}, check=1)
    assert "failed the board gate" in one_line(faulty.stderr)
    other = tmp_path / "other.npz"
    np.savez(other, mel=np.zeros((1, architectures.MELS, MEL_FRAMES), np.float32))
    wrong = run_cli("board", "run", "port", "--engine", engines / "engines", "--inputs", other, "--reference", ref,
                    "--results", tmp_path / "r2", board=TREE, check=2)
    assert "was made from other inputs or another graph than this run's" in one_line(wrong.stderr)
