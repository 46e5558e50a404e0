"""CosyVoice3's flow-matching DiT estimator: the NPU memory it takes, not its numerics.

An engine is mapped into a 32-bit NPU address space, so an attention graph compiled at a fixed
length S meets a ceiling in the low hundreds of frames (the reference documents' measurements), and a ladder of
S engines has to load lazily. The real estimator is not obtainable here: the board side is the
memory model, the ladder and the measurement kit (rkstudy.board.memory, .rknnrt, .dmesg, .check,
.load, .dram; `rkstudy board memory | check | dram`), and the host side is a DiT-shaped stand-in
with seeded random weights whose sizes are its own.

standin.py (the DiT stand-in, host) · reference_memory.py (the reference's memory figures) · producer.py
(stage 1, host) · study.py (host measurements, notebook 05) · lint_graphs.py (lint study graphs) · levers.py
(lever and compiler-check graphs) · cli.py (`rkstudy cosyvoice3 estimator`) · speak.py (the CosyVoice3
plan, checked; no model to speak with)."""

from .. import Family, register

FAMILY = register(Family(
    name="flow_estimator",
    title="CosyVoice3 flow estimator (DiT stand-in, random weights): the NPU memory ceiling and a lazy engine ladder",
    notebook="05_flow_estimator_memory.ipynb", command=("cosyvoice3", "estimator"),
    makes="rkstudy cosyvoice3 estimator --frames 250 --output estimator_s250.onnx --target {target}",
    cli="rkstudy.families.flow_estimator.cli:add_cli",
    lint_graphs="rkstudy.families.flow_estimator.lint_graphs:lint_graphs",
    lever_graphs="rkstudy.families.flow_estimator.levers:lever_graphs",
    plan="rkstudy.families.flow_estimator.speak:plan"))
