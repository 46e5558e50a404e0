"""Piper duration encoder on the NPU: phoneme ids (right-padded to a fixed width) -> prior stats and
duration conditioning, with the relative-shift chains rewritten, and a ladder of widths.

seam.py and tokens.py (seam and front end) · producer.py (host) · sidecar.py (the ladder, board side) ·
study.py (host measurements, notebook 02) · lint_graphs.py (lint study graphs) · levers.py (lever, compiler-check
and NPU-cost graphs) · cli.py (`rkstudy piper encoder`) · board.py (`rkstudy board run piper_encoder`)."""

from .. import Family, register

FAMILY = register(Family(
    name="piper_encoder",
    title="Piper duration encoder: token ids -> prior stats + duration conditioning, width ladder",
    notebook="02_piper_encoder.ipynb", command=("piper", "encoder"),
    makes="rkstudy piper encoder --frames 128 --output enc_n128.onnx --target {target}",
    cli="rkstudy.families.piper_encoder.cli:add_cli", board="rkstudy.families.piper_encoder.board:add_board",
    lint_graphs="rkstudy.families.piper_encoder.lint_graphs:lint_graphs",
    lever_graphs="rkstudy.families.piper_encoder.levers:lever_graphs",
    npu_cost_cases="rkstudy.families.piper_encoder.levers:npu_cost_cases"))
