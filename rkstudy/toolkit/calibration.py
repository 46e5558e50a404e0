"""What makes a quantized build (host): the calibration feeds and the toolkit's quantization settings.

Its own module because a Calibration is made by every family's quantization stage and by the lever
studies, keys the engine cache, and is recorded in a quantized engine's contract, without any of them
needing the build machinery.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import cache
from ..contract import QUANTIZED_DTYPES
from ..errors import UsageError

ALGORITHMS = ("normal", "mmse", "kl_divergence")  # min/max, minimum mean squared error, KL divergence
METHODS = ("channel", "layer")  # one weight scale per output channel, or one per layer


@dataclass(frozen=True, eq=False)
class Calibration:
    """What makes a quantized build: the calibration feeds ({input name: array}, one dict per sample)
    the toolkit runs to find each tensor's range, and the toolkit's quantization settings.

    The defaults are the toolkit's own (rknn.config: quantized_dtype w8a8, i.e. 8-bit asymmetric
    weights and activations; algorithm normal, i.e. min/max; per-channel weights), so `label` names
    exactly what was built. `dtype` is any of QUANTIZED_DTYPES (w8a16: 8-bit weights, 16-bit
    activations; w16a16i_dfp: 16-bit dynamic fixed point; w4a16: 4-bit weights), `algorithm` any of
    ALGORITHMS, `method` any of METHODS. The feeds are written as .npy files plus the dataset .txt the
    toolkit reads (one line per sample: that sample's .npy paths in input order).

    Two ways to keep part of the graph in float16, because plain int8 can lose a decoder whole:
    `keep_fp16` (tensor names of the toolkit's quantization config: its layers as accuracy_analysis
    names them, and also the casts at the graph's inputs and outputs and the tensors the compiler
    inserts, e.g. a tiled conv's `_tile0_conv`, which that report does not list) runs the toolkit's
    hybrid_quantization_step1 / step2 with those tensors set to float16; `auto_hybrid_cos` runs
    rknn.build(auto_hybrid=True) with that cosine threshold (config's auto_hybrid_cos_thresh), letting
    the toolkit choose.

    `int16_overflow` makes it a float build instead (rknn.build(do_quantization=False, dataset=...,
    auto_hybrid=True), rknn-toolkit2 >= 2.3.2): the toolkit runs the feeds to find each layer's range
    and computes in int16 the layers whose range exceeds float16's; the rest stays float16."""

    feeds: Sequence[Mapping[str, object]]
    dtype: str = "w8a8"
    algorithm: str = "normal"
    method: str = "channel"
    keep_fp16: Sequence[str] = ()
    auto_hybrid_cos: float | None = None
    int16_overflow: bool = False

    def __post_init__(self):
        if not self.feeds:
            raise UsageError("a quantized build needs at least one calibration feed; pass Calibration([{name: array}])")
        for what, value, known in (("dtype", self.dtype, tuple(QUANTIZED_DTYPES)),
                                   ("algorithm", self.algorithm, ALGORITHMS), ("method", self.method, METHODS)):
            if value not in known:
                raise UsageError(f"quantized {what} {value!r} is not one rknn.config documents; use one of "
                                 f"{', '.join(known)}")
        if self.keep_fp16 and self.auto_hybrid_cos is not None:
            raise UsageError("keep_fp16 and auto_hybrid_cos are two ways to choose the float16 layers; pass one")
        if self.int16_overflow and (self.keep_fp16 or self.auto_hybrid_cos is not None):
            raise UsageError("int16_overflow is a float build (nothing quantized to int8); drop keep_fp16 and "
                             "auto_hybrid_cos, or drop int16_overflow for an int8 build")
        object.__setattr__(self, "keep_fp16", tuple(dict.fromkeys(self.keep_fp16)))

    @property
    def weight_bits(self) -> int:
        """The bits of the weights a quantized layer of this build computes with (float16 layers: 16)."""
        return 16 if self.int16_overflow else QUANTIZED_DTYPES[self.dtype][0]

    @property
    def settings(self) -> str:
        """The quantizer's settings in one phrase, defaults included: 'w8a8 normal channel'."""
        return f"{self.dtype} {self.algorithm} {self.method}"

    @property
    def label(self) -> str:
        """The dtype column of a quantized build: 'int8 w8a8' (the bits of the weights name it), then the
        calibration algorithm and the per-layer method unless they are the defaults ('int8 w8a8 mmse',
        'int8 w8a8 layer'), then ' hybrid (12 layers fp16)' or ' auto-hybrid cos 0.99' when part of it
        stays float16."""
        if self.int16_overflow:
            return "fp16 auto-hybrid int16"
        label = f"int{QUANTIZED_DTYPES[self.dtype][0]} {self.dtype}"
        if self.algorithm != "normal":  # the toolkit's min/max default goes unnamed
            label += f" {self.algorithm}"
        if self.method != "channel":
            label += f" {self.method}"
        if self.keep_fp16:
            n = len(self.keep_fp16)
            label += f" hybrid ({n} layer{'s' if n != 1 else ''} fp16)"
        elif self.auto_hybrid_cos is not None:
            label += f" auto-hybrid cos {self.auto_hybrid_cos:g}"
        return label

    def with_fp16(self, keep: Sequence[str]) -> Calibration:
        """The same calibration and settings with `keep` (config tensor names) in float16."""
        from dataclasses import replace

        return replace(self, keep_fp16=tuple(keep), auto_hybrid_cos=None)

    def key(self, names: Sequence[str]) -> str:
        """Digest of the settings and every calibration array (by content, in input order)."""
        arrays = [np.ascontiguousarray(feed[n]) for feed in self.feeds for n in names]
        hybrid = [("keep_fp16", sorted(self.keep_fp16))] if self.keep_fp16 else []
        hybrid += [("auto_hybrid_cos", float(self.auto_hybrid_cos))] if self.auto_hybrid_cos is not None else []
        hybrid += [("int16_overflow", True)] if self.int16_overflow else []
        return cache.digest(self.dtype, self.algorithm, self.method, *hybrid,  # plain int8 keys stay as they were
                            [(str(a.dtype), a.shape) for a in arrays], *[a.tobytes() for a in arrays])

    def data_key(self, names: Sequence[str]) -> str:
        """Digest of what the toolkit's calibration pass sees (settings and arrays, no hybrid choice):
        one hybrid_quantization_step1 serves every keep_fp16 choice with this key."""
        arrays = [np.ascontiguousarray(feed[n]) for feed in self.feeds for n in names]
        return cache.digest(self.dtype, self.algorithm, self.method,
                            [(str(a.dtype), a.shape) for a in arrays], *[a.tobytes() for a in arrays])

    def write(self, folder: Path, names: Sequence[str]) -> Path:
        """The .npy files and the dataset .txt under `folder`; the .txt's path."""
        folder.mkdir(parents=True, exist_ok=True)
        lines = []
        for i, feed in enumerate(self.feeds):
            missing = [n for n in names if n not in feed]
            if missing:
                raise UsageError(f"calibration feed {i} has no array for {', '.join(missing)}; give every "
                                 f"feed one array per graph input ({', '.join(names)})")
            paths = []
            for j, name in enumerate(names):
                paths.append(folder / f"{i}_{j}.npy")
                np.save(paths[-1], np.asarray(feed[name]))
            lines.append(" ".join(str(p) for p in paths))
        dataset = folder / "dataset.txt"
        dataset.write_text("\n".join(lines) + "\n")
        return dataset

    def record(self) -> dict:
        """What a compiled contract records of this build (rkstudy.contract.QUANTIZATION_FIELDS)."""
        return {"dtype": self.dtype, "algorithm": self.algorithm, "method": self.method, "label": self.label,
                "calibration_samples": len(self.feeds), "fp16_tensors": len(self.keep_fp16)}

    def spec(self, dataset: Path) -> dict:
        return {"dataset": str(dataset), "quantized_dtype": self.dtype, "quantized_algorithm": self.algorithm,
                "quantized_method": self.method, "keep_fp16": list(self.keep_fp16),
                "auto_hybrid_cos": self.auto_hybrid_cos, "int16_overflow": self.int16_overflow}
