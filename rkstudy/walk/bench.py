"""The window walker's own cost, recorded as a benchmark (rkstudy bench walker): the per-window time on this
host's CPU of a walk with an engine that does no work, against a budget of 0.2 ms per window, 1 % of the ~21 ms
one Piper window takes on the RK3588 NPU (the RKNN decoder-path document's board figure). Never asserted in a
test: timing is machine noise.
"""

from __future__ import annotations

import time

import numpy as np

from ..tables.bench import machine
from . import window

WALKER_BUDGET_MS = 0.2


def walker_overhead(frames: int = 45 * 2000, emit: int = 45, context: int = 24, channels: int = 192,
                    samples_per_frame: int = 256, repeats: int = 5) -> dict:
    """Median over `repeats` walks of the per-window time with an engine that does no work."""
    win = emit + 2 * context
    latent = np.random.default_rng(0).standard_normal((channels, frames)).astype(np.float32)
    out = np.zeros((1, win * samples_per_frame), dtype=np.float32)
    n_windows = len(window.plan_windows(frames, emit, context))
    per_window = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        audio = window.walk_windows(latent, lambda x, m: out, emit=emit, context=context,
                                    samples_per_frame=samples_per_frame, progress=False)
        per_window.append((time.perf_counter() - t0) / n_windows * 1e3)
    assert audio.shape[-1] == frames * samples_per_frame
    ms = float(np.median(per_window))
    return {"benchmark": "walker_null_engine", "windows": n_windows, "window": f"{emit}+2x{context}",
            "channels": channels, "samples_per_frame": samples_per_frame,
            "value": round(ms, 4), "unit": "ms/window", "budget": WALKER_BUDGET_MS,
            "within_budget": ms < WALKER_BUDGET_MS, "machine": machine()}
