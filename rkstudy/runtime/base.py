"""The Runner surface every place a graph can run shares."""

from __future__ import annotations

from typing import Mapping

import numpy as np


class Runner:
    """Common surface: input names/shapes, run(), close(), `with`."""

    where = "fp32"
    target = "none"
    input_names: list[str]

    def _ordered(self, inputs, dtype=np.float32) -> list[np.ndarray]:
        """Inputs in engine order; cast to `dtype` (engines take float32) unless it is None."""
        if isinstance(inputs, Mapping):
            missing = [n for n in self.input_names if n not in inputs]
            if missing:
                raise KeyError(f"missing input(s) {', '.join(missing)}; this engine takes "
                               f"{', '.join(self.input_names)}")
            inputs = [inputs[n] for n in self.input_names]
        if len(inputs) != len(self.input_names):
            raise ValueError(f"got {len(inputs)} inputs, the engine takes {len(self.input_names)} "
                             f"({', '.join(self.input_names)})")
        return [np.ascontiguousarray(x, dtype=dtype) for x in inputs]

    def run(self, inputs) -> list[np.ndarray]:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
