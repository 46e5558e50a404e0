"""rknn-toolkit2's PC simulator (host only: the toolkit imports torch and onnx).

The simulator can only run a model built in the same process, so it lives in one long-lived toolkit
child per engine (rkstudy.toolkit.build.EngineProcess with serve=True): a walk over many windows builds once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from ..contract import refuse_unlisted
from .base import Runner


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
        from ..toolkit.build import EngineProcess

        self.target = target
        if shapes is None and not build_kwargs.get("shape_sets"):
            shapes = graph.input_shapes(Path(onnx_path))
        self._proc = EngineProcess(onnx_path, target, shapes, out, serve=True, **build_kwargs)
        self.shapes = self._proc.shapes  # a multi-shape build's largest set
        self.shape_sets = self._proc.shape_sets or [self.shapes]
        self.input_names = list(self.shapes)
        self.report = self._proc.wait_built()
        if not self.report.ok:
            self._proc.close()
            if not keep_failed:
                self.report.raise_for_status()

    def run(self, inputs) -> list[np.ndarray]:
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
