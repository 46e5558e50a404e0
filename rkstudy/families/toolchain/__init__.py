"""The toolchain study: the compiler, the simulator and the 13-bit register field, on probe graphs.

study.py (builds, simulator gate, REGTASK sweep on rkstudy.toolkit.probes' graphs; notebook 00) ·
lint_graphs.py (lint study graphs) · levers.py (lever graphs). No stage command and no board job: it
measures the tools every family stands on.
"""

from .. import Family, register

FAMILY = register(Family(
    name="toolchain", title="The compiler, the simulator and the 13-bit register field, on probe graphs",
    notebook="00_toolchain.ipynb",
    lint_graphs="rkstudy.families.toolchain.lint_graphs:lint_graphs",
    lever_graphs="rkstudy.families.toolchain.levers:lever_graphs",
    builds_on=("piper_decoder",)))
