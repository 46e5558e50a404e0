"""The build wrapper against the real rknn-toolkit2 compiler (each build takes 1-4 s)."""

import os
import signal
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from rkstudy import graph
from rkstudy.errors import InputError, UsageError
from rkstudy.paths import REPO
from rkstudy.toolkit import build, cost, envs, forkserver
from rkstudy.toolkit import probes as toolchain
from rkstudy.toolkit.calibration import Calibration

pytestmark = pytest.mark.simulator


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    path = tmp_path_factory.mktemp("probe") / "vocoder_probe.onnx"
    onnx.save(toolchain.vocoder_probe(), str(path))
    return path


@pytest.mark.parametrize("target", ["rk3588", "rk3566"])
def test_build_produces_an_engine(probe, tmp_path, target):
    out = tmp_path / f"probe-{target}.rknn"
    report = build.build_engine(probe, target, out=out, reuse=False)
    assert report.status == "ok", report.error
    assert report.engine == str(out) and out.stat().st_size == report.engine_bytes > 10_000
    assert report.regtask == 0 and report.peak_rss_mb > 50  # the toolkit child's own peak RSS
    assert report.row()["where"] == "host"
    assert report.toolkit_version == "rknn-toolkit2 2.5.0"
    assert "rknn building done" in open(report.log).read()  # fd 1/2 of the compiler, captured
    # a build is verbose unless asked otherwise: its row carries the NPU cost model's prediction from the table
    row = report.row()
    if target == "rk3588":
        assert row["npu_ms_predicted"] > row["npu_ms_conv"] > 0 and row["npu_cycles"] > 0
        assert row["npu_ms_predicted"] == pytest.approx(sum(row[f"npu_ms_{k}"] for k in cost.TERMS), abs=6 * 5e-4)
        assert row["npu_cost_note"] == cost.PREDICTED_BY and row["npu_mask"] == build.NPU_MASK
    else:   # no DRAM figure for rk3566: the row says so and how to get one
        assert row["npu_ms_predicted"] == "" and "rkstudy board dram" in row["npu_cost_note"]
    quiet = build.build_engine(probe, target, out=tmp_path / f"quiet-{target}.rknn", reuse=False, verbose=False)
    assert quiet.row()["npu_ms_predicted"] == "" and "a verbose build prints them" in quiet.row()["npu_cost_note"]


def test_reuse_returns_the_recorded_build(probe, tmp_path):
    out = tmp_path / "probe.rknn"
    first = build.build_engine(probe, "rk3588", out=out)
    mtime = out.stat().st_mtime_ns
    again = build.build_engine(probe, "rk3588", out=out)
    assert again == first and out.stat().st_mtime_ns == mtime
    rebuilt = build.build_engine(probe, "rk3588", {"x": [1, 16, 1, 64]}, out=out, optimization_level=2)
    assert rebuilt.ok and out.stat().st_mtime_ns != mtime  # a different level is a different engine


def test_one_build_per_content_key_whoever_asks(tmp_path, monkeypatch):
    # a simulator run through the cache builds once; a build, a second simulator run on the same input and
    # the same graph saved under another name (as the lint study saves it) read that build back
    from rkstudy.lint import compiler
    from rkstudy.toolkit import convert as engine

    monkeypatch.setenv("RKSTUDY_CACHE", str(tmp_path / "cache"))
    path = toolchain.save_probe(toolchain.vocoder_probe(), "vocoder_probe_t64")
    x = np.random.default_rng(1).standard_normal((1, 16, 1, 64)).astype(np.float32)
    first = engine.simulator_vs_fp32(path, "rk3588", [{"x": x}], cache=True, verbose=True)
    assert first.report.ok and first.rows[0]["where"] == "simulator" and first.rows[0]["snr_db"] > 40
    children = []
    monkeypatch.setattr(build.EngineProcess, "__init__", lambda *a, **k: children.append(a) or 1 / 0)
    assert build.build_engine(path, "rk3588") == first.report
    again = engine.simulator_vs_fp32(path, "rk3588", [[x]], cache=True)
    assert again.rows[0]["snr_db"] == first.rows[0]["snr_db"] and again.report == first.report
    verdict = compiler.ask(toolchain.vocoder_probe(), "rk3588", {"x": x}, name="renamed")
    assert verdict.built and verdict.snr_db == first.rows[0]["snr_db"] and verdict.layers
    assert children == []
    with pytest.raises(ZeroDivisionError):  # another input is another simulator run
        engine.simulator_vs_fp32(path, "rk3588", [{"x": 2 * x}], cache=True)


