"""What the toolchain probes offers the shared studies that build graphs from every family (host): the vocoder
probe for the toolkit-version table, the conv stack for the multi-shape lever.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...levers import LeverGraphs
from ...levers.multi_shape import conv_ladder
from ...levers.versions import Engine
from ...targets import STUDIED_TARGETS


def toolchain_probe(targets: Sequence[str] = STUDIED_TARGETS, frames: int = 64) -> Engine:
    """Notebook 00's vocoder probe (Conv1d, ConvTranspose1d, Snake with Sin) on seeded noise."""
    from ...toolkit.probes import save_probe, vocoder_probe

    x = np.random.default_rng(1).standard_normal((1, 16, 1, frames)).astype(np.float32)
    return Engine("toolchain probe", save_probe(vocoder_probe(frames=frames), f"vocoder_probe_t{frames}"),
                  [{"x": x}], tuple(targets))


def lever_graphs(quick: bool) -> LeverGraphs:
    """The probe with every toolkit version; the conv stack (a graph with no baked shapes, so the
    multi-shape lever is measured apart from any model's) at two widths quick, three full."""
    return LeverGraphs(versions=[toolchain_probe()], shape_ladders=[conv_ladder((16, 32) if quick else (64, 128, 256))])
