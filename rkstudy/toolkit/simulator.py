"""rknn-toolkit2's PC simulator (host only: the toolkit imports torch and onnx).

The simulator can only run a model built in the same process, so it lives in one long-lived toolkit
child per engine (rkstudy.toolkit.build.EngineProcess with serve=True): a walk over many windows builds once.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..contract import refuse_unlisted
from ..runtime.base import Runner

if TYPE_CHECKING:
    from .build import BuildReport


class SimulatorRunner(Runner):
    """Build `onnx_path` for `target` in a toolkit child and run the simulator there.

    `report` is the BuildReport (REGTASK count, seconds, engine size when `out` is given).
    Raises BuildFailed if the build does not succeed, unless `keep_failed`: then the child is
    stopped and `report` says how the build failed (a REGTASK-limit kill or a timeout is a
    measurement of a sweep, not an error), and `run` must not be called. With `shape_sets` (a
    build_kwargs entry: see rkstudy.toolkit.build.shape_sets_for) it runs at any of those sets and refuses
    every other shape before the toolkit sees it.
    """

    where = "simulator"

    def __init__(self, onnx_path, target: str = "rk3588",
                 shapes: Mapping[str, Sequence[int]] | None = None, out=None, *, keep_failed: bool = False,
                 **build_kwargs):
        from .. import graph
        from .build import EngineProcess

        self.target = target
        if shapes is None and not build_kwargs.get("shape_sets"):
            shapes = graph.input_shapes(Path(onnx_path))
        self._proc = EngineProcess(onnx_path, target, shapes, out, serve=True, **build_kwargs)
        self.shapes = {k: tuple(v) for k, v in self._proc.shapes.items()}  # a multi-shape build's largest set
        self.shape_sets = [{k: tuple(v) for k, v in set_.items()} for set_ in self._proc.shape_sets] or [self.shapes]
        self.input_names = list(self.shapes)
        self.report = self._proc.wait_built()
        self.calls = 0   # runs served: what the NPU cost model's per-call prediction is multiplied by
        if not self.report.ok:
            self._proc.close()
            if not keep_failed:
                self.report.raise_for_status()

    def run(self, inputs) -> list[np.ndarray]:
        self.calls += 1
        arrays = self._ordered(inputs)
        if len(self.shape_sets) > 1:
            refuse_unlisted(self.input_names, [x.shape for x in arrays], self.shape_sets)
        for name, x in zip(self.input_names, arrays):
            if len(self.shape_sets) == 1 and tuple(x.shape) != tuple(self.shapes[name]):
                raise ValueError(f"input {name!r} has shape {x.shape}; the engine was built for "
                                 f"{tuple(self.shapes[name])} (RKNN engines have fixed shapes)")
        return [np.asarray(o, dtype=np.float32) for o in self._proc.run(arrays)]

    @property
    def peak_rss_mb(self) -> float:
        """The child's peak RSS so far, build and every run (final once closed); `report` keeps
        the build's own."""
        return self._proc.peak_rss_mb

    def close(self) -> None:
        """Stop the child (a report without a peak RSS then takes the child's whole-life peak)."""
        self._proc.close()
        if not self.report.peak_rss_mb:
            self.report.peak_rss_mb = self._proc.peak_rss_mb


