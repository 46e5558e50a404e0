"""One small interface over the places a graph can run.

* OrtRunner: onnxruntime fp32 on the CPU, the reference every gate compares against.
* SimulatorRunner: rknn-toolkit2's PC simulator (host only), one long-lived toolkit child per engine.
* BoardRunner: RKNNLite on an RK3588/RK3566 with its NPU driver; real code that only runs where a
  board is present (see board_available()), and in CI through the replay double of RKNNLite.

All take `run({name: array})` (or a list in input order), return float32 arrays in output order,
say `where` and `target` they ran, and are context managers. rkstudy.runtime.wrappers wraps any of
them: Recording keeps every feed and output of a walk, ContractDtypes feeds each input in its
contract dtype.

Board side: importing this package pulls no converter module (the simulator's build import is lazy).
"""

from .base import Runner  # noqa: F401
from .board import BoardRunner, BoardUnavailable, RknnError, board_available  # noqa: F401
from .ort import OrtRunner  # noqa: F401
from .simulator import SimulatorRunner  # noqa: F401
from .wrappers import ContractDtypes, Recording  # noqa: F401
