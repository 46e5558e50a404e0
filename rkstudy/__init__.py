"""rkstudy: single TTS stages on Rockchip NPUs, measured off-board with the real compiler and simulator.

The package is layered. A module imports from its own layer and the layers listed before it, never
from a later one (tests/test_layers.py reads this list and fails on any import that runs up it, lazy
imports inside functions included):

    paths atomic errors fits process registry targets  foundations, the family registry (plugins), the SoC records
    graph                                              pure functions over ONNX graphs
    cache inputs                                       content-keyed build outputs; versioned board-input files
    contract gates produced                            the stage contract; metrics and gates; what stage 1 produces
    tables                                             stamped tables, provenance, diff, index, claims, reproduce
    runtime                                            the Runner interface and the fp32 runner (onnxruntime)
    toolkit                                            the compiler path: build child, stage 2, simulator, logs, probes
    board                                              RKNNLite runner, the board's files, board run/check/memory
    walk                                               window and stateful walkers, sidecars, the window planner
    plan                                               the component execution plan
    lint                                               lint rules and their cross-check against the compiler
    levers                                             the toolkit-lever study (versions, quantization, multi-shape)
    cliutil                                            what every family's command line shares
    families                                           one folder per model family
    notebook cli doctor bundle __main__                the notebook helper, the command line, doctor, the board bundle

A shared layer never names a family: where it needs a family's graph it asks the registry for the
family's hook.
"""

__version__ = "0.1.0"

from .process import for_readers as _for_readers  # noqa: E402
from .process import recorded as _recorded  # noqa: E402

if _recorded():  # an executed notebook kept for readers: set before any module imports tqdm or warns
    _for_readers()