def test_regtask_lines_are_counted_with_their_magnitude(tmp_path):
    path = tmp_path / "long.onnx"
    onnx.save(toolchain.long_axis_probe(32768), str(path))
    report = build.build_engine(path, "rk3588", out=tmp_path / "long.rknn", reuse=False)
    assert report.ok
    assert report.regtask >= 10
    assert report.regtask_max > graph.REGISTER_FIELD_MAX


def test_regtask_limit_kills_the_build(tmp_path):
    path = tmp_path / "long.onnx"
    onnx.save(toolchain.long_axis_probe(32768), str(path))
    report = build.build_engine(path, "rk3588", out=tmp_path / "long.rknn", regtask_limit=5, reuse=False)
    assert report.status == "regtask-limit"
    assert report.failed_step == "build"  # the step that was running, not load_onnx (the last one that finished)
    assert report.regtask > 5 and report.engine is None
    assert not (tmp_path / "long.rknn").exists()
    assert report.row()["npu_cost_note"] == "cannot speak: the build regtask-limit and made no engine"
    with pytest.raises(build.BuildFailed, match="regtask-limit .*13-bit field"):
        report.raise_for_status()


def test_a_compiler_crash_comes_back_as_a_report(probe, tmp_path):
    # signalled at once, not after a delay: a probe build can finish inside any fixed delay
    proc = build.EngineProcess(probe, "rk3588", out=tmp_path / "x.rknn")
    os.kill(proc.proc.pid, signal.SIGSEGV)
    report = proc.wait_built()
    assert report.status == "aborted"
    assert "SIGSEGV" in report.error
    assert report.engine is None


def test_a_toolkit_error_is_its_reason_not_its_traceback(tmp_path):
    """The toolkit re-raises with the inner traceback as the message; the row keeps the last line."""
    model = toolchain.vocoder_probe()
    model.opset_import[0].version = 20
    path = tmp_path / "opset20.onnx"
    onnx.save(model, str(path))
    report = build.build_engine(path, "rk3588", out=tmp_path / "opset20.rknn", reuse=False)
    assert report.status == "failed" and report.failed_step == "load_onnx"
    assert report.error.startswith("ValueError: Unsupport onnx opset 20") and "Traceback" not in report.error


def test_a_failing_step_is_named(tmp_path):
    # a graph onnx reads but the toolkit's loader rejects: an input shape the graph does not have
    path = tmp_path / "probe.onnx"
    onnx.save(toolchain.vocoder_probe(), str(path))
    report = build.build_engine(path, "rk3588", {"x": [1, 16, 1, 64], "nosuch": [1, 4]}, out=tmp_path / "bad.rknn",
                                reuse=False)
    assert report.status == "failed" and report.failed_step == "load_onnx"
    with pytest.raises(build.BuildFailed, match="failed at load_onnx") as exc:
        report.raise_for_status()
    assert "\n" not in str(exc.value)  # one line, naming the log


def test_an_unreadable_graph_is_refused_before_a_child_starts(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"this is not an onnx model")
    with pytest.raises(InputError, match="not a readable ONNX model"):
        build.build_engine(bad, "rk3588", {"x": [1, 4]}, out=tmp_path / "bad.rknn", reuse=False)


def test_a_hung_build_is_killed_at_its_timeout(probe, tmp_path):
    proc = build.EngineProcess(probe, "rk3588", out=tmp_path / "x.rknn", timeout=0.05)  # the build takes ~0.4 s
    report = proc.wait_built()
    assert report.status == "timeout" and "killed after 0 s" in report.error
    assert report.engine is None and not (tmp_path / "x.rknn").exists()


