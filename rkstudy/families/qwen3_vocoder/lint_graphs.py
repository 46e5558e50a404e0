"""The Qwen3 vocoder step's graphs (seeded random weights) as the lint study lints them (host; full runs
only): the TorchScript export before the long-axis rewrite and another exporter setting (a dynamic
one, linted at the static step's shapes) against the produced step, with a real carried cache as the
sample."""

from __future__ import annotations

import onnx

from ...lint.study import FamilyGraph

CODES_LENGTH = 16
EXPORTERS = ("torchscript17_dynamic",)


def lint_graphs(quick: bool) -> list[FamilyGraph]:
    if quick:
        return []
    from . import producer
    from .study import CODES_SEED

    product = producer.produce(CODES_LENGTH)
    pins = {t.name: tuple(t.shape) for t in product.contract.inputs}
    sample = producer.carried_feeds(product.path, 2, CODES_SEED + 1, product.contract)[-1]
    out = [FamilyGraph("qwen3_vocoder", "raw", f"step B={CODES_LENGTH}, torchscript17, before the long-axis rewrite",
                       onnx.load(str(producer.produce(CODES_LENGTH, long_axis=False).path)), sample=sample)]
    for exporter in EXPORTERS:
        graph = onnx.load(str(producer.produce(CODES_LENGTH, exporter=exporter).path))
        dynamic = any(not d.HasField("dim_value") for i in graph.graph.input for d in i.type.tensor_type.shape.dim)
        out.append(FamilyGraph("qwen3_vocoder", "raw", f"step B={CODES_LENGTH}, {exporter}", graph,
                               pins if dynamic else {}, sample))
    out.append(FamilyGraph("qwen3_vocoder", "rewritten", f"step B={CODES_LENGTH}, produced (torchscript17, long axes "
                           "rewritten)", onnx.load(str(product.path)), sample=sample))
    return out
