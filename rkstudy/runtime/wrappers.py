"""Runners that wrap another runner: the walkers see the wrapped runner's surface (input names,
shapes, where, target) unchanged, and the wrapper adds one thing on the way through.

* Recording: keeps every feed and every output (the exact inputs and carried state of a walk, to
  replay step by step on another runner or to probe stage 2 with).
* ContractDtypes: feeds each input in its contract dtype (onnxruntime wants token codes as int64;
  the walkers hand every array over as float32).

Board side: numpy only.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


class _Wrapper:
    """The wrapped runner's surface; `input_names` falls back to `default_names` for a runner that
    says none (a contract's own order)."""

    def __init__(self, runner, default_names: list[str] | None = None):
        self.runner = runner
        self.input_names = list(getattr(runner, "input_names", default_names or []))
        self.shapes = getattr(runner, "shapes", None)
        self.where, self.target = getattr(runner, "where", "fp32"), getattr(runner, "target", "none")


class Recording(_Wrapper):
    """A runner that records every feed it passes on and every output it gets back, as copies (a
    walker reuses its buffers, so a kept reference would change under the record)."""

    def __init__(self, runner):
        super().__init__(runner)
        self.feeds: list[dict[str, np.ndarray]] = []
        self.outputs: list[list[np.ndarray]] = []

    def run(self, feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        self.feeds.append({k: np.array(v) for k, v in feed.items()})
        got = self.runner.run(feed)
        self.outputs.append([np.array(x) for x in got])
        return got


class ContractDtypes(_Wrapper):
    """A runner fed each input in its contract dtype: the walker hands every array over as float32,
    and onnxruntime wants the codes as int64 (the simulator and the board cast to float32 anyway, and
    codes < 2048 are exact in float32)."""

    def __init__(self, runner, contract):
        super().__init__(runner, contract.input_names)
        self._dtypes = {t.name: t.dtype for t in contract.inputs}

    def run(self, feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        return self.runner.run({k: np.asarray(v).astype(self._dtypes.get(k, "float32")) for k, v in feed.items()})