class QuantizationSession:
    """One calibration pass of `onnx_path` for `target` (a Calibration without hybrid choices), then any
    number of variants of it with some of the toolkit's quantization-config tensors in float16, each
    built and served on the simulator in turn (rkstudy.toolkit.build.EngineProcess with session=True).
    A hybrid build is a calibration pass (most of its time) and a compile; here the pass runs once.

    `tensors` lists the config's tensors (name, dtype); `report` is the calibration's BuildReport (a
    failed or crashed calibration is a measurement: check `report.ok`); `variant(keep, out)` returns a
    Runner for that variant, valid until the next variant."""

    where = "simulator"

    def __init__(self, onnx_path, target: str, quantize, *, verbose: bool = True, **build_kwargs):
        from .. import graph
        from .build import EngineProcess

        self.target, self.quantize = target, quantize
        self.shapes = {k: tuple(v) for k, v in graph.input_shapes(Path(onnx_path)).items()}
        self._proc = EngineProcess(onnx_path, target, self.shapes, None, serve=True, session=True,
                                   quantize=quantize, verbose=verbose, **build_kwargs)
        self.report = self._proc.wait_built()
        self.tensors = list(self._proc.tensors)
        if not self.report.ok:
            self._proc.close()

    @property
    def alive(self) -> bool:
        return self.report.ok and not self._proc._finished

    def variant(self, keep: Sequence[str], out) -> _Variant:
        """The session's calibration built with `keep` (config tensor names) in float16 into `out`, started
        on the simulator: a Runner whose `report` says how the build went (run only when it is ok)."""
        from ..errors import UsageError

        if not self.alive:
            raise UsageError("this quantization session has ended (its calibration failed or the toolkit died)")
        quantize = self.quantize.with_fp16(keep) if keep else self.quantize
        return _Variant(self, self._proc.variant(keep, out, quantize))

    @property
    def peak_rss_mb(self) -> float:
        return self._proc.peak_rss_mb

    def close(self) -> None:
        self._proc.close()

    def __enter__(self) -> QuantizationSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Variant(Runner):
    """One variant of a QuantizationSession on the simulator, at the session graph's shapes."""

    where = "simulator"

    def __init__(self, session: QuantizationSession, report: BuildReport):
        self._session, self.report = session, report
        self.target, self.shapes = session.target, session.shapes
        self.input_names = list(self.shapes)

    def run(self, inputs) -> list[np.ndarray]:
        arrays = self._ordered(inputs)
        for name, x in zip(self.input_names, arrays):
            if tuple(x.shape) != tuple(self.shapes[name]):
                raise ValueError(f"input {name!r} has shape {x.shape}; the engine was built for "
                                 f"{tuple(self.shapes[name])} (RKNN engines have fixed shapes)")
        return [np.asarray(o, dtype=np.float32) for o in self._session._proc.run(arrays)]

    def close(self) -> None:
        """The session, not the variant, owns the child."""


@dataclass
class Simulated:
    """One build and the simulator's outputs on each of its feeds: `outputs[i]` is feed i's outputs
    (output order), `run_s[i]` its inference seconds, `peak_rss_mb` the child's whole-life peak (build
    and every run). `where`/`target` make it the origin of the rows it scores (rkstudy.tables.results.stamp).
    `inference_error` is the simulator's message when it built the engine but refused to run it (then
    `outputs` is empty): like a failed build, a measurement."""

    report: BuildReport
    feeds: list[list[np.ndarray]]
    outputs: list[list[np.ndarray]]
    run_s: list[float]
    peak_rss_mb: float
    inference_error: str | None = None

    where = "simulator"

    @property
    def target(self) -> str:
        return self.report.target

    def replay(self, input_names: Sequence[str]) -> Runner:
        """A runner that answers each of these feeds with its recorded outputs (a walk over the same
        windows runs without the toolkit); any other feed is refused."""
        return _Replayed(self, list(input_names))


class _Replayed(Runner):
    where = "simulator"

    def __init__(self, simulated: Simulated, input_names: list[str]):
        self.input_names, self.target = input_names, simulated.target
        self._answers = {_feed_digest(f): o for f, o in zip(simulated.feeds, simulated.outputs)}

    def run(self, inputs) -> list[np.ndarray]:
        got = self._answers.get(_feed_digest(self._ordered(inputs)))
        if got is None:
            raise KeyError("this feed is not one the simulator ran; add it to the feeds given to simulate()")
        return [np.array(o) for o in got]


def _feed_digest(arrays: Sequence[np.ndarray]) -> str:
    from .. import cache

    return cache.digest(*[(str(a.dtype), list(a.shape)) for a in arrays], *[a.tobytes() for a in arrays])


