"""One small interface over three places a graph can run.

* OrtRunner: onnxruntime fp32 on the CPU, the reference every gate compares against.
* SimulatorRunner: rknn-toolkit2's PC simulator, which can only run a model built in the same
  process, so it lives in one long-lived toolkit child per engine (a walk over many windows
  builds once).
* BoardRunner: RKNNLite on an RK3588/RK3566 with its NPU driver; real code that only runs where
  a board is present (see board_available()).

All three take `run({name: array})` (or a list in input order) and return a list of float32
arrays in output order, and all three are context managers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from .base import Runner
from .board import BoardRunner, BoardUnavailable, board_available  # noqa: F401


class OrtRunner(Runner):
    """onnxruntime fp32 on the CPU (the reference)."""

    def __init__(self, onnx_path, threads: int | None = None):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = threads
        model = onnx_path.SerializeToString() if hasattr(onnx_path, "SerializeToString") else str(onnx_path)
        self.session = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]

    def run(self, inputs) -> list[np.ndarray]:
        feed = dict(zip(self.input_names, self._ordered(inputs, dtype=None)))  # ids stay int64
        return [np.asarray(o, dtype=np.float32) for o in self.session.run(None, feed)]


class SimulatorRunner(Runner):
    """Build `onnx_path` for `target` in a toolkit child and run the simulator there.

    `report` is the BuildReport (REGTASK count, seconds, engine size when `out` is given).
    Raises BuildFailed if the build does not succeed.
    """

    where = "simulator"

    def __init__(self, onnx_path, target: str = "rk3588",
                 shapes: Mapping[str, Sequence[int]] | None = None, out=None, **build_kwargs):
        from .. import graph
        from ..build import EngineProcess

        self.target = target
        self.shapes = dict(shapes) if shapes is not None else graph.input_shapes(Path(onnx_path))
        self.input_names = list(self.shapes)
        self._proc = EngineProcess(onnx_path, target, self.shapes, out, serve=True, **build_kwargs)
        self.report = self._proc.wait_built()
        if not self.report.ok:
            self._proc.close()
            self.report.raise_for_status()

    def run(self, inputs) -> list[np.ndarray]:
        arrays = self._ordered(inputs)
        for name, x in zip(self.input_names, arrays):
            if tuple(x.shape) != tuple(self.shapes[name]):
                raise ValueError(f"input {name!r} has shape {x.shape}; the engine was built for "
                                 f"{tuple(self.shapes[name])} (RKNN engines have fixed shapes)")
        return [np.asarray(o, dtype=np.float32) for o in self._proc.run(arrays)]

    def close(self) -> None:
        self._proc.close()
