"""A user's own vocoder ONNX through the project's path: lint, pin and fold with a contract, the
window plan, the stateful step, build and simulator gate per target, and the board run, with no
family code. What the graph cannot tell by itself comes as flags (rkstudy.families.port.producer
documents the convention): the walked inputs with their frame axis and rate, the static inputs,
the walked outputs with their samples per frame, and the compiled length.

packages.py (host: the proving set's real modules, `vocos`, `bigvgan` and the `dac` and `snac` codec
decoders from their PyPI packages, exported) · architectures.py (host: the project's own generators,
HiFi-GAN V1/V3, MelGAN, odd strides, instance norm) · producer.py (host: the flags, the window graph and
its contract, the stateful step) · export.py (host: the user's export checked before surgery: no random
ops, a frame axis dynamic in fact, each output rate x frames plus one fixed remainder) ·
sidecar.py (board side: the window walk or the stateful step, whichever the contract says) · study.py
(host: the window plan as a rkstudy.walk.planner.PlanTarget, exactness of the step and the window walk in
float64 and fp32, what fp16 storage costs a graph) · targets.py (host: every target the toolkit builds,
measured the same way) · cli.py (`rkstudy port lint | fold | plan | step | build | all`) · board.py
(`rkstudy board run port`). No lint graphs of its own: its graphs are the user's own, linted by
`rkstudy port lint`.
"""

from .. import Family, register

FAMILY = register(Family(
    name="port", title="your own conv vocoder ONNX: lint, fold, window plan, stateful step, build, board run",
    notebook="07_port_your_model.ipynb", command=("port", "build"),
    cli="rkstudy.families.port.cli:add_cli", board="rkstudy.families.port.board:add_board",
    stage2="rkstudy port build --onnx <{graph}> --inputs <inputs.npz>"))