def simulate(onnx_path, target: str, feeds: Sequence, *, verbose: bool = True, **build_kwargs) -> Simulated:
    """Build `onnx_path` for `target` and run the simulator on every feed ({name: array} or lists in
    input order), once per content key: the engine's key (rkstudy.toolkit.engine_cache.engine_key), the
    REGTASK limit, verbosity and the feeds' bytes. Whoever asks again (another cell, another study)
    reads the recorded report and outputs instead of building again; the engine and its build record
    are written where rkstudy.toolkit.build.build_engine looks, so a plain build of the same graph is
    answered without a child too. A build that fails is recorded like one that succeeds (a
    REGTASK-limit kill is a measurement), a timeout is not (a slower machine might finish it)."""
    import json
    from dataclasses import asdict

    from .. import atomic, cache
    from ..errors import one_line
    from .build import REGTASK_LIMIT, BuildFailed, BuildReport, record_report
    from .engine_cache import default_engine_path, engine_key

    onnx_path = Path(onnx_path)
    build_key, shapes = engine_key(onnx_path, target, build_kwargs.pop("shapes", None),
                                   optimization_level=build_kwargs.get("optimization_level", 3),
                                   quantize=build_kwargs.get("quantize"), toolkit=build_kwargs.get("toolkit"))
    names = list(shapes)
    ordered = [Runner._ordered(_Named(names), f) for f in feeds]
    def key(logged: bool) -> str:
        return cache.digest(build_key, build_kwargs.get("regtask_limit", REGTASK_LIMIT), logged,
                            *[_feed_digest(f) for f in ordered])

    path = cache.entry("simulated", onnx_path.stem, key(verbose), ".npz")
    with cache.locked(path):  # two studies side by side asking for one run: the second reads the first's
        # the record under any graph name (lint saves the same bytes under its own), and a verbose
        # build's record answers a plain request too (only its log is longer)
        found = [hit for logged in ([True] if verbose else [False, True])
                 for hit in sorted(path.parent.glob(f"*-{key(logged)}.npz"))]
        if found:
            with np.load(found[0]) as saved:
                record = json.loads(str(saved["record"]))
                # a failed or refused build recorded no outputs (every n_outputs entry 0)
                outputs = [[saved[f"out_{i}_{j}"] for j in range(n)] for i, n in enumerate(record["n_outputs"]) if n]
            return Simulated(BuildReport.recorded(record["report"]), ordered, outputs, record["run_s"],
                             record["peak_rss_mb"], record.get("inference_error"))
        out = default_engine_path(onnx_path, target, build_key)
        eng = SimulatorRunner(onnx_path, target, shapes, out, keep_failed=True, verbose=verbose, **build_kwargs)
        outputs, run_s, refused = [], [], None
        try:
            if eng.report.ok:
                for f in ordered:
                    t0 = time.perf_counter()
                    outputs.append(eng.run(f))
                    run_s.append(time.perf_counter() - t0)
        except (RuntimeError, BuildFailed) as exc:  # built, but the simulator would not run it: say why
            outputs, run_s, refused = [], [], one_line(str(exc), 600)
        finally:
            eng.close()
        done = Simulated(eng.report, ordered, outputs, run_s, eng.peak_rss_mb or eng.report.peak_rss_mb, refused)
        if eng.report.status == "timeout":
            return done
        record_report(out, build_key, eng.report, verbose=verbose)  # what build_engine(reuse=True) reads back
        record = {"report": asdict(eng.report), "run_s": run_s, "peak_rss_mb": done.peak_rss_mb,
                  "inference_error": refused,
                  "n_outputs": [len(o) for o in outputs] + [0] * (len(ordered) - len(outputs))}
        with atomic.replacing(path) as tmp, open(tmp, "wb") as fh:
            np.savez(fh, record=np.array(json.dumps(record)),
                     **{f"out_{i}_{j}": o for i, outs in enumerate(outputs) for j, o in enumerate(outs)})
        return done


class _Named:
    """The input order Runner._ordered needs, for feeds checked before any runner exists."""

    def __init__(self, names: list[str]):
        self.input_names = names
