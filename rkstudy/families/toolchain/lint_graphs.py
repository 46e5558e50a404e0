"""The toolchain probes as the lint study lints them (host): the vocoder probe, raw and with its Sin
rewritten, and the long-axis convs at lengths either side of the 13-bit register field."""

from __future__ import annotations

import numpy as np

from ...lint.study import FamilyGraph

QUICK_LENGTHS = (8191, 32768)
FULL_LENGTHS = (4096, 8191, 8192, 12288, 16384, 24576, 32768, 65536)


def lint_graphs(quick: bool) -> list[FamilyGraph]:
    from ...graph.sine import reduce_sin
    from ...toolkit.probes import long_axis_probe, vocoder_probe

    x = {"x": np.random.default_rng(1).standard_normal((1, 16, 1, 64)).astype(np.float32)}
    out = [FamilyGraph("toolchain", "raw", "vocoder_probe", vocoder_probe(), sample=x),
           FamilyGraph("toolchain", "rewritten", "vocoder_probe, sine.reduce_sin", reduce_sin(vocoder_probe()),
                       sample=x)]
    out += [FamilyGraph("toolchain", "raw", f"long_axis_probe L={n}", long_axis_probe(n))
            for n in (QUICK_LENGTHS if quick else FULL_LENGTHS)]
    return out
