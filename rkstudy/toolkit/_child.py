"""Child side of rkstudy.toolkit.build: runs the toolkit in its own process.

`python -m rkstudy.toolkit._child SPEC_JSON CONTROL_FD` (or `forked`, the same in a process forked from
the fork server that imported the toolkit once: rkstudy.toolkit.forkserver.start_child) runs config (with the spec's
`dynamic_input` shape sets, when it has them) -> load_onnx -> build (fp16, or
quantized on the spec's calibration dataset, or hybrid_quantization_step1 -> step2 when layers are to
stay float16) ->
(accuracy_analysis on each of the spec's input sets, when it asks for it) ->
export_rknn, then (when the spec asks to serve) init_runtime on the simulator and answers
inference requests until told to stop, then release. Its fds 1 and 2 belong to the parent, which
logs them and counts REGTASK lines; the control fd (a multiprocessing Connection) carries the
step reports and the arrays, so the compiler's own output can never corrupt them.

A quantization session (spec `session`) calibrates once (hybrid_quantization_step1), reports every
tensor of the toolkit's quantization config, then builds one variant per request (step2 with the
request's tensors in float16: no tensors is the plain quantized build, bit for bit), each exported,
started on the simulator and served until the next request: the calibration pass, the costly half of a
quantized build, runs once for any number of hybrid choices.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

from rkstudy.tables.results import toolkit_version


def _send(conn: Connection, msg: dict) -> None:
    """Every message carries this process's own peak RSS so far (the parent's only honest source
    for it: see rkstudy.toolkit.build.EngineProcess._recv)."""
    from rkstudy.process import peak_rss_kb

    conn.send({**msg, "peak_rss_kb": peak_rss_kb()})


def _reason(exc: Exception) -> str:
    """`Type: message`; the toolkit re-raises its errors with the whole inner traceback as the
    message, whose last line is the reason ("ValueError: Unsupport onnx opset 20, need <= 19!")."""
    text = str(exc)
    if "Traceback (most recent call last)" in text:
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return lines[-1] if lines else type(exc).__name__
    return f"{type(exc).__name__}: {text}"


# Printed before every ready, done or refused: the parent counts REGTASK lines from the log pipe in its own
# thread, and the event arrives on another channel, often before the log's last lines are read (under load the
# count came out 0 where the compiler printed 14). Once the pump has read the mark, it has every line before it.
LOG_MARK = "rkstudy: build logged"


def logged() -> None:
    """Everything the compiler wrote so far pushed into the log pipe (C stdio too), then the mark."""
    import ctypes

    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass
    print(LOG_MARK, flush=True)


def quantization_config(folder: Path) -> Path:
    """The one quantization config hybrid_quantization_step1 wrote under `folder`."""
    found = sorted(folder.glob("*.quantization.cfg"))
    if len(found) != 1:
        raise RuntimeError(f"hybrid_quantization_step1 left {len(found)} quantization configs in {folder}, not one")
    return found[0]


def config_tensors(cfg_path: Path) -> list[dict]:
    """Every tensor of a quantization config in its order: name and dtype (float32 for the graph's own
    float inputs and outputs, which no setting changes)."""
    import yaml

    cfg = yaml.safe_load(cfg_path.read_text())
    return [{"name": name, "dtype": p.get("dtype", "")} for name, p in (cfg.get("quantize_parameters") or {}).items()]


def keep_in_float16(folder: Path, layers: list[str], out: Path | None = None) -> Path:
    """Set `layers` (tensor names of the config, as accuracy_analysis names them or as the config lists
    the casts and compiler-made tensors it adds) to float16 in the quantization config
    hybrid_quantization_step1 wrote under `folder`; the path written (`out`, or the config itself). A
    name the config does not quantize is an error naming a few it does, since the toolkit would
    silently ignore it."""
    import yaml

    source = quantization_config(folder)
    cfg = yaml.safe_load(source.read_text())
    quantized = [name for name, p in (cfg.get("quantize_parameters") or {}).items() if p.get("dtype") != "float32"]
    unknown = [name for name in layers if name not in quantized]
    if unknown:
        raise ValueError(f"no quantized layer named {', '.join(map(repr, unknown[:5]))} in the toolkit's "
                         f"quantization config; it quantizes e.g. {', '.join(map(repr, quantized[:5]))}")
    cfg["custom_quantize_layers"] = {**(cfg.get("custom_quantize_layers") or {}), **dict.fromkeys(layers, "float16")}
    target = out or source
    target.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return target


def _step2(run: Callable, rknn, cfg: Path) -> None:
    """hybrid_quantization_step2 on the model and data step 1 wrote beside `cfg`."""
    stem = cfg.parent / quantization_config(cfg.parent).name.removesuffix(".quantization.cfg")
    run("hybrid_quantization_step2", lambda: rknn.hybrid_quantization_step2(
        f"{stem}.model", f"{stem}.data", str(cfg)))


def _infer(conn: Connection, rknn, msg) -> None:
    """One simulator inference request answered; an error is reported and serving goes on (one bad input
    is not fatal)."""
    try:
        fmt = ["nchw" if x.ndim == 4 else None for x in msg]
        outs = rknn.inference(inputs=list(msg), data_format=fmt if any(fmt) else None)
        if outs is None:
            raise RuntimeError("rknn.inference returned None (see the engine log)")
        _send(conn, {"event": "outputs", "outputs": [o for o in outs]})
    except Exception as exc:
        _send(conn, {"event": "error", "error": f"{type(exc).__name__}: {exc}"})


def _session(conn: Connection, rknn, configured: Callable, run: Callable, quantize: dict, spec: dict) -> int:
    """The quantization session (see the module docstring): step 1 once, then one variant per request
    ({"keep": [tensor names], "out": engine path}), inference requests (lists of arrays) served by the
    latest variant, until None. A variant the toolkit refuses is reported (`refused`, its error) and the
    session goes on; a toolkit crash ends the child, and the parent reports the signal."""
    run("hybrid_quantization_step1", lambda: rknn.hybrid_quantization_step1(dataset=quantize["dataset"]))
    rknn.release()
    folder = Path.cwd()
    logged()
    _send(conn, {"event": "ready", "tensors": config_tensors(quantization_config(folder))})
    current = None
    while True:
        msg = conn.recv()
        if msg is None:
            break
        if not isinstance(msg, dict):
            _infer(conn, current, msg) if current is not None else _send(
                conn, {"event": "error", "error": "no variant is built: request one first"})
            continue
        if current is not None:
            current.release()
            current = None
        try:
            _send(conn, {"event": "start", "step": "hybrid_quantization_step2"})  # the config is step 2's input
            cfg = keep_in_float16(folder, list(msg["keep"]), out=folder / "variant.cfg")
            current = configured()
            _step2(run, current, cfg)
            run("export_rknn", lambda built=current, out=msg["out"]: built.export_rknn(out))
            run("init_runtime", lambda built=current: built.init_runtime(target=None))
            logged()
            _send(conn, {"event": "ready"})
        except Exception as exc:
            traceback.print_exc()
            logged()
            if current is not None:
                current.release()
                current = None
            _send(conn, {"event": "refused", "error": _reason(exc)})
    if current is not None:
        current.release()
    _send(conn, {"event": "done"})
    return 0


def main(spec_path: str, fd: str) -> int:
    conn = Connection(int(fd))
    with open(spec_path, encoding="utf-8") as fh:
        spec = json.load(fh)
    step = "import"

    def run(name: str, call: Callable[[], object]) -> None:
        """Announce the step before it runs, so a timeout or a signal names the step that was
        running (not the last one that finished), then report its return code."""
        nonlocal step
        step = name
        _send(conn, {"event": "start", "step": name})
        rc = call()
        _send(conn, {"event": "step", "step": name, "rc": rc})
        if rc not in (0, None):
            raise RuntimeError(f"rknn.{name} returned {rc}")

    try:
        # this interpreter's toolkit, which may not be the parent's (rkstudy.toolkit.envs.toolkit_env)
        _send(conn, {"event": "start", "step": step, "toolkit": toolkit_version()})
        from rknn.api import RKNN

        quantize = spec.get("quantize") or {}
        settings = {k: quantize[k] for k in ("quantized_dtype", "quantized_algorithm", "quantized_method")} \
            if quantize else {}
        if quantize.get("auto_hybrid_cos") is not None:
            settings["auto_hybrid_cos_thresh"] = quantize["auto_hybrid_cos"]
        if spec.get("dynamic_input"):
            # [[shape of each input, in order], ...]: the toolkit compiles one engine for every set
            settings["dynamic_input"] = spec["dynamic_input"]

        def configured() -> RKNN:
            made = RKNN(verbose=spec.get("verbose", False))
            run("config", lambda: made.config(target_platform=spec["target"], float_dtype="float16",
                                              optimization_level=spec["optimization_level"], **settings))
            return made

        rknn = configured()
        # a multi-shape build takes its shapes from dynamic_input alone (load_onnx's sizes would pin one)
        names = [] if spec.get("dynamic_input") else list(spec["inputs"])
        run("load_onnx", lambda: rknn.load_onnx(model=spec["onnx"], inputs=names or None,
                                                input_size_list=[spec["inputs"][n] for n in names] or None,
                                                outputs=spec.get("outputs")))
        if spec.get("session"):
            return _session(conn, rknn, configured, run, quantize, spec)
        if quantize.get("keep_fp16"):
            # step 1 writes <model>.model/.data/.quantization.cfg into the working directory (this
            # child's own); step 2 reads them back in a fresh instance, as the toolkit's own examples do
            run("hybrid_quantization_step1", lambda: rknn.hybrid_quantization_step1(dataset=quantize["dataset"]))
            rknn.release()
            cfg = keep_in_float16(Path.cwd(), quantize["keep_fp16"])
            rknn = configured()
            _step2(run, rknn, cfg)
        else:
            # int16_overflow: a float build whose layers past the fp16 range compute in int16 (the dataset
            # gives the ranges); otherwise a quantized build, auto-hybrid when a cosine threshold is set
            float_build = bool(quantize.get("int16_overflow"))
            run("build", lambda: rknn.build(do_quantization=bool(quantize) and not float_build,
                                            dataset=quantize.get("dataset"),
                                            auto_hybrid=float_build or quantize.get("auto_hybrid_cos") is not None))
        analyses = spec.get("analysis") or []
        for analysis in [analyses] if isinstance(analyses, dict) else analyses:  # one input set, or several
            run("accuracy_analysis", lambda one=analysis: rknn.accuracy_analysis(
                inputs=one["inputs"], output_dir=one["output_dir"], target=None))
        if spec.get("out"):
            run("export_rknn", lambda: rknn.export_rknn(spec["out"]))
        if spec.get("serve"):
            run("init_runtime", lambda: rknn.init_runtime(target=None))
            logged()
            _send(conn, {"event": "ready"})
            while True:
                msg = conn.recv()
                if msg is None:
                    break
                _infer(conn, rknn, msg)
        step = "release"
        rknn.release()
        logged()
        _send(conn, {"event": "done"})
        return 0
    except Exception as exc:
        traceback.print_exc()
        _send(conn, {"event": "failed", "step": step, "error": _reason(exc)})
        return 1


def forked(spec_path: str, conn_fd: int, out_fd: int, workdir: str) -> int:
    """main() in a process the fork server forked: it already holds the toolkit's modules, so a build
    starts without importing them again (about 2.5 s of a one-op probe's 3 s here). Made to look like
    the exec'd child: its own session (the parent kills the group), its own directory, fds 1 and 2 on
    the socket the parent logs and counts REGTASK lines from."""
    os.setsid()
    os.chdir(workdir)
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    os.close(out_fd)
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
    rc = main(spec_path, str(conn_fd))
    sys.stdout.flush()
    sys.stderr.flush()
    return rc


def fork_server(control_fd: int) -> int:
    """The fork server (rkstudy.toolkit.forkserver.ForkServer): import the toolkit once, then fork one child
    per request. A request is a JSON line {spec, workdir, env} with two fds (the child's control socket and
    its output socket); the reply is {"pid"}, and every child the server reaps is reported as {"pid",
    "status"}. It exits when the parent closes the control socket (the children, each in its own
    session, finish on their own)."""
    import select
    import socket

    import rknn.api  # noqa: F401  (what every child would import: the point of the server)

    control = socket.socket(fileno=control_fd)
    children: set[int] = set()

    def report_exits() -> None:
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                control.sendall(json.dumps({"pid": pid, "status": os.waitstatus_to_exitcode(status)}).encode() + b"\n")

    while True:
        ready, _, _ = select.select([control], [], [], 0.1)
        report_exits()
        if not ready:
            continue
        msg, fds, _, _ = socket.recv_fds(control, 1 << 20, 2)
        if not msg:
            return 0
        request = json.loads(msg)
        pid = os.fork()
        if pid == 0:
            control.close()
            os.environ.clear()
            os.environ.update(request["env"])  # the requester's environment now, not the server's at its start
            try:
                rc = forked(request["spec"], fds[0], fds[1], request["workdir"])
            except BaseException:  # noqa: BLE001 - the child must end here, never return into the server loop
                traceback.print_exc()
                rc = 1
            os._exit(rc)
        for fd in fds:
            os.close(fd)
        children.add(pid)
        control.sendall(json.dumps({"pid": pid}).encode() + b"\n")


if __name__ == "__main__" and sys.argv[1:2] == ["--fork-server"]:
    sys.exit(fork_server(int(sys.argv[2])))
elif __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