def test_a_build_forked_from_the_fork_server_is_the_fresh_interpreters_build(probe, tmp_path, monkeypatch):
    """The fork server only saves the imports: the same engine, the same toolkit and log, the same REGTASK
    count; and the child runs in the requester's environment as it is now, not as it was when the server
    started (a variable set after the first build reaches the second)."""
    forked = build.build_engine(probe, "rk3588", out=tmp_path / "forked.rknn", reuse=False)
    monkeypatch.setenv("RKNN_LOG_LEVEL", "5")  # the toolkit reads it: a chattier build log
    chatty = build.build_engine(probe, "rk3588", out=tmp_path / "chatty.rknn", reuse=False)
    monkeypatch.setenv(forkserver.FORK_SERVER_ENV, "0")
    monkeypatch.delenv("RKNN_LOG_LEVEL")
    fresh = build.build_engine(probe, "rk3588", out=tmp_path / "fresh.rknn", reuse=False)
    assert forked.status == fresh.status == "ok" and forked.toolkit_version == fresh.toolkit_version
    assert forked.engine_bytes == fresh.engine_bytes and forked.regtask == fresh.regtask == 0
    quiet = Path(forked.log).read_text().count("\n")
    assert abs(quiet - Path(fresh.log).read_text().count("\n")) <= 2
    assert Path(chatty.log).read_text().count("\n") > quiet


def test_a_killed_build_leaves_no_partial_engine(probe, tmp_path):
    out = tmp_path / "x.rknn"
    out.write_bytes(b"a stale engine from an older build")
    proc = build.EngineProcess(probe, "rk3588", out=out)
    assert not out.exists()  # the stale engine is gone before the child starts
    # a half-exported engine under the child's temporary name, then the kill: killing at once
    # is deterministic, where a timed kill raced the probe build on a fast runner (CI saw "ok")
    proc._partial.write_bytes(b"half an engine")
    os.kill(proc.proc.pid, signal.SIGKILL)
    report = proc.wait_built()
    assert report.status == "aborted" and "SIGKILL" in report.error and not out.exists()
    assert not list(tmp_path.glob(".*part*"))


def test_unknown_target_is_refused_before_any_work(probe):
    with pytest.raises(UsageError, match="rk3588, rk3566"):
        build.build_engine(probe, "rk3399")


