"""The Piper (VITS) decoder as a stateful streaming step: every conv keeps the input frames it still
needs in a cache that travels through graph I/O, so a step continues where the last one stopped and
recomputes no context (the window walk recomputes 48 of every 93 frames).

producer.py (host: graph surgery on the produced --dec-mask slice, the stage contract, the state-aware
probe; the float64 reference behind its exactness gate is rkstudy.graph.f64) · sidecar.py (board side,
over rkstudy.walk.stateful.StatefulWalker) · study.py (host measurements, notebook 01b) · lint_graphs.py
(lint study graphs) · levers.py (lever and compiler-check graphs) · cli.py (handlers of `rkstudy piper
decoder --stateful --emit E` and of stage 2 for a stateful contract; the flags live in piper_decoder's
command) · board.py (`rkstudy board run piper_decoder_stateful`)."""

from .. import Family, register

FAMILY = register(Family(
    name="piper_decoder_stateful",
    title="Piper (VITS) decoder as a stateful streaming step: caches through graph I/O, no recomputed context",
    notebook="01b_piper_decoder_stateful.ipynb", command=None,
    makes="rkstudy piper decoder --stateful --emit 45 --output decoder_step.onnx --target {target}",
    board="rkstudy.families.piper_decoder_stateful.board:add_board",
    lint_graphs="rkstudy.families.piper_decoder_stateful.lint_graphs:lint_graphs",
    lever_graphs="rkstudy.families.piper_decoder_stateful.levers:lever_graphs",
    handlers="rkstudy.families.piper_decoder_stateful.cli",
    builds_on=("piper_decoder", "inflect_decoder")))
