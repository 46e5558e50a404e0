"""Measuring (host): an engine of a stage (fp16, quantized, or a quantization session's hybrid variant)
walked through the simulator, scored against fp32 and recorded by content.

Every other part of the lever asks a Bench or a Session for a row, so a rerun, or a chosen point asked
for again, builds nothing, and a build the toolkit refuses or dies in is a row, never an exception.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from ... import atomic, cache, graph
from ...runtime import OrtRunner
from ...toolkit.build import BuildReport
from ...toolkit.calibration import Calibration
from ...toolkit.engine_cache import engine_key
from .shares import engine_shares
from .stages import Stage, listening
from .tensors import REFUSED_NAME, quantized_tensors

SCORES = 5  # bumped when what a recorded measurement holds changes, so older records are not read back


def _digest_arrays(arrays: Sequence[np.ndarray]) -> str:
    return cache.digest(*[(str(a.dtype), list(a.shape)) for a in arrays], *[np.ascontiguousarray(a).tobytes()
                                                                            for a in arrays])


def _settings(quantize: Calibration | None) -> str:
    return quantize.settings if quantize else "fp16"


class Bench:
    """A stage measured on one target: the fp32 walk of every evaluation item once (the reference of
    every row, keyed by its bytes), then any fp16, quantized or hybrid engine of the stage walked through
    the simulator and scored against it. Every measurement is recorded in the cache under its engine's
    content key and the reference's, so a rerun, or a chosen point asked for again, builds nothing.

    `listen` adds the listener's scores (rkstudy.gates.perceptual) to each row; `progress` gets one line
    per measurement."""

    def __init__(self, stage: Stage, target: str, *, listen: bool = True,
                 progress: Callable[[str], None] | None = None):
        self.stage, self.target, self.listen = stage, target, listen
        self.say = progress or (lambda _: None)
        self._fp32 = OrtRunner(stage.onnx)
        self._refs: dict[str, list[np.ndarray]] = {}
        self.refs = self.refs_for("full")
        stage.outputs["fp32"] = self.refs
        self.names = list(graph.input_shapes(stage.onnx))
        self.built = 0  # measurements this bench made (not read back)

    def refs_for(self, which: str) -> list[np.ndarray]:
        """The fp32 walk of the `which` items (computed once)."""
        if which not in self._refs:
            self._refs[which] = self._walk(self._fp32, which)
        return self._refs[which]

    def _key(self, quantize: Calibration | None, which: str) -> str:
        build, _ = engine_key(self.stage.onnx, self.target, quantize=quantize)
        return cache.digest(SCORES, build, which, _digest_arrays(self.refs_for(which)), self.listen)

    def _recall(self, key: str) -> tuple[dict, list[np.ndarray]] | None:
        path = cache.entry("quantized", self.stage.onnx.stem, key, ".npz")
        if not path.exists():
            return None
        with np.load(path) as saved:
            row = json.loads(str(saved["row"]))
            return row, [saved[f"out_{i}"] for i in range(int(saved["n"]))]

    def _record(self, key: str, row: dict, tests: Sequence[np.ndarray]) -> None:
        path = cache.entry("quantized", self.stage.onnx.stem, key, ".npz")
        with atomic.replacing(path) as tmp, open(tmp, "wb") as fh:
            np.savez(fh, row=np.array(json.dumps(row, default=float)), n=np.array(len(tests)),
                     **{f"out_{i}": t for i, t in enumerate(tests)})

    def _row(self, setting: str, quantize: Calibration | None, report: BuildReport, tests: list | None,
             which: str, groups: str) -> dict:
        stage, refs = self.stage, self.refs_for(which)
        row = {"stage": stage.name, "setting": setting, "dtype": report.dtype, "quantization": _settings(quantize),
               "calibration_samples": len(quantize.feeds) if quantize else 0,
               "fp16_groups": groups, "kept_fp16": len(quantize.keep_fp16) if quantize else 0,
               "scored_on": which, "status": report.status if tests is not None else "simulator refused",
               "error": (report.error or "")[:300]}
        if tests is not None:
            items = stage.items(which)
            row.update(stage.score(items, refs, tests))
            if self.listen:  # DNSMOS (no reference) on the full evaluation only: a search needs the pair scores
                row.update(listening(stage, refs, tests, absolute=which == "full"))
            shares = engine_shares(stage.onnx, Path(report.log).read_text(encoding="utf-8", errors="replace"),
                                   quantize)
            row.update({k: v for k, v in shares.items() if k != "fp16_convs"})
            row["fp16_convs"] = len(shares["fp16_convs"])  # graph convs with a float16 layer
        row.update({"engine_bytes": report.engine_bytes, **stage.texts, "regtask": report.regtask,
                    "build_s": round(report.seconds, 1),
                    # does a setting buy time on the NPU? the cost model's prediction per call from this build's
                    # layer table (a prediction, not a board number), beside what it costs in fidelity
                    **{k: v for k, v in report.prediction().row().items()
                       if k.startswith("npu_ms_") or k == "npu_cost_note"},
                    "where": "simulator", "target": self.target})
        return row

    def _walk(self, runner, which: str) -> list[np.ndarray]:
        return [np.asarray(self.stage.walk(runner, item), np.float32).reshape(-1) for item in self.stage.items(which)]

    def build(self, setting: str, quantize: Calibration | None = None, which: str = "full") -> dict:
        """One engine built on its own (fp16 when `quantize` is None; auto-hybrid and the int16 overflow
        mode need their own build) and walked over the `which` items; a build the toolkit refuses or dies
        in is a row with its status and error, never an exception."""
        from ...toolkit.build import BuildFailed, record_report
        from ...toolkit.engine_cache import default_engine_path
        from ...toolkit.simulator import SimulatorRunner

        key = self._key(quantize, which)
        if (hit := self._recall(key)) is not None:
            self.stage.outputs[setting] = hit[1]
            return {**hit[0], "setting": setting}
        self.say(f"{self.stage.name}, {self.target}: {setting}")
        build, _ = engine_key(self.stage.onnx, self.target, quantize=quantize)
        out = default_engine_path(self.stage.onnx, self.target, build)
        runner = SimulatorRunner(self.stage.onnx, self.target, out=out, quantize=quantize, verbose=True,
                                 keep_failed=True)
        tests = None
        try:
            if runner.report.ok:
                tests = self._walk(runner, which)
        except (RuntimeError, BuildFailed) as exc:  # built, but the simulator would not run it
            runner.report.error = str(exc)
        finally:
            runner.close()
        self.built += 1
        row = self._row(setting, quantize, runner.report, tests, which, "all" if quantize is None else "")
        if not runner.report.ok:
            row["status"] = outcome(runner.report)
        else:  # so `report` finds this build's log (its layer table) on a rerun too
            record_report(out, build, runner.report, verbose=True)
        if tests is not None:
            self.stage.outputs[setting] = tests
        if runner.report.status != "timeout":
            self._record(key, row, tests or [])
        return row

    def report(self, quantize: Calibration | None = None) -> BuildReport | None:
        """The recorded report of a build this bench (or an earlier run) made on its own, log included."""
        from ...toolkit.build import cached_report
        from ...toolkit.engine_cache import default_engine_path

        build, _ = engine_key(self.stage.onnx, self.target, quantize=quantize)
        return cached_report(default_engine_path(self.stage.onnx, self.target, build), build, verbose=True)

    def session(self, calibration: Calibration) -> Session:
        """A quantization session of `calibration` on this bench (its child starts only when a variant
        that is not recorded yet is asked for)."""
        return Session(self, calibration)


class Session:
    """One calibration of a stage (dtype, algorithm, method, feeds) and its hybrid variants, measured
    on a Bench: `measure(keep, setting)` scores the build with the config tensors `keep` in float16 (none:
    the plain quantized build). The toolkit child (rkstudy.toolkit.simulator.QuantizationSession) starts
    at the first variant the cache does not hold, and the config's tensor list is recorded so the
    groups of a later run need no child either."""

    def __init__(self, bench: Bench, calibration: Calibration):
        self.bench, self.calibration = bench, calibration
        self._child = None
        self._tensors: list[dict] | None = None
        self.failed: dict | None = None  # the calibration's own failure (a refusal or a crash), as a row
        self.refused: set[str] = set()  # config tensors step 2 refused by name: never asked for again
        if self._refused_path().exists():
            self.refused = set(json.loads(self._refused_path().read_text()))

    def _tensors_path(self) -> Path:
        stage = self.bench.stage
        key = cache.digest(stage.onnx, self.bench.target, self.calibration.data_key(self.bench.names))
        return cache.entry("quantized", stage.onnx.stem + "-tensors", key, ".json")

    def _start(self) -> bool:
        from ...toolkit.simulator import QuantizationSession

        if self._child is not None:
            return self._child.alive
        if self.failed is not None:
            return False
        b = self.bench
        b.say(f"{b.stage.name}, {b.target}: calibrating {self.calibration.settings} on "
              f"{len(self.calibration.feeds)} samples")
        self._child = QuantizationSession(b.stage.onnx, b.target, self.calibration)
        if not self._child.report.ok:
            self.failed = b._row(self.calibration.label, self.calibration, self._child.report, None, "full", "")
            self.failed["status"] = outcome(self._child.report)
            return False
        self._tensors = self._child.tensors
        atomic.write_text(self._tensors_path(), json.dumps(self._tensors))
        return True

    def _refused_path(self) -> Path:
        return self._tensors_path().with_suffix(".refused.json")

    @property
    def tensors(self) -> list[dict]:
        """The toolkit's quantization config: each tensor's name and dtype."""
        if self._tensors is None:
            path = self._tensors_path()
            if path.exists():
                self._tensors = json.loads(path.read_text())
            elif not self._start():
                return []
        return self._tensors or []

    def quantized(self) -> list[str]:
        """The config tensors a variant can keep in float16 (quantized_tensors), less any step 2 refused."""
        return [n for n in quantized_tensors(self.tensors, self.bench.stage.onnx) if n not in self.refused]

    def measure(self, keep: Sequence[str], setting: str, which: str = "full", groups: str = "") -> dict:
        """The variant with `keep` in float16 walked over the `which` items and scored (recorded by content)."""
        from ...toolkit.build import BuildFailed

        b = self.bench
        quantize = self.calibration.with_fp16(sorted(keep)) if keep else self.calibration
        key = b._key(quantize, which)
        if (hit := b._recall(key)) is not None:
            b.stage.outputs[setting] = hit[1]
            return {**hit[0], "setting": setting, "fp16_groups": groups}
        if not self._start():
            return {**self.failed, "setting": setting, "fp16_groups": groups, "scored_on": which}
        b.say(f"{b.stage.name}, {b.target}: {setting} ({which} evaluation)")
        build, _ = engine_key(b.stage.onnx, b.target, quantize=quantize)
        from ...toolkit.engine_cache import default_engine_path

        variant = self._child.variant(sorted(keep), default_engine_path(b.stage.onnx, b.target, build))
        tests = None
        try:
            if variant.report.ok:
                tests = b._walk(variant, which)
        except (RuntimeError, BuildFailed) as exc:
            variant.report.error = str(exc)
        b.built += 1
        refused = REFUSED_NAME.search(variant.report.error or "")
        if refused and refused.group(1) in keep:  # a constant the config lists: drop it, for good, and build again
            self.refused.add(refused.group(1))
            atomic.write_text(self._refused_path(), json.dumps(sorted(self.refused)))
            return self.measure([k for k in keep if k != refused.group(1)], setting, which, groups)
        row = b._row(setting, quantize, variant.report, tests, which, groups)
        row["calibration_s"] = round(self._child.report.seconds, 1)  # the session's one pass, for the cost
        if not variant.report.ok:
            row["status"] = outcome(variant.report)
        if not self._child.alive:  # the toolkit died under this variant: the session's later asks say so
            self.failed = {**row, "error": f"the session ended at an earlier variant: {row['error']}"[:300]}
        if tests is not None:
            b.stage.outputs[setting] = tests
        if variant.report.status != "timeout":
            b._record(key, row, tests or [])
        return row

    def close(self) -> None:
        if self._child is not None:
            self._child.close()
            self._child = None

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def outcome(report: BuildReport) -> str:
    """A failed build's status as a row says it: refused at a step (the toolkit raised), crashed (a signal
    ended the toolkit: 'crashed (SIGSEGV, exit 139)' as a shell reports it), or its plain status."""
    if report.ok:
        return "ok"
    error = report.error or ""
    if report.status == "aborted":
        import re
        import signal

        m = re.search(r"died on (SIG\w+)", error)
        if m:
            return f"crashed ({m.group(1)}, exit {128 + signal.Signals[m.group(1)].value}) at {report.failed_step}"
        return f"crashed at {report.failed_step}"
    if report.status == "failed":
        return f"refused at {report.failed_step or 'build'}"
    return report.status
