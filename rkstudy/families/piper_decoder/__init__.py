"""Piper (VITS) decoder on the NPU: the pre-flow latent and its mask in, audio out, walked by window.

seam and front end: rkstudy.families.piper.voice · producer.py (host) · sidecar.py (board side) · study.py
(host measurements, notebook 01) · lint_graphs.py (lint study graphs) · levers.py (lever, compiler-check and NPU-cost
graphs) · cli.py (`rkstudy piper decoder`, `rkstudy piper latents`) · board.py (`rkstudy board run
piper_decoder`) · speak.py (the Piper plan and `rkstudy speak piper`: the whole voice under a component
execution plan, the duration encoder's ladder and the decoder on the NPU or the CPU)."""

from .. import Family, register

# One place for the defaults both the board-safe cli.py and the host producer.py read: the 93-frame
# window (45 emitted + 24 context each side), measured in notebook 01 rather than inherited.
DEFAULT_EMIT, DEFAULT_CONTEXT = 45, 24

FAMILY = register(Family(
    name="piper_decoder", title="Piper (VITS) decoder: pre-flow latent -> audio, fixed-window walk",
    notebook="01_piper_decoder.ipynb", command=("piper", "decoder"),
    makes="rkstudy piper decoder --output decoder_z.onnx --target {target}",
    cli="rkstudy.families.piper_decoder.cli:add_cli", board="rkstudy.families.piper_decoder.board:add_board",
    bundle="rkstudy.families.piper_decoder.board:bundle_part",
    planner="rkstudy.families.piper_decoder.study:plan_target",
    lint_graphs="rkstudy.families.piper_decoder.lint_graphs:lint_graphs",
    lever_graphs="rkstudy.families.piper_decoder.levers:lever_graphs",
    npu_cost_cases="rkstudy.families.piper_decoder.levers:npu_cost_cases",
    compiler_cases="rkstudy.families.piper_decoder.levers:compiler_cases",
    plan="rkstudy.families.piper_decoder.speak:plan",
    builds_on=("piper_encoder",)))
