"""The Runner surface every place a graph can run shares.

Board side: numpy only.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


class Runner:
    """Common surface: input names, run(), close(), `with`; `where` and `target` say which place
    ran the numbers, and every results row takes them from here (rkstudy.tables.results.stamp)."""

    where = "fp32"
    target = "none"
    input_names: list[str]

    def _ordered(self, inputs, keep_dtype: bool = False) -> list[np.ndarray]:
        """Inputs in engine order, contiguous. Engines take float32 (the toolkit converts token ids
        it is fed as floats), so everything is cast unless `keep_dtype` (onnxruntime keeps int64)."""
        if isinstance(inputs, Mapping):
            missing = [n for n in self.input_names if n not in inputs]
            if missing:
                raise KeyError(f"missing input(s) {', '.join(missing)}; this engine takes "
                               f"{', '.join(self.input_names)}")
            inputs = [inputs[n] for n in self.input_names]
        if len(inputs) != len(self.input_names):
            raise ValueError(f"got {len(inputs)} inputs, the engine takes {len(self.input_names)} "
                             f"({', '.join(self.input_names)})")
        return [np.ascontiguousarray(x, dtype=None if keep_dtype else np.float32) for x in inputs]

    def run(self, inputs) -> list[np.ndarray]:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