def test_the_toolkit_leaves_nothing_in_the_callers_directory(probe, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    report = build.build_engine(probe, "rk3588", out=tmp_path / "out" / "e.rknn", reuse=False)
    assert report.ok
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no check*.onnx beside the caller


def test_the_peak_rss_is_the_childs_own_not_the_callers(probe, tmp_path):
    """wait4's ru_maxrss of a fork/vfork+exec child is floored by the parent's high-water mark at
    exec; the child's own VmHWM is not. A caller holding 1.5 GB must not show up in the build."""
    import resource

    ballast = bytearray(1536 << 20)
    ballast[::4096] = b"\1" * len(ballast[::4096])  # touch every page: resident, not just reserved
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 > 1536
    report = build.build_engine(probe, "rk3588", out=tmp_path / "p.rknn", reuse=False)
    del ballast
    assert report.ok and 50 < report.peak_rss_mb < 1400, report.peak_rss_mb


def _calibration(reference, **settings):
    rng = [np.random.default_rng(s) for s in reference]
    return Calibration([{"x": r.standard_normal((1, 16, 1, 64)).astype(np.float32)} for r in rng], **settings)


def test_calibration_writes_the_dataset_the_toolkit_reads(tmp_path):
    two = Calibration([{"b": np.ones(2), "a": np.zeros(3)}, {"a": np.ones(3), "b": np.zeros(2)}])
    dataset = two.write(tmp_path / "cal", ["a", "b"])
    lines = dataset.read_text().splitlines()
    assert len(lines) == 2  # one line per sample, its arrays in input order
    first = [np.load(p) for p in lines[0].split()]
    assert [a.shape for a in first] == [(3,), (2,)] and first[0].sum() == 0
    assert two.label == "int8 w8a8" and Calibration(two.feeds, dtype="w16a16i_dfp").label.startswith("int16")
    assert Calibration(two.feeds, algorithm="mmse").label == "int8 w8a8 mmse"
    with pytest.raises(UsageError, match="no array for b"):
        Calibration([{"a": np.ones(3)}]).write(tmp_path / "bad", ["a", "b"])
    with pytest.raises(UsageError, match="at least one calibration feed"):
        Calibration([])


def test_an_int8_build_is_quantized_and_keyed_by_its_calibration(probe, tmp_path):
    out = tmp_path / "q.rknn"
    report = build.build_engine(probe, "rk3588", out=out, quantize=_calibration(range(4)))
    fp16 = build.build_engine(probe, "rk3588", out=tmp_path / "h.rknn")
    assert report.ok and report.dtype == "int8 w8a8" and report.row()["dtype"] == "int8 w8a8"
    assert fp16.row()["dtype"] == "fp16" and report.engine_bytes < fp16.engine_bytes  # int8 weights
    mtime = out.stat().st_mtime_ns
    assert build.build_engine(probe, "rk3588", out=out, quantize=_calibration(range(4))) == report
    assert out.stat().st_mtime_ns == mtime  # the same calibration content: reused
    other = build.build_engine(probe, "rk3588", out=out, quantize=_calibration([9]))
    assert other.ok and out.stat().st_mtime_ns != mtime  # another calibration set is another engine


def test_the_simulator_serves_an_int8_engine_with_its_quantization_noise(probe):
    """The probe's Snake after a transposed conv in int8: measured 32.8 dB against fp32 where fp16
    gives 63.2 dB (toolkit 2.5.0, rk3588, calibration reference 0-3, input seed 100)."""
    from rkstudy import gates
    from rkstudy.runtime import OrtRunner
    from rkstudy.toolkit.simulator import SimulatorRunner

    x = {"x": np.random.default_rng(100).standard_normal((1, 16, 1, 64)).astype(np.float32)}
    ref = OrtRunner(probe).run(x)[0]
    with SimulatorRunner(probe, "rk3588", quantize=_calibration(range(4))) as sim:
        assert sim.report.dtype == "int8 w8a8"
        int8 = gates.snr_db(ref, sim.run(x)[0])
    with SimulatorRunner(probe, "rk3588") as sim:
        fp16 = gates.snr_db(ref, sim.run(x)[0])
    assert 25 < int8 < 40 and fp16 > 55, (int8, fp16)


@pytest.mark.simulator
def test_a_hybrid_build_keeps_the_named_layers_in_float16(probe, tmp_path):
    """hybrid_quantization_step1 -> config edit -> step2: the ConvTranspose whose output tensor is
    `h2` stays FLOAT16 in the compiled layer table, the two Convs stay INT8, and the label and the
    engine cache key name what was built."""
    from rkstudy.toolkit.log import layer_table

    hybrid = _calibration(range(4), keep_fp16=["h2"])
    assert hybrid.label == "int8 w8a8 hybrid (1 layer fp16)"
    report = build.build_engine(probe, "rk3588", out=tmp_path / "hy.rknn", quantize=hybrid, verbose=True)
    assert report.ok, report.error
    assert report.dtype == report.row()["dtype"] == "int8 w8a8 hybrid (1 layer fp16)"
    dtypes = {layer.node: layer.dtype for layer in layer_table(open(report.log).read())}
    assert dtypes["up"] == "FLOAT16" and dtypes["conv_pre"] == dtypes["conv_post"] == "INT8", dtypes
    plain = _calibration(range(4))
    assert hybrid.key(["x"]) != plain.key(["x"]) != _calibration(range(4), auto_hybrid_cos=0.99).key(["x"])
    with pytest.raises(UsageError, match="pass one"):
        _calibration([0], keep_fp16=["h2"], auto_hybrid_cos=0.99)


@pytest.mark.simulator
def test_a_hybrid_build_refuses_a_layer_the_toolkit_does_not_quantize(probe, tmp_path):
    report = build.build_engine(probe, "rk3588", out=tmp_path / "bad.rknn",
                                quantize=_calibration([0], keep_fp16=["nope"]))
    assert report.status == "failed" and report.failed_step == "hybrid_quantization_step1"
    assert "no quantized layer named 'nope'" in report.error and "'h1'" in report.error


@pytest.mark.simulator
def test_an_auto_hybrid_build_lets_the_toolkit_choose_float16_layers(probe, tmp_path):
    """At cosine 0.9999 the toolkit moves the probe's tail (ConvTranspose onwards) to float16 and
    keeps the first Conv in int8 (toolkit 2.5.0, rk3588, calibration reference 0-3)."""
    from rkstudy.toolkit.log import layer_table

    auto = _calibration(range(4), auto_hybrid_cos=0.9999)
    report = build.build_engine(probe, "rk3588", out=tmp_path / "auto.rknn", quantize=auto, verbose=True)
    assert report.ok and report.dtype == "int8 w8a8 auto-hybrid cos 0.9999", report.error
    dtypes = {layer.node: layer.dtype for layer in layer_table(open(report.log).read())}
    assert dtypes["conv_pre"] == "INT8" and dtypes["up"] == "FLOAT16", dtypes


def _fake_environment(root, version, marker):
    """A `.venv-rknn-<version>` under `root` whose python records that it ran, then runs this one."""
    venv = root / f".venv-rknn-{version}"
    (venv / "lib" / "python3.11" / "site-packages" / f"rknn_toolkit2-{version}.dist-info").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.parent.mkdir()
    python.write_text(f'#!/bin/sh\necho "$@" >> {marker}\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return python


@pytest.mark.simulator
def test_a_build_runs_in_the_chosen_environments_interpreter(probe, tmp_path, monkeypatch):
    monkeypatch.setenv("RKSTUDY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(envs, "REPO", tmp_path)
    marker = tmp_path / "ran"
    python = _fake_environment(tmp_path, "9.9.9", marker)
    env = envs.toolkit_env("9.9.9")
    assert env == envs.Toolkit(str(python), "rknn-toolkit2 9.9.9")  # read from the environment's metadata
    assert envs.toolkit_env("2.5.0").python == sys.executable  # the version installed here is this one
    here = build.build_engine(probe, "rk3588")
    there = build.build_engine(probe, "rk3588", toolkit="9.9.9")
    assert "rkstudy.toolkit._child" in marker.read_text()  # the child ran under the chosen interpreter
    assert here.ok and there.ok and here.engine != there.engine  # the toolkit keys the cache
    # the version a report names is the one the child imported, not the one its environment's name claims
    assert there.toolkit_version == here.toolkit_version == "rknn-toolkit2 2.5.0"


def test_a_missing_toolkit_environment_names_the_command_that_makes_it(probe, capsys):
    from rkstudy import cli
    from rkstudy.errors import NeedsConverter

    with pytest.raises(NeedsConverter, match=r"make toolkit-venv TOOLKIT=0\.0\.1"):
        envs.toolkit_env("0.0.1")
    assert cli.main(["build", str(probe), "--toolkit", "0.0.1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "make toolkit-venv TOOLKIT=0.0.1" in err[0]


@pytest.mark.simulator
@pytest.mark.skipif(not (REPO / ".venv-rknn-2.3.2").is_dir(),
                    reason="no 2.3.2 environment: make toolkit-venv TOOLKIT=2.3.2 (make test makes it)")
def test_toolkit_2_3_2_builds_and_simulates_in_its_own_environment(probe, tmp_path, capsys):
    import json

    from rkstudy import cli
    from rkstudy.toolkit.convert import simulator_vs_fp32

    report = build.build_engine(probe, "rk3588", out=tmp_path / "probe-2.3.2.rknn", reuse=False, toolkit="2.3.2")
    assert report.ok and report.toolkit_version == "rknn-toolkit2 2.3.2"
    assert report.engine_bytes > 10_000 and report.regtask == 0
    x = np.random.default_rng(1).standard_normal((1, 16, 1, 64)).astype(np.float32)
    sim = simulator_vs_fp32(probe, "rk3588", [{"x": x}], toolkit="2.3.2")
    assert sim.report.toolkit_version == "rknn-toolkit2 2.3.2" and sim.worst_snr_db > 40
    assert cli.main(["build", str(probe), "--toolkit", "2.3.2", "--out", str(tmp_path / "cli.rknn")]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["toolkit_version"] == "rknn-toolkit2 2.3.2" and printed["status"] == "ok"


def test_a_simulation_is_made_once_per_content_key(probe, tmp_path, monkeypatch):
    """simulate() builds and runs once; the same graph, target and feeds asked again are answered from
    the cache with no toolkit child (one is refused here), and so is a plain build_engine of that graph.
    The replayed runner answers the recorded feeds, bit for bit, and refuses any other."""
    from rkstudy.toolkit.simulator import simulate

    monkeypatch.setenv("RKSTUDY_CACHE", str(tmp_path / "cache"))
    feeds = [{"x": np.random.default_rng(s).standard_normal((1, 16, 1, 64)).astype(np.float32)} for s in (1, 2)]
    first = simulate(probe, "rk3588", feeds)
    assert first.report.ok and len(first.outputs) == 2 and len(first.run_s) == 2 and first.peak_rss_mb > 50
    monkeypatch.setenv(build.NO_CHILD_ENV, "answered from the cache")
    again = simulate(probe, "rk3588", feeds)
    assert again.report == first.report and again.run_s == first.run_s
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(first.outputs, again.outputs))
    assert build.build_engine(probe, "rk3588") == first.report
    replay = again.replay(["x"])
    assert (replay.where, replay.target) == ("simulator", "rk3588")
    assert np.array_equal(replay.run(feeds[1])[0], first.outputs[1][0])
    with pytest.raises(KeyError, match="not one the simulator ran"):
        replay.run({"x": feeds[0]["x"] + 1})
    with pytest.raises(UsageError, match="starts no toolkit child"):
        simulate(probe, "rk3588", feeds[:1])  # other feeds: another key, which would build


def test_the_int16_overflow_mode_is_a_float_build_keyed_apart(probe, tmp_path):
    """Calibration(int16_overflow=True) is rknn.build(do_quantization=False, auto_hybrid=True): a float
    engine (fp16 everywhere the range allows), labelled as such and keyed apart from the plain fp16 build."""
    int16 = _calibration(range(2), int16_overflow=True)
    assert int16.label == "fp16 auto-hybrid int16" and int16.key(["x"]) != _calibration(range(2)).key(["x"])
    with pytest.raises(UsageError, match="int16_overflow is a float build"):
        _calibration(range(2), int16_overflow=True, keep_fp16=["h2"])
    report = build.build_engine(probe, "rk3588", out=tmp_path / "i16.rknn", quantize=int16)
    fp16 = build.build_engine(probe, "rk3588", out=tmp_path / "f16.rknn")
    assert report.ok, report.error
    assert report.dtype == "fp16 auto-hybrid int16" and report.engine != fp16.engine


def test_a_killed_builds_regtask_count_is_the_limits_lower_bound_not_the_pipes_timing(tmp_path):
    """Lines still in the pipe after the kill are not counted: how many arrive depends on the kill's
    timing (20,001 one run, 20,234 the next), so the count of a killed build is the first line past the
    limit, the same every run, and its error says it is a lower bound."""
    import threading
    from collections import deque
    from types import SimpleNamespace

    line = ("E RKNN: [20:11:21.216] REGTASK: The bit width of field value exceeds the limit, target: v2, offset: "
            "0x4038, shift = 19, limit: 0x1fff, value: {:#x}\n")
    for arriving in (12, 40):  # lines the child had written before the kill landed
        proc = object.__new__(build.EngineProcess)
        proc.log, proc.tail = tmp_path / "build.log", deque(maxlen=10)
        proc.regtask = proc.regtask_max = 0
        proc.regtask_limit, proc.killed_for_regtask = 5, False
        proc._capture, proc._marked = None, threading.Event()  # no session variant is building
        proc._kill = lambda: None
        proc.proc = SimpleNamespace(stdout=[line.format(0x2000 + k).encode() for k in range(arriving)])
        proc._pump()
        assert proc.killed_for_regtask and (proc.regtask, proc.regtask_max) == (6, 0x2005)
