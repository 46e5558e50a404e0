"""The toolchain study: the compiler, the simulator and the 13-bit register field, on probe graphs.

probes.py (graphs built with onnx.helper) · study.py (builds, simulator gate, REGTASK sweep;
notebook 00) · lint_graphs.py (lint study graphs). No stage command and no board job: it measures the
tools every family stands on.
"""

from .. import Family, register

FAMILY = register(Family(
    name="toolchain", title="The compiler, the simulator and the 13-bit register field, on probe graphs",
    notebook="00_toolchain.ipynb",
    lint_graphs="rkstudy.families.toolchain.lint_graphs:lint_graphs"))
