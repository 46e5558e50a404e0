"""One engine build (and optional simulator run) with the converter's memory measured.

Run as a fresh process per build (`python measure.py ONNX OUT_JSON [--refs REFS.npz]`), so
that resource.getrusage(RUSAGE_CHILDREN) covers exactly this one toolkit child. Besides that
whole-life peak, a psutil thread polls the child's process tree every 0.1 s and keeps the peak
of its summed RSS per phase: `build` (config, load_onnx, build, export_rknn: the converter) and
`runtime` (simulator init and inference, when --refs asks for a simulator run). The phase is the
last step the child reported, which rkstudy.toolkit.build.EngineProcess records as `step`.

With --refs, the npz holds, per token count n, `feed_input_n` / `feed_lengths_n` (the padded
engine feed) and `stats_n` / `cond_n` (the fp32 raw slice at exact length): the simulator's
outputs are compared on the first n frames (SNR and max |diff|, as piper_encoder does).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import threading
import time
from pathlib import Path

import numpy as np

BUILD_STEPS = (None, "import", "config", "load_onnx", "build")  # last step done -> still converting


class TreePeak:
    """Peak summed RSS of a process and its descendants, split by the build phase."""

    def __init__(self, engine_process, interval: float = 0.1):
        import psutil

        self._ep = engine_process
        self._root = psutil.Process(engine_process.proc.pid)
        self._interval = interval
        self.build_peak = 0
        self.runtime_peak = 0
        self.build_cpu = 0.0  # CPU seconds of the child up to the last sample of the build phase
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _rss(self) -> int:
        import psutil

        total = 0
        try:
            procs = [self._root] + self._root.children(recursive=True)
        except psutil.Error:
            return 0
        for p in procs:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        return total

    def _cpu(self) -> float:
        import psutil

        try:
            t = self._root.cpu_times()
        except psutil.Error:
            return 0.0
        return t.user + t.system + t.children_user + t.children_system

    def _poll(self) -> None:
        while not self._stop.is_set():
            step = self._ep.step  # read before sampling: a sample is never credited to an earlier phase
            rss = self._rss()
            if step in BUILD_STEPS:  # "build" done means export_rknn is running: still the converter
                self.build_peak = max(self.build_peak, rss)
                self.build_cpu = max(self.build_cpu, self._cpu())
            else:
                self.runtime_peak = max(self.runtime_peak, rss)
            self._stop.wait(self._interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def snr_db(ref: np.ndarray, test: np.ndarray) -> float:
    ref, test = ref.astype(np.float64).ravel(), test.astype(np.float64).ravel()
    noise = np.sum((ref - test) ** 2)
    return float("inf") if noise == 0 else float(10 * np.log10(np.sum(ref ** 2) / noise))


def cpu_ops(log: str) -> list[str]:
    """Ops the compiled engine runs on the CPU, one per CPU layer of the verbose build log's layer
    table (rkstudy.toolkit.log), input/output operators left out. The "will fallback to CPU"
    warnings are not used: some name ops a later pass puts back."""
    from rkstudy.toolkit.log import IO_OPS, layer_table

    text = Path(log).read_text(encoding="utf-8", errors="replace").replace("\r", "")
    found = {f"{x.op}:{x.name}": x.op for x in layer_table(text) if x.target == "CPU" and x.op not in IO_OPS}
    return sorted(found.values())


def _histogram(names: list[str]) -> str:
    return ",".join(f"{op}x{names.count(op)}" for op in sorted(set(names)))


def measure(onnx_path: Path, engine_out: Path, refs: Path | None, target: str = "rk3588",
            verbose: bool = False) -> dict:
    from rkstudy.toolkit.build import EngineProcess

    load = round(os.getloadavg()[0], 2)  # the machine is shared: wall seconds depend on it, CPU seconds less
    proc = EngineProcess(onnx_path, target, out=engine_out, serve=refs is not None, verbose=verbose)
    peak = TreePeak(proc)
    report = proc.wait_built()
    sims = []
    try:
        if report.ok and refs is not None:
            data = np.load(refs)
            for n in sorted(int(k.split("_")[-1]) for k in data.files if k.startswith("stats_")):
                t = time.monotonic()
                got = proc.run([np.ascontiguousarray(data[f"feed_input_{n}"], np.float32),
                                np.ascontiguousarray(data[f"feed_lengths_{n}"], np.float32)])
                row = {"tokens": n, "sim_s": round(time.monotonic() - t, 2)}
                for name, ref, out in (("stats", data[f"stats_{n}"], got[0]), ("cond", data[f"cond_{n}"], got[1])):
                    out = np.asarray(out, np.float32)[..., :n]
                    row[f"{name}_snr_db"] = snr_db(ref[..., :n], out)
                    row[f"{name}_max_diff"] = float(np.max(np.abs(ref[..., :n] - out)))
                    row[f"{name}_nonfinite"] = int(np.size(out) - np.count_nonzero(np.isfinite(out)))
                sims.append(row)
    finally:
        proc.close()
        peak.stop()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    children = usage.ru_maxrss * 1024  # Linux: KiB
    snrs = [min(r["stats_snr_db"], r["cond_snr_db"]) for r in sims]
    return {"status": report.status, "error": report.error or "", "engine_bytes": report.engine_bytes,
            "build_s": round(report.seconds, 1), "regtask": report.regtask,
            "regtask_max": report.regtask_max, "build_peak_rss_bytes": peak.build_peak,
            "runtime_peak_rss_bytes": peak.runtime_peak, "child_maxrss_bytes": children,
            "build_cpu_s": round(peak.build_cpu, 1),
            "child_cpu_s": round(usage.ru_utime + usage.ru_stime, 1), "load_1min_at_start": load,
            "sim_min_snr_db": min(snrs) if snrs else None,
            "cpu_ops": _histogram(cpu_ops(report.log)) if verbose else None, "sim": sims, "log": report.log}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("onnx", type=Path)
    ap.add_argument("out_json", type=Path)
    ap.add_argument("--refs", type=Path, help="npz of feeds and fp32 references: run the simulator")
    ap.add_argument("--engine", type=Path, help="engine path (default: next to out_json)")
    ap.add_argument("--keep-engine", action="store_true", help="keep the .rknn (default: delete)")
    ap.add_argument("--target", default="rk3588")
    ap.add_argument("--verbose", action="store_true",
                    help="verbose toolkit log: lists the ops compiled for the CPU (cpu_ops); costs converter RAM")
    args = ap.parse_args()
    engine = args.engine or args.out_json.with_suffix(".rknn")
    row = measure(args.onnx, engine, args.refs, args.target, args.verbose)
    if not args.keep_engine and engine.exists():
        os.unlink(engine)
    args.out_json.write_text(json.dumps(row, indent=1))
    return 0 if row["status"] == "ok" else 1


if __name__ == "__main__":
    raise SystemExit(main())
