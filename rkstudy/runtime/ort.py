"""onnxruntime fp32 on the CPU: the reference every gate compares against.

Board side: onnxruntime is in the board extra too (the encoder ladder's fp32 fallback runs there).
"""

from __future__ import annotations

import numpy as np

from .base import Runner


class OrtRunner(Runner):
    """onnxruntime fp32 on the CPU (the reference). Takes a path, bytes or a ModelProto."""

    where = "fp32"

    def __init__(self, model, threads: int | None = None):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = threads
        if hasattr(model, "SerializeToString"):
            model = model.SerializeToString()
        elif not isinstance(model, bytes):
            model = str(model)
        self.session = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.shapes = {i.name: tuple(i.shape) for i in self.session.get_inputs()}
        self.calls = 0  # runs served: what a recorded NPU prediction per call is multiplied by

    def run(self, inputs) -> list[np.ndarray]:
        self.calls += 1
        feed = dict(zip(self.input_names, self._ordered(inputs, keep_dtype=True)))
        return [np.asarray(o, dtype=np.float32) for o in self.session.run(None, feed)]
