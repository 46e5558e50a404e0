"""What a compiled engine runs on low-bit weights (host): the share of the stage's conv MACs per weight
width, read from the build's own layer table and constant table.

Why from the log: a layer's dtype alone does not say it (under w4a16 a layer computes in float16 on 4-bit
weights), and the goal of the lever is stated as that share.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from ...toolkit import macs
from ...toolkit.build import BuildReport
from ...toolkit.calibration import Calibration
from ...toolkit.log import IO_OPS, WEIGHT_BITS, Layer, layer_table, weight_dtypes
from .stages import Stage
from .tensors import CONVERT_OPS


def weight_bits(layer: Layer, quantize: Calibration | None, stored: Mapping[int, str] | None = None) -> int:
    """The bits of the weights a compiled layer computes with: what the build log's constant table says
    its weight is stored in (`stored`: rkstudy.toolkit.log.weight_dtypes; under w4a16 a layer computes in
    float16 on 4-bit weights, so its own dtype does not say), else 16 for a float16 layer (and every layer
    of an fp16 build) and the build's quantized dtype's weight bits for the rest."""
    if stored and layer.id in stored and stored[layer.id] in WEIGHT_BITS:
        return WEIGHT_BITS[stored[layer.id]]
    if quantize is None or layer.dtype.upper().startswith("FLOAT"):
        return 16
    return quantize.weight_bits


def engine_shares(onnx, log_text: str, quantize: Calibration | None) -> dict:
    """From a verbose build's layer table and constant table: the share of the graph's conv MACs (and of
    its conv weights) computed on weights of 8 bits or fewer, how much of the graph's conv MACs the table
    accounts for (rkstudy.toolkit.macs: 1.0 when every conv has a compiled layer), and the convs left
    in float16 (a layer on float16 weights)."""
    layers = layer_table(log_text)
    stored = weight_dtypes(log_text)
    accounting = macs.account(onnx, layers)
    low = lambda layer: weight_bits(layer, quantize, stored) <= 8  # noqa: E731
    return {"low_bit_mac_share": round(accounting.share(low), 4),
            "low_bit_weight_share": round(accounting.share(low, weights=True), 4),
            "conv_macs": accounting.conv_macs, "mac_coverage": round(accounting.coverage, 6),
            "fp16_layers": len(float16_layers(layers)),
            "fp16_convs": accounting.chosen_nodes(lambda layer: weight_bits(layer, quantize, stored) == 16
                                                  and layer.dtype.upper().startswith("FLOAT"))}


def float16_layers(layers: Sequence[Layer]) -> list[str]:
    """The compute layers a compiled engine runs in FLOAT16 (its I/O rows and dtype casts left out)."""
    return [layer.name for layer in layers if layer.dtype == "FLOAT16" and layer.op not in IO_OPS + CONVERT_OPS]


def mac_accounting(stage: Stage, report: BuildReport) -> dict:
    """One row for the MAC-accounting table: the stage's graph conv MACs against its layer table's
    printed conv MACs, every difference by cause (rkstudy.toolkit.macs.Accounting.reconciliation)."""
    accounting = macs.account(stage.onnx, layer_table(Path(report.log).read_text(encoding="utf-8", errors="replace")))
    return {"stage": stage.name, **accounting.reconciliation(), "where": "host", "target": report.target}
