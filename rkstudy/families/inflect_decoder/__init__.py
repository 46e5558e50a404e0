"""The Inflect v2 decode.onnx contract: the same seam inside a decode.onnx with a noise head, carved
from the Piper voice, through the shared decoder producer and sidecar.

carve.py (host: the decode.onnx, prior samples) · study.py (context sweep, notebook 01) ·
lint_graphs.py (lint study graphs) · cli.py (`rkstudy inflect decoder`) · speak.py (the Inflect v2 plan,
checked; no model to speak with). Its engines run on a board through the Piper decoder sidecar.
"""

from .. import Family, register

# One place for the window both the board-safe cli.py and the host carve.py read: 192 emitted frames
# with 32 of context each side (the 256-frame window).
EMIT, CONTEXT = 192, 32

FAMILY = register(Family(
    name="inflect_decoder", title="Inflect v2 decode.onnx contract, carved from the Piper voice (256-frame window)",
    notebook="01_piper_decoder.ipynb", command=("inflect", "decoder"),
    makes="rkstudy inflect decoder --decode-onnx decode.onnx --output decoder_z.onnx --target {target}",
    cli="rkstudy.families.inflect_decoder.cli:add_cli", planner="rkstudy.families.inflect_decoder.study:plan_target",
    lint_graphs="rkstudy.families.inflect_decoder.lint_graphs:lint_graphs",
    plan="rkstudy.families.inflect_decoder.speak:plan",
    builds_on=("piper_decoder",)))
