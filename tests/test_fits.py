"""rkstudy.fits on exact cases, and the two growth studies re-fitted from the committed tables' own
inputs: the committed growth tables (written with 6 significant digits) come out again."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from rkstudy import fits
from rkstudy.tables.results import read_table

RESULTS = Path(__file__).resolve().parent.parent / "results"


def _num(v: str):
    """A CSV cell as the study wrote it: a number where it parses as one, else the text ("" for none)."""
    try:
        return int(v) if v.lstrip("-").isdigit() else float(v)
    except ValueError:
        return v


def test_power_law_exponent_exact():
    x = [64, 96, 128, 192]
    assert fits.power_law_exponent(x, [3.0 * n ** 2.5 for n in x]) == pytest.approx(2.5, abs=1e-12)
    assert math.isnan(fits.power_law_exponent([64], [1.0]))
    with pytest.raises(ValueError, match="3 x values against 2"):
        fits.power_law_exponent([1, 2, 3], [1, 2])


def test_polynomial_and_crossing_exact():
    a, b, c = 500_000.0, 16_000.0, 10.0
    s = np.array([64, 110, 250, 500, 900, 2000], float)
    coef, resid = fits.polynomial(s, a + b * s + c * s * s, (0, 1, 2))
    assert coef == pytest.approx([a, b, c]) and np.abs(resid).max() < 1e-3
    x = fits.crossing(coef, (0, 1, 2), 2**32)
    assert a + b * x + c * x * x == pytest.approx(2**32)
    # y = 100 + 2 x^2 reaches 300 at x = 10 exactly; a falling line never reaches a level above it
    assert fits.crossing([100.0, 2.0], (0, 2), 300.0) == pytest.approx(10.0)
    assert fits.crossing([5.0, -1.0], (0, 1), 10.0) is None


def _assert_rows_match(got: list[dict], committed: list[dict]) -> None:
    assert len(got) == len(committed)
    for g, c in zip(got, committed):
        for key, value in g.items():
            if key == "where" or key not in c:
                continue
            want = _num(c[key])
            if isinstance(value, str) or isinstance(want, str):
                assert str(value) == c[key], (key, value, c[key])
            else:
                assert value == pytest.approx(want, rel=1e-5, abs=1e-9), (key, value, c[key])


def test_flow_estimator_growth_refit_from_committed_builds():
    from rkstudy.families.flow_estimator import study

    builds = [{k: _num(v) if k in ("S", "depth", "engine_bytes", "plan_internal_bytes", "plan_weight_bytes") else v
               for k, v in r.items()} for r in read_table(RESULTS / "flow_estimator" / "builds.csv")]
    committed = read_table(RESULTS / "flow_estimator" / "growth.csv")
    assert len(committed) == 12
    _assert_rows_match(study.growth_rows(builds), committed)


def test_flow_estimator_reference_fit_matches_committed_table():
    from rkstudy.families.flow_estimator import study
    from rkstudy.families.flow_estimator.reference_memory import reference_memory_model
    from rkstudy.tables.results import reference_figure

    committed = read_table(RESULTS / "flow_estimator" / "reference_fit.csv")
    dma = int(reference_figure("flow_estimator", "dma map refused at rknn_init (dmesg line)")["value"])  # notebook 05
    got = study.reference_fit_rows(reference_memory_model(), dma)
    _assert_rows_match(got, committed)


def test_piper_encoder_growth_refit_from_committed_sizes():
    from rkstudy.families.piper_encoder import study

    sizes = [{**r, "frames": int(r["frames"]), "engine_bytes": _num(r["engine_bytes"]),
              "onnx_initializer_bytes": _num(r["onnx_initializer_bytes"])}
             for r in read_table(RESULTS / "piper_encoder" / "sizes.csv") if r["relshift"] == "gather"]
    committed = read_table(RESULTS / "piper_encoder" / "growth.csv")
    got = study.growth_rows(sizes, int(committed[0]["base_bytes"]))
    _assert_rows_match(got, committed)
