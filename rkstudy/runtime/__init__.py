"""One small interface over the places a graph can run.

* OrtRunner (here): onnxruntime fp32 on the CPU, the reference every gate compares against.
* SimulatorRunner (rkstudy.toolkit.simulator): rknn-toolkit2's PC simulator (host only), one long-lived
  toolkit child per engine.
* BoardRunner (rkstudy.board.runner): RKNNLite on a board with its NPU driver; real code that only runs
  where a board is present (see board_available()), and in CI through the replay double of RKNNLite.

This package holds the interface and the fp32 runner; each other place keeps its runner in its own
layer (the toolkit's, the board's), so nothing here imports upward.

All take `run({name: array})` (or a list in input order), return float32 arrays in output order,
say `where` and `target` they ran, and are context managers. rkstudy.runtime.wrappers wraps any of
them: Recording keeps every feed and output of a walk, ContractDtypes feeds each input in its
contract dtype.

Board side: numpy and onnxruntime (at call time) only.
"""

from .base import Runner  # noqa: F401
from .ort import OrtRunner  # noqa: F401
from .wrappers import ContractDtypes, Recording  # noqa: F401
