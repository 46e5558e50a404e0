"""The flow estimator's graphs (the DiT stand-in, random weights) as the lint study lints them (host):
the TorchScript export as it comes out, and the graph folded at the pinned shapes (what the engine is
built from), with the contract's feeds."""

from __future__ import annotations

import tempfile
from pathlib import Path

import onnx

from ...lint.study import FamilyGraph

FRAMES, DEPTH = 64, 2


def lint_graphs(quick: bool) -> list[FamilyGraph]:
    from . import producer, standin

    product = producer.produce(FRAMES, depth=DEPTH)
    cfg = standin.standin_config(DEPTH)
    with tempfile.TemporaryDirectory(prefix="rkstudy-lint-dit-") as tmp:
        raw = onnx.load(str(standin.export(standin.build(cfg), FRAMES, Path(tmp) / "raw.onnx")))
    sample = producer.feeds(product.contract)
    return [FamilyGraph("flow_estimator", "raw", f"exported at S={FRAMES}, depth {DEPTH} (unfolded)", raw,
                        sample=sample),
            FamilyGraph("flow_estimator", "rewritten", f"folded at S={FRAMES}, depth {DEPTH}",
                        onnx.load(str(product.path)), sample=sample)]
