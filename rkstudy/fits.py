"""Growth fits: how a size grows with the compiled length (engine bytes against frames, tokens or S).

Two questions, one module. A power law y ~ x^k says how fast a size grows (the Piper encoder's width
ladder: the exponent, not a curve to extrapolate). A least-squares polynomial in x with chosen powers
says how much it is, and where it reaches a level (the flow estimator's stand-in: the S at which its
planned arena would cross the 32-bit ceiling, an extrapolation past the longest build).

numpy only.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def power_law_exponent(x: Sequence[float], y: Sequence[float]) -> float:
    """Least-squares slope of log(y) against log(x), the k of y ~ x^k (NaN with fewer than two points)."""
    if len(x) != len(y):
        raise ValueError(f"{len(x)} x values against {len(y)} y values")
    if len(x) < 2:
        return float("nan")
    return float(np.polyfit(np.log(np.asarray(x, float)), np.log(np.asarray(y, float)), 1)[0])


def polynomial(x: Sequence[float], y: Sequence[float], powers: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares coefficients of y = sum(coef[i] * x**powers[i]), and the residuals (fit - y)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    design = np.stack([x ** p for p in powers], axis=1)
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    return coef, design @ coef - y


def crossing(coef: Sequence[float], powers: Sequence[int], level: float) -> float | None:
    """Smallest x > 0 where the polynomial of `polynomial` reaches `level` (None if it never does)."""
    poly = np.zeros(max(powers) + 1)
    for c, p in zip(coef, powers):
        poly[max(powers) - p] += c
    poly[-1] -= level
    roots = [r.real for r in np.roots(poly) if abs(r.imag) < 1e-6 and r.real > 0]
    return float(min(roots)) if roots else None
