"""Which quantized dtype each target builds and simulates (host), on one small probe graph.

Asked before any stage is quantized: which dtype a target takes is not documented, and a toolkit that
dies on one (each build runs in its own child) must be a row, not the end of the study.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from ... import cache, gates, graph
from ...contract import QUANTIZED_DTYPES
from ...runtime import OrtRunner
from ...targets import ALL_TARGETS
from ...toolkit.calibration import Calibration
from .bench import outcome


def probe_dtypes(targets: Sequence[str] = ALL_TARGETS, dtypes: Sequence[str] = tuple(QUANTIZED_DTYPES),
                 progress: Callable[[str], None] | None = None) -> list[dict]:
    """Which quantized dtype each target builds and simulates, on the dtype probe (rkstudy.toolkit.probes:
    16 -> 32 -> 1 channels, k7), calibrated on 4 seeded noise inputs and scored against fp32 on a fifth:
    one row per (target, dtype), the toolkit's refusal or crash quoted (each build runs in its own child,
    so a toolkit that dies is a row, not the end of the study)."""
    from ...toolkit import probes
    from ...toolkit.simulator import simulate

    path = cache.cached_bytes("toolchain", "dtype_probe", probes.dtype_probe().SerializeToString(), ".onnx")
    shape = tuple(graph.input_shapes(path)["x"])
    noise = [np.random.default_rng(s).standard_normal(shape).astype(np.float32) for s in range(5)]
    ref = OrtRunner(path).run({"x": noise[4]})[0]
    rows = []
    for target in targets:
        for dtype in dtypes:
            (progress or (lambda _: None))(f"dtype probe: {target} {dtype}")
            quantize = Calibration([{"x": x} for x in noise[:4]], dtype=dtype)
            sim = simulate(path, target, [{"x": noise[4]}], quantize=quantize, verbose=True)
            got = sim.outputs[0][0] if sim.outputs else None
            status = outcome(sim.report) if not sim.report.ok else ("simulator refused" if got is None else "ok")
            rows.append({"target_soc": target, "dtype": dtype, "weight_bits": QUANTIZED_DTYPES[dtype][0],
                         "activation_bits": QUANTIZED_DTYPES[dtype][1], "status": status,
                         "builds": sim.report.ok, "simulates": got is not None,
                         "snr_vs_fp32_db": gates.snr_db(ref, got) if got is not None else None,
                         "engine_bytes": sim.report.engine_bytes, "failed_step": sim.report.failed_step or "",
                         "error": (sim.inference_error or sim.report.error or "")[:240],
                         "where": "simulator" if got is not None else "host", "target": target})
    return rows


def builds(probe_rows: Sequence[Mapping], target: str) -> list[str]:
    """The dtypes the probe says `target` builds and simulates, in QUANTIZED_DTYPES order."""
    ok = {r["dtype"] for r in probe_rows if r["target_soc"] == target and r["simulates"]}
    return [d for d in QUANTIZED_DTYPES if d in ok]
