"""The boundary signals a rewritten graph reads, all made from one frame-mask input (1 on the real
frames, 0 elsewhere, at one sample per frame): for a tensor at `rate` samples per frame that is
`extent` samples longer than rate x frames, its length mask (1 on its samples), its first-sample and
its last-sample indicators. Each is made once, from ops the streaming rules stream themselves
(an all-ones ConvTranspose repeats the mask to a rate, a ones Conv and a Min lengthen it, Slices and
Pads shift it), so a stateful step carries their recent past in its state like any other history.
"""

from __future__ import annotations

import numpy as np
from onnx import numpy_helper

from .core import Builder

# The largest repeat one all-ones ConvTranspose of the mask makes. rknn-toolkit2 2.5.0 aborts ("buffer
# overflow!") on a one-channel ConvTranspose of kernel = stride = 127 or more over 16 frames (and logs
# REGTASK lines from 31 up), so a mask at a hop such as 512 is repeated in steps: 16 x 16 x 2 builds clean.
REPEAT_MAX = 16


def pad_node(b: Builder, x: str, rank: int, axis: int, before: int, after: int, opset: int, base: str,
             out: str | None = None) -> str:
    """A zero Pad of `x` by (before, after) samples on `axis`."""
    pads = [0] * (2 * rank)
    pads[axis], pads[rank + axis] = before, after
    if opset < 11:
        return b.node("Pad", [x], base, out=out, pads=pads, mode="constant")
    return b.node("Pad", [x, b.const(pads, base + "_pads")], base, out=out, mode="constant")


class Masks:
    """Boundary signals on demand, each made once; `b.nodes` holds what they need, to be placed at the
    top of the graph (they read the mask input and constants only)."""

    def __init__(self, mask: str, opset: int):
        self.mask, self.opset = mask, opset
        self.b = Builder("/valid")
        self._made: dict[tuple, str] = {}
        self.used = False

    def _float(self, values, base: str) -> str:
        name = self.b.name(base)
        self.b.inits.append(numpy_helper.from_array(np.asarray(values, np.float32), name))
        return name

    def at_rate(self, rate: int) -> str:
        """The frame mask repeated to `rate` samples per frame (1 on [0, rate x frames)): a chain of
        all-ones ConvTransposes, each repeating by a factor of at most REPEAT_MAX, from the largest rate
        already made that divides it."""
        self.used = True
        key = ("rate", rate)
        if key not in self._made:
            if rate == 1:
                self._made[key] = self.mask
            else:
                made = [k[1] for k in self._made if k[0] == "rate"]
                below = [q for q in made if rate % q == 0 and 1 < rate // q <= REPEAT_MAX]
                factor = rate // max(below) if below else max(
                    (f for f in range(2, REPEAT_MAX + 1) if rate % f == 0), default=rate)
                source = self.at_rate(rate // factor)
                ones = self._float(np.ones((1, 1, factor)), f"ones_{factor}")
                self._made[key] = self.b.node("ConvTranspose", [source, ones], f"mask_x{rate}",
                                              out=f"{self.mask}_x{rate}", kernel_shape=[factor], strides=[factor])
        return self._made[key]

    def length(self, rate: int, extent: int) -> str:
        """1 on [0, rate x frames + extent), [1, 1, rate x frames + extent]."""
        key = ("length", rate, extent)
        if key not in self._made:
            m = self.at_rate(rate)
            if extent > 0:   # reach `extent` samples past the last: a ones conv, then at most 1
                ones = self._float(np.ones((1, 1, extent + 1)), f"ones_{extent + 1}")
                count = self.b.node("Conv", [m, ones], f"mask_r{rate}_plus{extent}", kernel_shape=[extent + 1],
                                    pads=[extent, extent])
                m = self.b.node("Min", [count, self._float(1.0, "one")], f"mask_r{rate}_e{extent}",
                                out=f"{self.mask}_x{rate}_plus{extent}")
            elif extent < 0:   # end `-extent` samples early: the mask shifted left, times itself
                cut = -extent
                ahead = self.b.slice(m, cut, np.iinfo(np.int64).max, 2, f"mask_r{rate}_ahead{cut}")
                here = self.b.slice(m, 0, -cut, 2, f"mask_r{rate}_cut{cut}")
                m = self.b.node("Mul", [ahead, here], f"mask_r{rate}_e{extent}", out=f"{self.mask}_x{rate}_minus{cut}")
            self._made[key] = m
        return self._made[key]

    def shifted(self, x: str, by: int, base: str, b: Builder | None = None) -> str:
        """x ([1, C, L]) moved `by` samples later (positive) or earlier (negative) along time, zeros shifted
        in, the length kept; its nodes go to `b` (default: the masks' own)."""
        b = b or self.b
        if by > 0:
            padded = pad_node(b, x, 3, 2, by, 0, self.opset, base + "_pad")
            return b.slice(padded, 0, -by, 2, base)
        padded = pad_node(b, x, 3, 2, 0, -by, self.opset, base + "_pad")
        return b.slice(padded, -by, np.iinfo(np.int64).max, 2, base)

    def first(self, rate: int, extent: int) -> str:
        """1 on the first sample of the length only: m x (1 - m one sample later)."""
        key = ("first", rate, extent)
        if key not in self._made:
            m = self.length(rate, extent)
            late = self.shifted(m, 1, f"mask_r{rate}_e{extent}_late")
            rest = self.b.node("Sub", [self._float(1.0, "one"), late], f"mask_r{rate}_e{extent}_notlate")
            self._made[key] = self.b.node("Mul", [m, rest], f"first_r{rate}_e{extent}", out=f"{m}_first")
        return self._made[key]

    def last(self, rate: int, extent: int) -> str:
        """1 on the last sample of the length only: m x (1 - m one sample earlier)."""
        key = ("last", rate, extent)
        if key not in self._made:
            m = self.length(rate, extent)
            early = self.shifted(m, -1, f"mask_r{rate}_e{extent}_early")
            rest = self.b.node("Sub", [self._float(1.0, "one"), early], f"mask_r{rate}_e{extent}_notearly")
            self._made[key] = self.b.node("Mul", [m, rest], f"last_r{rate}_e{extent}", out=f"{m}_last")
        return self._made[key]

    def shaped(self, name: str, rank: int, axis: int) -> str:
        """`name` ([1, 1, L]) reshaped to broadcast against a rank-`rank` tensor with time on `axis`."""
        if rank == 3 and axis == 2:
            return name
        key = ("shaped", name, rank, axis)
        if key not in self._made:
            shape = [1] * rank
            shape[axis] = -1
            self._made[key] = self.b.node("Reshape", [name, self.b.const(shape, "mask_shape")],
                                          f"{name}_as{rank}_{axis}",
                                          out=f"{name}_on_axis{axis}_of{rank}")
        return self._made[key]
